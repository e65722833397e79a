//! RabbitMQ's stream protocol in a 3-node cluster, driven by RabbitMQ's
//! Rust stream client: every member's stream port serves (a follower
//! carries its clients to the leader), Metadata names the leader and
//! every member as a replica, a follower's open response names that
//! follower, a publisher on a connection a follower carries is
//! confirmed, consumers put on replicas read the follower's own copy
//! (filtered, with credit, told when their stream goes), and after the
//! leader is killed a client of a surviving member reads every confirmed
//! message at its offset.

use crate::cluster_support;
use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use cluster_support::Cluster;
use common::streams::{
    ask_deliver_v2, raw_open_at, raw_open_beating, read_checked_chunks, read_until, read_versioned,
    send_frame, string, subscribe_at,
};
use futures::StreamExt;
use rabbitmq_stream_client::types::{Message, StreamMetadata};
use rabbitmq_stream_client::types::{MessageResult, OffsetSpecification};
use rabbitmq_stream_client::{Client, ClientOptions, Environment, FilterConfiguration};
use rabbitmq_stream_protocol::ResponseKind;

fn options(c: &Cluster, i: usize) -> ClientOptions {
    ClientOptions::builder()
        .host("127.0.0.1")
        .port(c.nodes[i].stream)
        .build()
}

async fn try_env(c: &Cluster, i: usize) -> Result<Environment, String> {
    Environment::builder()
        .host("127.0.0.1")
        .port(c.nodes[i].stream)
        .build()
        .await
        .map_err(|e| e.to_string())
}

fn port_of(c: &Cluster, i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], c.nodes[i].stream))
}

/// Creates `stream` through node `i`, retrying while the node is not
/// serving yet or the cluster's version is below the one streams need.
async fn create_when_ready(c: &Cluster, i: usize, stream: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let made = match try_env(c, i).await {
            Ok(env) => env
                .stream_creator()
                .create(stream)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
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

/// Metadata of `stream` through node `i` once it names `replicas`
/// replicas (the leader learns where its members serve within a second
/// or two).
async fn metadata_with(c: &Cluster, i: usize, stream: &str, replicas: usize) -> StreamMetadata {
    let client = Client::connect(options(c, i)).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut meta = client.metadata(vec![stream.into()]).await.unwrap();
        let m = meta.remove(stream).expect("the stream's metadata");
        if m.replicas.len() == replicas {
            client.close().await.unwrap();
            return m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Metadata never named {replicas} replicas: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Message `i`: the later ones labelled "red" (even) or "blue" (odd).
fn body(i: u64) -> Vec<u8> {
    match i {
        0..50 => format!("m{i}").into_bytes(),
        _ if i.is_multiple_of(2) => format!("red {i}").into_bytes(),
        _ => format!("blue {i}").into_bytes(),
    }
}

fn colour(m: &Message) -> String {
    let body = String::from_utf8_lossy(m.data().unwrap_or_default()).into_owned();
    body.split(' ').next().unwrap_or_default().to_string()
}

type Messages = Vec<(u64, Vec<u8>)>;

/// Reads `n` messages from the first offset, with `filter` if given,
/// through node `i` (whose Metadata puts the consumer on a replica).
async fn read(
    c: &Cluster,
    i: usize,
    stream: &str,
    n: usize,
    filter: Option<&str>,
) -> Result<Messages, String> {
    let env = try_env(c, i).await?;
    let filter = filter.map(|f| FilterConfiguration::new(vec![f.to_string()], false));
    let mut consumer = env
        .consumer()
        .offset(OffsetSpecification::First)
        .filter_input(filter)
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

/// Messages the members other than `leader` delivered from their own
/// copies, as their Prometheus says.
async fn served_by_followers(c: &Cluster, leader: usize) -> u64 {
    let mut sum = 0;
    for i in (0..c.nodes.len()).filter(|&i| i != leader) {
        let text = c.metrics(i).await;
        let name = "warren_follower_stream_deliveries_total ";
        sum += text
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or(0, |v| v.trim().parse::<u64>().expect("a count"));
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_serves_and_replicas_read_their_own_copies() {
    let cluster = Cluster::start(3);
    let (leader, term) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    create_when_ready(&cluster, follower, "events").await;

    // Metadata (answered by the leader, whichever member the client
    // reached) names the leader at its host in --peers and its own
    // stream port, and the followers as replicas.
    let meta = metadata_with(&cluster, follower, "events", 2).await;
    assert_eq!(meta.leader.host, "127.0.0.1");
    assert_eq!(meta.leader.port, cluster.nodes[leader].stream as u32);
    let mut replicas: Vec<u32> = meta.replicas.iter().map(|r| r.port).collect();
    replicas.sort_unstable();
    let mut want: Vec<u32> = [follower, other]
        .iter()
        .map(|&i| cluster.nodes[i].stream as u32)
        .collect();
    want.sort_unstable();
    assert_eq!(replicas, want);

    // The follower's open response names the follower, as RabbitMQ's
    // nodes name themselves.
    let client = Client::connect(options(&cluster, follower)).await.unwrap();
    let props = client.connection_properties().await;
    let own = cluster.nodes[follower].stream.to_string();
    assert_eq!(props.get("advertised_port"), Some(&own));

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
        let more = tokio::time::timeout(Duration::from_secs(10), confirms.recv())
            .await
            .expect("confirms in time")
            .expect("the connection is open");
        confirmed.extend(more);
    }
    assert_eq!(confirmed, ids);
    client.close().await.unwrap();

    // The environment's producer, made through the other follower, goes
    // to the leader Metadata names; it labels what it sends.
    let producer = try_env(&cluster, other)
        .await
        .unwrap()
        .producer()
        .filter_value_extractor(colour)
        .build("events")
        .await
        .expect("a producer");
    for i in 50..100 {
        let m = Message::builder().body(body(i)).build();
        let status = producer.send_with_confirm(m).await.expect("sent");
        assert!(status.confirmed(), "message {i} confirmed");
    }
    producer.close().await.unwrap();

    // Consumers go to replicas, which serve them from their own copies:
    // every message at its offset, and a filtered one only its label's
    // (each message a chunk of its own: credit flows here).
    let before = served_by_followers(&cluster, leader).await;
    let want: Messages = (0..100).map(|i| (i, body(i))).collect();
    assert_eq!(
        read(&cluster, follower, "events", 100, None).await,
        Ok(want.clone())
    );
    let red: Messages = (50..100).step_by(2).map(|i| (i, body(i))).collect();
    assert_eq!(
        read(&cluster, other, "events", 25, Some("red")).await,
        Ok(red)
    );
    let served = served_by_followers(&cluster, leader).await - before;
    assert!(served >= 125, "the followers served {served} of 125");

    // Without the leader, a survivor's port serves every confirmed
    // message at its offset.
    cluster.kill(leader);
    let (new_leader, _) = cluster.wait_leader(term, Duration::from_secs(30)).await;
    let survivor = (0..3).find(|&i| i != leader && i != new_leader).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match read(&cluster, survivor, "events", 100, None).await {
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

/// A follower serves stored batches (100 messages of 1 KiB each, more
/// than it copies) from its own copy as the leader does: whole, read from
/// its file onto the connection it carries, each Deliver frame's chunk
/// with the entry count, data length and CRC a client that checks them
/// finds, from the first offset and from inside a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_sends_stored_batches_as_clients_check_them() {
    let cluster = Cluster::start(3);
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    create_when_ready(&cluster, leader, "batches").await;
    let big = |i: u64| format!("{i:08}").repeat(128).into_bytes();
    let env = try_env(&cluster, leader).await.unwrap();
    let producer = env.producer().build("batches").await.unwrap();
    for from in (0..300).step_by(100) {
        let batch = (from..from + 100)
            .map(|i| Message::builder().body(big(i)).build())
            .collect();
        let statuses = producer.batch_send_with_confirm(batch).await.unwrap();
        assert!(statuses.iter().all(|s| s.confirmed()));
    }
    producer.close().await.unwrap();
    let before = served_by_followers(&cluster, leader).await;
    for (i, start) in [(1, 0u64), (2, 150)] {
        let follower = (leader + i) % 3;
        let mut s = raw_open_at(port_of(&cluster, follower)).await;
        subscribe_at(&mut s, "batches", start).await;
        read_checked_chunks(&mut s, start, 300, big).await;
    }
    let served = served_by_followers(&cluster, leader).await - before;
    assert!(served >= 450, "the followers served {served} of 450");
    cluster.assert_no_panics();
}

/// A subscription a follower serves: answered there, sent nothing without
/// credit, a chunk per credit, an id in use refused, and told when its
/// stream is deleted (through the leader) while it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_subscription_takes_credit_and_learns_its_stream_went() {
    let cluster = Cluster::start(3);
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let follower = (leader + 1) % 3;
    create_when_ready(&cluster, leader, "going").await;
    let mut s = raw_open_at(port_of(&cluster, follower)).await;
    // Deliver 2, as the leader answers for the connection.
    assert_eq!(ask_deliver_v2(&mut s).await, (1, 2));
    let subscribe = |correlation: u8, credit: u8| {
        let mut sub = vec![0, 0, 0, correlation, 1];
        sub.extend(string("going"));
        sub.extend([0, 1]); // first
        sub.extend([0, credit]);
        sub.extend([0, 0, 0, 0]); // no properties
        sub
    };
    send_frame(&mut s, 7, &subscribe(9, 0)).await;
    let ok = read_until(&mut s, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 9, 0, 1], "subscribed");
    send_frame(&mut s, 7, &subscribe(10, 0)).await;
    let taken = read_until(&mut s, 0x8007).await;
    assert_eq!(&taken[..6], &[0, 0, 0, 10, 0, 3], "the id is in use");

    let env = try_env(&cluster, leader).await.unwrap();
    let producer = env.producer().build("going").await.unwrap();
    for i in 0..3 {
        let m = Message::builder().body(body(i)).build();
        assert!(producer.send_with_confirm(m).await.unwrap().confirmed());
    }
    let before = served_by_followers(&cluster, leader).await;
    // Nothing without credit; one credit, one chunk from the first offset.
    let nothing = tokio::time::timeout(Duration::from_millis(500), read_until(&mut s, 8)).await;
    assert!(nothing.is_err(), "no chunk without credit");
    send_frame(&mut s, 9, &[1, 0, 1]).await;
    let (version, chunk) = read_versioned(&mut s, 8).await;
    assert_eq!((version, chunk[0]), (2, 1), "deliver 2, for subscription 1");
    let committed = u64::from_be_bytes(chunk[1..9].try_into().unwrap());
    assert_eq!(committed, 2, "the last offset committed");
    let first = u64::from_be_bytes(chunk[33..41].try_into().unwrap());
    assert_eq!(first, 0, "from the first offset");
    let after = served_by_followers(&cluster, leader).await;
    assert!(after > before, "served by the follower");

    // A consumer that only sends credits (answered by the follower) for
    // longer than two heartbeats keeps its connection: the follower tells
    // the leader it is there.
    let mut beating = raw_open_beating(port_of(&cluster, follower), 1).await;
    send_frame(&mut beating, 7, &subscribe(11, 0)).await;
    let ok = read_until(&mut beating, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 11, 0, 1], "subscribed");
    for _ in 0..10 {
        send_frame(&mut beating, 9, &[1, 0, 0]).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let mut meta = vec![0, 0, 0, 12, 0, 0, 0, 1];
    meta.extend(string("going"));
    send_frame(&mut beating, 15, &meta).await;
    let answer = read_until(&mut beating, 0x800f).await;
    assert_eq!(&answer[..4], &[0, 0, 0, 12], "still open after 4 s");

    // Deleted through the leader: the follower's subscription is told.
    env.delete_stream("going").await.unwrap();
    let update = read_until(&mut s, 16).await;
    assert_eq!(&update[..2], &[0, 6], "stream not available");
    assert_eq!(&update[2..], &string("going")[..]);
    cluster.assert_no_panics();
}
