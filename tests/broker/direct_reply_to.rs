//! Direct reply-to, as RabbitMQ documents it: the requester consumes from
//! `amq.rabbitmq.reply-to` (no-ack) and publishes its request on that
//! channel with reply_to = `amq.rabbitmq.reply-to`; the broker rewrites
//! reply_to to `amq.rabbitmq.reply-to.<token>`, and the responder's reply
//! to the default exchange with that key goes straight to the requester's
//! consumer, with no queue. Misuse gets RabbitMQ's 406s; a reply to a
//! consumer that is gone is dropped; declaring the pseudo-queue answers
//! ok (0 messages, 1 consumer), a dead token 404.

use crate::common;
use crate::helpers;

use common::*;
use helpers::*;
use lapin::{options::*, types::FieldTable, BasicProperties};

const PSEUDO: &str = "amq.rabbitmq.reply-to";

fn no_ack() -> BasicConsumeOptions {
    BasicConsumeOptions {
        no_ack: true,
        ..BasicConsumeOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_and_its_reply_go_without_a_queue() {
    let b = start().await;
    let (_rc, responder) = b.channel().await;
    declare(&responder, "rpc").await;
    let mut requests = consumer(&responder, "rpc", "server").await;

    let (_qc, requester) = b.channel().await;
    let mut replies = consume(
        &requester,
        PSEUDO,
        "client",
        no_ack(),
        FieldTable::default(),
    )
    .await;
    requester
        .basic_publish(
            "".into(),
            "rpc".into(),
            BasicPublishOptions::default(),
            b"2+2",
            BasicProperties::default()
                .with_reply_to(PSEUDO.into())
                .with_correlation_id("c1".into()),
        )
        .await
        .unwrap();
    let req = next(&mut requests).await.expect("the request");
    let reply_to = req
        .properties
        .reply_to()
        .as_ref()
        .map(|s| s.as_str().to_string())
        .expect("reply_to");
    assert!(
        reply_to.starts_with("amq.rabbitmq.reply-to.") && reply_to.len() > PSEUDO.len() + 16,
        "reply_to rewritten to a token: {reply_to}"
    );
    assert_eq!(
        req.properties.correlation_id().as_ref().map(|s| s.as_str()),
        Some("c1"),
        "other properties kept"
    );
    req.ack(BasicAckOptions::default()).await.unwrap();
    // A declare of the reply-to name: it is there.
    let ok = responder
        .queue_declare(
            reply_to.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!((ok.message_count(), ok.consumer_count()), (0, 1));
    responder
        .basic_publish(
            "".into(),
            reply_to.as_str().into(),
            BasicPublishOptions::default(),
            b"4",
            BasicProperties::default().with_correlation_id("c1".into()),
        )
        .await
        .unwrap();
    let reply = next(&mut replies).await.expect("the reply");
    assert_eq!(reply.data, b"4");
    assert_eq!(reply.routing_key.as_str(), reply_to);
    // The pseudo-queue itself.
    let ok = requester
        .queue_declare(
            PSEUDO.into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!((ok.message_count(), ok.consumer_count()), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misuse_gets_rabbitmqs_406s() {
    let b = start().await;
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let e = ch
        .basic_consume(
            PSEUDO.into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(reply_code(&e), Some(406));
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("PRECONDITION_FAILED - reply consumer cannot acknowledge")
    );
    let ch = conn.create_channel().await.unwrap();
    let _c = consume(&ch, PSEUDO, "c1", no_ack(), FieldTable::default()).await;
    let e = ch
        .basic_consume(PSEUDO.into(), "c2".into(), no_ack(), FieldTable::default())
        .await
        .unwrap_err();
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("PRECONDITION_FAILED - reply consumer already set")
    );
    // Publishing with reply_to on a channel without a reply consumer.
    let ch = conn.create_channel().await.unwrap();
    let mut errors = Errors::new(&conn);
    let _ = ch
        .basic_publish(
            "".into(),
            "anywhere".into(),
            BasicPublishOptions::default(),
            b"x",
            BasicProperties::default().with_reply_to(PSEUDO.into()),
        )
        .await;
    let e = errors.next_error().await.expect("the channel is closed");
    assert_eq!(reply_code(&e), Some(406));
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("PRECONDITION_FAILED - fast reply consumer does not exist")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_to_a_consumer_that_is_gone_is_dropped() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    let conn = b.connect().await;
    let requester = conn.create_channel().await.unwrap();
    let _replies = consume(
        &requester,
        PSEUDO,
        "client",
        no_ack(),
        FieldTable::default(),
    )
    .await;
    declare(&ch, "rpc").await;
    requester
        .basic_publish(
            "".into(),
            "rpc".into(),
            BasicPublishOptions::default(),
            b"q",
            BasicProperties::default().with_reply_to(PSEUDO.into()),
        )
        .await
        .unwrap();
    // Published on another connection: it may take a moment to arrive.
    let mut req = None;
    for _ in 0..500 {
        req = ch
            .basic_get("rpc".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap();
        if req.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let req = req.expect("the request");
    let reply_to = req
        .delivery
        .properties
        .reply_to()
        .as_ref()
        .map(|s| s.as_str().to_string())
        .unwrap();
    requester.close(200, "bye".into()).await.unwrap();
    // Dropped, with the publish confirmed and the channel fine.
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let confirm = ch
        .basic_publish(
            "".into(),
            reply_to.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            b"late",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack());
    let e = ch
        .queue_declare(
            reply_to.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(reply_code(&e), Some(404), "{e:?}");
}
