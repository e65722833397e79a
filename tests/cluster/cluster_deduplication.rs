//! Deduplication caches in a 3-node cluster: a durable queue's and a
//! durable exchange's entries travel in the Raft log with their messages'
//! commit, so after the leader is killed the new leader still drops every
//! key confirmed before (pika drives the queue, tests/pika/dedup.py).

use crate::cluster_support;
use crate::common;
use crate::helpers;

use std::time::Duration;

use cluster_support::Cluster;
use common::pika::pika;
use helpers::{bind, drain, exchange, table};
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, ExchangeKind};

fn dedup() -> FieldTable {
    table(&[
        ("x-message-deduplication", AMQPValue::Boolean(true)),
        ("x-cache-size", AMQPValue::LongInt(100)),
    ])
}

fn keyed(key: &str) -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert("x-deduplication-header".into(), helpers::s(key));
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(h)
}

/// Declares the durable queue `q` (as dedup.py does), the exchange `dx`
/// and its queue through node `i`, retrying while the cluster's version
/// is below the one durable caches need (it is raised shortly after a
/// fresh cluster elects its leader) or the node is not serving yet.
async fn declare_when_ready(c: &Cluster, i: usize) -> (lapin::Connection, Channel) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    loop {
        let conn = c
            .connect(i, Duration::from_secs(30))
            .await
            .expect("connect");
        let ch = conn.create_channel().await.unwrap();
        let declared = async {
            ch.queue_declare("dq".into(), durable, dedup()).await?;
            let opts = ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            };
            exchange(&ch, "dx", ExchangeKind::Fanout, opts, dedup()).await?;
            ch.queue_declare("from-dx".into(), durable, FieldTable::default())
                .await
        };
        match declared.await {
            Ok(_) => {
                bind(&ch, "from-dx", "dx", "", FieldTable::default()).await;
                ch.confirm_select(ConfirmSelectOptions::default())
                    .await
                    .unwrap();
                return (conn, ch);
            }
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never declared: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn publish_acked(ch: &Channel, exchange: &str, key: &str, body: &str, p: BasicProperties) {
    let confirm = ch
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            p,
        )
        .await
        .unwrap()
        .await
        .expect("confirm");
    assert!(confirm.is_ack(), "{body}: {confirm:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_keys_are_still_duplicates_after_the_leader_dies() {
    let cluster = Cluster::start(3);
    let (leader, term) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let (conn, ch) = declare_when_ready(&cluster, leader).await;
    for i in 0..5 {
        let k = format!("k{i}");
        publish_acked(&ch, "dx", "", &k, keyed(&k)).await;
    }
    let uri = cluster.uri(leader);
    let ran = tokio::task::spawn_blocking(move || pika(&uri, &["before", "dq"]))
        .await
        .unwrap();
    drop(conn);

    cluster.kill(leader);
    let (next, _) = cluster.wait_leader(term, Duration::from_secs(30)).await;
    let conn = cluster
        .connect(next, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for i in 0..6 {
        let k = format!("k{i}");
        publish_acked(&ch, "dx", "", &format!("{k} again"), keyed(&k)).await;
    }
    assert_eq!(
        drain(&ch, "from-dx").await,
        ["k0", "k1", "k2", "k3", "k4", "k5 again"]
    );
    if ran {
        let uri = cluster.uri(next);
        tokio::task::spawn_blocking(move || pika(&uri, &["after", "dq"]))
            .await
            .unwrap();
    }
    drop(conn);
    cluster.assert_no_panics();
}
