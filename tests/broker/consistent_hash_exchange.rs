//! The x-consistent-hash exchange (plugins/consistent-hash): even spread
//! across equally weighted queues, a key's messages stay in one queue in
//! order, weights and hash-header, and bad binding keys refused.

use crate::common;
use crate::helpers;

use common::*;
use helpers::*;
use lapin::{options::*, types::FieldTable, BasicProperties, ExchangeKind};

async fn hash_exchange(ch: &lapin::Channel, name: &str, args: FieldTable) {
    ch.exchange_declare(
        name.into(),
        ExchangeKind::Custom("x-consistent-hash".into()),
        ExchangeDeclareOptions::default(),
        args,
    )
    .await
    .expect("x-consistent-hash is a known exchange type");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spreads_evenly_and_keeps_a_keys_messages_together_in_order() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    hash_exchange(&ch, "ring", FieldTable::default()).await;
    for q in ["p0", "p1", "p2", "p3"] {
        declare(&ch, q).await;
        bind(&ch, q, "ring", "1", FieldTable::default()).await;
    }
    const N: u32 = 100_000;
    for i in 0..N {
        // Random-looking keys; every 1000th message reuses key "fixed".
        let key = if i % 1000 == 0 {
            "fixed".to_string()
        } else {
            format!("k{}", i.wrapping_mul(2_654_435_761))
        };
        ch.basic_publish(
            "ring".into(),
            key.as_str().into(),
            BasicPublishOptions::default(),
            &i.to_be_bytes(),
            BasicProperties::default(),
        )
        .await
        .unwrap();
    }
    let mut counts = Vec::new();
    for q in ["p0", "p1", "p2", "p3"] {
        counts.push(wait_count_stable(&c, q).await);
    }
    assert_eq!(counts.iter().sum::<u32>(), N, "{counts:?}");
    for n in &counts {
        let share = *n as f64 / (N as f64 / 4.0);
        assert!((0.9..=1.1).contains(&share), "uneven: {counts:?}");
    }
    // "fixed" went to exactly one queue, in publish order.
    let mut holders = 0;
    for q in ["p0", "p1", "p2", "p3"] {
        let mut fixed = Vec::new();
        while let Some(m) = ch
            .basic_get(q.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            if m.delivery.routing_key.as_str() == "fixed" {
                fixed.push(u32::from_be_bytes(
                    <[u8; 4]>::try_from(&m.delivery.data[..]).unwrap(),
                ));
            }
        }
        if !fixed.is_empty() {
            holders += 1;
            assert_eq!(fixed.len(), 100);
            assert!(fixed.windows(2).all(|w| w[0] < w[1]), "in order");
        }
    }
    assert_eq!(holders, 1);
}

/// The queue's message count once it stops changing.
async fn wait_count_stable(c: &lapin::Connection, q: &str) -> u32 {
    let ch = c.create_channel().await.unwrap();
    let mut last = u32::MAX;
    loop {
        let n = ch
            .queue_declare(
                q.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count();
        if n == last {
            return n;
        }
        last = n;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_header_routes_by_a_header() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    hash_exchange(&ch, "by-user", table(&[("hash-header", s("user"))])).await;
    declare(&ch, "a").await;
    declare(&ch, "b").await;
    bind(&ch, "a", "by-user", "1", FieldTable::default()).await;
    bind(&ch, "b", "by-user", "1", FieldTable::default()).await;
    for i in 0..50u8 {
        // Different routing keys, same header: one queue gets them all.
        let props = BasicProperties::default().with_headers(table(&[("user", s("alice"))]));
        publish_with(
            &ch,
            "by-user",
            &format!("rk{i}"),
            BasicPublishOptions::default(),
            &[i],
            props,
        )
        .await;
    }
    let (a, b2) = (drain(&ch, "a").await.len(), drain(&ch, "b").await.len());
    assert!(a == 50 && b2 == 0 || a == 0 && b2 == 50, "a={a} b={b2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_key_must_be_a_weight() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    hash_exchange(&ch, "ring", FieldTable::default()).await;
    declare(&ch, "q").await;
    let r = ch
        .queue_bind(
            "q".into(),
            "ring".into(),
            "heavy".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await;
    expect_code(r, 406);
    let ch = c.create_channel().await.unwrap();
    let bad = table(&[("hash-header", s("h")), ("hash-property", s("message_id"))]);
    let r = ch
        .exchange_declare(
            "both".into(),
            ExchangeKind::Custom("x-consistent-hash".into()),
            ExchangeDeclareOptions::default(),
            bad,
        )
        .await;
    expect_code(r, 406);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_property_routes_by_a_property() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    hash_exchange(&ch, "by-id", table(&[("hash-property", s("message_id"))])).await;
    declare(&ch, "a").await;
    declare(&ch, "b").await;
    bind(&ch, "a", "by-id", "1", FieldTable::default()).await;
    bind(&ch, "b", "by-id", "1", FieldTable::default()).await;
    for i in 0..50u8 {
        // Different routing keys, same message_id: one queue gets them all.
        let props = BasicProperties::default().with_message_id("order-7".into());
        publish_with(
            &ch,
            "by-id",
            &format!("rk{i}"),
            BasicPublishOptions::default(),
            &[i],
            props,
        )
        .await;
    }
    let (a, b2) = (drain(&ch, "a").await.len(), drain(&ch, "b").await.len());
    assert!(a == 50 && b2 == 0 || a == 0 && b2 == 50, "a={a} b={b2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_of_a_million_costs_no_more_memory_than_a_weight_of_one() {
    // Warren used to keep one bucket per unit of weight, rebuilt under the
    // exchange's lock at every bind: 20 bindings of weight 1,000,000 held
    // 20 million entries.
    let tmp = tempfile::tempdir().unwrap();
    let broker = common::child::ChildBroker::spawn(
        &tmp.path().join("data"),
        &tmp.path().join("warren.log"),
        &[],
    );
    let c = broker.connect().await;
    let ch = c.create_channel().await.unwrap();
    hash_exchange(&ch, "heavy", FieldTable::default()).await;
    let before = broker.rss_kib().unwrap();
    for i in 0..20 {
        let q = format!("h{i}");
        declare(&ch, &q).await;
        bind(&ch, &q, "heavy", "1000000", FieldTable::default()).await;
    }
    let grown_mib = broker.rss_kib().unwrap().saturating_sub(before) / 1024;
    assert!(
        grown_mib < 32,
        "20 heavy bindings grew RSS by {grown_mib} MiB"
    );
    for i in 0..1000u32 {
        publish(&ch, "heavy", &format!("k{i}"), b"x").await;
    }
    let mut total = 0;
    for i in 0..20 {
        total += message_count(&ch, &format!("h{i}")).await;
    }
    assert_eq!(total, 1000, "each message went to exactly one queue");
}
