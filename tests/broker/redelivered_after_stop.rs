//! `redelivered` across a stop, with the real binary.
//!
//! A message that was delivered (basic.deliver or basic.get-ok sent) and
//! not acked when the broker is SIGKILLed comes back redelivered=true, even
//! when the kill follows the delivery at once. Warren used to raise the
//! delivered mark in memory and write it every 100 ms, so 100 of 100 such
//! messages came back redelivered=false after a kill right after a burst
//! of basic.get. Now a reservation is written before the first delivery
//! past it (store/delivered.rs). After a clean stop exactly the delivered
//! messages are flagged. Also: tx.commit that only acks makes those acks
//! durable before commit-ok (it used to answer at once, and the acked
//! message could come back after a kill).

use crate::common;

use std::time::Duration;

use common::child::ChildBroker;
use common::*;
use futures::StreamExt;
use lapin::{options::*, types::FieldTable, BasicProperties, Channel};

async fn durable_queue(ch: &Channel, name: &str) -> u32 {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("queue.declare")
    .message_count()
}

/// Publishes `n` persistent messages (bodies 0..n) and waits for confirms.
async fn publish_confirmed(ch: &Channel, queue: &str, n: u32) {
    publish_padded(ch, queue, n, 4).await
}

/// `publish_confirmed` with bodies padded to `size` bytes.
async fn publish_padded(ch: &Channel, queue: &str, n: u32, size: usize) {
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut pending = Vec::new();
    for i in 0..n {
        pending.push(
            ch.basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &padded(i, size),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap(),
        );
    }
    for p in pending {
        assert!(p.await.unwrap().is_ack());
    }
}

fn padded(i: u32, size: usize) -> Vec<u8> {
    let mut b = i.to_be_bytes().to_vec();
    b.resize(size.max(4), 0);
    b
}

/// Gets every message of `queue` (no-ack): (body, redelivered) in order.
async fn get_all(ch: &Channel, queue: &str) -> Vec<(u32, bool)> {
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let body = u32::from_be_bytes(m.delivery.data[..4].try_into().unwrap());
        out.push((body, m.delivery.redelivered));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_right_before_a_kill_come_back_redelivered() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("warren.log");
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    durable_queue(&ch, "got").await;
    durable_queue(&ch, "consumed").await;
    publish_confirmed(&ch, "got", 100).await;
    publish_confirmed(&ch, "consumed", 100).await;
    // 100 basic.get-ok, unacked.
    let gch = conn.create_channel().await.unwrap();
    for _ in 0..100 {
        gch.basic_get("got".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("a message");
    }
    // 50 basic.deliver, unacked (prefetch 50).
    let cch = conn.create_channel().await.unwrap();
    cch.basic_qos(50, BasicQosOptions::default()).await.unwrap();
    let mut consumer = cch
        .basic_consume(
            "consumed".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for _ in 0..50 {
        next(&mut consumer).await.expect("a delivery");
    }
    // At once: no time for any periodic write.
    broker.kill();
    drop((consumer, cch, gch, ch, conn));
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let got = get_all(&ch, "got").await;
    assert_eq!(got.len(), 100);
    let not = got.iter().filter(|(_, r)| !r).count();
    assert_eq!(
        not, 0,
        "delivered before the kill but not flagged: {not} of 100"
    );
    let consumed = get_all(&ch, "consumed").await;
    assert_eq!(consumed.len(), 100);
    let wrong: Vec<u32> = consumed
        .iter()
        .filter(|(body, r)| *body < 50 && !r)
        .map(|(b, _)| *b)
        .collect();
    assert!(wrong.is_empty(), "delivered, not flagged: {wrong:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_clean_stop_exactly_the_delivered_are_redelivered() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("warren.log");
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    durable_queue(&ch, "q").await;
    publish_confirmed(&ch, "q", 10).await;
    let gch = conn.create_channel().await.unwrap();
    for _ in 0..3 {
        gch.basic_get("q".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("a message");
    }
    broker.signal(libc::SIGTERM);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while broker.exited().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no clean stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((gch, ch, conn));
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let got = get_all(&ch, "q").await;
    let expected: Vec<(u32, bool)> = (0..10).map(|i| (i, i < 3)).collect();
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tx_commit_of_acks_is_durable_before_commit_ok() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("warren.log");
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    durable_queue(&ch, "tx").await;
    publish_confirmed(&ch, "tx", 20).await;
    let tch = conn.create_channel().await.unwrap();
    tch.tx_select().await.unwrap();
    let mut last = 0;
    for _ in 0..20 {
        let m = tch
            .basic_get("tx".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("a message");
        last = m.delivery.delivery_tag;
    }
    tch.basic_ack(last, BasicAckOptions { multiple: true })
        .await
        .unwrap();
    tch.tx_commit().await.unwrap();
    broker.kill();
    drop((tch, ch, conn));
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    assert_eq!(
        durable_queue(&ch, "tx").await,
        0,
        "acks committed before the kill came undone"
    );
    let mut c = ch
        .basic_consume(
            "tx".into(),
            "x".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), c.next())
            .await
            .is_err(),
        "nothing left"
    );
}

/// A queue keeps a bounded part of its messages in memory (16 MiB) and
/// reads the rest back from the store as the head drains; messages read
/// back after a restart came without the redelivered flag, so those
/// delivered before a kill beyond the first 16 MiB came back unflagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_past_the_memory_bound_come_back_redelivered() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("warren.log");
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    durable_queue(&ch, "big").await;
    // 24 MiB of 4 KiB messages.
    publish_padded(&ch, "big", 6000, 4096).await;
    let gch = conn.create_channel().await.unwrap();
    for _ in 0..6000 {
        gch.basic_get("big".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("a message");
    }
    broker.kill();
    drop((gch, ch, conn));
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let got = get_all(&ch, "big").await;
    assert_eq!(got.len(), 6000);
    let not: Vec<u32> = got.iter().filter(|(_, r)| !r).map(|(b, _)| *b).collect();
    assert!(
        not.is_empty(),
        "delivered before the kill but not flagged: {} of 6000, first {:?}",
        not.len(),
        &not[..not.len().min(5)]
    );
}
