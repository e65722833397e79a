//! A 3-node cluster of real processes on loopback: persistent messages
//! published with pipelined confirms through a follower while the leader
//! is SIGKILLed (or SIGSTOPped: a hung leader) at random moments, round
//! after round; then everything is consumed and checked as Jepsen's
//! total-queue checks it: every confirmed message is dequeued, nothing is
//! dequeued that was never published, and a message comes twice only
//! marked redelivered.

use crate::cluster_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cluster_support::total::{consume_all, report, History, Workload};
use cluster_support::Cluster;
use rand::Rng;

/// Cluster tests share the machine's two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Rounds of: publish a while, fail the leader with `fail`, wait for a
/// new one, publish on, bring the old one back with `recover`.
async fn rounds(
    rounds: usize,
    fail: fn(&Cluster, usize),
    recover: fn(&Cluster, usize),
) -> (History, BTreeMap<u64, (u32, bool)>, Vec<String>) {
    let cluster = Arc::new(Cluster::start(3));
    let (first, mut term) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    // Publish through a follower, then the others.
    let order: Vec<usize> = (0..3).map(|k| (first + 1 + k) % 3).collect();
    let work = Workload::start(&cluster, order);
    let mut failed_at = Vec::new();
    let mut to_leader = Vec::new();
    for _ in 0..rounds {
        let pause = rand::thread_rng().gen_range(500..1500);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let leader = cluster.leader().expect("a leader");
        fail(&cluster, leader);
        let failed = std::time::Instant::now();
        failed_at.push(failed);
        let (_, t) = cluster.wait_leader(term, Duration::from_secs(30)).await;
        to_leader.push(failed.elapsed());
        term = t;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        recover(&cluster, leader);
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let history = work.stop().await;
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let got = consume_all(&cluster, (leader + 1) % 3).await;
    cluster.assert_no_panics();
    // How long each failure stopped confirms: to the new leader serving,
    // and to the first confirm of a message sent after the failure.
    let failovers = failed_at
        .iter()
        .zip(&to_leader)
        .map(|(at, l)| {
            format!(
                "{l:.2?} to serve, {:.2?} to a confirm",
                history.gap_after(*at)
            )
        })
        .collect();
    (history, got, failovers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_confirmed_message_is_lost_when_the_leader_is_killed() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (history, got, failovers) = rounds(3, |c, i| c.kill(i), |c, i| c.spawn(i)).await;
    eprintln!("SIGKILL failovers: {failovers:?}");
    report("SIGKILL", 1000, &history, &got);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_confirmed_message_is_lost_when_the_leader_hangs() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (history, got, failovers) = rounds(
        2,
        |c, i| c.signal(i, libc::SIGSTOP),
        |c, i| c.signal(i, libc::SIGCONT),
    )
    .await;
    eprintln!("SIGSTOP failovers: {failovers:?}");
    report("SIGSTOP", 1000, &history, &got);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_talk_over_mutual_tls_when_certificates_are_configured() {
    let _one = ONE_AT_A_TIME.lock().await;
    let certs = tempfile::tempdir().unwrap();
    let toml = cluster_support::mutual_tls_config(certs.path());
    let cluster = Arc::new(Cluster::start_with(3, &toml));
    let (leader, term) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    // A plain connection to a Raft port gets nothing: the port speaks TLS
    // and wants a member's certificate.
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", cluster.nodes[leader].raft))
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw.write_all(b"R\0\0\0\x01\x02").await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), raw.read(&mut buf))
        .await
        .expect("the member closes a plain connection")
        .unwrap_or(0);
    assert!(
        n == 0 || buf[0] == 0x15,
        "a plain Raft request was answered"
    );
    // Publish through a follower (carried to the leader over TLS), lose
    // the leader, and find every message on the new one.
    let work = Workload::start(&cluster, vec![(leader + 1) % 3, (leader + 2) % 3]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.kill(leader);
    cluster.wait_leader(term, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let history = work.stop().await;
    let (now, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    // Through the surviving follower: carried to the leader over TLS.
    let via = (0..3).find(|&i| i != now && i != leader).unwrap_or(now);
    let got = consume_all(&cluster, via).await;
    report("mutual TLS", 500, &history, &got);
    cluster.assert_no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = Arc::new(Cluster::start(3));
    cluster.wait_leader(0, Duration::from_secs(30)).await;
    let work = Workload::start(&cluster, vec![0, 1, 2]);
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // A clean stop (SIGTERM) ends in time, leader or not.
        assert!(
            cluster.terminate(i, Duration::from_secs(20)),
            "node {i} did not stop"
        );
        cluster.spawn(i);
        // Back as a member before the next one goes.
        cluster.wait_leader(0, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let history = work.stop().await;
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let got = consume_all(&cluster, leader).await;
    report("rolling restart", 1000, &history, &got);
    cluster.assert_no_panics();
}
