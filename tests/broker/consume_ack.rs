//! Consumers and acknowledgements: round-robin, FIFO, basic.qos (per
//! consumer and per channel), ack / nack / reject, requeue order and the
//! redelivered flag, requeue on channel and connection close, recover,
//! consumer tags, exclusive consumers, cancel (client and server sent),
//! no-ack consumers and consumer priorities.

use crate::common;
use crate::helpers;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use helpers::{
    body, channel_closed, connection_closed, consume, consumer, declare_with, drain, expect_code,
    reply_text, table, take, wait_count, Errors,
};
use lapin::{
    options::*,
    types::{AMQPValue, FieldTable},
    Channel,
};

/// Publishes bodies "0".."n-1" (as text) to `queue` via the default exchange.
async fn publish_n(ch: &Channel, queue: &str, n: usize) {
    for i in 0..n {
        publish(ch, "", queue, i.to_string().as_bytes()).await;
    }
}

fn bodies(ds: &[lapin::message::Delivery]) -> Vec<String> {
    ds.iter().map(body).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_across_two_consumers() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    let mut c1 = consumer(&ch, "q", "c1").await;
    let mut c2 = consumer(&ch, "q", "c2").await;
    publish_n(&ch, "q", 10).await;
    let a = bodies(&take(&mut c1, 5).await);
    let b2 = bodies(&take(&mut c2, 5).await);
    assert_no_delivery(&mut c1).await;
    assert_no_delivery(&mut c2).await;
    let evens: Vec<String> = (0..10).step_by(2).map(|i: usize| i.to_string()).collect();
    let odds: Vec<String> = (1..10).step_by(2).map(|i: usize| i.to_string()).collect();
    assert!(
        (a == evens && b2 == odds) || (a == odds && b2 == evens),
        "not round-robin: c1 {a:?}, c2 {b2:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_receives_in_fifo_order() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    publish_n(&ch, "q", 50).await;
    let mut cons = consumer(&ch, "q", "c").await;
    publish(&ch, "", "q", b"50").await;
    let got = take(&mut cons, 51).await;
    let want: Vec<String> = (0..51).map(|i| i.to_string()).collect();
    assert_eq!(bodies(&got), want);
    // Delivery tags count up from 1 on the channel.
    let tags: Vec<u64> = got.iter().map(|d| d.delivery_tag).collect();
    assert_eq!(tags, (1..=51).collect::<Vec<u64>>());
    assert!(got.iter().all(|d| !d.redelivered));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_per_consumer_limits_unacked() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    ch.basic_qos(2, BasicQosOptions { global: false })
        .await
        .unwrap();
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 5).await;
    let first = take(&mut cons, 2).await;
    assert_eq!(bodies(&first), ["0", "1"]);
    assert_no_delivery(&mut cons).await;
    // One ack lets one more through.
    first[0].ack(BasicAckOptions::default()).await.unwrap();
    let third = take(&mut cons, 1).await;
    assert_eq!(bodies(&third), ["2"]);
    assert_no_delivery(&mut cons).await;
    // A multiple ack frees both slots.
    ch.basic_ack(third[0].delivery_tag, BasicAckOptions { multiple: true })
        .await
        .unwrap();
    let rest = take(&mut cons, 2).await;
    assert_eq!(bodies(&rest), ["3", "4"]);
    // 2 remain unacked; the queue holds nothing ready.
    assert_eq!(wait_count(&b.connect().await, "q", 0).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_per_consumer_applies_to_each_consumer_and_only_new_ones() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    declare(&ch, "early").await;
    // Created before basic.qos: unlimited.
    let mut early = consumer(&ch, "early", "early").await;
    ch.basic_qos(1, BasicQosOptions { global: false })
        .await
        .unwrap();
    let mut c1 = consumer(&ch, "q", "c1").await;
    let mut c2 = consumer(&ch, "q", "c2").await;
    publish_n(&ch, "q", 4).await;
    publish_n(&ch, "early", 3).await;
    // Each of c1, c2 holds one.
    let d1 = take(&mut c1, 1).await;
    let d2 = take(&mut c2, 1).await;
    assert_no_delivery(&mut c1).await;
    assert_no_delivery(&mut c2).await;
    let mut both = bodies(&d1);
    both.extend(bodies(&d2));
    both.sort();
    assert_eq!(both, ["0", "1"]);
    // The early consumer is not limited.
    assert_eq!(bodies(&take(&mut early, 3).await), ["0", "1", "2"]);
    d1[0].ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(take(&mut c1, 1).await.len(), 1);
    assert_no_delivery(&mut c2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_global_is_shared_by_the_channel() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q1").await;
    declare(&ch, "q2").await;
    ch.basic_qos(3, BasicQosOptions { global: true })
        .await
        .unwrap();
    let mut c1 = consumer(&ch, "q1", "c1").await;
    let mut c2 = consumer(&ch, "q2", "c2").await;
    publish_n(&ch, "q1", 5).await;
    publish_n(&ch, "q2", 5).await;
    // Three in total across both consumers.
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while got.len() < 3 && tokio::time::Instant::now() < deadline {
        tokio::select! {
            Some(Ok(d)) = c1.next() => got.push(d),
            Some(Ok(d)) = c2.next() => got.push(d),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    assert_eq!(got.len(), 3);
    assert_no_delivery(&mut c1).await;
    assert_no_delivery(&mut c2).await;
    // Acking one lets exactly one more through, to either consumer.
    got[0].ack(BasicAckOptions::default()).await.unwrap();
    let more = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            Some(Ok(d)) = c1.next() => d,
            Some(Ok(d)) = c2.next() => d,
        }
    })
    .await
    .expect("one more delivery after an ack");
    drop(more);
    assert_no_delivery(&mut c1).await;
    assert_no_delivery(&mut c2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_global_and_per_consumer_together() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    ch.basic_qos(2, BasicQosOptions { global: false })
        .await
        .unwrap();
    ch.basic_qos(3, BasicQosOptions { global: true })
        .await
        .unwrap();
    let mut c1 = consumer(&ch, "q", "c1").await;
    publish_n(&ch, "q", 10).await;
    // c1 is held at 2 by its own limit.
    take(&mut c1, 2).await;
    assert_no_delivery(&mut c1).await;
    // A second consumer only gets the one left under the channel limit.
    let mut c2 = consumer(&ch, "q", "c2").await;
    take(&mut c2, 1).await;
    assert_no_delivery(&mut c2).await;
    assert_no_delivery(&mut c1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_multiple_and_ack_all() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 6).await;
    let ds = take(&mut cons, 6).await;
    // Ack 1..=3 at once.
    ch.basic_ack(ds[2].delivery_tag, BasicAckOptions { multiple: true })
        .await
        .unwrap();
    // Tag 0 with multiple: everything outstanding (4..=6) ... except we
    // first nack 6 with requeue so it comes back.
    ch.basic_nack(
        ds[5].delivery_tag,
        BasicNackOptions {
            multiple: false,
            requeue: true,
        },
    )
    .await
    .unwrap();
    let again = take(&mut cons, 1).await;
    assert_eq!(body(&again[0]), "5");
    assert!(again[0].redelivered);
    ch.basic_ack(0, BasicAckOptions { multiple: true })
        .await
        .unwrap();
    // Nothing is left unacked: closing the channel requeues nothing.
    ch.close(200, "bye".into()).await.unwrap();
    assert_eq!(wait_count(&c, "q", 0).await, 0);
    let ch = c.create_channel().await.unwrap();
    assert!(drain(&ch, "q").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_puts_messages_back_in_their_original_position() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    publish_n(&ch, "q", 5).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(
            ch.basic_get("q".into(), BasicGetOptions { no_ack: false })
                .await
                .unwrap()
                .expect("message"),
        );
    }
    let tag = |i: usize| got[i].delivery.delivery_tag;
    // reject "1" with requeue: it goes back ahead of "3" and "4".
    ch.basic_reject(tag(1), BasicRejectOptions { requeue: true })
        .await
        .unwrap();
    // nack "0" and "2" (multiple up to "2") with requeue.
    ch.basic_nack(
        tag(2),
        BasicNackOptions {
            multiple: true,
            requeue: true,
        },
    )
    .await
    .unwrap();
    let mut order = Vec::new();
    while let Some(m) = ch
        .basic_get("q".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        order.push((body(&m.delivery), m.delivery.redelivered));
    }
    assert_eq!(
        order,
        [
            ("0".to_string(), true),
            ("1".to_string(), true),
            ("2".to_string(), true),
            ("3".to_string(), false),
            ("4".to_string(), false),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_to_consumer_redelivers_with_flag() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 2).await;
    let ds = take(&mut cons, 2).await;
    ds[0]
        .nack(BasicNackOptions {
            multiple: false,
            requeue: true,
        })
        .await
        .unwrap();
    let again = take(&mut cons, 1).await;
    assert_eq!(body(&again[0]), "0");
    assert!(again[0].redelivered);
    assert!(again[0].delivery_tag > ds[1].delivery_tag, "a new tag");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_and_reject_without_requeue_drop() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 4).await;
    let ds = take(&mut cons, 4).await;
    ds[0]
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    ch.basic_nack(
        ds[3].delivery_tag,
        BasicNackOptions {
            multiple: true,
            requeue: false,
        },
    )
    .await
    .unwrap();
    assert_no_delivery(&mut cons).await;
    ch.close(200, "bye".into()).await.unwrap();
    assert_eq!(wait_count(&c, "q", 0).await, 0);
    let ch = c.create_channel().await.unwrap();
    assert!(drain(&ch, "q").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_of_unknown_delivery_tag_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let mut errors = Errors::new(&c);
    ch.basic_ack(99, BasicAckOptions::default()).await.unwrap();
    let e = errors.next_error().await.expect("channel error");
    assert_eq!(reply_code(&e), Some(406), "{e:?}");
    assert_eq!(
        reply_text(&e).unwrap(),
        "PRECONDITION_FAILED - unknown delivery tag 99"
    );
    assert!(channel_closed(&ch).await);
    assert!(c.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_ack_is_406_and_requeues_the_rest() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 3).await;
    let ds = take(&mut cons, 3).await;
    let mut errors = Errors::new(&c);
    ch.basic_ack(ds[0].delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    ch.basic_ack(ds[0].delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    let code = errors.next_code().await;
    assert_eq!(code, Some(406));
    assert!(channel_closed(&ch).await);
    assert!(c.status().connected());
    // The channel's other unacked deliveries were requeued.
    assert_eq!(wait_count(&c, "q", 2).await, 2);
    let ch = c.create_channel().await.unwrap();
    let m = ch
        .basic_get("q".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body(&m.delivery), "1");
    assert!(m.delivery.redelivered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_multiple_of_unknown_tag_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 2).await;
    let ds = take(&mut cons, 2).await;
    let mut errors = Errors::new(&c);
    ch.basic_ack(ds[1].delivery_tag + 5, BasicAckOptions { multiple: true })
        .await
        .unwrap();
    assert_eq!(errors.next_code().await, Some(406));
    assert!(channel_closed(&ch).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_channel_requeues_unacked_in_order() {
    let b = start().await;
    let c = b.connect().await;
    let ch1 = c.create_channel().await.unwrap();
    let ch2 = c.create_channel().await.unwrap();
    declare(&ch1, "q").await;
    let mut cons1 = consumer(&ch1, "q", "c1").await;
    publish_n(&ch1, "q", 5).await;
    let ds = take(&mut cons1, 5).await;
    ds[1].ack(BasicAckOptions::default()).await.unwrap();
    ds[3].ack(BasicAckOptions::default()).await.unwrap();
    ch1.close(200, "bye".into()).await.unwrap();

    let mut cons2 = consumer(&ch2, "q", "c2").await;
    publish(&ch2, "", "q", b"5").await;
    let got = take(&mut cons2, 4).await;
    let seen: Vec<(String, bool)> = got.iter().map(|d| (body(d), d.redelivered)).collect();
    assert_eq!(
        seen,
        [
            ("0".to_string(), true),
            ("2".to_string(), true),
            ("4".to_string(), true),
            ("5".to_string(), false),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_connection_requeues_unacked_in_order() {
    let b = start().await;
    let watcher = b.connect().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    ch.basic_qos(3, BasicQosOptions::default()).await.unwrap();
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 5).await;
    let ds = take(&mut cons, 3).await;
    ds[0].ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(take(&mut cons, 1).await.len(), 1);
    // Unacked now: "1", "2", "3"; ready: "4".
    c.close(200, "bye".into()).await.unwrap();

    assert_eq!(wait_count(&watcher, "q", 4).await, 4);
    let wch = watcher.create_channel().await.unwrap();
    let mut order = Vec::new();
    while let Some(m) = wch
        .basic_get("q".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        order.push((body(&m.delivery), m.delivery.redelivered));
    }
    assert_eq!(
        order,
        [
            ("1".to_string(), true),
            ("2".to_string(), true),
            ("3".to_string(), true),
            ("4".to_string(), false),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_error_requeues_unacked() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 2).await;
    take(&mut cons, 2).await;
    // A soft error closes the channel; its deliveries go back.
    let r = declare_with(
        &ch,
        "missing",
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await;
    expect_code(r, 404);
    assert_eq!(wait_count(&c, "q", 2).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_recover_requeue_redelivers() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 3).await;
    let first = take(&mut cons, 3).await;
    assert!(first.iter().all(|d| !d.redelivered));
    ch.basic_recover(BasicRecoverOptions { requeue: true })
        .await
        .unwrap();
    let again = take(&mut cons, 3).await;
    assert_eq!(bodies(&again), ["0", "1", "2"]);
    assert!(again.iter().all(|d| d.redelivered));
    // The old tags are gone; the new ones work.
    for d in &again {
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    assert_no_delivery(&mut cons).await;
    assert!(ch.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_consumer_tag() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    let c1 = consumer(&ch, "q", "").await;
    let c2 = consumer(&ch, "q", "").await;
    let (t1, t2) = (c1.tag(), c2.tag());
    assert!(t1.as_str().starts_with("amq.ctag-"), "{t1:?}");
    assert!(t2.as_str().starts_with("amq.ctag-"), "{t2:?}");
    assert_ne!(t1, t2);
    let q = declare(&ch, "q").await;
    assert_eq!(q.consumer_count(), 2);
    // The generated tag names the consumer for cancel.
    ch.basic_cancel(t1.clone(), BasicCancelOptions::default())
        .await
        .unwrap();
    let q = declare(&ch, "q").await;
    assert_eq!(q.consumer_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_consumer_refuses_others() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let _ex = consume(
        &ch,
        "q",
        "ex",
        BasicConsumeOptions {
            exclusive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await;
    let ch2 = c.create_channel().await.unwrap();
    let r = ch2
        .basic_consume(
            "q".into(),
            "other".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
    let text = expect_code(r, 403);
    assert_eq!(
        text,
        "ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use"
    );
    assert!(c.status().connected());

    // The other way round: an exclusive consumer on a queue that has one.
    let ch3 = c.create_channel().await.unwrap();
    declare(&ch3, "q2").await;
    let _plain = consumer(&ch3, "q2", "plain").await;
    let ch4 = c.create_channel().await.unwrap();
    let r = ch4
        .basic_consume(
            "q2".into(),
            "ex2".into(),
            BasicConsumeOptions {
                exclusive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    expect_code(r, 403);

    // Once the exclusive consumer cancels, others may consume.
    ch.basic_cancel("ex".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    let ch5 = c.create_channel().await.unwrap();
    let _ok = consumer(&ch5, "q", "after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reusing_a_consumer_tag_closes_the_connection_with_530() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    declare(&ch, "q2").await;
    let _c1 = consumer(&ch, "q", "dup").await;
    let r = ch
        .basic_consume(
            "q2".into(),
            "dup".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
    let text = expect_code(r, 530);
    assert_eq!(text, "NOT_ALLOWED - attempt to reuse consumer tag 'dup'");
    assert!(connection_closed(&c).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_consumer_tag_on_two_channels_is_fine() {
    let b = start().await;
    let c = b.connect().await;
    let ch1 = c.create_channel().await.unwrap();
    let ch2 = c.create_channel().await.unwrap();
    declare(&ch1, "q").await;
    let _a = consumer(&ch1, "q", "same").await;
    let _b = consumer(&ch2, "q", "same").await;
    assert_eq!(declare(&ch1, "q").await.consumer_count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_cancel_stops_deliveries_and_keeps_unacked() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 2).await;
    let ds = take(&mut cons, 2).await;
    ch.basic_cancel("c".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    // The consumer's stream ends.
    let end = tokio::time::timeout(Duration::from_secs(5), cons.next()).await;
    assert!(
        matches!(end, Ok(None)),
        "consumer stream did not end: {end:?}"
    );
    publish(&ch, "", "q", b"after").await;
    assert_eq!(wait_count(&c, "q", 1).await, 1);
    // Deliveries made before the cancel can still be acked.
    ds[0].ack(BasicAckOptions::default()).await.unwrap();
    ds[1]
        .nack(BasicNackOptions {
            multiple: false,
            requeue: true,
        })
        .await
        .unwrap();
    assert_eq!(wait_count(&c, "q", 2).await, 2);
    assert!(ch.status().connected());
    assert_eq!(drain(&ch, "q").await, ["1", "after"]);
    // Cancelling an unknown tag is not an error.
    ch.basic_cancel("nope".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    assert!(ch.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_queue_cancels_its_consumers() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    let other = b.connect().await;
    let och = other.create_channel().await.unwrap();
    och.queue_delete("q".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    // lapin advertises consumer_cancel_notify: the server's basic.cancel
    // ends the consumer's stream.
    let end = tokio::time::timeout(Duration::from_secs(5), cons.next()).await;
    assert!(
        matches!(end, Ok(None)),
        "consumer stream did not end: {end:?}"
    );
    // The channel stays open.
    assert!(ch.status().connected());
    declare(&ch, "q2").await;
    assert!(ch.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_tag_is_free_again_after_a_server_cancel() {
    // RabbitMQ forgets a consumer its queue cancelled: the tag can be used
    // again on the same channel.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    let och = c.create_channel().await.unwrap();
    och.queue_delete("q".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), cons.next()).await;
    assert!(
        matches!(end, Ok(None)),
        "consumer stream did not end: {end:?}"
    );
    declare(&ch, "q").await;
    let r = ch
        .basic_consume(
            "q".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
    assert!(r.is_ok(), "reusing a cancelled consumer's tag: {r:?}");
    assert!(c.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ack_consumer() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    // basic.qos does not limit no-ack consumers.
    ch.basic_qos(1, BasicQosOptions::default()).await.unwrap();
    let mut cons = consume(
        &ch,
        "q",
        "c",
        BasicConsumeOptions {
            no_ack: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await;
    publish_n(&ch, "q", 5).await;
    assert_eq!(bodies(&take(&mut cons, 5).await), ["0", "1", "2", "3", "4"]);
    // Nothing to requeue when the channel closes.
    ch.close(200, "bye".into()).await.unwrap();
    assert_eq!(wait_count(&c, "q", 0).await, 0);
    let ch = c.create_channel().await.unwrap();
    assert!(drain(&ch, "q").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_priorities() {
    let b = start().await;
    let c = b.connect().await;
    let lch = c.create_channel().await.unwrap();
    let hch = c.create_channel().await.unwrap();
    declare(&lch, "q").await;
    // Low priority first, so registration order cannot explain the result.
    let mut low = consumer(&lch, "q", "low").await;
    hch.basic_qos(2, BasicQosOptions::default()).await.unwrap();
    let mut high = consume(
        &hch,
        "q",
        "high",
        BasicConsumeOptions::default(),
        table(&[("x-priority", AMQPValue::LongInt(10))]),
    )
    .await;
    publish_n(&lch, "q", 5).await;
    // The high-priority consumer takes what its credit allows, the rest
    // goes to the low-priority one.
    let h = take(&mut high, 2).await;
    assert_eq!(bodies(&h), ["0", "1"]);
    assert_eq!(bodies(&take(&mut low, 3).await), ["2", "3", "4"]);
    assert_no_delivery(&mut high).await;
    // With credit again, the high-priority consumer gets new messages.
    for d in &h {
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    publish_n(&lch, "q", 2).await;
    assert_eq!(bodies(&take(&mut high, 2).await), ["0", "1"]);
    assert_no_delivery(&mut low).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_from_missing_queue_is_404() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = ch
        .basic_consume(
            "nope".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
    let text = expect_code(r, 404);
    assert_eq!(text, "NOT_FOUND - no queue 'nope' in vhost '/'");
    assert!(c.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_recover_without_requeue_is_not_implemented() {
    // RabbitMQ: "NOT_IMPLEMENTED - requeue=false", a connection error.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = ch
        .basic_recover(BasicRecoverOptions { requeue: false })
        .await;
    expect_code(r, 540);
    assert!(connection_closed(&c).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_after_the_queue_was_deleted_is_fine() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let mut cons = consumer(&ch, "q", "c").await;
    publish_n(&ch, "q", 1).await;
    let d = take(&mut cons, 1).await;
    let och = c.create_channel().await.unwrap();
    och.queue_delete("q".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    ch.basic_ack(d[0].delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    // The channel is still fine: a synchronous round trip works.
    ch.basic_qos(5, BasicQosOptions::default()).await.unwrap();
    assert!(ch.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_tag_reuse_is_checked_before_the_queue() {
    // RabbitMQ looks the tag up first: reusing it is 530 even when the
    // named queue does not exist.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let _c1 = consumer(&ch, "q", "dup").await;
    let r = ch
        .basic_consume(
            "missing".into(),
            "dup".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
    expect_code(r, 530);
    assert!(connection_closed(&c).await);
}
