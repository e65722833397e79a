//! A member added while clients publish, to a leader whose log fills past
//! `log_max_mb` many times while the new member installs its snapshot of
//! the backlog: it catches up and votes (the leader keeps the log it still
//! needs, gives each snapshot chunk and the install the time they take,
//! and a request asked again waits on the same learner instead of
//! restarting its replication), and it holds every confirmed message.

use crate::cluster_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::api::http;
use cluster_support::total::{check, consume_all, publish_routed, History, Route, QUEUE};
use cluster_support::Cluster;
use lapin::types::FieldTable;
use parking_lot::Mutex;

/// Messages in the backlog before the new member starts, of `PAD` bytes:
/// a snapshot of about 200 MB.
const BACKLOG: usize = 50_000;
const PAD: usize = 4096;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_under_load_catches_up_and_votes() {
    // A snapshot every 4 MiB of log, keeping 5 entries.
    let mut c = Cluster::start_with(3, "[cluster]\nlog_max_mb = 4\nlog_keep = 5\n");
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    let four = c.add_node();
    let c = Arc::new(c);
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(History::default()));
    let route: Route = Arc::new(|_| ("".into(), QUEUE.into(), FieldTable::default(), PAD));
    let publisher = tokio::spawn(publish_routed(
        Arc::clone(&c),
        Arc::new(Mutex::new(vec![leader])),
        Arc::clone(&stop),
        Arc::clone(&history),
        route,
    ));
    let deadline = Instant::now() + Duration::from_secs(300);
    while history.lock().confirmed.len() < BACKLOG {
        assert!(
            Instant::now() < deadline,
            "backlog not confirmed: {}",
            c.logs_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Node 4 starts and is added while the publisher goes on; a client
    // that gives up after 5 s asks again, as the nemesis's does.
    c.spawn_joining(four);
    let url = format!("{}/api/cluster/members/4", c.api(leader));
    let body = serde_json::json!({"raft": format!("127.0.0.1:{}", c.nodes[four].raft)});
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut asked = 0;
    loop {
        asked += 1;
        let r = http()
            .put(&url)
            .basic_auth("guest", Some("guest"))
            .json(&body)
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        let status = r.as_ref().map(|r| r.status().as_u16()).ok();
        if matches!(status, Some(201 | 204)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 4 not added after {asked} requests: {status:?} {}",
            c.logs_tail()
        );
        if status.is_some() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    publisher.await.unwrap();
    assert!(
        c.log_has(four, "snapshot installed"),
        "node 4 caught up without a snapshot: the test did not test"
    );

    // Node 4 leads and serves every confirmed message.
    c.lead_with(four).await;
    let got = consume_all(&c, four).await;
    check(&history.lock(), &got);
    c.assert_no_panics();
}
