//! Durability across a clean restart (`TestBroker::restart`, which must
//! reopen the data dir at once; the other tests use
//! `restart_when_unlocked` so they test what survives): durable
//! exchanges, queues (with their arguments) and bindings (queue and
//! exchange-to-exchange) come back and transient or exclusive ones do not;
//! deletions and unbinds stick; persistent messages in durable queues come
//! back in order with their properties, transient ones do not; messages
//! delivered but unacked before the restart come back redelivered=true in
//! order, undelivered ones redelivered=false (also across several restarts
//! and for messages published after one).

use crate::common;

use common::*;
use lapin::{
    options::*,
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, ExchangeKind,
};

async fn passive_queue(ch: &Channel, name: &str) -> Result<lapin::Queue, lapin::Error> {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
}

/// Whether a queue exists (passive declare on a channel of its own).
async fn queue_exists(conn: &lapin::Connection, name: &str) -> bool {
    let ch = conn.create_channel().await.unwrap();
    match passive_queue(&ch, name).await {
        Ok(_) => true,
        Err(e) => {
            assert_eq!(
                reply_code(&e),
                Some(404),
                "passive queue.declare {name}: {e:?}"
            );
            false
        }
    }
}

/// Whether an exchange exists (passive declare on a channel of its own).
async fn exchange_exists(conn: &lapin::Connection, name: &str) -> bool {
    let ch = conn.create_channel().await.unwrap();
    match ch
        .exchange_declare(
            name.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
    {
        Ok(()) => true,
        Err(e) => {
            assert_eq!(
                reply_code(&e),
                Some(404),
                "passive exchange.declare {name}: {e:?}"
            );
            false
        }
    }
}

async fn declare_exchange(ch: &Channel, name: &str, kind: ExchangeKind, durable: bool) {
    ch.exchange_declare(
        name.into(),
        kind,
        ExchangeDeclareOptions {
            durable,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("exchange.declare");
}

async fn declare_queue(ch: &Channel, name: &str, durable: bool, args: FieldTable) {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            durable,
            ..QueueDeclareOptions::default()
        },
        args,
    )
    .await
    .expect("queue.declare");
}

async fn bind(ch: &Channel, queue: &str, exchange: &str, key: &str) {
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        key.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("queue.bind");
}

fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

/// Publishes with confirms so the broker has the messages before we go on.
async fn confirmed_channel(conn: &lapin::Connection) -> Channel {
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    ch
}

async fn publish_confirmed(
    ch: &Channel,
    exchange: &str,
    key: &str,
    body: &[u8],
    props: BasicProperties,
) {
    let confirm = ch
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            props,
        )
        .await
        .expect("basic.publish");
    assert!(confirm.await.expect("confirm").is_ack());
}

/// basic.get without auto-ack.
async fn get_manual(ch: &Channel, queue: &str) -> Option<lapin::message::BasicGetMessage> {
    ch.basic_get(queue.into(), BasicGetOptions { no_ack: false })
        .await
        .expect("basic.get")
}

/// Drains a queue with no-ack gets: (body, redelivered) in order.
async fn drain(ch: &Channel, queue: &str) -> Vec<(Vec<u8>, bool)> {
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
    {
        out.push((m.delivery.data.clone(), m.delivery.redelivered));
    }
    out
}

fn owned(v: &[(&[u8], bool)]) -> Vec<(Vec<u8>, bool)> {
    v.iter().map(|(b, r)| (b.to_vec(), *r)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_topology_survives_restart_and_transient_does_not() {
    let mut b = start().await;
    {
        let (_c, ch) = b.channel().await;
        declare_exchange(&ch, "dx", ExchangeKind::Direct, true).await;
        declare_exchange(&ch, "dfan", ExchangeKind::Fanout, true).await;
        declare_exchange(&ch, "tx", ExchangeKind::Direct, false).await;
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongInt(5));
        declare_queue(&ch, "dq", true, args).await;
        declare_queue(&ch, "dq2", true, FieldTable::default()).await;
        declare_queue(&ch, "tq", false, FieldTable::default()).await;
        ch.queue_declare(
            "exq".into(),
            QueueDeclareOptions {
                durable: true,
                exclusive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        bind(&ch, "dq", "dx", "k").await; // durable
        bind(&ch, "dq2", "dfan", "").await; // durable
        ch.exchange_bind(
            "dfan".into(),
            "dx".into(),
            "e2e".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap(); // durable exchange-to-exchange
        bind(&ch, "tq", "dx", "k").await; // transient: tq is transient
        bind(&ch, "dq", "tx", "t").await; // transient: tx is transient
    }
    b.restart_when_unlocked().await;
    let c = b.connect().await;
    assert!(exchange_exists(&c, "dx").await);
    assert!(exchange_exists(&c, "dfan").await);
    assert!(
        !exchange_exists(&c, "tx").await,
        "transient exchange survived"
    );
    assert!(queue_exists(&c, "dq").await);
    assert!(queue_exists(&c, "dq2").await);
    assert!(!queue_exists(&c, "tq").await, "transient queue survived");
    assert!(!queue_exists(&c, "exq").await, "exclusive queue survived");

    let ch = c.create_channel().await.unwrap();
    // Queue binding.
    publish(&ch, "dx", "k", b"via-k").await;
    assert_eq!(
        get_eventually(&ch, "dq").await.as_deref(),
        Some(&b"via-k"[..])
    );
    // Exchange-to-exchange binding, then the fanout's queue binding.
    publish(&ch, "dx", "e2e", b"via-e2e").await;
    assert_eq!(
        get_eventually(&ch, "dq2").await.as_deref(),
        Some(&b"via-e2e"[..])
    );
    assert_eq!(get_body(&ch, "dq").await, None);

    // Types, flags and arguments came back: equivalent redeclares are fine,
    // inequivalent ones 406.
    declare_exchange(&ch, "dx", ExchangeKind::Direct, true).await;
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongInt(5));
    declare_queue(&ch, "dq", true, args).await;
    let e = ch
        .exchange_declare(
            "dx".into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect_err("dx is a direct exchange");
    assert_eq!(reply_code(&e), Some(406), "{e:?}");
    let ch = c.create_channel().await.unwrap();
    let e = ch
        .queue_declare(
            "dq".into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect_err("dq has x-max-length");
    assert_eq!(reply_code(&e), Some(406), "{e:?}");
    let ch = c.create_channel().await.unwrap();
    let e = ch
        .queue_declare(
            "dq2".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect_err("dq2 is durable");
    assert_eq!(reply_code(&e), Some(406), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_and_unbinds_stick_across_restart() {
    let mut b = start().await;
    {
        let (_c, ch) = b.channel().await;
        declare_exchange(&ch, "gone-x", ExchangeKind::Topic, true).await;
        declare_exchange(&ch, "kept-x", ExchangeKind::Topic, true).await;
        declare_queue(&ch, "gone-q", true, FieldTable::default()).await;
        declare_queue(&ch, "kept-q", true, FieldTable::default()).await;
        bind(&ch, "kept-q", "kept-x", "a.*").await;
        bind(&ch, "kept-q", "kept-x", "b.*").await;
        ch.queue_unbind(
            "kept-q".into(),
            "kept-x".into(),
            "a.*".into(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.exchange_delete("gone-x".into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
        ch.queue_delete("gone-q".into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    b.restart_when_unlocked().await;
    let c = b.connect().await;
    assert!(!exchange_exists(&c, "gone-x").await);
    assert!(!queue_exists(&c, "gone-q").await);
    assert!(exchange_exists(&c, "kept-x").await);
    let ch = c.create_channel().await.unwrap();
    publish(&ch, "kept-x", "a.1", b"unbound").await;
    publish(&ch, "kept-x", "b.1", b"bound").await;
    assert_eq!(
        get_eventually(&ch, "kept-q").await.as_deref(),
        Some(&b"bound"[..])
    );
    assert_eq!(get_body(&ch, "kept-q").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_messages_survive_restart_and_transient_ones_do_not() {
    let mut b = start().await;
    {
        let c = b.connect().await;
        let ch = confirmed_channel(&c).await;
        declare_queue(&ch, "dq", true, FieldTable::default()).await;
        declare_queue(&ch, "tq", false, FieldTable::default()).await;
        let mut headers = FieldTable::default();
        headers.insert("h".into(), AMQPValue::LongString("v".into()));
        let props = persistent()
            .with_content_type("text/plain".into())
            .with_message_id("m-1".into())
            .with_headers(headers)
            .with_priority(3)
            .with_correlation_id("corr".into());
        publish_confirmed(&ch, "", "dq", b"p1", props).await;
        publish_confirmed(&ch, "", "dq", b"t1", BasicProperties::default()).await;
        publish_confirmed(&ch, "", "dq", b"p2", persistent()).await;
        publish_confirmed(
            &ch,
            "",
            "dq",
            b"t2",
            BasicProperties::default().with_delivery_mode(1),
        )
        .await;
        publish_confirmed(&ch, "", "dq", b"p3", persistent()).await;
        publish_confirmed(&ch, "", "tq", b"in-transient-queue", persistent()).await;
    }
    b.restart_when_unlocked().await;
    let (c, ch) = b.channel().await;
    let q = passive_queue(&ch, "dq").await.unwrap();
    assert_eq!(q.message_count(), 3);
    let m = get_manual(&ch, "dq").await.expect("p1");
    assert_eq!(m.delivery.data, b"p1");
    assert!(!m.delivery.redelivered);
    assert_eq!(m.delivery.exchange.as_str(), "");
    assert_eq!(m.delivery.routing_key.as_str(), "dq");
    let p = &m.delivery.properties;
    assert_eq!(p.delivery_mode(), &Some(2));
    assert_eq!(
        p.content_type().as_ref().map(|s| s.as_str()),
        Some("text/plain")
    );
    assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("m-1"));
    assert_eq!(
        p.correlation_id().as_ref().map(|s| s.as_str()),
        Some("corr")
    );
    assert_eq!(p.priority(), &Some(3));
    let h = p.headers().as_ref().expect("headers");
    assert_eq!(h.inner().get("h"), Some(&AMQPValue::LongString("v".into())));
    assert_eq!(m.message_count, 2);
    m.delivery.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(
        drain(&ch, "dq").await,
        owned(&[(b"p2", false), (b"p3", false)])
    );
    assert!(!queue_exists(&c, "tq").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_messages_come_back_redelivered_in_order() {
    let mut b = start().await;
    let (c, ch) = b.channel().await;
    let pch = confirmed_channel(&c).await;
    declare_queue(&ch, "work", true, FieldTable::default()).await;
    for i in 0..6u8 {
        publish_confirmed(&pch, "", "work", &[b'm', b'0' + i], persistent()).await;
    }
    // m0, m1, m2 delivered; m1 acked; m0 and m2 left unacked.
    let m0 = get_manual(&ch, "work").await.expect("m0");
    let m1 = get_manual(&ch, "work").await.expect("m1");
    let m2 = get_manual(&ch, "work").await.expect("m2");
    assert_eq!(
        (
            &m0.delivery.data[..],
            &m1.delivery.data[..],
            &m2.delivery.data[..]
        ),
        (&b"m0"[..], &b"m1"[..], &b"m2"[..])
    );
    m1.delivery.ack(BasicAckOptions::default()).await.unwrap();
    // Let the ack land before stopping (a round trip on the same channel).
    passive_queue(&ch, "work").await.unwrap();
    b.restart_when_unlocked().await;
    drop((c, ch, pch, m0, m2));

    let (_c, ch) = b.channel().await;
    assert_eq!(
        drain(&ch, "work").await,
        owned(&[
            (b"m0", true),
            (b"m2", true),
            (b"m3", false),
            (b"m4", false),
            (b"m5", false),
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_deliveries_unacked_at_restart_come_back_redelivered() {
    let mut b = start().await;
    let (c, ch) = b.channel().await;
    let pch = confirmed_channel(&c).await;
    declare_queue(&ch, "cq", true, FieldTable::default()).await;
    for i in 0..5u8 {
        publish_confirmed(&pch, "", "cq", &[b'c', b'0' + i], persistent()).await;
    }
    ch.basic_qos(2, BasicQosOptions::default()).await.unwrap();
    let mut consumer = ch
        .basic_consume(
            "cq".into(),
            "ctag".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let d0 = next(&mut consumer).await.expect("c0");
    let d1 = next(&mut consumer).await.expect("c1");
    assert_eq!((&d0.data[..], &d1.data[..]), (&b"c0"[..], &b"c1"[..]));
    assert_no_delivery(&mut consumer).await; // prefetch 2
    b.restart_when_unlocked().await;
    drop((consumer, d0, d1, c, ch, pch));

    let (_c, ch) = b.channel().await;
    assert_eq!(
        drain(&ch, "cq").await,
        owned(&[
            (b"c0", true),
            (b"c1", true),
            (b"c2", false),
            (b"c3", false),
            (b"c4", false),
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undelivered_messages_stay_not_redelivered_across_restarts() {
    let mut b = start().await;
    {
        let c = b.connect().await;
        let ch = confirmed_channel(&c).await;
        declare_queue(&ch, "keep", true, FieldTable::default()).await;
        for body in [&b"a"[..], b"b", b"c"] {
            publish_confirmed(&ch, "", "keep", body, persistent()).await;
        }
    }
    b.restart_when_unlocked().await;
    b.restart_when_unlocked().await;
    let (_c, ch) = b.channel().await;
    assert_eq!(
        drain(&ch, "keep").await,
        owned(&[(b"a", false), (b"b", false), (b"c", false)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_published_after_a_restart_is_not_marked_redelivered_by_the_next() {
    // Messages delivered (and acked) before the first restart must not make
    // a message published after it look delivered at the second.
    let mut b = start().await;
    {
        let c = b.connect().await;
        let ch = confirmed_channel(&c).await;
        declare_queue(&ch, "seq", true, FieldTable::default()).await;
        for body in [&b"old-1"[..], b"old-2", b"old-3"] {
            publish_confirmed(&ch, "", "seq", body, persistent()).await;
        }
        assert_eq!(drain(&ch, "seq").await.len(), 3);
    }
    b.restart_when_unlocked().await;
    {
        let c = b.connect().await;
        let ch = confirmed_channel(&c).await;
        publish_confirmed(&ch, "", "seq", b"fresh-1", persistent()).await;
        publish_confirmed(&ch, "", "seq", b"fresh-2", persistent()).await;
    }
    b.restart_when_unlocked().await;
    let (_c, ch) = b.channel().await;
    assert_eq!(
        drain(&ch, "seq").await,
        owned(&[(b"fresh-1", false), (b"fresh-2", false)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_and_purged_messages_do_not_come_back() {
    let mut b = start().await;
    {
        let c = b.connect().await;
        let ch = confirmed_channel(&c).await;
        declare_queue(&ch, "acked", true, FieldTable::default()).await;
        declare_queue(&ch, "purged", true, FieldTable::default()).await;
        for i in 0..10u8 {
            publish_confirmed(&ch, "", "acked", &[i], persistent()).await;
            publish_confirmed(&ch, "", "purged", &[i], persistent()).await;
        }
        for _ in 0..4 {
            let m = get_manual(&ch, "acked").await.unwrap();
            m.delivery.ack(BasicAckOptions::default()).await.unwrap();
        }
        let n = ch
            .queue_purge("purged".into(), QueuePurgeOptions::default())
            .await
            .unwrap();
        assert_eq!(n, 10);
    }
    b.restart_when_unlocked().await;
    let (_c, ch) = b.channel().await;
    let bodies: Vec<Vec<u8>> = drain(&ch, "acked")
        .await
        .into_iter()
        .map(|(b, _)| b)
        .collect();
    assert_eq!(bodies, (4..10u8).map(|i| vec![i]).collect::<Vec<_>>());
    assert_eq!(drain(&ch, "purged").await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_restart_reopens_the_data_dir_at_once() {
    // After Server::shutdown returns, the store must be closed: a new
    // broker on the same data dir starts immediately.
    let mut b = start().await;
    {
        let (_c, ch) = b.channel().await;
        declare_queue(&ch, "q", true, FieldTable::default()).await;
    }
    b.restart().await;
    let c = b.connect().await;
    assert!(queue_exists(&c, "q").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_ttl_keeps_running_while_the_broker_is_down() {
    // The deadline is stored with the message (as RabbitMQ stores expiry):
    // a message whose TTL ran out during the downtime is dead-lettered at
    // recovery instead of getting a fresh TTL.
    let mut b = start().await;
    {
        let c = b.connect().await;
        let ch = confirmed_channel(&c).await;
        declare_queue(&ch, "expired-dl", true, FieldTable::default()).await;
        let mut args = FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString("expired-dl".into()),
        );
        declare_queue(&ch, "ttl", true, args).await;
        let short = persistent().with_expiration("2000".into());
        let long = persistent().with_expiration("3600000".into());
        publish_confirmed(&ch, "", "ttl", b"short", short).await;
        publish_confirmed(&ch, "", "ttl", b"long", long).await;
    }
    b.stop().await;
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    b.restart_when_unlocked().await;
    let (_c, ch) = b.channel().await;
    assert_eq!(
        drain(&ch, "ttl").await,
        owned(&[(b"long", false)]),
        "the short-lived message expired while the broker was down"
    );
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let dead = loop {
        let got = drain(&ch, "expired-dl").await;
        if !got.is_empty() || tokio::time::Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(dead, owned(&[(b"short", false)]));
}
