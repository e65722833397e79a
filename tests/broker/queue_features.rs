//! Priority queues (x-max-priority), single active consumer, x-delivery-limit
//! with x-delivery-count, and sender-selected distribution (CC / BCC).

use crate::common;
use crate::helpers;

use common::*;
use helpers::*;
use lapin::{
    options::*,
    types::{AMQPValue, FieldArray, FieldTable},
    BasicProperties,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_queue_delivers_by_priority_then_fifo() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare_with(
        &ch,
        "prio",
        QueueDeclareOptions::default(),
        table(&[("x-max-priority", AMQPValue::LongInt(5))]),
    )
    .await
    .unwrap();
    for (body, p) in [
        ("low-1", 0u8),
        ("high-1", 5),
        ("capped", 9),
        ("mid", 2),
        ("high-2", 5),
        ("low-2", 0),
    ] {
        let props = BasicProperties::default().with_priority(p);
        publish_with(
            &ch,
            "",
            "prio",
            BasicPublishOptions::default(),
            body.as_bytes(),
            props,
        )
        .await;
    }
    assert_eq!(
        drain(&ch, "prio").await,
        ["high-1", "capped", "high-2", "mid", "low-1", "low-2"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_active_consumer_takes_over_in_order() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare_with(
        &ch,
        "sac",
        QueueDeclareOptions::default(),
        table(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
    )
    .await
    .unwrap();
    let ch1 = b.connect().await.create_channel().await.unwrap();
    let ch2 = b.connect().await.create_channel().await.unwrap();
    let mut first = consumer(&ch1, "sac", "first").await;
    let mut second = consumer(&ch2, "sac", "second").await;
    for i in 0..4u8 {
        publish(&ch, "", "sac", &[i]).await;
    }
    for i in 0..4u8 {
        let d = next(&mut first)
            .await
            .expect("the active consumer gets everything");
        assert_eq!(d.data, [i]);
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    assert_no_delivery(&mut second).await;
    ch1.basic_cancel("first".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    publish(&ch, "", "sac", b"after").await;
    let d = next(&mut second)
        .await
        .expect("the next consumer takes over");
    assert_eq!(d.data, b"after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_limit_dead_letters_a_poison_message() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "poison").await;
    declare_with(
        &ch,
        "work",
        QueueDeclareOptions::default(),
        table(&[
            ("x-delivery-limit", AMQPValue::LongInt(2)),
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s("poison")),
        ]),
    )
    .await
    .unwrap();
    publish(&ch, "", "work", b"bad").await;
    let mut counts = Vec::new();
    for _ in 0..3 {
        let m = ch
            .basic_get("work".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("redelivered until the limit");
        let count = m
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delivery-count").cloned());
        counts.push(count);
        m.delivery
            .nack(BasicNackOptions {
                multiple: false,
                requeue: true,
            })
            .await
            .unwrap();
    }
    assert_eq!(
        counts,
        [
            None,
            Some(AMQPValue::LongLongInt(1)),
            Some(AMQPValue::LongLongInt(2))
        ]
    );
    assert_eq!(
        get_eventually(&ch, "poison").await.as_deref(),
        Some(&b"bad"[..])
    );
    assert_eq!(get_body(&ch, "work").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cc_and_bcc_add_routing_keys_and_bcc_is_hidden() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    for q in ["to", "cc", "bcc"] {
        declare(&ch, q).await;
        bind(&ch, q, "amq.direct", q, FieldTable::default()).await;
    }
    let mut cc = FieldArray::default();
    cc.push(s("cc"));
    let mut bcc = FieldArray::default();
    bcc.push(s("bcc"));
    let headers = table(&[
        ("CC", AMQPValue::FieldArray(cc)),
        ("BCC", AMQPValue::FieldArray(bcc)),
    ]);
    let props = BasicProperties::default().with_headers(headers);
    publish_with(
        &ch,
        "amq.direct",
        "to",
        BasicPublishOptions::default(),
        b"memo",
        props,
    )
    .await;
    for q in ["to", "cc", "bcc"] {
        let m = ch
            .basic_get(q.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{q} got the message"));
        let h = m.delivery.properties.headers().clone().unwrap_or_default();
        assert!(h.contains_key("CC"), "CC stays");
        assert!(!h.contains_key("BCC"), "BCC is stripped");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_active_consumer_takes_over_when_the_active_one_disconnects() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare_with(
        &ch,
        "sac",
        QueueDeclareOptions::default(),
        table(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
    )
    .await
    .unwrap();
    let c1 = b.connect().await;
    let ch1 = c1.create_channel().await.unwrap();
    let ch2 = b.connect().await.create_channel().await.unwrap();
    let mut first = consumer(&ch1, "sac", "first").await;
    let mut second = consumer(&ch2, "sac", "second").await;
    publish(&ch, "", "sac", b"one").await;
    let d = next(&mut first).await.expect("the active consumer");
    assert_eq!(d.data, b"one");
    assert_no_delivery(&mut second).await;
    // Gone without a cancel, its delivery unacked: the next one takes over
    // and gets the unacked message back first, then what follows.
    c1.close(200, "bye".into()).await.unwrap();
    publish(&ch, "", "sac", b"two").await;
    let d = next(&mut second)
        .await
        .expect("the next consumer takes over");
    assert_eq!(d.data, b"one");
    assert!(d.redelivered);
    let d = next(&mut second).await.expect("and gets what follows");
    assert_eq!(d.data, b"two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_active_consumer_take_over_redelivers_unacked_first_in_order() {
    // The active consumer holds message 0 unacked (prefetch 1) while 1..4
    // wait behind it. When its connection goes, the next consumer gets 0
    // (redelivered) first, then 1..4, as RabbitMQ gives it; Warren used
    // to hand over 1,2,3,4 and only then 0.
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare_with(
        &ch,
        "sac-order",
        QueueDeclareOptions::default(),
        table(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
    )
    .await
    .unwrap();
    let c1 = b.connect().await;
    let ch1 = c1.create_channel().await.unwrap();
    ch1.basic_qos(1, BasicQosOptions::default()).await.unwrap();
    let ch2 = b.connect().await.create_channel().await.unwrap();
    let mut first = consumer(&ch1, "sac-order", "first").await;
    let mut second = consumer(&ch2, "sac-order", "second").await;
    for i in 0..5u8 {
        publish(&ch, "", "sac-order", &[i]).await;
    }
    let d = next(&mut first).await.expect("the active consumer");
    assert_eq!(d.data, [0]);
    assert_eq!(message_count(&ch, "sac-order").await, 4);
    c1.close(200, "bye".into()).await.unwrap();
    let got: Vec<(u8, bool)> = take(&mut second, 5)
        .await
        .iter()
        .map(|d| (d.data[0], d.redelivered))
        .collect();
    assert_eq!(
        got,
        vec![(0, true), (1, false), (2, false), (3, false), (4, false)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_publish_refuses_for_the_full_queue_only() {
    // The publisher is nacked; the other queue the message routes to
    // still gets it.
    let b = start().await;
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let full = table(&[
        ("x-max-length", AMQPValue::LongInt(0)),
        ("x-overflow", s("reject-publish")),
    ]);
    declare_with(&ch, "full", QueueDeclareOptions::default(), full)
        .await
        .unwrap();
    declare(&ch, "open").await;
    bind(&ch, "full", "amq.fanout", "", FieldTable::default()).await;
    bind(&ch, "open", "amq.fanout", "", FieldTable::default()).await;
    let confirm = publish_with(
        &ch,
        "amq.fanout",
        "",
        BasicPublishOptions::default(),
        b"m",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    assert!(confirm.is_nack());
    assert_eq!(drain(&ch, "open").await, ["m"]);
    assert!(drain(&ch, "full").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_x_args_are_406_with_rabbitmqs_wording() {
    let b = start().await;
    let c = b.connect().await;
    let cases = [
        (
            "x-max-length",
            AMQPValue::LongInt(-1),
            "{value_negative,-1}",
        ),
        (
            "x-message-ttl",
            s("soon"),
            "\"expected integer, got longstr\"",
        ),
        (
            "x-queue-mode",
            s("eager"),
            "\"unsupported queue mode 'eager'\"",
        ),
        ("x-expires", AMQPValue::LongInt(0), "{value_zero,0}"),
        (
            "x-max-priority",
            AMQPValue::LongInt(300),
            "{max_value_exceeded,300}",
        ),
        ("x-overflow", s("drop-tail"), "invalid_overflow"),
        (
            "x-dead-letter-routing-key",
            s("k"),
            "routing_key_but_no_dlx_defined",
        ),
    ];
    for (arg, value, why) in cases {
        let ch = c.create_channel().await.unwrap();
        let r = declare_with(
            &ch,
            "q",
            QueueDeclareOptions::default(),
            table(&[(arg, value)]),
        )
        .await;
        let text = expect_code(r, 406);
        assert_eq!(
            text,
            format!("PRECONDITION_FAILED - invalid arg '{arg}' for queue 'q' in vhost '/': {why}")
        );
    }
}
