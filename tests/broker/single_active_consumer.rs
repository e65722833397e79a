//! Single active consumer take-over, however the active consumer leaves:
//! the active one (prefetch 1, never acks) holds message 0 while 1..4 wait;
//! the next one (no prefetch limit) must get 0 (redelivered), 1, 2, 3, 4,
//! as RabbitMQ 3.10 delivers them. A client may leave by channel.close
//! alone (a raw client), by dropping the connection with its channels open,
//! or by basic.cancel and then channel.close (pika's BlockingChannel.close
//! cancels its consumers first). A consumer cancelled while it holds
//! deliveries hands over once they are settled.

use crate::common;
use crate::helpers;

use std::net::SocketAddr;

use amq_protocol::protocol::{basic, channel, AMQPClass};
use common::raw::{self, Raw, FRAME_BODY};
use common::*;
use helpers::*;
use lapin::{options::*, types::AMQPValue};

/// Declares a single-active-consumer queue.
async fn declare_sac(b: &TestBroker, name: &str) -> (lapin::Connection, lapin::Channel) {
    let (c, ch) = b.channel().await;
    declare_with(
        &ch,
        name,
        QueueDeclareOptions::default(),
        table(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
    )
    .await
    .unwrap();
    (c, ch)
}

/// The waiting consumer (on its own connection, no prefetch limit).
async fn waiting(b: &TestBroker, queue: &str) -> lapin::Consumer {
    let ch = b.connect().await.create_channel().await.unwrap();
    consumer(&ch, queue, "second").await
}

async fn publish_five(ch: &lapin::Channel, queue: &str) {
    for i in 0..5u8 {
        publish(ch, "", queue, &[i]).await;
    }
}

/// The next `n` deliveries as (first body byte, redelivered).
async fn order(c: &mut lapin::Consumer, n: usize) -> Vec<(u8, bool)> {
    take(c, n)
        .await
        .iter()
        .map(|d| (d.data[0], d.redelivered))
        .collect()
}

const RABBITMQ_ORDER: [(u8, bool); 5] = [(0, true), (1, false), (2, false), (3, false), (4, false)];

/// A raw client's consumer with prefetch 1 on channel 1, holding the
/// first delivery (message 0) unacked.
async fn raw_active(addr: SocketAddr, queue: &str) -> Raw {
    let mut r = Raw::open(addr).await;
    r.open_channel(1).await;
    r.send(&raw::method(
        1,
        AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
            prefetch_count: 1,
            global: false,
        })),
    ))
    .await;
    let (_, m) = r.expect_method().await;
    assert!(matches!(m, AMQPClass::Basic(basic::AMQPMethod::QosOk(_))));
    r.send(&raw::method(
        1,
        AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
            queue: queue.into(),
            consumer_tag: "first".into(),
            no_local: false,
            no_ack: false,
            exclusive: false,
            nowait: false,
            arguments: Default::default(),
        })),
    ))
    .await;
    let (_, m) = r.expect_method().await;
    assert!(matches!(
        m,
        AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(_))
    ));
    r
}

/// Reads the raw consumer's delivery: its body.
async fn raw_delivery(r: &mut Raw) -> Vec<u8> {
    let (_, m) = r.expect_method().await;
    assert!(
        matches!(m, AMQPClass::Basic(basic::AMQPMethod::Deliver(_))),
        "expected basic.deliver, got {m:?}"
    );
    r.expect_frame().await; // the content header
    let body = r.expect_frame().await;
    assert_eq!(body.kind, FRAME_BODY);
    body.payload
}

/// A lapin consumer with prefetch 1 on "sac", active and holding message
/// 0 of the five published, and the waiting one: (its channel, the
/// delivery, the waiting consumer).
async fn lapin_active(
    b: &TestBroker,
    ch: &lapin::Channel,
) -> (lapin::Channel, lapin::message::Delivery, lapin::Consumer) {
    let ch1 = b.connect().await.create_channel().await.unwrap();
    ch1.basic_qos(1, BasicQosOptions::default()).await.unwrap();
    let mut first = consumer(&ch1, "sac", "first").await;
    let second = waiting(b, "sac").await;
    publish_five(ch, "sac").await;
    let d = next(&mut first).await.expect("the active consumer");
    assert_eq!(d.data, [0]);
    (ch1, d, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_client_closing_its_channel_hands_over_in_order() {
    let b = start().await;
    let (_c, ch) = declare_sac(&b, "sac").await;
    let mut first = raw_active(b.addr, "sac").await;
    let mut second = waiting(&b, "sac").await;
    publish_five(&ch, "sac").await;
    assert_eq!(raw_delivery(&mut first).await, [0]);
    assert_no_delivery(&mut second).await;
    // channel.close with the consumer still on it, no basic.cancel.
    first
        .send(&raw::method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
                reply_code: 200,
                reply_text: "bye".into(),
                class_id: 0,
                method_id: 0,
            })),
        ))
        .await;
    let (_, m) = first.expect_method().await;
    assert!(matches!(
        m,
        AMQPClass::Channel(channel::AMQPMethod::CloseOk(_))
    ));
    assert_eq!(order(&mut second, 5).await, RABBITMQ_ORDER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_client_dropping_its_connection_hands_over_in_order() {
    let b = start().await;
    let (_c, ch) = declare_sac(&b, "sac").await;
    let mut first = raw_active(b.addr, "sac").await;
    let mut second = waiting(&b, "sac").await;
    publish_five(&ch, "sac").await;
    assert_eq!(raw_delivery(&mut first).await, [0]);
    // The socket goes with the channel still open: no close of any kind.
    drop(first);
    assert_eq!(order(&mut second, 5).await, RABBITMQ_ORDER);
}

/// pika's BlockingChannel.close: basic.cancel of every consumer, then
/// channel.close. Warren used to hand 1..4 over at the cancel, and 0 after
/// the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_then_close_hands_over_in_order() {
    let b = start().await;
    let (_c, ch) = declare_sac(&b, "sac").await;
    let (ch1, _held, mut second) = lapin_active(&b, &ch).await;
    ch1.basic_cancel("first".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    ch1.close(200, "bye".into()).await.unwrap();
    assert_eq!(order(&mut second, 5).await, RABBITMQ_ORDER);
}

/// A cancelled active consumer that keeps its channel open holds the queue
/// until it settles what it holds: nothing reaches the next one meanwhile
/// (not even what is published after the cancel); an ack hands over the
/// rest, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_active_consumer_hands_over_once_it_acks() {
    let b = start().await;
    let (_c, ch) = declare_sac(&b, "sac").await;
    let (ch1, d, mut second) = lapin_active(&b, &ch).await;
    ch1.basic_cancel("first".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    publish(&ch, "", "sac", &[5]).await;
    assert_no_delivery(&mut second).await;
    d.acker.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(
        order(&mut second, 5).await,
        [(1, false), (2, false), (3, false), (4, false), (5, false)]
    );
    assert!(ch1.status().connected(), "the first channel stays open");
}
