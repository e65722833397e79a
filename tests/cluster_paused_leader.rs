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

mod cluster_support;

use std::collections::BTreeSet;
use std::time::Duration;

use cluster_support::total::{durable, queue_args};
use cluster_support::Cluster;
use futures::StreamExt;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;

const QUEUE: &str = "paused";
const PREFETCH: u16 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_leader_delivers_nothing_the_new_one_serves() {
    let c = Cluster::start(3);
    let (leader, term) = c.wait_leader(0, Duration::from_secs(30)).await;
    let conn = c
        .connect(leader, Duration::from_secs(30))
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

    // A consumer of the leader takes its prefetch and holds it.
    ch.basic_qos(PREFETCH, BasicQosOptions::default())
        .await
        .unwrap();
    let mut a = ch
        .basic_consume(
            QUEUE.into(),
            "a".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut held = Vec::new();
    while held.len() < PREFETCH as usize {
        let d = tokio::time::timeout(Duration::from_secs(10), a.next())
            .await
            .expect("a delivery")
            .unwrap()
            .unwrap();
        held.push(d);
    }

    // Paused; the others elect a leader, whose consumer takes the head.
    c.signal(leader, libc::SIGSTOP);
    let (next, _) = c.wait_leader(term, Duration::from_secs(30)).await;
    let conn_b = c
        .connect(next, Duration::from_secs(30))
        .await
        .expect("connect to the new leader");
    let ch_b = conn_b.create_channel().await.unwrap();
    ch_b.basic_qos(500, BasicQosOptions::default())
        .await
        .unwrap();
    let mut b = ch_b
        .basic_consume(
            QUEUE.into(),
            "b".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
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

    // The paused leader's consumer acks what it held (the kernel keeps
    // the bytes), and the leader resumes.
    for d in held {
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    c.signal(leader, libc::SIGCONT);
    let mut after = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while let Ok(Some(Ok(d))) = tokio::time::timeout_at(deadline, a.next()).await {
        after.push((String::from_utf8(d.data.clone()).unwrap(), d.redelivered));
    }
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
