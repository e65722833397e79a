//! SIGTERM / SIGINT stop the `warren` binary cleanly: clients are told with
//! connection.close 320 CONNECTION_FORCED, the process exits 0, and what
//! was durable is there after a restart.

use crate::common;
use crate::helpers;

use std::time::Duration;

use common::child::ChildBroker;
use lapin::{options::*, types::FieldTable, BasicProperties};

async fn wait_exit(b: &ChildBroker) -> std::process::ExitStatus {
    for _ in 0..200 {
        if let Some(status) = b.exited() {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("warren did not exit; log:\n{}", b.log_tail());
}

async fn stops_cleanly_on(sig: i32) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("warren.log");
    let data = dir.path().join("data");
    let b = ChildBroker::spawn(&data, &log, &[]);
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        "kept".into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    ch.basic_publish(
        "".into(),
        "kept".into(),
        BasicPublishOptions::default(),
        b"persisted",
        BasicProperties::default().with_delivery_mode(2),
    )
    .await
    .unwrap()
    .await
    .unwrap();

    let mut errors = helpers::Errors::new(&conn);
    b.signal(sig);
    assert_eq!(
        errors.next_code().await,
        Some(320),
        "the client is told why"
    );
    let status = wait_exit(&b).await;
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        b.log_tail()
    );

    let b = ChildBroker::spawn(&data, &log, &[]);
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let got = ch
        .basic_get("kept".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the persistent message survived the stop");
    assert_eq!(got.delivery.data, b"persisted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_connections_with_320_and_exits_0() {
    stops_cleanly_on(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_closes_connections_with_320_and_exits_0() {
    stops_cleanly_on(libc::SIGINT).await;
}
