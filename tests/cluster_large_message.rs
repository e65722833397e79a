//! A message far larger than what the members' link carries within one
//! heartbeat interval: 100 MiB, persistent, in a 3-node cluster whose
//! members send at most 100 Mbit/s (tc in each node's network namespace).
//! openraft cancels an append after one heartbeat interval (250 ms here,
//! about 3 MB of this link), so the entry used to be sent whole and
//! cancelled forever: no confirm, and commits stopped behind it. Now it is
//! staged on the followers in parts (cluster/append.rs): it is confirmed,
//! every member holds it, and after the leader is killed the new leader
//! delivers it intact, with a small message published after it.

mod cluster_support;
#[allow(unused)] // cluster_support takes its ports from common
mod common;

use std::time::Duration;

use cluster_support::api::leader_json;
use cluster_support::netns::{self, Net};
use cluster_support::total::durable;
use cluster_support::Cluster;
use futures::StreamExt;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;

const SIZE: usize = 100 << 20;

fn body() -> Vec<u8> {
    (0..SIZE).map(|i| (i % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mib_message_replicates_over_a_100_mbit_link() {
    let Some(net) = Net::new() else {
        assert!(!netns::required(), "cannot make network namespaces");
        eprintln!("skipped: network namespaces need root and iproute2");
        return;
    };
    let hosts: Vec<(String, Option<String>)> =
        (1..=3).map(|i| (net.host(i), Some(net.ns(i)))).collect();
    let cluster = Cluster::start_on(&hosts, "loopback_users = []\n");
    for i in 1..=3 {
        net.limit(i, "100mbit");
    }
    let (leader, term) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let conn = cluster
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect to the leader");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare("big".into(), durable(), FieldTable::default())
        .await
        .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let persistent = BasicProperties::default().with_delivery_mode(2);
    let mut confirms = Vec::new();
    for payload in [body(), b"after".to_vec()] {
        let c = ch
            .basic_publish(
                "".into(),
                "big".into(),
                BasicPublishOptions::default(),
                &payload,
                persistent.clone(),
            )
            .await
            .unwrap();
        confirms.push(c);
    }
    for c in confirms {
        // Two followers at 100 Mbit/s each way: about 17 s of sending.
        let ack = tokio::time::timeout(Duration::from_secs(120), c)
            .await
            .unwrap_or_else(|_| panic!("no confirm in 120 s: {}", cluster.logs_tail()))
            .unwrap();
        assert!(ack.is_ack());
    }
    drop(conn);

    // Every member holds the log up to the leader's commit.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (_, status) = leader_json(&cluster, "/api/cluster").await;
        let commit = status["commit_index"].as_u64().unwrap_or(u64::MAX);
        let members = status["members"].as_array().cloned().unwrap_or_default();
        let held = members.len() == 3
            && members
                .iter()
                .all(|m| m["leader"] == true || m["matched_index"].as_u64() >= Some(commit));
        if held {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the followers never caught up: {status}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The leader dies; the new one delivers both messages, intact.
    cluster.kill(leader);
    let (next, _) = cluster.wait_leader(term, Duration::from_secs(60)).await;
    let conn = cluster
        .connect(next, Duration::from_secs(30))
        .await
        .expect("connect to the new leader");
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(
            "big".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let d = tokio::time::timeout(Duration::from_secs(120), consumer.next())
            .await
            .expect("a delivery within 120 s")
            .expect("the consumer ended")
            .unwrap();
        d.ack(BasicAckOptions::default()).await.unwrap();
        got.push(d.data);
    }
    assert_eq!(got[0].len(), SIZE);
    assert!(got[0] == body(), "the large message came back changed");
    assert_eq!(got[1], b"after");
    cluster.assert_no_panics();
}
