//! A message that arrived in a large read buffer does not pin that buffer.
//! A message cut from the read buffer keeps a slice of it; where a large
//! message shared the buffer, each small queued message used to keep a
//! buffer the size of the large one alive. Here 100,000 small messages are
//! queued while a 20 KiB message (routed nowhere) arrives next to each:
//! the broker's memory grows about as much as for the small ones alone.

use crate::common;
use crate::helpers;

use common::child::ChildBroker;
use common::raw::{self, Raw};
use common::*;

const N: usize = 100_000;

/// Sends N small publishes to "small", each followed by `large` bytes to
/// a queue that does not exist (dropped); returns the broker's RSS growth
/// in MiB once all small ones are queued.
async fn queued_growth(large: usize) -> u64 {
    let tmp = tempfile::tempdir().unwrap();
    let broker = ChildBroker::spawn(&tmp.path().join("data"), &tmp.path().join("log"), &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    declare(&ch, "small").await;
    let before = broker.rss_kib().unwrap();
    let mut r = Raw::open(broker.addr()).await;
    r.open_channel(1).await;
    let big = vec![0u8; large];
    let mut batch = Vec::new();
    for i in 0..N {
        batch.extend(raw::publish_message(
            1,
            "",
            "small",
            &(i as u64).to_be_bytes(),
        ));
        if large > 0 {
            batch.extend(raw::publish_message(1, "", "nowhere", &big));
        }
        if batch.len() > 1 << 20 {
            r.send(&batch).await;
            batch.clear();
        }
    }
    r.send(&batch).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let n = helpers::message_count(&ch, "small").await;
        if n as usize == N {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "only {n} queued");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    broker.rss_kib().unwrap().saturating_sub(before) / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_messages_next_to_large_ones_cost_what_they_cost_alone() {
    let alone = queued_growth(0).await;
    let mixed = queued_growth(20 << 10).await;
    eprintln!("{N} small messages queued: RSS +{alone} MiB alone, +{mixed} MiB with a 20 KiB message next to each");
    assert!(
        mixed <= alone * 2 + 16,
        "small messages pinned large buffers: +{mixed} MiB vs +{alone} MiB alone"
    );
}
