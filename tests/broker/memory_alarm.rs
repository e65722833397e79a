//! The memory alarm (RabbitMQ's vm_memory_high_watermark): over the limit,
//! connections that publish are blocked (connection.blocked, and the
//! broker stops reading from them) while consumers go on; below it, they
//! are unblocked and their publishes flow again.

use crate::common;
use crate::helpers;

use common::*;
use helpers::*;
use lapin::options::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_are_blocked_over_the_limit_and_consumers_go_on() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.memory_limit_mb = 1; // always over: the alarm is up from the start
    let b = start_with(cfg).await;
    let broker = std::sync::Arc::clone(&b.server.as_ref().unwrap().broker);
    assert!(eventually(|| broker.memory.is_raised()).await);

    let publisher = b.connect().await;
    let ch = publisher.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    ch.queue_declare(
        "q".into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        Default::default(),
    )
    .await
    .unwrap();
    assert!(
        !publisher.status().blocked(),
        "not blocked before publishing"
    );
    // Persistent to a durable queue: its confirm waits for a flush.
    let first = ch
        .basic_publish(
            "".into(),
            "q".into(),
            BasicPublishOptions::default(),
            b"first",
            lapin::BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap();
    assert!(
        eventually(|| publisher.status().blocked()).await,
        "the publisher is told it is blocked"
    );
    assert!(
        first.await.unwrap().is_ack(),
        "confirms still flow while blocked"
    );
    assert!(publisher.status().blocked());

    // A connection that only consumes is not blocked.
    let consumer = b.connect().await;
    let cch = consumer.create_channel().await.unwrap();
    assert_eq!(
        get_eventually(&cch, "q").await.as_deref(),
        Some(&b"first"[..])
    );

    // While blocked, nothing more it publishes gets in (lapin holds its
    // frames back once told; Warren would not read them anyway).
    let pch = ch.clone();
    let pending = tokio::spawn(async move {
        pch.basic_publish(
            "".into(),
            "q".into(),
            BasicPublishOptions::default(),
            b"second",
            Default::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap()
    });
    assert_eq!(get_body(&cch, "q").await, None);

    broker.memory.set_limit(u64::MAX);
    assert!(
        eventually(|| !publisher.status().blocked()).await,
        "unblocked when the alarm clears"
    );
    assert!(pending.await.unwrap().is_ack());
    assert_eq!(
        get_eventually(&cch, "q").await.as_deref(),
        Some(&b"second"[..])
    );
    assert!(!consumer.status().blocked());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_connection_is_not_read_until_the_alarm_clears() {
    // What lapin hides (it stops writing once told): the broker itself
    // stops reading a publishing connection, and says so on the wire.
    use amq_protocol::protocol::{connection, AMQPClass};
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.memory_limit_mb = 1;
    let b = start_with(cfg).await;
    let broker = std::sync::Arc::clone(&b.server.as_ref().unwrap().broker);
    assert!(eventually(|| broker.memory.is_raised()).await);

    let mut r = raw::Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&raw::queue_declare(1, "q", false, false, false))
        .await;
    let (_, declare_ok) = r.expect_method().await;
    assert!(matches!(declare_ok, AMQPClass::Queue(_)), "{declare_ok:?}");
    r.send(&raw::publish_message(1, "", "q", b"first")).await;
    let (ch, m) = r.expect_method().await;
    assert_eq!(ch, 0);
    assert!(
        matches!(m, AMQPClass::Connection(connection::AMQPMethod::Blocked(_))),
        "expected connection.blocked, got {m:?}"
    );
    r.send(&raw::publish_message(1, "", "q", b"second")).await;

    let (_c, cch) = b.channel().await;
    assert_eq!(
        get_eventually(&cch, "q").await.as_deref(),
        Some(&b"first"[..])
    );
    assert_eq!(
        get_body(&cch, "q").await,
        None,
        "the second publish is not read"
    );

    broker.memory.set_limit(u64::MAX);
    let (ch, m) = r.expect_method().await;
    assert_eq!(ch, 0);
    assert!(
        matches!(
            m,
            AMQPClass::Connection(connection::AMQPMethod::Unblocked(_))
        ),
        "expected connection.unblocked, got {m:?}"
    );
    assert_eq!(
        get_eventually(&cch, "q").await.as_deref(),
        Some(&b"second"[..])
    );
}
