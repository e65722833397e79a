//! RabbitMQ's stream protocol in a 3-node cluster, driven by RabbitMQ's
//! Rust stream client: every member's stream port serves (a follower
//! carries its clients to the leader), Metadata names the leader at the
//! address its members know it by, a publisher on a connection a follower
//! carries is confirmed, and after the leader is killed a client of a
//! surviving member reads every confirmed message at its offset.

mod cluster_support;

use std::time::Duration;

use cluster_support::Cluster;
use futures::StreamExt;
use rabbitmq_stream_client::types::MessageResult;
use rabbitmq_stream_client::types::{Message, OffsetSpecification};
use rabbitmq_stream_client::{Client, ClientOptions, Environment};
use rabbitmq_stream_protocol::ResponseKind;

fn options(c: &Cluster, i: usize) -> ClientOptions {
    ClientOptions::builder()
        .host("127.0.0.1")
        .port(c.nodes[i].stream)
        .build()
}

async fn env(c: &Cluster, i: usize) -> Environment {
    Environment::builder()
        .host("127.0.0.1")
        .port(c.nodes[i].stream)
        .build()
        .await
        .expect("connects")
}

/// Creates `stream` through node `i`, retrying while the node is not
/// serving yet or the cluster's version is below the one streams need.
async fn create_when_ready(c: &Cluster, i: usize, stream: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let made = match Environment::builder()
            .host("127.0.0.1")
            .port(c.nodes[i].stream)
            .build()
            .await
        {
            Ok(env) => env
                .stream_creator()
                .create(stream)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match made {
            Ok(()) => return,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the stream was never created: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn body(i: u64) -> Vec<u8> {
    format!("m{i}").into_bytes()
}

/// Reads `n` messages from the first offset through node `i`.
async fn read_all(c: &Cluster, i: usize, stream: &str, n: usize) -> Result<Messages, String> {
    let env = Environment::builder()
        .host("127.0.0.1")
        .port(c.nodes[i].stream)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let mut consumer = env
        .consumer()
        .offset(OffsetSpecification::First)
        .build(stream)
        .await
        .map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    while got.len() < n {
        let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .map_err(|_| "no delivery in time".to_string())?
            .ok_or("the consumer ended")?
            .map_err(|e| e.to_string())?;
        let body = d.message().data().map(<[u8]>::to_vec).unwrap_or_default();
        got.push((d.offset(), body));
    }
    Ok(got)
}

type Messages = Vec<(u64, Vec<u8>)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_members_stream_port_serves_and_a_confirmed_message_survives_the_leader() {
    let cluster = Cluster::start(3);
    let (leader, term) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let follower = (leader + 1) % 3;
    create_when_ready(&cluster, follower, "events").await;

    // A follower's connection is the leader's: Metadata names the leader
    // at its host in --peers and its own stream port, and so does the
    // connection's advertised address.
    let client = Client::connect(options(&cluster, follower)).await.unwrap();
    let meta = client.metadata(vec!["events".into()]).await.unwrap();
    let events = &meta["events"];
    assert_eq!(events.leader.host, "127.0.0.1");
    assert_eq!(events.leader.port, cluster.nodes[leader].stream as u32);
    let props = client.connection_properties().await;
    let leader_port = cluster.nodes[leader].stream.to_string();
    assert_eq!(props.get("advertised_port"), Some(&leader_port));

    // A publisher on the carried connection is confirmed there.
    let (confirms_tx, mut confirms) = tokio::sync::mpsc::unbounded_channel();
    let handler = move |m: MessageResult| async move {
        if let Some(Ok(r)) = m {
            if let ResponseKind::PublishConfirm(c) = r.kind_ref() {
                let _ = confirms_tx.send(c.publishing_ids.clone());
            }
        }
        Ok(())
    };
    client.set_handler(handler).await;
    let declared = client.declare_publisher(1, None, "events").await.unwrap();
    assert!(
        declared.is_ok(),
        "publisher declared: {:?}",
        declared.code()
    );
    let batch: Vec<Message> = (0..50)
        .map(|i| Message::builder().body(body(i)).build())
        .collect();
    let ids = client.publish(1, batch, 1).await.unwrap();
    let mut confirmed = Vec::new();
    while confirmed.len() < ids.len() {
        let ids = tokio::time::timeout(Duration::from_secs(10), confirms.recv())
            .await
            .expect("confirms in time")
            .expect("the connection is open");
        confirmed.extend(ids);
    }
    assert_eq!(confirmed, ids);
    client.close().await.unwrap();

    // The environment's producer, made through the other follower, goes
    // to the leader Metadata names.
    let other = (leader + 2) % 3;
    let producer = env(&cluster, other)
        .await
        .producer()
        .build("events")
        .await
        .expect("a producer");
    for i in 50..100 {
        let m = Message::builder().body(body(i)).build();
        let status = producer.send_with_confirm(m).await.expect("sent");
        assert!(status.confirmed(), "message {i} confirmed");
    }
    producer.close().await.unwrap();
    let want: Messages = (0..100).map(|i| (i, body(i))).collect();
    assert_eq!(
        read_all(&cluster, follower, "events", 100).await,
        Ok(want.clone())
    );

    // Without the leader, a survivor's port serves every confirmed
    // message at its offset.
    cluster.kill(leader);
    let (new_leader, _) = cluster.wait_leader(term, Duration::from_secs(30)).await;
    let survivor = (0..3).find(|&i| i != leader && i != new_leader).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match read_all(&cluster, survivor, "events", 100).await {
            Ok(got) => {
                assert_eq!(got, want);
                break;
            }
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "never read: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    cluster.assert_no_panics();
}
