//! A leader whose log sync stalls (a dead disk: the fail point
//! `raft-log-sync` sleeps in its sync thread) went on leading: its
//! followers' fsyncs alone make a majority, and the watchdog measured the
//! age of the commit in flight, which stayed small. A busy leader, on the
//! other hand, stepped down for a backlog of commits. The watchdog now
//! watches the sync's own progress, steps the leader down once a sync has
//! run `step_down_ms`, and hands leadership to the follower with the most
//! of the log once the followers' lease has run out.
//!
//! The bound: the stalled leader stops serving within `step_down_ms` plus
//! two heartbeats (1.7 s by default) of the stall, and another member
//! serves about a lease (2 s) and an election round later: within 5 s.
//! Needs the `failpoints` feature (the README's test command enables it).

#![cfg(feature = "failpoints")]

use crate::cluster_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::total::{consume_all, report, Workload};
use cluster_support::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_log_sync_stalls_is_replaced_in_bounded_time() {
    // Node 1 forms the cluster and leads first; from its 300th log sync
    // on, each sync hangs for a minute.
    let stall = vec![(
        "FAILPOINTS".to_string(),
        "raft-log-sync=300*off->sleep(60000)".to_string(),
    )];
    let cluster = Arc::new(Cluster::start_with_env(3, &[stall]));
    let (leader, term) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    assert_eq!(leader, 0, "node 1 forms the cluster and leads first");
    let started = Instant::now();
    let work = Workload::start(&cluster, vec![1, 2, 0]);
    let (now, _) = cluster.wait_leader(term, Duration::from_secs(60)).await;
    assert_ne!(now, 0, "the stalled node leads again");
    eprintln!(
        "replaced {:.1?} after the load began (handed over: {})",
        started.elapsed(),
        cluster.log_has(0, "handed leadership over")
    );
    // Publishing goes on through the new leader.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let history = work.stop().await;
    let stepped_down = cluster.log_has(0, "stepping down stalled=true");
    assert!(stepped_down, "{}", cluster.logs_tail());
    // The longest time without a confirm: the stall's step-down, the
    // hand-over, and the publisher's move to the new leader.
    let mut at: Vec<Instant> = history.confirmed_at.iter().map(|(_, t)| *t).collect();
    at.sort();
    let gap = at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    eprintln!("longest time without a confirm: {gap:.1?}");
    assert!(
        gap < Duration::from_secs(8),
        "confirms stopped for {gap:?}; {}",
        cluster.logs_tail()
    );
    // The disk is mended: the node starts again without the fail point,
    // and everything confirmed is consumed from a healthy cluster (with
    // one member's disk dead, any hiccup of the last one steps the leader
    // down, which the consumer of this check does not ride out).
    cluster.kill(0);
    cluster.nodes[0].env.lock().unwrap().clear();
    cluster.spawn(0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (now, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let got = consume_all(&cluster, now).await;
    report("stalled log sync", 500, &history, &got);
    cluster.assert_no_panics();
}
