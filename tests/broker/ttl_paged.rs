//! Message TTL reaches messages paged out of memory: past a durable
//! queue's memory bound (16 MiB of bodies) its messages wait in the store
//! only, and with no consumer to read them back they used to outlive
//! their TTL for good (a dead-letter "delay queue" nobody consumes stopped
//! releasing anything once it held 16 MiB).

use crate::common;
use crate::helpers;

use std::time::Duration;

use common::*;
use helpers::*;
use lapin::{options::*, types::AMQPValue, BasicProperties};

/// More than the memory bound: 6,000 bodies of 4 KiB.
const COUNT: u32 = 6000;
const SIZE: usize = 4096;

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// Publishes COUNT persistent 4 KiB messages to `queue`, confirmed.
async fn fill(ch: &lapin::Channel, queue: &str) {
    publish(ch, queue, COUNT, BasicProperties::default()).await;
}

/// Publishes `n` persistent 4 KiB messages with `props` to `queue`,
/// confirmed.
async fn publish(ch: &lapin::Channel, queue: &str, n: u32, props: BasicProperties) {
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let body = vec![b'x'; SIZE];
    let mut confirms = Vec::new();
    for _ in 0..n {
        let c = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &body,
                props.clone().with_delivery_mode(2),
            )
            .await
            .unwrap();
        confirms.push(c);
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
}

/// Waits up to 60 s for `queue` to hold `n`; returns what it holds.
async fn settle(ch: &lapin::Channel, queue: &str, n: u32) -> u32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = message_count(ch, queue).await;
        if got == n || tokio::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn dead_letter_queue(ch: &lapin::Channel, ttl: Option<i32>) {
    ch.queue_declare("dead".into(), durable(), Default::default())
        .await
        .unwrap();
    let mut args = vec![
        ("x-dead-letter-exchange", s("")),
        ("x-dead-letter-routing-key", s("dead")),
    ];
    if let Some(ms) = ttl {
        args.push(("x-message-ttl", AMQPValue::LongInt(ms)));
    }
    declare_with(ch, "delay", durable(), table(&args))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_out_messages_expire_with_no_consumer() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    // Long enough that the bound is passed before the first expires.
    dead_letter_queue(&ch, Some(8000)).await;
    fill(&ch, "delay").await;
    assert_eq!(settle(&ch, "dead", COUNT).await, COUNT, "all dead-lettered");
    assert_eq!(message_count(&ch, "delay").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_ttl_set_after_paging_expires_the_paged_messages() {
    let b = start_with_api().await;
    let (_c, ch) = b.channel().await;
    dead_letter_queue(&ch, None).await;
    fill(&ch, "delay").await;
    let policy = serde_json::json!({
        "pattern": "^delay$", "apply-to": "queues", "definition": {"message-ttl": 1}
    });
    let url = format!("http://{}/api/policies/%2F/ttl", b.api.expect("api"));
    let put = reqwest::Client::new()
        .put(url)
        .basic_auth("guest", Some("guest"))
        .json(&policy)
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());
    assert_eq!(settle(&ch, "dead", COUNT).await, COUNT, "all dead-lettered");
    assert_eq!(message_count(&ch, "delay").await, 0);
}

/// Messages that expire deep in the stored tail while memory already
/// holds twice its bound of messages that do not: the expiry timer cannot
/// read them back yet. It used to drop their deadlines, so once a consumer
/// made room they stayed in the queue, expired, until a consumer reached
/// them; now they wait aside and expire as soon as there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_expiring_past_a_full_memory_expire_once_there_is_room() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    dead_letter_queue(&ch, None).await;
    // 9,000 that never expire: 4,096 fill memory (16 MiB), the rest wait
    // in the store; the timer reads 4,096 of them back on its way to the
    // expiring ones, then memory is full (32 MiB).
    publish(&ch, "delay", 9000, BasicProperties::default()).await;
    let expiring = BasicProperties::default().with_expiration("1".into());
    publish(&ch, "delay", 2000, expiring).await;
    // A consumer takes 4,000 of the head: room for the rest.
    for _ in 0..4000 {
        let got = ch
            .basic_get("delay".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap();
        assert!(got.is_some(), "the head is there");
    }
    assert_eq!(settle(&ch, "dead", 2000).await, 2000, "all dead-lettered");
    assert_eq!(message_count(&ch, "delay").await, 5000, "the rest wait");
}
