//! A leader's queue past its memory bound keeps only a count of the
//! messages it paged out, and reads them back from the store as the head
//! drains. On a cluster's leader the store shows what is applied, and a
//! message is applied only once its log entry commits: a persistent
//! message paged out was shipped but not staged, so a consumer that caught
//! up with the publishers read a batch without it, the queue took it for
//! gone ("fewer than we counted"), and it stayed invisible until a
//! restart, then came out of order. The same held for the copies a queue
//! writes at once (dead-lettering, delayed releases). No fault is needed:
//! a consumer that keeps up with a publisher past the bound is enough.
//! Under this load no leader steps down (one did, for a backlog of
//! commits, before the watchdog watched the sync's progress instead).

mod cluster_support;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use cluster_support::total::durable;
use cluster_support::Cluster;
use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Bodies of 4 KiB: 6,000 of them are past a queue's 16 MiB in memory.
const BODY: usize = 4096;
const BEFORE: u64 = 6000;
const DURING: u64 = 6000;

fn body(id: u64) -> Vec<u8> {
    let mut b = vec![b'x'; BODY];
    b[..8].copy_from_slice(&id.to_be_bytes());
    b
}

/// Publishes ids `from..to` to `exchange`/`key` with pipelined confirms;
/// every one must be confirmed.
async fn publish(ch: &Channel, exchange: &str, key: &str, from: u64, to: u64) {
    let mut window = VecDeque::new();
    for id in from..to {
        let confirm = ch
            .basic_publish(
                exchange.into(),
                key.into(),
                BasicPublishOptions::default(),
                &body(id),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish");
        window.push_back(confirm);
        while window.len() >= 1000 || (id + 1 == to && !window.is_empty()) {
            let c = window.pop_front().unwrap();
            let c = tokio::time::timeout(Duration::from_secs(30), c)
                .await
                .expect("a confirm in time")
                .expect("confirm");
            assert!(c.is_ack(), "nacked");
        }
    }
}

/// Consumes `queue` until `n` messages came (or none for 15 s): their ids
/// in delivery order.
async fn consume(ch: &Channel, queue: &str, n: u64) -> Vec<u64> {
    ch.basic_qos(1000, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    while (got.len() as u64) < n {
        let next = tokio::time::timeout(Duration::from_secs(15), consumer.next()).await;
        let Ok(Some(Ok(d))) = next else { break };
        let id = u64::from_be_bytes(d.data[..8].try_into().unwrap());
        got.push(id);
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    got
}

/// Publishes `BEFORE` messages with no consumer, then consumes `queue`
/// while `DURING` more are published: every one must come once, and in
/// order if `ordered`.
async fn past_the_bound(
    exchange: &str,
    key: &str,
    queue: &str,
    ordered: bool,
    declare: impl AsyncFnOnce(&Channel),
) {
    let cluster = Arc::new(Cluster::start(3));
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let conn = cluster
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    declare(&ch).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    publish(&ch, exchange, key, 0, BEFORE).await;
    let consumer_conn = cluster
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect");
    let cch = consumer_conn.create_channel().await.unwrap();
    let total = BEFORE + DURING;
    let consuming = tokio::spawn({
        let queue = queue.to_string();
        async move { consume(&cch, &queue, total).await }
    });
    publish(&ch, exchange, key, BEFORE, total).await;
    let mut got = consuming.await.unwrap();
    if !ordered {
        got.sort_unstable();
    }
    let seen: std::collections::HashSet<u64> = got.iter().copied().collect();
    let missing = (0..total).filter(|id| !seen.contains(id)).count();
    let first_out_of_order = got.windows(2).position(|w| w[1] != w[0] + 1);
    assert!(
        missing == 0 && first_out_of_order.is_none() && got.len() as u64 == total,
        "{} of {total} confirmed messages delivered ({missing} missing), out of order at {:?}",
        got.len(),
        first_out_of_order.map(|i| &got[i..(i + 2).min(got.len())])
    );
    // A busy leader is not a failed one: nobody stepped down.
    for i in 0..3 {
        assert!(
            !cluster.log_has(i, "stepping down"),
            "node {} stepped down under load: {}",
            i + 1,
            cluster.logs_tail()
        );
    }
    cluster.assert_no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_out_messages_are_delivered_in_order_without_a_restart() {
    let _one = ONE_AT_A_TIME.lock().await;
    past_the_bound("", "paged", "paged", true, async |ch: &Channel| {
        ch.queue_declare("paged".into(), durable(), FieldTable::default())
            .await
            .unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettered_copies_past_the_bound_are_all_delivered() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Not in order: the expiry timer and a publish may each dead-letter a
    // batch at once (RabbitMQ does not promise dead-lettered order either).
    past_the_bound("", "expiring", "dead", false, async |ch: &Channel| {
        ch.queue_declare("dead".into(), durable(), FieldTable::default())
            .await
            .unwrap();
        // Every message expires at once and is dead-lettered to "dead":
        // each copy there is written at once (push_written).
        let mut args = FieldTable::default();
        args.insert("x-message-ttl".into(), AMQPValue::LongUInt(0));
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString("dead".into()),
        );
        ch.queue_declare("expiring".into(), durable(), args)
            .await
            .unwrap();
    })
    .await;
}
