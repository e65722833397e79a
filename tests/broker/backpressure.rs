//! A peer that sends and never reads what it is sent. Warren used to read
//! and answer such a peer without bound: a client pipelining passive
//! queue.declare and never reading its socket grew the broker's RSS by
//! about 3 GiB in 15 s. Now a connection whose outbox is over its
//! high-water mark is not read until the writer drained it, whatever the
//! peer sends, and a peer that takes nothing for `send_timeout_ms` is
//! disconnected and its resources (here an exclusive queue) released.

use crate::common;
use crate::helpers;

use std::time::Duration;

use common::child::ChildBroker;
use common::raw::{self, Raw};
use common::*;
use tokio::io::AsyncWriteExt;

/// Passive declares of `queue`, `n` of them back to back.
fn passive_declares(queue: &str, n: usize) -> Vec<u8> {
    let one = raw::queue_declare(1, queue, true, false, false);
    one.repeat(n)
}

/// Writes `chunk` over and over on a socket nobody reads, until it fails
/// or `stop` says so.
fn flood(
    mut r: Raw,
    chunk: Vec<u8>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut sent = 0u64;
        while !*stop.borrow() {
            match tokio::time::timeout(Duration::from_millis(200), r.stream.write_all(&chunk)).await
            {
                Ok(Ok(())) => sent += chunk.len() as u64,
                Ok(Err(_)) => break,
                Err(_) => {}
            }
        }
        sent
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_cannot_grow_the_broker() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = ChildBroker::spawn(&tmp.path().join("data"), &tmp.path().join("log"), &[]);
    let conn = broker.connect().await;
    declare(&conn.create_channel().await.unwrap(), "p").await;
    let before = broker.rss_kib().unwrap();
    let mut r = Raw::open(broker.addr()).await;
    r.open_channel(1).await;
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let writer = flood(r, passive_declares("p", 10_000), stop_rx);
    let mut peak = before;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(broker.rss_kib().unwrap_or(0));
    }
    let _ = stop.send(true);
    let sent = writer.await.unwrap();
    let grown_mib = peak.saturating_sub(before) / 1024;
    eprintln!(
        "sent {} MiB of requests; RSS grew {grown_mib} MiB",
        sent >> 20
    );
    assert!(grown_mib < 64, "RSS grew {grown_mib} MiB");
    // Other connections are served meanwhile.
    assert_connection_works(&conn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_is_dropped_after_send_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    c.send_timeout_ms = 1000;
    c.outbox_high_water_bytes = 64 << 10;
    let b = start_with(c).await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&raw::queue_declare(1, "held", false, false, true))
        .await;
    r.expect_method().await;
    let observer = b.connect().await;
    assert!(exists_for_observer(&observer, "held").await);
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let writer = flood(r, passive_declares("held", 10_000), stop_rx);
    // The broker gives up on it: the writes fail and the queue goes.
    let sent = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("the broker disconnected the peer")
        .unwrap();
    eprintln!("sent {} KiB before being disconnected", sent >> 10);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while exists_for_observer(&observer, "held").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the exclusive queue outlived its connection"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `name` exists, seen from another connection (passive declare
/// on a fresh channel; 405 is another connection's exclusive queue).
async fn exists_for_observer(conn: &lapin::Connection, name: &str) -> bool {
    let ch = conn.create_channel().await.unwrap();
    let r = ch
        .queue_declare(
            name.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await;
    match r {
        Ok(_) => true,
        Err(e) => reply_code(&e) == Some(405),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_piling_up_do_not_stop_the_broker_reading_publishes() {
    // A client that consumes without a prefetch limit and publishes on the
    // same connection without reading (say, blocked in its callback on
    // the write): only replies to its own requests stop the reader, so its
    // publishes keep being taken while deliveries wait for it (a review
    // found the reader stopped on deliveries too: a deadlock that ended
    // with send_timeout).
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    c.outbox_high_water_bytes = 256 << 10;
    let b = start_with(c).await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "flood").await;
    declare(&ch, "sink").await;
    let big = vec![0u8; 8 << 10];
    for _ in 0..2000 {
        publish(&ch, "", "flood", &big).await;
    }
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&raw::method(
        1,
        amq_protocol::protocol::AMQPClass::Basic(
            amq_protocol::protocol::basic::AMQPMethod::Consume(
                amq_protocol::protocol::basic::Consume {
                    queue: "flood".into(),
                    consumer_tag: "c".into(),
                    no_local: false,
                    no_ack: true,
                    exclusive: false,
                    nowait: true,
                    arguments: Default::default(),
                },
            ),
        ),
    ))
    .await;
    // Never reading: 1000 publishes, each a few hundred bytes.
    let mut batch = Vec::new();
    for i in 0..1000u32 {
        batch.extend(raw::publish_message(1, "", "sink", &i.to_be_bytes()));
    }
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let _writer = flood(r, batch, stop_rx);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = helpers::message_count(&ch, "sink").await;
        if n >= 1000 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {n} publishes were read while deliveries waited"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
