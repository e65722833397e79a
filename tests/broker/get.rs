//! basic.get: get-ok / get-empty, the message count in get-ok, no-ack and
//! acknowledged gets, requeue of got messages, and errors.

use crate::common;
use crate::helpers;

use common::*;
use helpers::{consumer, expect_code, publish_with, s, table, wait_count};
use lapin::{options::*, BasicProperties};

async fn get(
    ch: &lapin::Channel,
    q: &str,
    no_ack: bool,
) -> Option<lapin::message::BasicGetMessage> {
    ch.basic_get(q.into(), BasicGetOptions { no_ack })
        .await
        .expect("basic.get")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_and_get_empty() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    assert!(get(&ch, "q", true).await.is_none());
    publish(&ch, "", "q", b"one").await;
    let m = get(&ch, "q", true).await.expect("get-ok");
    assert_eq!(m.delivery.data, b"one");
    assert_eq!(m.delivery.exchange.as_str(), "");
    assert_eq!(m.delivery.routing_key.as_str(), "q");
    assert!(!m.delivery.redelivered);
    assert!(get(&ch, "q", true).await.is_none());
    assert!(ch.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_ok_carries_the_remaining_message_count() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    for i in 0..3u8 {
        publish(&ch, "", "q", &[i]).await;
    }
    let counts: Vec<u32> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(get(&ch, "q", false).await.expect("get-ok").message_count);
        }
        v
    };
    assert_eq!(counts, [2, 1, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_with_ack() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    publish(&ch, "", "q", b"a").await;
    publish(&ch, "", "q", b"b").await;
    let m = get(&ch, "q", false).await.expect("get-ok");
    assert_eq!(m.delivery.data, b"a");
    m.delivery.ack(BasicAckOptions::default()).await.unwrap();
    let m = get(&ch, "q", false).await.expect("get-ok");
    assert_eq!(m.delivery.data, b"b");
    // Delivery tags count up on the channel.
    assert_eq!(m.delivery.delivery_tag, 2);
    m.delivery.ack(BasicAckOptions::default()).await.unwrap();
    // Acked messages are gone for good, even after the channel closes.
    ch.close(200, "bye".into()).await.unwrap();
    assert_eq!(wait_count(&c, "q", 0).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_with_reject_requeue_puts_it_back_first() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    publish(&ch, "", "q", b"a").await;
    publish(&ch, "", "q", b"b").await;
    let m = get(&ch, "q", false).await.expect("get-ok");
    assert_eq!(m.message_count, 1);
    m.delivery
        .reject(BasicRejectOptions { requeue: true })
        .await
        .unwrap();
    let m = get(&ch, "q", false).await.expect("get-ok");
    assert_eq!(m.delivery.data, b"a");
    assert!(m.delivery.redelivered);
    assert_eq!(m.message_count, 1);
    m.delivery
        .nack(BasicNackOptions {
            multiple: false,
            requeue: false,
        })
        .await
        .unwrap();
    let m = get(&ch, "q", true).await.expect("get-ok");
    assert_eq!(m.delivery.data, b"b");
    assert!(!m.delivery.redelivered);
    assert!(get(&ch, "q", true).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_get_is_requeued_when_the_channel_closes() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    publish(&ch, "", "q", b"a").await;
    publish(&ch, "", "q", b"b").await;
    let _a = get(&ch, "q", false).await.expect("get-ok");
    let _b = get(&ch, "q", true).await.expect("get-ok");
    ch.close(200, "bye".into()).await.unwrap();
    // Only the acknowledged-mode one comes back.
    assert_eq!(wait_count(&c, "q", 1).await, 1);
    let ch = c.create_channel().await.unwrap();
    let m = get(&ch, "q", true).await.expect("get-ok");
    assert_eq!(m.delivery.data, b"a");
    assert!(m.delivery.redelivered);
    assert!(get(&ch, "q", true).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_ignores_prefetch() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    ch.basic_qos(1, BasicQosOptions { global: false })
        .await
        .unwrap();
    ch.basic_qos(1, BasicQosOptions { global: true })
        .await
        .unwrap();
    for i in 0..3u8 {
        publish(&ch, "", "q", &[i]).await;
    }
    for i in 0..3u8 {
        let m = get(&ch, "q", false).await.expect("get-ok despite prefetch");
        assert_eq!(m.delivery.data, [i]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_shares_delivery_tags_with_consumers() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    declare(&ch, "q2").await;
    let mut cons = consumer(&ch, "q2", "c").await;
    publish(&ch, "", "q2", b"x").await;
    let d = next(&mut cons).await.expect("delivery");
    publish(&ch, "", "q", b"y").await;
    let m = get(&ch, "q", false).await.expect("get-ok");
    assert_eq!(d.delivery_tag, 1);
    assert_eq!(m.delivery.delivery_tag, 2);
    // Ack both at once.
    ch.basic_ack(2, BasicAckOptions { multiple: true })
        .await
        .unwrap();
    ch.basic_qos(0, BasicQosOptions::default()).await.unwrap();
    assert!(ch.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_keeps_properties() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    let props = BasicProperties::default()
        .with_content_type("text/plain".into())
        .with_correlation_id("corr".into())
        .with_reply_to("back".into())
        .with_priority(3)
        .with_delivery_mode(2)
        .with_headers(table(&[("h", s("v"))]));
    publish_with(
        &ch,
        "",
        "q",
        BasicPublishOptions::default(),
        b"p",
        props.clone(),
    )
    .await;
    let m = get(&ch, "q", true).await.expect("get-ok");
    assert_eq!(m.delivery.properties, props);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_from_missing_queue_is_404() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = ch
        .basic_get("nope".into(), BasicGetOptions::default())
        .await;
    let text = expect_code(r, 404);
    assert_eq!(text, "NOT_FOUND - no queue 'nope' in vhost '/'");
    assert!(c.status().connected());
}
