//! queue.unbind and exchange.unbind follow RabbitMQ 3.10's rules
//! (rabbit_binding:remove, rabbit_channel:binding_action): unbind-ok when
//! the source exchange, the destination or the binding does not exist; the
//! default exchange on either side is 403; another connection's exclusive
//! queue is 405 only if the binding exists. Warren used to answer a
//! missing exchange or queue with 404.

use crate::common;
use crate::helpers;

use common::*;
use helpers::*;
use lapin::{options::*, types::FieldTable, Channel};

async fn queue_unbind(
    ch: &Channel,
    queue: &str,
    exchange: &str,
    key: &str,
) -> Result<(), lapin::Error> {
    ch.queue_unbind(
        queue.into(),
        exchange.into(),
        key.into(),
        FieldTable::default(),
    )
    .await
}

async fn exchange_unbind(ch: &Channel, dest: &str, source: &str) -> Result<(), lapin::Error> {
    ch.exchange_unbind(
        dest.into(),
        source.into(),
        "k".into(),
        ExchangeUnbindOptions::default(),
        FieldTable::default(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbinding_what_does_not_exist_is_ok() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    exchange(
        &ch,
        "x",
        lapin::ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    queue_unbind(&ch, "q", "no-such-exchange", "k")
        .await
        .expect("missing source exchange");
    queue_unbind(&ch, "no-such-queue", "x", "k")
        .await
        .expect("missing queue");
    queue_unbind(&ch, "q", "x", "never-bound")
        .await
        .expect("missing binding");
    exchange_unbind(&ch, "x", "no-such-exchange")
        .await
        .expect("missing source");
    exchange_unbind(&ch, "no-such-exchange", "x")
        .await
        .expect("missing destination");
    exchange_unbind(&ch, "x", "amq.direct")
        .await
        .expect("missing binding");
    // A real binding still goes.
    bind(&ch, "q", "x", "k", FieldTable::default()).await;
    queue_unbind(&ch, "q", "x", "k").await.unwrap();
    publish(&ch, "x", "k", b"gone").await;
    assert_eq!(message_count(&ch, "q").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_exchange_on_either_side_is_403() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let e = queue_unbind(&ch, "q", "", "q").await.unwrap_err();
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("ACCESS_REFUSED - operation not permitted on the default exchange")
    );
    for (dest, source) in [("amq.direct", ""), ("", "amq.direct"), ("", "")] {
        let ch = c.create_channel().await.unwrap();
        let e = exchange_unbind(&ch, dest, source).await.unwrap_err();
        assert_eq!(reply_code(&e), Some(403), "{dest:?} <- {source:?}: {e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_connections_exclusive_queue_is_405_only_if_bound() {
    let b = start().await;
    let (_owner, och) = b.channel().await;
    och.queue_declare(
        "mine".into(),
        QueueDeclareOptions {
            exclusive: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    bind(&och, "mine", "amq.direct", "bound", FieldTable::default()).await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    queue_unbind(&ch, "mine", "amq.direct", "not-bound")
        .await
        .expect("no such binding: unbind-ok");
    let e = queue_unbind(&ch, "mine", "amq.direct", "bound")
        .await
        .unwrap_err();
    assert_eq!(reply_code(&e), Some(405), "{e:?}");
    // The binding is still there.
    publish(&och, "amq.direct", "bound", b"still").await;
    assert_eq!(message_count(&och, "mine").await, 1);
}
