//! Operating a cluster of real processes: a follower that was down
//! catches up from a snapshot and then serves everything as the leader;
//! a node joins and another leaves through the management API, which lists
//! the members and says when a node is quorum-critical; a delayed message
//! survives losing the leader and fires on time on the new one.

use crate::cluster_support;

use std::time::{Duration, Instant};

use cluster_support::api::{get_json, http, leader_json};
use cluster_support::total::durable;
use cluster_support::{count, Cluster};
use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;

/// Cluster tests share the machine's two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Publishes `n` persistent messages to `queue` through node `i`, each
/// confirmed before the next (so each is its own log entry).
async fn publish_one_by_one(c: &Cluster, i: usize, queue: &str, n: usize) {
    let conn = c
        .connect(i, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(queue.into(), durable(), FieldTable::default())
        .await
        .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for k in 0..n {
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                k.to_string().as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }
    let _ = conn.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_was_down_catches_up_from_a_snapshot() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Nothing kept for a member catching up (log_hold_mb): the one back
    // gets the snapshot, not the log the leader would otherwise keep.
    let c = Cluster::start_with(
        3,
        "[cluster]\nsnapshot_every = 100\nlog_keep = 10\nlog_hold_mb = 0\n",
    );
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    let behind = (leader + 1) % 3;
    c.kill(behind);
    publish_one_by_one(&c, leader, "snap", 400).await;
    c.spawn(behind);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.log_has(behind, "snapshot installed") {
        assert!(
            Instant::now() < deadline,
            "no snapshot installed: {}",
            c.logs_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.lead_with(behind).await;
    assert_eq!(count(&c, behind, "snap").await, 400);
    c.assert_no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_and_leave_through_the_api() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut c = Cluster::start(3);
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    publish_one_by_one(&c, leader, "kept", 20).await;
    // Every member runs this build: the leader raises the cluster
    // version to what it applies.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, cluster) = leader_json(&c, "/api/cluster").await;
        if cluster["cluster_version"] == cluster["applies_up_to"] {
            assert_eq!(
                cluster["cluster_version"],
                warren::store::op::LEVEL,
                "{cluster}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cluster version not raised: {cluster}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, nodes) = leader_json(&c, "/api/nodes").await;
    assert_eq!(status, 200);
    let nodes = nodes.as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    let roles: Vec<&str> = nodes
        .iter()
        .map(|n| n["raft"]["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "leader").count(),
        1,
        "{roles:?}"
    );
    assert!(nodes.iter().all(|n| n["running"] == true), "{nodes:?}");
    // All three up: stopping one leaves a majority.
    let (status, _) = leader_json(&c, "/api/health/checks/node-is-quorum-critical").await;
    assert_eq!(status, 200);

    // Node 4 joins: started with the cluster's peers and itself, added by
    // the leader.
    let four = c.add_node();
    c.spawn_joining(four);
    let body = serde_json::json!({"raft": format!("127.0.0.1:{}", c.nodes[four].raft)});
    let add_four = || {
        http()
            .put(format!("{}/api/cluster/members/4", c.api(leader)))
            .basic_auth("guest", Some("guest"))
            .json(&body)
            .send()
    };
    let r = add_four().await.unwrap();
    assert_eq!(
        r.status().as_u16(),
        201,
        "{:?} {}",
        r.text().await,
        c.logs_tail()
    );
    // Asked again (a client that gave up waiting): nothing changes.
    let r = add_four().await.unwrap();
    assert_eq!(r.status().as_u16(), 204, "{:?}", r.text().await);
    let (_, cluster) = leader_json(&c, "/api/cluster").await;
    assert_eq!(cluster["members"].as_array().unwrap().len(), 4, "{cluster}");
    assert!(cluster["members"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["voter"] == true));

    // A follower leaves; the cluster of three goes on.
    let gone = (0..3).find(|&i| i != leader).unwrap();
    let r = http()
        .delete(format!(
            "{}/api/cluster/members/{}",
            c.api(leader),
            gone + 1
        ))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", c.logs_tail()));
    assert_eq!(r.status().as_u16(), 204, "{:?}", r.text().await);
    c.kill(gone);
    let (_, cluster) = leader_json(&c, "/api/cluster").await;
    assert_eq!(cluster["members"].as_array().unwrap().len(), 3, "{cluster}");
    // The new member holds everything: make it lead and count.
    c.lead_with(four).await;
    assert_eq!(count(&c, four, "kept").await, 20);

    // Two of three left running: stopping either loses the majority.
    let other = (0..4)
        .find(|&i| i != four && i != gone && c.running(i))
        .unwrap();
    let third = (0..4)
        .find(|&i| i != four && i != gone && i != other)
        .unwrap();
    c.kill(third);
    let (status, body) = get_json(&format!(
        "{}/api/health/checks/node-is-quorum-critical",
        c.api(c.leader().expect("a leader"))
    ))
    .await;
    assert_eq!(status, 503, "{body}");
    c.assert_no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_survives_losing_the_leader() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::start(3);
    let (leader, term) = c.wait_leader(0, Duration::from_secs(30)).await;
    let follower = (leader + 1) % 3;
    let conn = c.connect(follower, Duration::from_secs(30)).await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert(
        "x-delayed-type".into(),
        AMQPValue::LongString("direct".into()),
    );
    ch.exchange_declare(
        "later".into(),
        lapin::ExchangeKind::Custom("x-delayed-message".into()),
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await
    .unwrap();
    ch.queue_declare("due".into(), durable(), FieldTable::default())
        .await
        .unwrap();
    ch.queue_bind(
        "due".into(),
        "later".into(),
        "k".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut headers = FieldTable::default();
    headers.insert("x-delay".into(), AMQPValue::LongInt(5000));
    let sent = Instant::now();
    ch.basic_publish(
        "later".into(),
        "k".into(),
        BasicPublishOptions::default(),
        b"on time",
        BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let _ = conn.close(200, "done".into()).await;
    c.kill(leader);
    let (new_leader, _) = c.wait_leader(term, Duration::from_secs(30)).await;
    let conn = c
        .connect(new_leader, Duration::from_secs(30))
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(
            "due".into(),
            "c".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let d = tokio::time::timeout(Duration::from_secs(20), consumer.next())
        .await
        .expect("the delayed message arrives")
        .unwrap()
        .unwrap();
    let after = sent.elapsed();
    assert_eq!(&d.data[..], b"on time");
    assert!(after >= Duration::from_millis(4900), "too early: {after:?}");
    assert!(after < Duration::from_secs(9), "late: {after:?}");
    c.assert_no_panics();
}

/// Bytes of the files in `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The log is bounded by its size, not only by its count of entries: an
/// entry is a commit round of up to 1 MiB, so 48 MiB of messages make a
/// few hundred entries, far below `snapshot_every`, and every member's log
/// used to keep them all (under load, gigabytes). Past `log_max_mb` since
/// the last snapshot, each member snapshots and purges its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_snapshotted_by_its_size() {
    publish_48_mib_and_see_the_logs_shrink("[cluster]\nlog_max_mb = 4\nlog_keep = 5\n").await;
}

/// What a member keeps of its log before its last snapshot is bounded by
/// bytes (`log_keep_mb`) as well as by entries: `log_keep` entries of up
/// to 1 MiB each kept up to a gigabyte on every member. Here the count
/// alone keeps all 48 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_member_keeps_before_its_snapshot_is_bounded_by_bytes() {
    publish_48_mib_and_see_the_logs_shrink(
        "[cluster]\nlog_max_mb = 4\nlog_keep = 100000\nlog_keep_mb = 1\n",
    )
    .await;
}

/// Publishes 48 MiB of persistent messages to a 3-node cluster configured
/// by `config` and waits for every member's Raft log to hold under 16 MiB.
async fn publish_48_mib_and_see_the_logs_shrink(config: &str) {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::start_with(3, config);
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    let conn = c
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare("sized".into(), durable(), FieldTable::default())
        .await
        .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let body = vec![b'x'; 64 << 10];
    for _ in 0..8 {
        let mut confirms = Vec::new();
        for _ in 0..96 {
            let confirm = ch
                .basic_publish(
                    "".into(),
                    "sized".into(),
                    BasicPublishOptions::default(),
                    &body,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap();
            confirms.push(confirm);
        }
        for confirm in confirms {
            assert!(confirm.await.unwrap().is_ack());
        }
    }
    let _ = conn.close(200, "done".into()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sizes: Vec<u64> = c
            .nodes
            .iter()
            .map(|n| dir_bytes(&n.dir.join("raft-log")))
            .collect();
        if sizes.iter().all(|&s| s < 16 << 20) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the members' Raft logs hold {sizes:?} bytes: {}",
            c.logs_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(count(&c, leader, "sized").await, 768);
    c.assert_no_panics();
}
