//! A term's broker whose journal failed a commit can never confirm again;
//! while Raft still has the node lead that term, the broker goes and a new
//! one serves. Before, a failed commit left the leader serving clients
//! whose publishes were never confirmed, until the term changed (in the
//! nemesis run, a leader stayed so for minutes).

use crate::cluster_support;

use std::time::{Duration, Instant};

use cluster_support::total::durable;
use cluster_support::{count, Cluster};
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;

/// Publishes persistent messages to `queue` through node 0, reconnecting
/// when a connection fails or a confirm does not come in 5 s, until
/// `want` are confirmed (or 60 s pass); returns how many were.
async fn publish_confirmed(c: &Cluster, queue: &str, want: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut confirmed = 0;
    while confirmed < want && Instant::now() < deadline {
        let Some(conn) = c.connect(0, Duration::from_secs(10)).await else {
            continue;
        };
        let Ok(ch) = conn.create_channel().await else {
            continue;
        };
        // A durable declare waits for a commit: 5 s at most.
        let ready = tokio::time::timeout(Duration::from_secs(5), async {
            ch.queue_declare(queue.into(), durable(), FieldTable::default())
                .await?;
            ch.confirm_select(ConfirmSelectOptions::default()).await
        })
        .await;
        if !matches!(ready, Ok(Ok(()))) {
            continue;
        }
        while confirmed < want && Instant::now() < deadline {
            let sent = ch
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    b"m",
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await;
            let Ok(confirm) = sent else { break };
            match tokio::time::timeout(Duration::from_secs(5), confirm).await {
                Ok(Ok(c)) if c.is_ack() => confirmed += 1,
                _ => break,
            }
        }
    }
    confirmed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_gives_way_to_a_new_broker_of_the_term() {
    // One member: Raft keeps it leader of its term whatever the journal
    // does. Its commits after the 20th: one fails.
    let env = vec![vec![(
        "FAILPOINTS".to_string(),
        "raft-journal-commit=20*off->1*return->off".to_string(),
    )]];
    let c = Cluster::start_with_env(1, &env);
    c.wait_leader(0, Duration::from_secs(30)).await;
    let confirmed = publish_confirmed(&c, "q", 200).await;
    assert_eq!(confirmed, 200, "publishing stopped: {}", c.logs_tail());
    assert!(
        c.log_has(0, "failed a commit: serving anew"),
        "the fail point never fired: {}",
        c.logs_tail()
    );
    // Every confirmed message is there (others may be too: unconfirmed
    // ones of the failed commit's connection, sent again).
    assert!(count(&c, 0, "q").await >= 200);
    c.assert_no_panics();
}
