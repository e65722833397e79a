//! The x-delayed-message exchange (plugins/delayed-message): messages with
//! x-delay are held and routed by the inner type when due, with x-delay
//! turned negative; no delay routes at once; held persistent messages
//! survive a restart and kill -9; delays past 2^32 ms are kept; the
//! mandatory rule; the held count per exchange.

use crate::common;
use crate::helpers;

use std::time::{Duration, Instant};

use common::*;
use helpers::*;
use lapin::{
    options::*,
    types::{AMQPValue, FieldTable},
    BasicProperties, ExchangeKind,
};

async fn delayed_exchange(ch: &lapin::Channel, name: &str, inner: &str, durable: bool) {
    ch.exchange_declare(
        name.into(),
        ExchangeKind::Custom("x-delayed-message".into()),
        ExchangeDeclareOptions {
            durable,
            ..Default::default()
        },
        table(&[("x-delayed-type", s(inner))]),
    )
    .await
    .expect("x-delayed-message is a known exchange type");
}

fn delayed(ms: i64) -> BasicProperties {
    BasicProperties::default().with_headers(table(&[("x-delay", AMQPValue::LongLongInt(ms))]))
}

fn held(b: &TestBroker, exchange: &str) -> u64 {
    let server = b.server.as_ref().expect("running");
    server
        .broker
        .vhost("/")
        .and_then(|v| v.exchange(exchange))
        .map_or(0, |x| x.held_count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_is_routed_when_due_with_a_negative_x_delay() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    delayed_exchange(&ch, "later", "direct", false).await;
    declare(&ch, "q").await;
    bind(&ch, "q", "later", "k", FieldTable::default()).await;
    let sent = Instant::now();
    publish_with(
        &ch,
        "later",
        "k",
        BasicPublishOptions::default(),
        b"hello",
        delayed(300),
    )
    .await;
    assert_eq!(get_body(&ch, "q").await, None, "not before its time");
    assert_eq!(held(&b, "later"), 1);
    let mut consumer = consumer(&ch, "q", "c").await;
    let d = next(&mut consumer).await.expect("released");
    assert!(
        sent.elapsed() >= Duration::from_millis(290),
        "released after {:?}",
        sent.elapsed()
    );
    assert_eq!(d.data, b"hello");
    let h = d.properties.headers().clone().unwrap_or_default();
    assert_eq!(
        h.inner().get("x-delay"),
        Some(&AMQPValue::LongLongInt(-300))
    );
    assert_eq!(held(&b, "later"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_delay_or_a_negative_one_routes_at_once_by_the_inner_type() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    delayed_exchange(&ch, "now", "topic", false).await;
    declare(&ch, "q").await;
    bind(&ch, "q", "now", "a.*", FieldTable::default()).await;
    publish_with(
        &ch,
        "now",
        "a.b",
        BasicPublishOptions::default(),
        b"plain",
        BasicProperties::default(),
    )
    .await;
    publish_with(
        &ch,
        "now",
        "a.c",
        BasicPublishOptions::default(),
        b"negative",
        delayed(-5),
    )
    .await;
    publish_with(
        &ch,
        "now",
        "x.y",
        BasicPublishOptions::default(),
        b"unbound",
        BasicProperties::default(),
    )
    .await;
    assert_eq!(
        get_eventually(&ch, "q").await.as_deref(),
        Some(&b"plain"[..])
    );
    assert_eq!(
        get_eventually(&ch, "q").await.as_deref(),
        Some(&b"negative"[..])
    );
    assert_eq!(get_body(&ch, "q").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_come_out_in_due_order() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    delayed_exchange(&ch, "later", "fanout", false).await;
    declare(&ch, "q").await;
    bind(&ch, "q", "later", "", FieldTable::default()).await;
    publish_with(
        &ch,
        "later",
        "",
        BasicPublishOptions::default(),
        b"slow",
        delayed(400),
    )
    .await;
    publish_with(
        &ch,
        "later",
        "",
        BasicPublishOptions::default(),
        b"fast",
        delayed(100),
    )
    .await;
    let mut consumer = consumer(&ch, "q", "c").await;
    assert_eq!(
        next(&mut consumer).await.map(|d| d.data),
        Some(b"fast".to_vec())
    );
    assert_eq!(
        next(&mut consumer).await.map(|d| d.data),
        Some(b"slow".to_vec())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_past_49_7_days_are_kept() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    delayed_exchange(&ch, "far", "direct", false).await;
    declare(&ch, "q").await;
    bind(&ch, "q", "far", "k", FieldTable::default()).await;
    // 2^32 ms is 49.7 days; RabbitMQ's plugin caps there.
    publish_with(
        &ch,
        "far",
        "k",
        BasicPublishOptions::default(),
        b"x",
        delayed(1 << 33),
    )
    .await;
    assert!(eventually(|| held(&b, "far") == 1).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(get_body(&ch, "q").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_returns_when_nothing_would_route_at_publish_time() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    delayed_exchange(&ch, "later", "direct", false).await;
    let c = publish_with(
        &ch,
        "later",
        "nobody",
        BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        },
        b"x",
        delayed(100),
    )
    .await
    .await
    .unwrap();
    assert_eq!(c.take_message().expect("returned").reply_code, 312);
    assert_eq!(held(&b, "later"), 0, "a returned message is not held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_persistent_delayed_messages_survive_a_restart() {
    let mut b = start().await;
    {
        let (_c, ch) = b.channel().await;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        delayed_exchange(&ch, "later", "direct", true).await;
        ch.queue_declare(
            "q".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        bind(&ch, "q", "later", "k", FieldTable::default()).await;
        let props = delayed(1500).with_delivery_mode(2);
        let c = publish_with(
            &ch,
            "later",
            "k",
            BasicPublishOptions::default(),
            b"kept",
            props,
        )
        .await
        .await
        .unwrap();
        assert!(c.is_ack());
        let transient = delayed(1500);
        publish_with(
            &ch,
            "later",
            "k",
            BasicPublishOptions::default(),
            b"lost",
            transient,
        )
        .await
        .await
        .unwrap();
    }
    b.restart().await;
    assert_eq!(held(&b, "later"), 1, "the persistent one is still held");
    let (_c, ch) = b.channel().await;
    let mut consumer = consumer(&ch, "q", "c").await;
    let d = next(&mut consumer)
        .await
        .expect("released after the restart");
    assert_eq!(d.data, b"kept");
    assert_no_delivery(&mut consumer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_delayed_messages_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (data, log) = (dir.path().join("data"), dir.path().join("warren.log"));
    let broker = child::ChildBroker::spawn(&data, &log, &[]);
    {
        let conn = broker.connect().await;
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        delayed_exchange(&ch, "later", "direct", true).await;
        ch.queue_declare(
            "q".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        bind(&ch, "q", "later", "k", FieldTable::default()).await;
        for i in 0..50u8 {
            let props = delayed(1000).with_delivery_mode(2);
            let c = publish_with(
                &ch,
                "later",
                "k",
                BasicPublishOptions::default(),
                &[i],
                props,
            )
            .await
            .await
            .unwrap();
            assert!(c.is_ack());
        }
    }
    broker.kill();
    let broker = child::ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = consumer(&ch, "q", "c").await;
    let mut got = Vec::new();
    while got.len() < 50 {
        match next(&mut consumer).await {
            Some(d) => got.push(d.data[0]),
            None => break,
        }
    }
    got.sort_unstable();
    assert_eq!(
        got,
        (0..50u8).collect::<Vec<_>>(),
        "log:\n{}",
        broker.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_transaction_a_delayed_message_is_held_at_commit() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    delayed_exchange(&ch, "later", "direct", false).await;
    declare(&ch, "q").await;
    bind(&ch, "q", "later", "k", FieldTable::default()).await;
    ch.tx_select().await.unwrap();
    let publish = || {
        publish_with(
            &ch,
            "later",
            "k",
            BasicPublishOptions::default(),
            b"m",
            delayed(3_600_000),
        )
    };
    publish().await;
    ch.tx_rollback().await.unwrap();
    assert_eq!(held(&b, "later"), 0, "rolled back: never held");
    publish().await;
    // A synchronous method on the channel: the publish was handled.
    message_count(&ch, "q").await;
    assert_eq!(held(&b, "later"), 0, "not held before the commit");
    ch.tx_commit().await.unwrap();
    assert_eq!(held(&b, "later"), 1, "held once committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_dead_lettered_to_a_delayed_exchange_is_held() {
    // As with the plugin: the dead-letter exchange's type applies, so an
    // x-delay header the message carries delays it there.
    let b = start().await;
    let (_c, ch) = b.channel().await;
    delayed_exchange(&ch, "retry", "direct", false).await;
    declare(&ch, "again").await;
    bind(&ch, "again", "retry", "work", FieldTable::default()).await;
    let args = table(&[("x-dead-letter-exchange", s("retry"))]);
    declare_with(&ch, "work", QueueDeclareOptions::default(), args)
        .await
        .unwrap();
    publish_with(
        &ch,
        "",
        "work",
        BasicPublishOptions::default(),
        b"job",
        delayed(3_600_000),
    )
    .await;
    let m = ch
        .basic_get("work".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("the job");
    m.delivery
        .acker
        .nack(BasicNackOptions {
            requeue: false,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        message_count(&ch, "again").await,
        0,
        "held, not routed at once"
    );
    assert_eq!(held(&b, "retry"), 1);
}
