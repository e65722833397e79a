//! Streams in a 3-node cluster: appends replicate through the Raft log
//! like every durable write, a reader at the end is not handed an append
//! while both followers are stopped and gets it as they return (the
//! commit gate itself is unit-tested in queue/stream/tests.rs), and
//! after the leader is killed the new leader serves the same messages
//! at the same offsets, a tracked reader resumes where its acks left
//! off, and new appends follow on.

mod cluster_support;
mod common;
mod helpers;
mod stream_support;

use std::time::Duration;

use cluster_support::Cluster;
use common::{assert_no_delivery, next};
use helpers::{declare_with, s, table};
use lapin::{options::*, types::AMQPValue, Connection};
use stream_support::*;

/// Declares stream `name` through node `i`, retrying while the cluster's
/// version is below the one streams need (it is raised shortly after a
/// fresh cluster elects its leader) or the node is not serving yet.
async fn declare_when_ready(c: &Cluster, i: usize, name: &str) -> Connection {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let conn = c
            .connect(i, Duration::from_secs(30))
            .await
            .expect("connect");
        let ch = conn.create_channel().await.unwrap();
        match declare_with(&ch, name, durable(), stream(&[])).await {
            Ok(_) => return conn,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the stream was never declared: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn tracked() -> lapin::types::FieldTable {
    table(&[
        (
            "x-stream-automatic-offset-tracking",
            AMQPValue::Boolean(true),
        ),
        ("x-stream-offset", s("first")),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_replicated_serves_only_what_is_committed_and_survives_its_leader() {
    let cluster = Cluster::start(3);
    let (leader, term) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let follower = (leader + 1) % 3;
    // Through a follower: the client is served by the leader.
    let conn = declare_when_ready(&cluster, follower, "events").await;
    let ch = conn.create_channel().await.unwrap();
    publish_confirmed(&ch, "events", (0..1000).map(|i| format!("m{i}"))).await;

    let (_t, mut t) = reader_with(&conn, "events", "keeper", 100, tracked())
        .await
        .unwrap();
    assert_eq!(read_acking(&mut t, 500).await, numbered(0..500));
    // The tracked offset is written before the next commit: a confirmed
    // publish after the acks covers it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    publish_confirmed(&ch, "events", ["m1000".to_string()]).await;
    let (_a, mut all) = reader(&conn, "events", 500, Some(s("first"))).await;
    assert_eq!(read_acking(&mut all, 1001).await, numbered(0..1001));

    // With both followers stopped nothing commits: a reader at the end
    // is not handed the append, and gets it once they are back.
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &f in &others {
        cluster.signal(f, libc::SIGSTOP);
    }
    let pending = ch
        .basic_publish(
            "".into(),
            "events".into(),
            BasicPublishOptions::default(),
            b"m1001",
            lapin::BasicProperties::default(),
        )
        .await
        .unwrap();
    assert_no_delivery(&mut all).await;
    for &f in &others {
        cluster.signal(f, libc::SIGCONT);
    }
    assert!(pending.await.expect("confirm").is_ack());
    assert_eq!(read_acking(&mut all, 1).await, numbered(1001..1002));
    drop(conn);

    // The leader dies; the next one has every confirmed message at its
    // offset, and the tracked reader's place.
    cluster.kill(leader);
    let (next_leader, _) = cluster.wait_leader(term, Duration::from_secs(30)).await;
    let conn = cluster
        .connect(next_leader, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    let (_a, mut all) = reader(&conn, "events", 500, Some(s("first"))).await;
    assert_eq!(read_acking(&mut all, 1002).await, numbered(0..1002));
    let (_t, mut t) = reader_with(&conn, "events", "keeper", 100, tracked())
        .await
        .unwrap();
    assert_eq!(read_acking(&mut t, 1).await, numbered(500..501));
    publish_confirmed(&ch, "events", ["after".to_string()]).await;
    let d = next(&mut all).await.expect("the new message");
    assert_eq!((offset_of(&d), &d.data[..]), (1002, &b"after"[..]));
    drop(conn);
    cluster.assert_no_panics();
}
