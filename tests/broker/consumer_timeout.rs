//! Consumer timeout, better than RabbitMQ's. A delivery unacked for longer
//! than the timeout (`consumer_timeout`; `x-consumer-timeout` on the queue,
//! or on basic.consume, which wins) is requeued and redelivered, and its
//! consumer gets a server-sent basic.cancel while the channel stays open
//! (RabbitMQ closes the channel with 406). A basic.get delivery that times
//! out is requeued silently; a late ack of a timed-out tag is ignored; a
//! client without consumer_cancel_notify gets RabbitMQ's 406 instead.

use crate::common;
use crate::helpers;

use std::time::Duration;

use amq_protocol::protocol::{basic as bm, AMQPClass};
use common::raw::{self, Raw};
use common::*;
use helpers::*;
use lapin::{options::*, types::FieldTable};

async fn broker(timeout_ms: u64) -> (TestBroker, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    c.consumer_timeout = timeout_ms;
    (start_with(c).await, tmp)
}

/// Waits (up to 10 s) for the next delivery.
async fn within_10s(c: &mut lapin::Consumer) -> Option<lapin::message::Delivery> {
    use futures::StreamExt;
    match tokio::time::timeout(Duration::from_secs(10), c.next()).await {
        Ok(Some(Ok(d))) => Some(d),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_delivery_is_requeued_and_its_consumer_cancelled() {
    let (b, _t) = broker(1000).await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "slow").await;
    publish(&ch, "", "slow", b"work").await;
    let (_c1, ch1) = b.channel().await;
    let mut first = consumer(&ch1, "slow", "first").await;
    let d = next(&mut first).await.expect("delivered");
    assert!(!d.redelivered);
    // Another consumer gets it once the first one's delivery timed out.
    let (_c2, ch2) = b.channel().await;
    let mut second = consumer(&ch2, "slow", "second").await;
    let again = within_10s(&mut second)
        .await
        .expect("requeued after the timeout");
    assert_eq!(again.data, b"work");
    assert!(again.redelivered);
    again.ack(BasicAckOptions::default()).await.unwrap();
    // The first consumer was cancelled; its late ack is ignored and its
    // channel stays open.
    d.ack(BasicAckOptions::default()).await.unwrap();
    declare(&ch1, "still-open").await;
    assert_eq!(message_count(&ch1, "slow").await, 0);
    publish(&ch, "", "slow", b"next").await;
    let n = within_10s(&mut second)
        .await
        .expect("the live consumer gets the rest");
    assert_eq!(n.data, b"next");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_get_is_requeued_silently_and_its_late_ack_ignored() {
    let (b, _t) = broker(1000).await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "got").await;
    publish(&ch, "", "got", b"once").await;
    let m = ch
        .basic_get("got".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("a message");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while message_count(&ch, "got").await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never requeued");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    m.delivery.ack(BasicAckOptions::default()).await.unwrap();
    let again = ch
        .basic_get("got".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("requeued");
    assert!(again.delivery.redelivered);
    assert_eq!(again.delivery.data, b"once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_argument_wins_over_the_queue_argument() {
    let (b, _t) = broker(0).await;
    let (_c, ch) = b.channel().await;
    let args = table(&[(
        "x-consumer-timeout",
        lapin::types::AMQPValue::LongLongInt(1000),
    )]);
    declare_with(&ch, "q", QueueDeclareOptions::default(), args)
        .await
        .unwrap();
    publish(&ch, "", "q", b"a").await;
    publish(&ch, "", "q", b"b").await;
    // Consumer argument 0: never times out, whatever the queue says.
    let (_c1, ch1) = b.channel().await;
    ch1.basic_qos(1, BasicQosOptions::default()).await.unwrap();
    let never = table(&[(
        "x-consumer-timeout",
        lapin::types::AMQPValue::LongLongInt(0),
    )]);
    let mut patient = consume(&ch1, "q", "patient", BasicConsumeOptions::default(), never).await;
    let d = next(&mut patient).await.expect("delivered");
    assert_eq!(d.data, b"a");
    // The queue's timeout applies to a consumer without its own.
    let (_c2, ch2) = b.channel().await;
    ch2.basic_qos(1, BasicQosOptions::default()).await.unwrap();
    let mut hasty = consumer(&ch2, "q", "hasty").await;
    let h = next(&mut hasty).await.expect("delivered");
    assert_eq!(h.data, b"b");
    let (_c3, ch3) = b.channel().await;
    let mut third = consumer(&ch3, "q", "third").await;
    let t = within_10s(&mut third)
        .await
        .expect("b times out under the queue's 1 s");
    assert_eq!(t.data, b"b");
    // a is still held by the patient consumer.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_no_delivery(&mut third).await;
    d.ack(BasicAckOptions::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_consumer_cancel_notify_the_channel_is_closed_with_406() {
    let (b, _t) = broker(1000).await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "old-client").await;
    publish(&ch, "", "old-client", b"x").await;
    // A raw client that announces no capabilities.
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    let t = r.start_and_tune("guest", "guest", false).await;
    r.send(&raw::tune_ok(t.channel_max, t.frame_max, 0)).await;
    r.send(&raw::connection_open("/")).await;
    r.expect_method().await;
    r.open_channel(1).await;
    r.send(&raw::method(
        1,
        AMQPClass::Basic(bm::AMQPMethod::Consume(bm::Consume {
            queue: "old-client".into(),
            consumer_tag: "c".into(),
            no_local: false,
            no_ack: false,
            exclusive: false,
            nowait: false,
            arguments: FieldTable::default(),
        })),
    ))
    .await;
    let close = r.expect_channel_close(1).await;
    assert_eq!(close.reply_code, 406);
    assert_eq!(
        close.reply_text.as_str(),
        "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: 1000 ms. \
         This timeout value can be configured, see consumers doc guide to learn more"
    );
    // The message is back.
    assert_eq!(
        get_eventually(&ch, "old-client").await.as_deref(),
        Some(&b"x"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_hears_basic_cancel_and_the_channel_stays_open() {
    let (b, _t) = broker(1000).await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "heard").await;
    publish(&ch, "", "heard", b"x").await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&raw::method(
        1,
        AMQPClass::Basic(bm::AMQPMethod::Consume(bm::Consume {
            queue: "heard".into(),
            consumer_tag: "mine".into(),
            no_local: false,
            no_ack: false,
            exclusive: false,
            nowait: false,
            arguments: FieldTable::default(),
        })),
    ))
    .await;
    let mut cancelled = false;
    for _ in 0..10 {
        let f = r.expect_frame().await;
        if let Some(AMQPClass::Basic(bm::AMQPMethod::Cancel(c))) = f.method() {
            assert_eq!(c.consumer_tag.as_str(), "mine");
            cancelled = true;
            break;
        }
    }
    assert!(cancelled, "basic.cancel after the timeout");
    // The channel is open: a declare on it is answered.
    r.send(&raw::queue_declare(1, "heard", true, false, false))
        .await;
    let (c, m) = r.expect_method().await;
    assert_eq!(c, 1);
    assert!(
        matches!(
            m,
            AMQPClass::Queue(amq_protocol::protocol::queue::AMQPMethod::DeclareOk(_))
        ),
        "{m:?}"
    );
}
