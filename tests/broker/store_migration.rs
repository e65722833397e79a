//! A data dir written by an older build (WARREN_OLD_BIN, as for the
//! rolling-upgrade test: its messages in sled's messages tree) opens in
//! this one with every message it held, once: they move into the message
//! log at the first start (src/store/migrate.rs), acked ones stay gone, a
//! fan-out reaches every queue, and a crash after the move doubles nothing.
//!
//! .ci/run builds the old binary and sets WARREN_REQUIRE_OLD_BIN; without
//! WARREN_OLD_BIN elsewhere the test says it is skipped and passes.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::child::ChildBroker;
use futures::StreamExt;
use lapin::{options::*, types::FieldTable, BasicProperties, Channel, ExchangeKind};

async fn declare(ch: &Channel, name: &str, passive: bool) -> u32 {
    let opts = QueueDeclareOptions {
        durable: true,
        passive,
        ..QueueDeclareOptions::default()
    };
    ch.queue_declare(name.into(), opts, FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("queue {name}: {e}"))
        .message_count()
}

async fn publish(ch: &Channel, exchange: &str, key: &str, body: String) {
    let props = BasicProperties::default().with_delivery_mode(2);
    let confirm = ch
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            props,
        )
        .await
        .expect("publish");
    assert!(confirm.await.expect("confirm").is_ack());
}

/// Every message of `queue`, consumed without acks.
async fn drain(ch: &Channel, queue: &str, n: usize) -> Vec<String> {
    let mut c = ch
        .basic_consume(
            queue.into(),
            format!("drain-{queue}").as_str().into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut out = Vec::new();
    while out.len() < n {
        let d = tokio::time::timeout(Duration::from_secs(10), c.next())
            .await
            .unwrap_or_else(|_| panic!("{queue}: {} of {n}", out.len()))
            .expect("stream")
            .expect("delivery");
        out.push(String::from_utf8(d.data).unwrap());
    }
    out
}

fn stop(b: &ChildBroker) {
    b.signal(libc::SIGTERM);
    for _ in 0..300 {
        if b.exited().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the broker did not stop: {}", b.log_tail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_data_dir_with_a_backlog_opens_whole_and_once() {
    let Some(old) = std::env::var_os("WARREN_OLD_BIN").map(PathBuf::from) else {
        assert!(
            std::env::var_os("WARREN_REQUIRE_OLD_BIN").is_none(),
            "WARREN_OLD_BIN is not set"
        );
        eprintln!("skipped: set WARREN_OLD_BIN to the build to migrate from");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("warren.log");

    // The old build: a backlog, a fan-out, and acked messages.
    let b = ChildBroker::spawn_bin(&old, &data, &log, &[]);
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare(&ch, "backlog", false).await;
    let fan_opts = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    ch.exchange_declare(
        "fan".into(),
        ExchangeKind::Fanout,
        fan_opts,
        FieldTable::default(),
    )
    .await
    .unwrap();
    for q in ["fan-a", "fan-b"] {
        declare(&ch, q, false).await;
        ch.queue_bind(
            q.into(),
            "fan".into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    for i in 0..3000 {
        publish(&ch, "", "backlog", format!("backlog-{i}")).await;
    }
    for i in 0..200 {
        publish(&ch, "fan", "", format!("fan-{i}")).await;
    }
    // The first 1000 acked.
    let mut c = ch
        .basic_consume(
            "backlog".into(),
            "acker".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    ch.basic_qos(1000, BasicQosOptions::default())
        .await
        .unwrap();
    for i in 0..1000 {
        let d = c.next().await.expect("stream").expect("delivery");
        assert_eq!(d.data, format!("backlog-{i}").as_bytes());
        if i == 999 {
            d.ack(BasicAckOptions { multiple: true }).await.unwrap();
        }
    }
    ch.close(200, "bye".into()).await.unwrap();
    conn.close(200, "bye".into()).await.unwrap();
    stop(&b);

    // This build: every message there once, in order.
    let b = ChildBroker::spawn(&data, &log, &[]);
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    assert_eq!(
        declare(&ch, "backlog", true).await,
        2000,
        "{}",
        b.log_tail()
    );
    assert_eq!(declare(&ch, "fan-a", true).await, 200);
    assert_eq!(declare(&ch, "fan-b", true).await, 200);
    let segments = std::fs::read_dir(data.join("messages"))
        .expect("the message log's directory")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "seg"))
        })
        .count();
    assert!(segments > 0, "the messages are in the log");
    drop(conn);
    // A crash after the move: nothing doubled, nothing lost.
    b.kill();
    let b = ChildBroker::spawn(&data, &log, &[]);
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    assert_eq!(declare(&ch, "backlog", true).await, 2000);
    let backlog = drain(&ch, "backlog", 2000).await;
    let want: Vec<String> = (1000..3000).map(|i| format!("backlog-{i}")).collect();
    assert_eq!(backlog, want);
    for q in ["fan-a", "fan-b"] {
        let got = drain(&ch, q, 200).await;
        let want: Vec<String> = (0..200).map(|i| format!("fan-{i}")).collect();
        assert_eq!(got, want, "{q}");
    }
    drop(conn);
    b.kill();
}
