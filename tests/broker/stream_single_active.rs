//! Single active consumer over RabbitMQ's stream protocol: consumers
//! sharing a name on a stream, one reading at a time, told by
//! ConsumerUpdate, with RabbitMQ's Rust stream client; on a super stream,
//! its partitions spread over the group's consumers; and the frames
//! themselves, as a client that writes them sees them.

use crate::common;

use std::time::Duration;

use common::streams::*;
use futures::StreamExt;
use rabbitmq_stream_client::types::{
    Message, MessageContext, OffsetSpecification, RoutingKeyRoutingStrategy, RoutingStrategy,
    SuperStreamConsumer,
};

/// A ConsumerUpdate callback that resumes after the offset the group
/// stored (from the first offset if it stored none), as RabbitMQ's
/// documentation has applications do.
async fn resume(_active: u8, ctx: MessageContext) -> OffsetSpecification {
    match ctx.client().query_offset(ctx.name(), &ctx.stream()).await {
        Ok(at) => OffsetSpecification::Offset(at + 1),
        Err(_) => OffsetSpecification::First,
    }
}

/// Of two consumers named alike on a stream only the first reads; when
/// it goes, the second takes over after the offset the first stored, so
/// nothing is read twice and nothing is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_consumer_takes_over_at_the_stored_offset() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("sac").await.unwrap();
    publish_to(&env, "sac", 0..10).await;
    let consumer = || {
        env.consumer()
            .name("app")
            .enable_single_active_consumer(true)
            .consumer_update(resume)
    };
    let mut first = consumer().build("sac").await.unwrap();
    let want = |r: std::ops::Range<u64>| r.map(|i| (i, body(i))).collect::<Vec<_>>();
    assert_eq!(take(&mut first, 10).await, want(0..10), "from the first");
    let mut second = consumer().build("sac").await.unwrap();
    publish_to(&env, "sac", 10..13).await;
    assert_eq!(take(&mut first, 3).await, want(10..13));
    assert_nothing_more(&mut second).await;
    first.store_offset(12).await.unwrap();
    first.handle().close().await.unwrap();
    publish_to(&env, "sac", 13..15).await;
    assert_eq!(take(&mut second, 2).await, want(13..15), "after 12");
    assert_nothing_more(&mut second).await;
}

/// The next `n` deliveries of a super stream consumer, as (partition,
/// body), sorted.
async fn take_all(c: &mut SuperStreamConsumer, n: usize) -> Vec<(String, String)> {
    let mut got = Vec::new();
    while got.len() < n {
        let d = next_delivery(c).await;
        let body = d.message().data().unwrap_or_default();
        got.push((
            d.stream().clone(),
            String::from_utf8_lossy(body).into_owned(),
        ));
    }
    got.sort();
    got
}

async fn nothing_more(c: &mut SuperStreamConsumer) {
    let more = tokio::time::timeout(Duration::from_millis(500), c.next()).await;
    assert!(more.is_err(), "no more deliveries");
}

fn sent(partitions: &[u8], rounds: &[u8]) -> Vec<(String, String)> {
    let mut v = Vec::new();
    for p in partitions {
        for r in rounds {
            v.push((format!("orders-{p}"), format!("k{p} round {r}")));
        }
    }
    v.sort();
    v
}

/// A super stream's partitions spread over a group's consumers: alone,
/// one reads all three; a second takes partition 1 (its index modulo two)
/// once the first has stepped down from it; when the second goes, the
/// first has partition 1 again and reads it (its credit kept across the
/// step-down); when the first goes too, a third has them all. Each is
/// told by ConsumerUpdate and answers with where to start (here, the
/// first offset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_super_streams_partitions_spread_over_the_group() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator()
        .create_super_stream("orders", 3, None)
        .await
        .unwrap();
    let mut producer = env
        .super_stream_producer(RoutingStrategy::RoutingKeyStrategy(
            RoutingKeyRoutingStrategy {
                routing_extractor: &key_of,
            },
        ))
        .build("orders")
        .await
        .unwrap();
    let mut round = async |r: u8| {
        for p in 0..3 {
            let m = Message::builder()
                .body(format!("k{p} round {r}").into_bytes())
                .build();
            producer.send(m, |_| async {}).await.unwrap();
        }
    };
    let consumer = || {
        env.super_stream_consumer()
            .name("billing")
            .enable_single_active_consumer(true)
            .consumer_update(|_active, _ctx| async { OffsetSpecification::First })
    };
    let mut one = consumer().build("orders").await.unwrap();
    round(0).await;
    assert_eq!(take_all(&mut one, 3).await, sent(&[0, 1, 2], &[0]));
    let mut two = consumer().build("orders").await.unwrap();
    assert_eq!(
        take_all(&mut two, 1).await,
        sent(&[1], &[0]),
        "partition 1 moved"
    );
    round(1).await;
    assert_eq!(take_all(&mut one, 2).await, sent(&[0, 2], &[1]));
    assert_eq!(take_all(&mut two, 1).await, sent(&[1], &[1]));
    nothing_more(&mut one).await;
    nothing_more(&mut two).await;
    two.handle().close().await.unwrap();
    assert_eq!(take_all(&mut one, 2).await, sent(&[1], &[0, 1]), "back");
    round(2).await;
    assert_eq!(take_all(&mut one, 3).await, sent(&[0, 1, 2], &[2]));
    let mut three = consumer().build("orders").await.unwrap();
    one.handle().close().await.unwrap();
    let all = sent(&[0, 1, 2], &[0, 1, 2]);
    assert_eq!(take_all(&mut three, 9).await, all);
    nothing_more(&mut three).await;
}

/// A subscription's properties: (key, value) pairs as the protocol
/// writes them.
fn properties(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut v = (pairs.len() as u32).to_be_bytes().to_vec();
    for (k, val) in pairs {
        v.extend(string(k));
        v.extend(string(val));
    }
    v
}

fn subscribe(correlation: u8, id: u8, pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut sub = vec![0, 0, 0, correlation, id];
    sub.extend(string("wire"));
    sub.extend([0, 1]); // first
    sub.extend([0, 10]); // credit
    sub.extend(properties(pairs));
    sub
}

/// The frames: a single active consumer needs a name; it is told it is
/// active with ConsumerUpdate and reads nothing until it answers, then
/// from the offset it answers with; credit for one that is not active is
/// kept and answered with "precondition failed", as RabbitMQ does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_update_on_the_wire() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("wire").await.unwrap();
    publish_to(&env, "wire", 0..3).await;
    let mut s = raw_open(&b).await;
    let sac = ("single-active-consumer", "true");
    send_frame(&mut s, 7, &subscribe(1, 1, &[sac])).await;
    let refused = read_until(&mut s, 0x8007).await;
    assert_eq!(&refused[..6], &[0, 0, 0, 1, 0, 0x11], "no name: refused");
    send_frame(&mut s, 7, &subscribe(2, 1, &[sac, ("name", "app")])).await;
    let ok = read_until(&mut s, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 2, 0, 1], "subscribed");
    let update = read_until(&mut s, 26).await;
    assert_eq!(&update[4..], &[1, 1], "subscription 1 is active");
    // A second member waits; its credit is kept and refused.
    send_frame(&mut s, 7, &subscribe(3, 2, &[sac, ("name", "app")])).await;
    let ok = read_until(&mut s, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 3, 0, 1]);
    send_frame(&mut s, 9, &[2, 0, 5]).await;
    let credit = read_until(&mut s, 0x8009).await;
    assert_eq!(
        &credit[..],
        &[0, 0x11, 2],
        "credit for a consumer not active"
    );
    // The answer: start at offset 1. The first chunk starts there (none
    // was sent before the answer).
    let mut answer = update[..4].to_vec();
    answer.extend([0, 1, 0, 4]);
    answer.extend(1u64.to_be_bytes());
    send_frame(&mut s, 0x801a, &answer).await;
    let chunk = read_until(&mut s, 8).await;
    assert_eq!(chunk[0], 1, "for subscription 1");
    let first = u64::from_be_bytes(chunk[25..33].try_into().unwrap());
    assert_eq!(first, 1, "from the offset answered");
    // The first unsubscribes: the second is made active.
    send_frame(&mut s, 12, &[0, 0, 0, 4, 1]).await;
    let update = read_until(&mut s, 26).await;
    assert_eq!(&update[4..], &[2, 1], "subscription 2 is active");
}

/// A stream deleted under a group: each member is told and dropped, as
/// RabbitMQ drops them, so a consumer of a stream made again with the
/// name (with the same subscription id) is made active at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_streams_members_leave_their_group() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("wire").await.unwrap();
    let mut s = raw_open(&b).await;
    let sac = [("single-active-consumer", "true"), ("name", "")];
    send_frame(&mut s, 7, &subscribe(1, 1, &sac)).await;
    let ok = read_until(&mut s, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 1, 0, 1], "an empty name is a name");
    let update = read_until(&mut s, 26).await;
    assert_eq!(&update[4..], &[1, 1]);
    send_frame(&mut s, 7, &subscribe(2, 2, &sac)).await;
    read_until(&mut s, 0x8007).await;
    env.delete_stream("wire").await.unwrap();
    // One MetadataUpdate per member (each is dropped as it is sent).
    for _ in 0..2 {
        let went = read_until(&mut s, 16).await;
        assert_eq!(&went[..2], &[0, 6], "stream not available");
    }
    env.stream_creator().create("wire").await.unwrap();
    send_frame(&mut s, 7, &subscribe(3, 1, &sac)).await;
    let ok = read_until(&mut s, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 3, 0, 1], "the id is free again");
    // The new member is made active (the second may have been, for the
    // moment between the two going).
    loop {
        let update = read_until(&mut s, 26).await;
        if update[4] == 1 {
            assert_eq!(update[5], 1, "active");
            break;
        }
    }
}
