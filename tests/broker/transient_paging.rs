//! Non-durable queues page too (issue 26): past the same memory bound as
//! a durable queue (16 MiB of bodies, or 64k messages) their messages wait
//! in the message log as transient ones, so a backlog costs disk, not
//! memory; they come back in order, expire and dead-letter as in memory,
//! and go with the queue.

use crate::common;
use crate::helpers;

use std::time::Duration;

use common::*;
use helpers::*;
use lapin::{options::*, types::AMQPValue, types::FieldTable, BasicProperties};
use serde_json::Value;

const MIB: usize = 1 << 20;

async fn queue_json(b: &TestBroker, name: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let url = format!(
        "http://{}/api/queues/%2F/{name}",
        b.api.expect("the API listens")
    );
    let client = reqwest::Client::new();
    let mut last = Value::Null;
    for _ in 0..100 {
        let got = client
            .get(&url)
            .basic_auth("guest", Some("guest"))
            .send()
            .await
            .unwrap();
        last = got.json().await.unwrap();
        if ready(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never got there: {last}");
}

/// A body of `size` bytes that says which it is.
fn numbered(i: u32, size: usize) -> Vec<u8> {
    let mut body = vec![b'.'; size];
    body[..4].copy_from_slice(&i.to_be_bytes());
    body
}

/// Publishes `n` bodies of `size` to `queue`, every other one persistent,
/// confirmed.
async fn fill(ch: &lapin::Channel, queue: &str, n: u32, size: usize) {
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirms = Vec::new();
    for i in 0..n {
        let props = BasicProperties::default().with_delivery_mode(1 + (i % 2) as u8);
        let c = publish_with(
            ch,
            "",
            queue,
            BasicPublishOptions::default(),
            &numbered(i, size),
            props,
        )
        .await;
        confirms.push(c);
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
}

/// A non-durable queue and an exclusive one keep 16 MiB of bodies in
/// memory and the rest in the log; every message comes back, in order,
/// with its body; deleting the queue with messages out unacked is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_durable_backlog_pages_out_and_comes_back_in_order() {
    let b = start_with_api().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "t").await;
    let exclusive = QueueDeclareOptions {
        exclusive: true,
        ..Default::default()
    };
    ch.queue_declare("x".into(), exclusive, FieldTable::default())
        .await
        .unwrap();
    fill(&ch, "t", 24, MIB).await;
    fill(&ch, "x", 24, MIB).await;
    for name in ["t", "x"] {
        let q = queue_json(&b, name, |q| q["messages"] == 24).await;
        assert_eq!(q["message_bytes"], 24 * MIB, "{q}");
        let paged = q["message_bytes_paged_out"].as_u64().expect("paged out");
        assert!(paged >= 4 * MIB as u64, "{q}");
        assert!(q["messages_paged_out"].as_u64() >= Some(4), "{q}");
        let memory = q["memory"].as_u64().expect("memory");
        assert!(memory < 24 * MIB as u64 - paged + MIB as u64, "{q}");
    }
    for i in 0..24 {
        let got = ch
            .basic_get("t".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .expect("a message");
        assert_eq!(got.delivery.data, numbered(i, MIB), "message {i}");
        assert!(!got.delivery.redelivered);
    }
    assert_eq!(message_count(&ch, "t").await, 0);

    // Refilled, then deleted with twenty out unacked (from the log).
    fill(&ch, "t", 24, MIB).await;
    ch.basic_qos(20, BasicQosOptions::default()).await.unwrap();
    let mut c = consumer(&ch, "t", "holds").await;
    let held = take(&mut c, 20).await;
    assert_eq!(held.len(), 20);
    assert_eq!(held[19].data, numbered(19, MIB));
    ch.queue_delete("t".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    for d in held {
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    // The channel is still open: the queue's pages went without fuss.
    declare(&ch, "after").await;
    assert_eq!(message_count(&ch, "after").await, 0);
}

/// A non-durable "delay queue" nobody consumes: its messages past the
/// bound expire from the log and are dead-lettered, as in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_out_messages_of_a_non_durable_queue_expire_and_dead_letter() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "dead").await;
    let args = table(&[
        ("x-dead-letter-exchange", s("")),
        ("x-dead-letter-routing-key", s("dead")),
        // Long enough that the bound is passed before the first expires.
        ("x-message-ttl", AMQPValue::LongInt(8000)),
    ]);
    declare_with(&ch, "delay", QueueDeclareOptions::default(), args)
        .await
        .unwrap();
    let n = 6000;
    fill(&ch, "delay", n, 4096).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while message_count(&ch, "dead").await < n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(message_count(&ch, "dead").await, n, "all dead-lettered");
    assert_eq!(message_count(&ch, "delay").await, 0);
    let first = get_body(&ch, "dead").await.expect("a message");
    assert_eq!(first, numbered(0, 4096), "in order");
}
