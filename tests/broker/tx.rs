//! Transactions: tx.select / commit / rollback over publishes and acks,
//! when work becomes visible, what a rollback or a close undoes, and the
//! tx / confirm mode errors.

use crate::common;
use crate::helpers;

use common::*;
use helpers::{
    bind, body, channel_closed, consumer, drain, expect_code, publish_with, take, wait_count,
    Errors,
};
use lapin::{options::*, types::FieldTable, BasicProperties};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_are_visible_only_after_commit() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    ch.tx_select().await.unwrap();
    publish(&ch, "", "q", b"1").await;
    publish(&ch, "", "q", b"2").await;
    // A round trip on the tx channel, then look from elsewhere.
    ch.basic_qos(0, BasicQosOptions::default()).await.unwrap();
    let other = c.create_channel().await.unwrap();
    assert!(get_body(&other, "q").await.is_none());
    assert_eq!(declare(&other, "q").await.message_count(), 0);
    ch.tx_commit().await.unwrap();
    // Committed: in the queue, in order.
    assert_eq!(declare(&other, "q").await.message_count(), 2);
    assert_eq!(drain(&other, "q").await, ["1", "2"]);
    // The channel stays transactional: the next publish waits for commit.
    publish(&ch, "", "q", b"3").await;
    ch.basic_qos(0, BasicQosOptions::default()).await.unwrap();
    assert!(get_body(&other, "q").await.is_none());
    ch.tx_commit().await.unwrap();
    assert_eq!(drain(&other, "q").await, ["3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_discards_publishes() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    ch.tx_select().await.unwrap();
    publish(&ch, "", "q", b"gone").await;
    ch.tx_rollback().await.unwrap();
    ch.tx_commit().await.unwrap();
    let other = c.create_channel().await.unwrap();
    assert!(get_body(&other, "q").await.is_none());
    // Later publishes commit normally.
    publish(&ch, "", "q", b"kept").await;
    ch.tx_commit().await.unwrap();
    assert_eq!(drain(&other, "q").await, ["kept"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncommitted_publishes_are_lost_when_the_channel_closes() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    ch.tx_select().await.unwrap();
    publish(&ch, "", "q", b"x").await;
    ch.close(200, "bye".into()).await.unwrap();
    let other = c.create_channel().await.unwrap();
    assert!(get_body(&other, "q").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_take_effect_at_commit() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    for i in 0..3u8 {
        publish(&ch, "", "q", &[b'0' + i]).await;
    }
    ch.tx_select().await.unwrap();
    let mut tags = Vec::new();
    for _ in 0..3 {
        let m = ch
            .basic_get("q".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("message");
        tags.push(m.delivery.delivery_tag);
    }
    ch.basic_ack(tags[0], BasicAckOptions::default())
        .await
        .unwrap();
    ch.basic_ack(tags[1], BasicAckOptions::default())
        .await
        .unwrap();
    ch.tx_commit().await.unwrap();
    // "0" and "1" are acked for good; "2" is still unacked and comes back
    // when the channel closes.
    ch.close(200, "bye".into()).await.unwrap();
    assert_eq!(wait_count(&c, "q", 1).await, 1);
    let other = c.create_channel().await.unwrap();
    assert_eq!(drain(&other, "q").await, ["2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncommitted_acks_are_undone_when_the_channel_closes() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    publish(&ch, "", "q", b"a").await;
    publish(&ch, "", "q", b"b").await;
    ch.tx_select().await.unwrap();
    let mut cons = consumer(&ch, "q", "c").await;
    let ds = take(&mut cons, 2).await;
    ch.basic_ack(ds[1].delivery_tag, BasicAckOptions { multiple: true })
        .await
        .unwrap();
    ch.close(200, "bye".into()).await.unwrap();
    assert_eq!(wait_count(&c, "q", 2).await, 2);
    let other = c.create_channel().await.unwrap();
    let m = other
        .basic_get("q".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.delivery.data, b"a");
    assert!(m.delivery.redelivered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_returns_acks_to_unacked() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    for m in [b"a", b"b", b"c"] {
        publish(&ch, "", "q", m).await;
    }
    ch.tx_select().await.unwrap();
    let mut cons = consumer(&ch, "q", "c").await;
    let ds = take(&mut cons, 3).await;
    ch.basic_ack(ds[0].delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    ch.basic_ack(ds[2].delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    ch.tx_rollback().await.unwrap();
    // The rolled-back acks' tags are valid again: ack "b" for real.
    ch.basic_ack(ds[1].delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    ch.tx_commit().await.unwrap();
    assert!(ch.status().connected());
    // "a" and "c" are unacked again: requeued when the channel closes.
    ch.close(200, "bye".into()).await.unwrap();
    assert_eq!(wait_count(&c, "q", 2).await, 2);
    let other = c.create_channel().await.unwrap();
    let mut got = Vec::new();
    while let Some(m) = other
        .basic_get("q".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        got.push((body(&m.delivery), m.delivery.redelivered));
    }
    assert_eq!(got, [("a".to_string(), true), ("c".to_string(), true)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_ack_can_be_acked_again_after_rollback() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    publish(&ch, "", "q", b"a").await;
    ch.tx_select().await.unwrap();
    let m = ch
        .basic_get("q".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .unwrap();
    let tag = m.delivery.delivery_tag;
    ch.basic_ack(tag, BasicAckOptions::default()).await.unwrap();
    ch.tx_rollback().await.unwrap();
    ch.basic_ack(tag, BasicAckOptions::default()).await.unwrap();
    ch.tx_commit().await.unwrap();
    ch.close(200, "bye".into()).await.unwrap();
    assert_eq!(wait_count(&c, "q", 0).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_in_tx_frees_prefetch_only_at_commit() {
    // The limiter hears of transactional acks when they are committed.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    ch.basic_qos(1, BasicQosOptions::default()).await.unwrap();
    ch.tx_select().await.unwrap();
    let mut cons = consumer(&ch, "q", "c").await;
    let pch = c.create_channel().await.unwrap();
    publish(&pch, "", "q", b"1").await;
    let d = take(&mut cons, 1).await;
    ch.basic_ack(d[0].delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    publish(&pch, "", "q", b"2").await;
    assert_no_delivery(&mut cons).await;
    ch.tx_commit().await.unwrap();
    let d = take(&mut cons, 1).await;
    assert_eq!(body(&d[0]), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_requeue_in_tx_happens_at_commit() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    publish(&ch, "", "q", b"a").await;
    ch.tx_select().await.unwrap();
    let m = ch
        .basic_get("q".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .unwrap();
    ch.basic_nack(
        m.delivery.delivery_tag,
        BasicNackOptions {
            multiple: false,
            requeue: true,
        },
    )
    .await
    .unwrap();
    ch.basic_qos(0, BasicQosOptions::default()).await.unwrap();
    let other = c.create_channel().await.unwrap();
    assert!(
        get_body(&other, "q").await.is_none(),
        "requeued before commit"
    );
    ch.tx_commit().await.unwrap();
    let m = other
        .basic_get("q".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("requeued at commit");
    assert!(m.delivery.redelivered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_in_tx_to_missing_exchange_fails_at_once() {
    // RabbitMQ looks the exchange up when the publish arrives, tx or not.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    ch.tx_select().await.unwrap();
    let mut errors = Errors::new(&c);
    publish(&ch, "nope", "k", b"x").await;
    let e = errors
        .next_error()
        .await
        .expect("channel closed before commit");
    assert_eq!(reply_code(&e), Some(404), "{e:?}");
    assert!(channel_closed(&ch).await);
    assert!(c.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_publish_is_routed_when_published() {
    // RabbitMQ routes a transactional publish when it arrives and delivers
    // to those queues at commit: unbinding in between changes nothing.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let admin = c.create_channel().await.unwrap();
    declare(&admin, "q").await;
    bind(&admin, "q", "amq.direct", "k", FieldTable::default()).await;
    ch.tx_select().await.unwrap();
    publish(&ch, "amq.direct", "k", b"m").await;
    ch.basic_qos(0, BasicQosOptions::default()).await.unwrap();
    admin
        .queue_unbind(
            "q".into(),
            "amq.direct".into(),
            "k".into(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    ch.tx_commit().await.unwrap();
    assert_eq!(drain(&admin, "q").await, ["m"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_in_tx_is_returned_at_commit() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    ch.tx_select().await.unwrap();
    publish_with(
        &ch,
        "",
        "nowhere",
        BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        },
        b"m",
        BasicProperties::default(),
    )
    .await;
    // Nothing is returned before the commit...
    ch.basic_qos(0, BasicQosOptions::default()).await.unwrap();
    assert!(ch.wait_for_confirms().await.unwrap().is_empty());
    // ... and the return precedes commit-ok.
    ch.tx_commit().await.unwrap();
    let returned = ch.wait_for_confirms().await.unwrap();
    assert_eq!(returned.len(), 1);
    assert_eq!(returned[0].reply_code, 312);
    assert_eq!(returned[0].delivery.data, b"m");
    assert!(ch.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_select_on_a_tx_channel_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    ch.tx_select().await.unwrap();
    let r = ch.confirm_select(ConfirmSelectOptions::default()).await;
    let text = expect_code(r, 406);
    assert_eq!(
        text,
        "PRECONDITION_FAILED - cannot switch from tx to confirm mode"
    );
    assert!(channel_closed(&ch).await);
    assert!(c.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_or_rollback_without_select_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let text = expect_code(ch.tx_commit().await, 406);
    assert_eq!(text, "PRECONDITION_FAILED - channel is not transactional");
    assert!(channel_closed(&ch).await);
    let ch = c.create_channel().await.unwrap();
    expect_code(ch.tx_rollback().await, 406);
    assert!(c.status().connected());
    // tx.select twice is fine.
    let ch = c.create_channel().await.unwrap();
    ch.tx_select().await.unwrap();
    ch.tx_select().await.unwrap();
    ch.tx_commit().await.unwrap();
}
