//! A leader paused (SIGSTOP) long enough for the others to elect a new
//! one, then resumed, must deliver nothing: the new leader has handed
//! its messages out again (as redelivered). The resumed leader reads its
//! consumer's acks (buffered by the kernel while it was stopped), which
//! frees prefetch credit. It used to deliver the next messages at once,
//! unflagged, before Raft told it it no longer led: the same messages
//! went out from two nodes, the later delivery without the redelivered
//! flag (found by tests/cluster_nemesis.rs). Two faults: delivery was not
//! checked against the leadership lease, and a watchdog whose first tick
//! came only after the pause took that tick for the term's first
//! confirmation. Now a queue hands out nothing replicated unless the
//! lease (renewed from confirmations, dated when they began) holds, and
//! the term's first confirmation is dated when the node became leader.
//!
//! And a leader paused with deliveries in a connection's outbox (made
//! before the pause, under a valid lease, not yet written) must not write
//! them once resumed: the hour-long nemesis found such a delivery reaching
//! a consumer a second after the new leader had handed the same message to
//! another one. The outbox now writes deliveries only while the lease
//! holds (the second test; it needs the `failpoints` feature, whose
//! `outbox-before-write` holds the writes as the pause caught them).

use crate::cluster_support;

use std::collections::BTreeSet;
use std::time::Duration;

use cluster_support::total::{durable, queue_args};
use cluster_support::Cluster;
use futures::StreamExt;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, Consumer};

const QUEUE: &str = "paused";
const PREFETCH: u16 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_leader_delivers_nothing_the_new_one_serves() {
    let c = Cluster::start(3);
    let (leader, term) = c.wait_leader(0, Duration::from_secs(30)).await;
    let (_conn, ch) = filled(&c, leader).await;

    // A consumer of the leader takes its prefetch and holds it.
    let mut a = consume(&ch, "a", PREFETCH).await;
    let mut held = Vec::new();
    while held.len() < PREFETCH as usize {
        let d = tokio::time::timeout(Duration::from_secs(10), a.next())
            .await
            .expect("a delivery")
            .unwrap()
            .unwrap();
        held.push(d);
    }

    c.signal(leader, libc::SIGSTOP);
    let (_conn_b, taken) = taken_over(&c, term).await;

    // The paused leader's consumer acks what it held (the kernel keeps
    // the bytes), and the leader resumes.
    for d in held {
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    c.signal(leader, libc::SIGCONT);
    let after = drain(&mut a, Duration::from_secs(5)).await;
    assert!(
        after.is_empty(),
        "the resumed leader delivered {} messages (the new leader had: {}), first {:?}\n{}",
        after.len(),
        after.iter().filter(|(id, _)| taken.contains(id)).count(),
        &after[..after.len().min(5)],
        c.logs_tail()
    );
    c.assert_no_panics();
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_leader_writes_none_of_the_deliveries_it_had_buffered() {
    // Node 1 forms the cluster and leads first; its first write of
    // deliveries waits 3 s before it looks at the lease and writes.
    let hold = vec![(
        "FAILPOINTS".to_string(),
        "outbox-before-write=1*return(3000)".to_string(),
    )];
    let c = Cluster::start_with_env(3, &[hold]);
    let (leader, term) = c.wait_leader(0, Duration::from_secs(30)).await;
    assert_eq!(leader, 0, "node 1 forms the cluster and leads first");
    let (_conn, ch) = filled(&c, leader).await;

    // A consumer of the leader: its first deliveries sit in the outbox
    // (consume-ok may sit with them: the consumer is awaited on a task).
    let a = tokio::spawn(async move {
        let mut a = consume(&ch, "a", PREFETCH).await;
        drain(&mut a, Duration::from_secs(60)).await
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Paused with them buffered; the others elect a leader, whose
    // consumer takes the head.
    c.signal(leader, libc::SIGSTOP);
    let (_conn_b, taken) = taken_over(&c, term).await;
    c.signal(leader, libc::SIGCONT);
    // The resumed leader closes the consumer's connection unwritten.
    let got = tokio::time::timeout(Duration::from_secs(30), a)
        .await
        .expect("the resumed leader's consumer ends")
        .unwrap_or_default();
    assert!(
        got.is_empty(),
        "the resumed leader wrote {} deliveries it had buffered before the pause (the new \
         leader had delivered {} of them), first {:?}\n{}",
        got.len(),
        got.iter().filter(|(id, _)| taken.contains(id)).count(),
        &got[..got.len().min(5)],
        c.logs_tail()
    );
    assert!(
        c.log_has(leader, "closing the connection without sending them"),
        "the resumed leader held its buffered deliveries back\n{}",
        c.logs_tail()
    );
    c.assert_no_panics();
}

/// A connection to node `at` and a channel in confirm mode, after 2000
/// persistent messages were published to the queue and confirmed.
async fn filled(c: &Cluster, at: usize) -> (Connection, Channel) {
    let conn = c
        .connect(at, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(QUEUE.into(), durable(), queue_args())
        .await
        .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirms = Vec::new();
    for id in 0..2000u32 {
        let confirm = ch
            .basic_publish(
                "".into(),
                QUEUE.into(),
                BasicPublishOptions::default(),
                id.to_string().as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap();
        confirms.push(confirm);
    }
    for confirm in confirms {
        assert!(confirm.await.unwrap().is_ack());
    }
    (conn, ch)
}

/// A consumer of the queue on `ch` with this prefetch.
async fn consume(ch: &Channel, tag: &str, prefetch: u16) -> Consumer {
    ch.basic_qos(prefetch, BasicQosOptions::default())
        .await
        .unwrap();
    ch.basic_consume(
        QUEUE.into(),
        tag.into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap()
}

/// With the leader of `term` paused: the others elect a leader, whose
/// consumer takes 200 messages from the head (all redelivered). Returns
/// its connection (open) and what it took.
async fn taken_over(c: &Cluster, term: u64) -> (Connection, BTreeSet<String>) {
    let (next, _) = c.wait_leader(term, Duration::from_secs(30)).await;
    let conn = c
        .connect(next, Duration::from_secs(30))
        .await
        .expect("connect to the new leader");
    let ch = conn.create_channel().await.unwrap();
    let mut b = consume(&ch, "b", 500).await;
    let mut taken = BTreeSet::new();
    while taken.len() < 200 {
        let d = tokio::time::timeout(Duration::from_secs(10), b.next())
            .await
            .expect("a delivery from the new leader")
            .unwrap()
            .unwrap();
        assert!(d.redelivered, "a recovered message comes redelivered");
        taken.insert(String::from_utf8(d.data.clone()).unwrap());
    }
    (conn, taken)
}

/// What the consumer receives (body, redelivered) until it ends or
/// nothing comes for `quiet`.
async fn drain(consumer: &mut Consumer, quiet: Duration) -> Vec<(String, bool)> {
    let mut got = Vec::new();
    while let Ok(Some(Ok(d))) = tokio::time::timeout(quiet, consumer.next()).await {
        got.push((String::from_utf8(d.data.clone()).unwrap(), d.redelivered));
    }
    got
}
