//! A rolling upgrade under load: a 3-node cluster of the build before
//! cluster versions (WARREN_OLD_BIN, e.g. d0876f8) is moved to this build
//! node by node, SIGTERM and start again on the same data, while a client
//! publishes with pipelined confirms. Nothing confirmed is lost, nothing
//! is served twice unflagged, and the cluster version stays 1 while an old
//! build is a member (the new builds write nothing it cannot apply); once
//! the last member runs this build, the leader raises it to the newest
//! this build applies.
//!
//! .ci/run builds the old binary from the repository's history and sets
//! WARREN_REQUIRE_OLD_BIN; without WARREN_OLD_BIN elsewhere the test says
//! it is skipped and passes.

use crate::cluster_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::api::leader_json;
use cluster_support::total::{consume_all, report, Workload};
use cluster_support::Cluster;

/// The cluster version the leader reports (None: an old build leads, or
/// no answer).
async fn version(c: &Cluster) -> Option<u64> {
    let (_, status) = leader_json(c, "/api/cluster").await;
    status["cluster_version"].as_u64()
}

/// Waits until node `i`'s matched index reaches the leader's commit.
async fn caught_up(c: &Cluster, i: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, s) = leader_json(c, "/api/cluster").await;
        let commit = s["commit_index"].as_u64().unwrap_or(u64::MAX);
        let id = c.nodes[i].id;
        let member = s["members"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["id"] == id).cloned());
        let done = member.is_some_and(|m| {
            m["leader"] == true || m["matched_index"].as_u64().is_some_and(|x| x >= commit)
        });
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {id} did not catch up: {s} {}",
            c.logs_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_under_load_loses_nothing() {
    let Some(old) = std::env::var_os("WARREN_OLD_BIN").map(PathBuf::from) else {
        assert!(
            std::env::var_os("WARREN_REQUIRE_OLD_BIN").is_none(),
            "WARREN_OLD_BIN is not set"
        );
        eprintln!("skipped: set WARREN_OLD_BIN to the build to upgrade from");
        return;
    };
    let new = PathBuf::from(env!("CARGO_BIN_EXE_warren"));
    let c = Arc::new(Cluster::start_binary(3, &old));
    let (first, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    // Followers first, the leader last, as an operator would.
    let mut order: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    order.push(first);
    let work = Workload::start(&c, vec![first, order[0], order[1]]);
    tokio::time::sleep(Duration::from_secs(3)).await;

    for (n, &i) in order.iter().enumerate() {
        let before = work.history().lock().confirmed.len();
        assert!(c.terminate(i, Duration::from_secs(20)), "node {i} stops");
        *c.nodes[i].bin.lock().unwrap() = Some(new.clone());
        c.spawn(i);
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.leader().is_none() {
            assert!(Instant::now() < deadline, "no leader: {}", c.logs_tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        caught_up(&c, i).await;
        // Load goes on through the mixed cluster.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = work.history().lock().confirmed.len();
        assert!(after > before, "nothing confirmed after upgrading node {i}");
        if n < 2 {
            // An old build is still a member: a new leader keeps the
            // version (an old one does not report it).
            assert!(
                version(&c).await.is_none_or(|v| v == 1),
                "the cluster version moved with an old member"
            );
        }
    }

    // Every member runs this build: the version goes up.
    let deadline = Instant::now() + Duration::from_secs(30);
    while version(&c).await != Some(u64::from(warren::store::op::LEVEL)) {
        assert!(
            Instant::now() < deadline,
            "the cluster version was not raised: {}",
            c.logs_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let history = work.stop().await;
    let at = c.leader().expect("a leader");
    let got = consume_all(&c, at).await;
    report("rolling upgrade", 1000, &history, &got);
    c.assert_no_panics();
}
