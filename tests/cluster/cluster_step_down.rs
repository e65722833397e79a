//! A leader that loses its followers steps down, and openraft keeps it
//! leader of the same term. It served again in that term once the pause
//! was over, with a broker recovered from the applied state while its
//! previous broker's entries were still uncommitted: a queue deleted just
//! before (an auto-delete queue whose last consumer left; the delete not
//! committed) was back, a client published to it and got confirms once a
//! follower returned, and the delete then committed under those messages:
//! the next leader had neither the queue nor the confirmed messages. A
//! node now serves a term again only once everything its previous broker
//! wrote is applied.

use crate::cluster_support;

use std::sync::Arc;
use std::time::Duration;

use cluster_support::Cluster;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;

/// Lines of node `i`'s log that say it serves.
fn servings(c: &Cluster, i: usize) -> usize {
    std::fs::read_to_string(&c.nodes[i].log)
        .unwrap_or_default()
        .matches("leading: serving clients")
        .count()
}

/// The message count of `queue` as node `i` answers (the leader's
/// answer, through a follower), None if there is no such queue; retried
/// while connections fail (a node stepping down closes them).
async fn exists(c: &Cluster, i: usize, queue: &str) -> Option<u32> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "no answer");
        let Some(conn) = c.connect(i, Duration::from_secs(60)).await else {
            continue;
        };
        let Ok(ch) = conn.create_channel().await else {
            continue;
        };
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let r = ch
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await;
        let _ = conn.close(200, "done".into()).await;
        match r {
            Ok(q) => return Some(q.message_count()),
            Err(e) => match e.kind() {
                lapin::ErrorKind::ProtocolError(p) if p.get_id() == 404 => return None,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            },
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stepped_down_serves_only_what_is_applied() {
    let cluster = Arc::new(Cluster::start(3));
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    // A durable auto-delete queue with a consumer.
    let conn = cluster
        .connect(leader, Duration::from_secs(30))
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let auto_delete = QueueDeclareOptions {
        durable: true,
        auto_delete: true,
        ..Default::default()
    };
    ch.queue_declare("q".into(), auto_delete, FieldTable::default())
        .await
        .unwrap();
    let _consumer = ch
        .basic_consume(
            "q".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let served = servings(&cluster, leader);
    for &f in &followers {
        cluster.signal(f, libc::SIGSTOP);
    }
    // Its last consumer goes: the queue is deleted, and that cannot
    // commit while the followers are stopped (nothing waits for it).
    ch.basic_cancel("c".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cluster.log_has(leader, "stepping down") {
        assert!(tokio::time::Instant::now() < deadline, "no step-down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(conn);
    // The pause after a step-down is three election timeouts (3 s); give
    // the node time to serve again if it would.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    while servings(&cluster, leader) == served && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // While the delete is not committed the node must not serve a state
    // without it: the queue would come back.
    let seen = tokio::time::timeout(Duration::from_secs(4), exists(&cluster, leader, "q")).await;
    assert!(
        !matches!(seen, Ok(Some(_))),
        "the node served again with the queue it had deleted (a broker built from the applied \
         state while its own entries were not applied)"
    );
    // One follower back: the node may stay leader of its term (the other
    // follower's log is as short as this one's) and commit.
    cluster.signal(followers[0], libc::SIGCONT);
    // Publish to "q" with confirms, if the node serving has "q".
    let mut confirmed = 0u32;
    if exists(&cluster, leader, "q").await.is_some() {
        let conn = cluster
            .connect(leader, Duration::from_secs(60))
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        for i in 0..50u32 {
            let c = ch
                .basic_publish(
                    "".into(),
                    "q".into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    i.to_string().as_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap();
            let c = tokio::time::timeout(Duration::from_secs(30), c)
                .await
                .expect("a confirm in time")
                .unwrap();
            // Unroutable (the queue is gone): returned, not kept.
            if c.is_ack() && c.take_message().is_none() {
                confirmed += 1;
            }
        }
        let _ = conn.close(200, "done".into()).await;
    }
    cluster.signal(followers[1], libc::SIGCONT);
    // The node goes: the next leader must have every confirmed message.
    let term = cluster.led_term(leader).unwrap_or(0);
    cluster.kill(leader);
    cluster.wait_leader(term, Duration::from_secs(30)).await;
    let kept = exists(&cluster, followers[0], "q").await;
    eprintln!(
        "served again: {}; confirmed {confirmed}; the next leader has {kept:?}",
        servings(&cluster, leader) > served
    );
    assert!(
        confirmed == 0 || kept == Some(confirmed),
        "{confirmed} messages confirmed to q; the next leader has {kept:?}"
    );
    cluster.assert_no_panics();
}
