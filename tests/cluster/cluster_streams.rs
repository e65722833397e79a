//! Streams in a 3-node cluster: appends replicate through the Raft log
//! like every durable write, a reader at the end is not handed an append
//! while both followers are stopped and gets it as they return (the
//! commit gate itself is unit-tested in queue/stream/tests.rs), and
//! after the leader is killed the new leader serves the same messages
//! at the same offsets, a tracked reader resumes where its acks left
//! off, and new appends follow on.

use crate::cluster_support;
use crate::common;
use crate::helpers;
use crate::stream_support;

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

/// The size of the classic queue's messages beside a stream reader: many
/// frames each.
const BIG: usize = 300 << 10;

/// This node's count of stream deliveries made from its own copy, as
/// its Prometheus says.
async fn served_here(c: &Cluster, i: usize) -> u64 {
    let text = c.metrics(i).await;
    let name = "warren_follower_stream_deliveries_total ";
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

/// A consumer attached to a follower reads that follower's copy: the same
/// messages at the same offsets as the leader serves, counted in the
/// follower's own metrics; on a channel that also consumes a classic
/// queue (served by the leader) the tags are one sequence and every ack
/// reaches its side; a reader at the end gets what is committed next, and
/// is cancelled when the stream is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_serves_stream_readers_from_its_own_copy() {
    let cluster = Cluster::start(3);
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let f = (leader + 1) % 3;
    let lconn = declare_when_ready(&cluster, leader, "events").await;
    let lch = lconn.create_channel().await.unwrap();
    publish_confirmed(&lch, "events", (0..2000).map(|i| format!("m{i}"))).await;
    declare_with(&lch, "work", durable(), Default::default())
        .await
        .unwrap();
    publish_confirmed(
        &lch,
        "work",
        (0..10).map(|i| format!("w{i}{}", "x".repeat(BIG - 2))),
    )
    .await;
    assert_eq!(served_here(&cluster, f).await, 0);

    let fconn = cluster
        .connect(f, Duration::from_secs(30))
        .await
        .expect("connect");
    let (_c, mut all) = reader(&fconn, "events", 100, Some(s("first"))).await;
    assert_eq!(read_acking(&mut all, 2000).await, numbered(0..2000));
    assert!(served_here(&cluster, f).await >= 2000);
    assert_eq!(served_here(&cluster, leader).await, 0);

    // One channel, two consumers read at once: the stream's (here) and a
    // classic queue's (the leader's, large messages that arrive in many
    // frames: nothing of the stream's lands inside one). Every delivery
    // is acked by its own tag.
    let ch = fconn.create_channel().await.unwrap();
    ch.basic_qos(20, BasicQosOptions::default()).await.unwrap();
    let args = table(&[("x-stream-offset", AMQPValue::LongLongInt(0))]);
    let mut tail = ch
        .basic_consume("events".into(), "tail".into(), Default::default(), args)
        .await
        .unwrap();
    let mut work = ch
        .basic_consume(
            "work".into(),
            "work".into(),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    let classic = async {
        let mut got = Vec::new();
        for _ in 0..10 {
            let d = next(&mut work).await.expect("a classic delivery");
            assert_eq!(d.data.len(), BIG, "a whole message");
            got.push(String::from_utf8_lossy(&d.data[..2]).into_owned());
            d.ack(BasicAckOptions::default()).await.unwrap();
        }
        got
    };
    let (streamed, got) = tokio::join!(read_acking(&mut tail, 2000), classic);
    assert_eq!(streamed, numbered(0..2000));
    assert_eq!(got, (0..10).map(|i| format!("w{i}")).collect::<Vec<_>>());
    // A reader here is cancelled here; reusing its tag while it reads is
    // a connection error (530), as in RabbitMQ.
    ch.basic_cancel("tail".into(), Default::default())
        .await
        .unwrap();
    let conn2 = cluster
        .connect(f, Duration::from_secs(30))
        .await
        .expect("connect");
    let (ch2, _reader) = reader_with(&conn2, "events", "again", 10, Default::default())
        .await
        .unwrap();
    let reused = ch2
        .basic_consume(
            "events".into(),
            "again".into(),
            Default::default(),
            Default::default(),
        )
        .await;
    assert!(reused.is_err(), "a reused consumer tag was taken");
    // The acks reached the leader: nothing comes back once the channel
    // closes.
    ch.close(200, "done".into()).await.unwrap();
    assert_eq!(cluster_support::count(&cluster, leader, "work").await, 0);

    // A reader at the end is handed what is committed next.
    publish_confirmed(&lch, "events", (2000..2005).map(|i| format!("m{i}"))).await;
    assert_eq!(read_acking(&mut all, 5).await, numbered(2000..2005));

    // Deleting the stream cancels the reader here.
    lch.queue_delete("events".into(), Default::default())
        .await
        .unwrap();
    assert!(
        next(&mut all).await.is_none(),
        "the reader was not cancelled"
    );
    drop(fconn);
    cluster.assert_no_panics();
}

/// Every offset form and a filter, read on a follower: the start is
/// placed with what the follower applied, the same as the leader places it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_places_every_offset_form_and_filters() {
    let cluster = Cluster::start(3);
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let f = (leader + 2) % 3;
    let lconn = declare_when_ready(&cluster, leader, "events").await;
    let lch = lconn.create_channel().await.unwrap();
    publish_confirmed(&lch, "events", (0..100).map(|i| format!("m{i}"))).await;
    // A second boundary between the two batches.
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs()
    };
    let now = secs(std::time::SystemTime::now());
    while secs(std::time::SystemTime::now()) < now + 2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = secs(std::time::SystemTime::now());
    // Stored times come from the coarse wall clock, a tick behind at most.
    tokio::time::sleep(Duration::from_millis(100)).await;
    publish_confirmed(&lch, "events", (100..200).map(|i| format!("m{i}"))).await;
    let labelled: Vec<(String, Option<&str>)> = (0..30)
        .map(|i| (format!("l{i}"), Some(["red", "blue", "green"][i % 3])))
        .collect();
    let labelled: Vec<(&str, Option<&str>)> =
        labelled.iter().map(|(b, v)| (b.as_str(), *v)).collect();
    publish_labelled(&lch, "events", &labelled).await;
    let served = served_here(&cluster, f).await;

    let fconn = cluster
        .connect(f, Duration::from_secs(30))
        .await
        .expect("connect");
    let first = |v: AMQPValue| Some(v);
    let cases = [
        (first(s("first")), 0),
        (first(AMQPValue::LongLongInt(150)), 150),
        (first(AMQPValue::Timestamp(second)), 100),
        (first(s("last")), 229),
    ];
    for (offset, want) in cases {
        let (_c, mut r) = reader(&fconn, "events", 10, offset.clone()).await;
        let d = next(&mut r).await.expect("a delivery");
        assert_eq!(offset_of(&d), want, "{offset:?}");
    }
    // Next (the default) waits for what comes after.
    let (_c, mut tail) = reader(&fconn, "events", 10, None).await;
    assert_no_delivery(&mut tail).await;
    publish_confirmed(&lch, "events", ["after".to_string()]).await;
    let d = next(&mut tail).await.expect("the next message");
    assert_eq!((offset_of(&d), &d.data[..]), (230, &b"after"[..]));

    let filter = table(&[
        ("x-stream-offset", s("first")),
        (
            "x-stream-filter",
            AMQPValue::FieldArray(vec![s("red"), s("green")].into()),
        ),
    ]);
    let (_c, mut reds) = reader_with(&fconn, "events", "", 50, filter).await.unwrap();
    let want: Vec<String> = (0..30)
        .filter(|i| i % 3 != 1)
        .map(|i| format!("l{i}"))
        .collect();
    assert_eq!(bodies_acking(&mut reds, want.len()).await, want);
    assert_no_delivery(&mut reds).await;
    assert!(served_here(&cluster, f).await >= served + 7 + 20);
    drop(fconn);
    cluster.assert_no_panics();
}
