//! A publisher faster than the cluster commits. The members' links carry
//! 100 Mbit/s (tc in each node's network namespace) while one connection
//! publishes persistent 256 KiB messages, without confirms, as fast as the
//! leader reads them. Everything submitted waits for its commit in the
//! leader's memory, and the leader used to read on until its own
//! heartbeats starved behind the appends: within five seconds it could not
//! confirm its majority, stepped down and closed every client. Now a
//! publishing connection stops being read
//! while the commits are behind by more than a bound
//! (store/raft/backlog.rs): the leader's memory stays bounded, it keeps
//! leading (a backlog is not a stalled log), and the publisher goes on at
//! the rate the cluster commits.

use crate::cluster_support;
use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::netns::{self, Net};
use cluster_support::total::durable;
use cluster_support::Cluster;
use common::raw::{self, Raw};
use lapin::types::FieldTable;

const BODY: usize = 256 << 10;
const SECS: u64 = 20;

/// Resident bytes of process `pid`.
fn rss(pid: u32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_faster_than_the_cluster_commits_waits_for_it() {
    let Some(net) = Net::new() else {
        assert!(!netns::required(), "cannot make network namespaces");
        eprintln!("skipped: network namespaces need root and iproute2");
        return;
    };
    let hosts: Vec<(String, Option<String>)> =
        (1..=3).map(|i| (net.host(i), Some(net.ns(i)))).collect();
    let c = Cluster::start_on(&hosts, "loopback_users = []\n");
    for i in 1..=3 {
        net.limit(i, "100mbit");
    }
    let (leader, term) = c.wait_leader(0, Duration::from_secs(30)).await;
    let conn = c
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect to the leader");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare("flood".into(), durable(), FieldTable::default())
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;

    let node = &c.nodes[leader];
    let addr = format!("{}:{}", node.host, node.amqp).parse().unwrap();
    let mut publisher = Raw::open(addr).await;
    publisher.open_channel(1).await;
    let frame_max = publisher.tune.as_ref().map_or(131_072, |t| t.frame_max) as usize;
    let data = vec![7u8; BODY];
    let mut message = raw::basic_publish(1, "", "flood", false, false);
    message.extend(raw::content_header(1, BODY as u64, true));
    for chunk in data.chunks(frame_max - 8) {
        message.extend(raw::body(1, chunk));
    }
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (sent, stop) = (Arc::clone(&sent), Arc::clone(&stop));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                publisher.try_send(&message).await?;
                sent.fetch_add(BODY as u64, Ordering::Relaxed);
            }
            Ok::<_, std::io::Error>(publisher)
        })
    };

    let pid = c.pid(leader).expect("the leader runs");
    let base = rss(pid);
    let mut peak = base;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(SECS) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak = peak.max(rss(pid));
        assert!(
            !writer.is_finished(),
            "the publisher was cut off: {}",
            c.logs_tail()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let mib = |b: u64| b >> 20;
    eprintln!(
        "published {} MiB in {SECS} s; the leader's memory: {} MiB before, {} MiB at most",
        mib(sent.load(Ordering::Relaxed)),
        mib(base),
        mib(peak)
    );
    assert!(
        sent.load(Ordering::Relaxed) > 32 << 20,
        "the publisher hardly published"
    );
    assert!(
        peak < base + (768 << 20),
        "the leader's memory grew by {} MiB",
        mib(peak - base)
    );
    // Still the leader of the same term: a backlog is not a stall.
    assert_eq!(c.leader(), Some(leader), "{}", c.logs_tail());
    assert_eq!(c.led_term(leader), Some(term));
    assert!(!c.log_has(leader, "stepping down"), "{}", c.logs_tail());
    c.assert_no_panics();
}
