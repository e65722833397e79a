//! Message TTL (queue x-message-ttl and per-message expiration, expired
//! wherever the message sits, never delivered), dead-lettering with
//! RabbitMQ's x-death header, length limits with each x-overflow mode,
//! and x-expires.

use crate::common;
use crate::helpers;

use std::time::Duration;

use common::*;
use helpers::*;
use lapin::{
    options::*,
    types::{AMQPValue, FieldTable},
    BasicProperties,
};

fn text(v: Option<&AMQPValue>) -> Option<String> {
    match v? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

/// The x-death tables of a message, newest first.
fn x_death(props: &BasicProperties) -> Vec<FieldTable> {
    let Some(h) = props.headers() else {
        return Vec::new();
    };
    match h.inner().get("x-death") {
        Some(AMQPValue::FieldArray(a)) => a
            .as_slice()
            .iter()
            .filter_map(|v| match v {
                AMQPValue::FieldTable(t) => Some(t.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

async fn get_msg(ch: &lapin::Channel, queue: &str) -> Option<lapin::message::BasicGetMessage> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(m) = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            return Some(m);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_message_behind_a_long_lived_one_is_dead_lettered_at_its_deadline() {
    // RabbitMQ only expires at the head; Warren removes a message wherever
    // it sits. The head here lives for a minute, the one behind it 100 ms.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "dead").await;
    declare_with(
        &ch,
        "work",
        QueueDeclareOptions::default(),
        table(&[
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s("dead")),
        ]),
    )
    .await
    .unwrap();
    let long = BasicProperties::default().with_expiration("60000".into());
    let short = BasicProperties::default().with_expiration("100".into());
    publish_with(
        &ch,
        "",
        "work",
        BasicPublishOptions::default(),
        b"head",
        long,
    )
    .await;
    publish_with(
        &ch,
        "",
        "work",
        BasicPublishOptions::default(),
        b"behind",
        short,
    )
    .await;
    let m = get_msg(&ch, "dead")
        .await
        .expect("the short-lived message was dead-lettered");
    assert_eq!(m.delivery.data, b"behind");
    let deaths = x_death(&m.delivery.properties);
    assert_eq!(deaths.len(), 1);
    let d = deaths[0].inner();
    assert_eq!(text(d.get("reason")).as_deref(), Some("expired"));
    assert_eq!(text(d.get("queue")).as_deref(), Some("work"));
    assert_eq!(text(d.get("original-expiration")).as_deref(), Some("100"));
    assert_eq!(d.get("count"), Some(&AMQPValue::LongLongInt(1)));
    assert_eq!(
        m.delivery.properties.expiration(),
        &None,
        "expiration is removed"
    );
    assert_eq!(
        wait_count(&c, "work", 1).await,
        1,
        "the head is still there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_ttl_and_message_ttl_take_the_smaller() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "q",
        QueueDeclareOptions::default(),
        table(&[("x-message-ttl", AMQPValue::LongInt(60_000))]),
    )
    .await
    .unwrap();
    let short = BasicProperties::default().with_expiration("50".into());
    publish_with(
        &ch,
        "",
        "q",
        BasicPublishOptions::default(),
        b"short",
        short,
    )
    .await;
    publish(&ch, "", "q", b"long").await;
    assert_eq!(wait_count(&c, "q", 1).await, 1);
    assert_eq!(drain(&ch, "q").await, ["long"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_messages_are_never_delivered() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare_with(
        &ch,
        "q",
        QueueDeclareOptions::default(),
        table(&[("x-message-ttl", AMQPValue::LongInt(30))]),
    )
    .await
    .unwrap();
    for i in 0..50u8 {
        publish(&ch, "", "q", &[i]).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut consumer = consumer(&ch, "q", "c").await;
    assert_no_delivery(&mut consumer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_and_nacked_messages_carry_x_death() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "dead").await;
    bind(&ch, "dead", "amq.direct", "dl", FieldTable::default()).await;
    declare_with(
        &ch,
        "work",
        QueueDeclareOptions::default(),
        table(&[
            ("x-dead-letter-exchange", s("amq.direct")),
            ("x-dead-letter-routing-key", s("dl")),
        ]),
    )
    .await
    .unwrap();
    publish(&ch, "", "work", b"bad").await;
    let m = ch
        .basic_get("work".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("message");
    m.delivery
        .nack(BasicNackOptions {
            multiple: false,
            requeue: false,
        })
        .await
        .unwrap();
    let d = get_msg(&ch, "dead").await.expect("dead-lettered");
    assert_eq!(d.delivery.data, b"bad");
    assert_eq!(d.delivery.exchange.as_str(), "amq.direct");
    assert_eq!(d.delivery.routing_key.as_str(), "dl");
    let deaths = x_death(&d.delivery.properties);
    let t = deaths[0].inner();
    assert_eq!(text(t.get("reason")).as_deref(), Some("rejected"));
    assert_eq!(text(t.get("exchange")).as_deref(), Some(""));
    match t.get("routing-keys") {
        Some(AMQPValue::FieldArray(a)) => {
            assert_eq!(text(a.as_slice().first()).as_deref(), Some("work"))
        }
        other => panic!("routing-keys: {other:?}"),
    }
    let h = d.delivery.properties.headers().clone().unwrap_or_default();
    assert_eq!(
        text(h.inner().get("x-first-death-reason")).as_deref(),
        Some("rejected")
    );
    assert_eq!(
        text(h.inner().get("x-first-death-queue")).as_deref(),
        Some("work")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_cycle_without_rejection_drops_the_message() {
    // Two queues dead-lettering into each other by TTL: RabbitMQ drops the
    // message when it would come back to a queue it already expired in.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    for (name, other) in [("a", "b"), ("b", "a")] {
        declare_with(
            &ch,
            name,
            QueueDeclareOptions::default(),
            table(&[
                ("x-message-ttl", AMQPValue::LongInt(20)),
                ("x-dead-letter-exchange", s("")),
                ("x-dead-letter-routing-key", s(other)),
            ]),
        )
        .await
        .unwrap();
    }
    publish(&ch, "", "a", b"loop").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(wait_count(&c, "a", 0).await, 0);
    assert_eq!(wait_count(&c, "b", 0).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_length_drop_head_dead_letters_the_oldest() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "dead").await;
    declare_with(
        &ch,
        "short",
        QueueDeclareOptions::default(),
        table(&[
            ("x-max-length", AMQPValue::LongInt(2)),
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s("dead")),
        ]),
    )
    .await
    .unwrap();
    for m in ["1", "2", "3", "4"] {
        publish(&ch, "", "short", m.as_bytes()).await;
    }
    assert_eq!(
        get_eventually(&ch, "dead").await.as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(
        get_eventually(&ch, "dead").await.as_deref(),
        Some(&b"2"[..])
    );
    assert_eq!(drain(&ch, "short").await, ["3", "4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_length_bytes_counts_bodies() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare_with(
        &ch,
        "bytes",
        QueueDeclareOptions::default(),
        table(&[("x-max-length-bytes", AMQPValue::LongInt(10))]),
    )
    .await
    .unwrap();
    for m in ["aaaa", "bbbb", "cccc"] {
        publish(&ch, "", "bytes", m.as_bytes()).await;
    }
    assert_eq!(drain(&ch, "bytes").await, ["bbbb", "cccc"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_publish_dlx_dead_letters_the_refused_message() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare(&ch, "dead").await;
    declare_with(
        &ch,
        "small",
        QueueDeclareOptions::default(),
        table(&[
            ("x-max-length", AMQPValue::LongInt(1)),
            ("x-overflow", s("reject-publish-dlx")),
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s("dead")),
        ]),
    )
    .await
    .unwrap();
    let ok = publish_with(
        &ch,
        "",
        "small",
        BasicPublishOptions::default(),
        b"1",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    assert!(ok.is_ack());
    let refused = publish_with(
        &ch,
        "",
        "small",
        BasicPublishOptions::default(),
        b"2",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    assert!(refused.is_nack(), "the publisher is told");
    let m = get_msg(&ch, "dead")
        .await
        .expect("refused message dead-lettered");
    assert_eq!(m.delivery.data, b"2");
    assert_eq!(
        text(x_death(&m.delivery.properties)[0].inner().get("reason")).as_deref(),
        Some("maxlen")
    );
    assert_eq!(drain(&ch, "small").await, ["1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_queue_expires() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "temp",
        QueueDeclareOptions::default(),
        table(&[("x-expires", AMQPValue::LongInt(100))]),
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let ch2 = c.create_channel().await.unwrap();
        let r = ch2
            .queue_declare(
                "temp".into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await;
        match r {
            Err(e) => {
                assert_eq!(reply_code(&e), Some(404));
                break;
            }
            Ok(_) if tokio::time::Instant::now() > deadline => panic!("queue did not expire"),
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_with_a_consumer_does_not_expire() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "kept",
        QueueDeclareOptions::default(),
        table(&[("x-expires", AMQPValue::LongInt(50))]),
    )
    .await
    .unwrap();
    let _consumer = consumer(&ch, "kept", "c").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ch2 = c.create_channel().await.unwrap();
    ch2.queue_declare(
        "kept".into(),
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("still there");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_that_dead_letters_into_itself_does_not_loop_forever() {
    // x-max-length 0 and its own name as dead-letter routing key: every
    // push drops the message back into the same queue. A forged x-death
    // with a rejection defeats the cycle rule, so the hop limit must stop
    // it; the broker keeps serving.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "self",
        QueueDeclareOptions::default(),
        table(&[
            ("x-max-length", AMQPValue::LongInt(0)),
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s("self")),
        ]),
    )
    .await
    .unwrap();
    let mut death = FieldTable::default();
    death.insert("queue".into(), s("elsewhere"));
    death.insert("reason".into(), s("rejected"));
    let mut deaths = lapin::types::FieldArray::default();
    deaths.push(AMQPValue::FieldTable(death));
    let props = BasicProperties::default()
        .with_headers(table(&[("x-death", AMQPValue::FieldArray(deaths))]));
    publish_with(
        &ch,
        "",
        "self",
        BasicPublishOptions::default(),
        b"loop",
        props,
    )
    .await;
    publish(&ch, "", "self", b"plain").await;
    assert_eq!(wait_count(&c, "self", 0).await, 0);
    assert_connection_works(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovered_messages_still_expire() {
    let mut b = start().await;
    {
        let (_c, ch) = b.channel().await;
        declare_with(
            &ch,
            "kept",
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            table(&[("x-message-ttl", AMQPValue::LongInt(300))]),
        )
        .await
        .unwrap();
        let props = BasicProperties::default().with_delivery_mode(2);
        publish_with(
            &ch,
            "",
            "kept",
            BasicPublishOptions::default(),
            b"old",
            props,
        )
        .await;
        assert_eq!(wait_count(&_c, "kept", 1).await, 1);
    }
    b.restart().await;
    let c = b.connect().await;
    assert_eq!(
        wait_count(&c, "kept", 0).await,
        0,
        "TTL applies after a restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejecting_a_delivery_of_a_deleted_queue_dead_letters_nothing() {
    // RabbitMQ: a deleted queue's messages are gone, unacked ones included.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "dead").await;
    let args = table(&[
        ("x-dead-letter-exchange", s("")),
        ("x-dead-letter-routing-key", s("dead")),
    ]);
    declare_with(&ch, "work", QueueDeclareOptions::default(), args)
        .await
        .unwrap();
    publish(&ch, "", "work", b"m").await;
    let m = ch
        .basic_get("work".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("a message");
    let other = c.create_channel().await.unwrap();
    other
        .queue_delete("work".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    m.delivery
        .acker
        .nack(BasicNackOptions {
            requeue: false,
            ..Default::default()
        })
        .await
        .unwrap();
    // A synchronous method on the same channel: the nack was handled.
    let dead = ch
        .queue_declare(
            "dead".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!(dead.message_count(), 0);
}
