//! x-queue-type: quorum queues on a single node (RabbitMQ 3.10's checks and
//! wording, every message kept whatever its delivery mode, x-delivery-limit)
//! and a type Warren does not have.

use crate::common;
use crate::helpers;

use common::*;
use helpers::{consumer, declare_with, expect_code, s, table};
use lapin::{
    options::*,
    types::{AMQPValue, FieldTable},
    BasicProperties,
};

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

fn quorum(extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut pairs = vec![("x-queue-type", s("quorum"))];
    pairs.extend(extra.iter().cloned());
    table(&pairs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_declares_refuse_what_rabbitmq_refuses() {
    let b = start().await;
    let c = b.connect().await;
    let cases: Vec<(&str, QueueDeclareOptions, FieldTable, &str)> = vec![
        (
            "qq-transient",
            QueueDeclareOptions::default(),
            quorum(&[]),
            "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'qq-transient' in vhost '/'",
        ),
        (
            "qq-excl",
            QueueDeclareOptions {
                durable: true,
                exclusive: true,
                ..Default::default()
            },
            quorum(&[]),
            "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue 'qq-excl' in vhost '/'",
        ),
        (
            "qq-ad",
            QueueDeclareOptions {
                durable: true,
                auto_delete: true,
                ..Default::default()
            },
            quorum(&[]),
            "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'qq-ad' in vhost '/'",
        ),
        (
            "",
            durable(),
            quorum(&[]),
            "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue",
        ),
        (
            "qq-prio",
            durable(),
            quorum(&[("x-max-priority", AMQPValue::LongInt(5))]),
            "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'qq-prio' in vhost '/' of queue type rabbit_quorum_queue",
        ),
        (
            "qq-lazy",
            durable(),
            quorum(&[("x-queue-mode", s("lazy"))]),
            "PRECONDITION_FAILED - invalid arg 'x-queue-mode' for queue 'qq-lazy' in vhost '/' of queue type rabbit_quorum_queue",
        ),
        (
            "qq-size",
            durable(),
            quorum(&[("x-quorum-initial-group-size", AMQPValue::LongInt(0))]),
            "PRECONDITION_FAILED - invalid arg 'x-quorum-initial-group-size' for queue 'qq-size' in vhost '/': {value_zero,0}",
        ),
        (
            "st",
            durable(),
            table(&[("x-queue-type", s("lazy"))]),
            "PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue 'st' in vhost '/': \"unsupported queue type 'lazy'\"",
        ),
    ];
    for (name, opts, args, text) in cases {
        let ch = c.create_channel().await.unwrap();
        let got = expect_code(declare_with(&ch, name, opts, args).await, 406);
        assert_eq!(got, text);
    }
    // What quorum queues take is accepted, and the queue is a quorum one.
    let ch = c.create_channel().await.unwrap();
    let args = quorum(&[
        ("x-delivery-limit", AMQPValue::LongInt(2)),
        ("x-quorum-initial-group-size", AMQPValue::LongInt(3)),
        ("x-message-ttl", AMQPValue::LongInt(60_000)),
        ("x-dead-letter-strategy", s("at-least-once")),
    ]);
    declare_with(&ch, "qq-ok", durable(), args.clone())
        .await
        .unwrap();
    declare_with(&ch, "qq-ok", durable(), args).await.unwrap();
    declare_with(&ch, "qq-plain", durable(), quorum(&[]))
        .await
        .unwrap();
    let classic = table(&[("x-queue-type", s("classic"))]);
    let got = expect_code(declare_with(&ch, "qq-plain", durable(), classic).await, 406);
    assert_eq!(
        got,
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'qq-plain' in vhost '/': \
         received 'classic' but current is 'quorum'"
    );
    let ch = c.create_channel().await.unwrap();
    let got = expect_code(
        declare_with(&ch, "qq-plain", durable(), FieldTable::default()).await,
        406,
    );
    assert_eq!(
        got,
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'qq-plain' in vhost '/': \
         received none but current is the value 'quorum' of type 'longstr'"
    );
    // A classic queue is still anything it was.
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "classic-prio",
        QueueDeclareOptions::default(),
        table(&[
            ("x-queue-type", s("classic")),
            ("x-max-priority", AMQPValue::LongInt(5)),
        ]),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_keeps_transient_messages_across_a_restart() {
    let mut b = start().await;
    {
        let (_c, ch) = b.channel().await;
        declare_with(&ch, "qq", durable(), quorum(&[]))
            .await
            .unwrap();
        declare_with(&ch, "classic", durable(), FieldTable::default())
            .await
            .unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        for q in ["qq", "classic"] {
            ch.basic_publish(
                "".into(),
                q.into(),
                BasicPublishOptions::default(),
                b"transient",
                BasicProperties::default().with_delivery_mode(1),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        }
    }
    b.restart().await;
    let (_c, ch) = b.channel().await;
    assert_eq!(
        get_body(&ch, "qq").await.as_deref(),
        Some(&b"transient"[..])
    );
    assert_eq!(get_body(&ch, "classic").await, None, "RabbitMQ drops them");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_dead_letters_past_its_delivery_limit() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare_with(&ch, "dlq", durable(), FieldTable::default())
        .await
        .unwrap();
    let args = quorum(&[
        ("x-delivery-limit", AMQPValue::LongInt(1)),
        ("x-dead-letter-exchange", s("")),
        ("x-dead-letter-routing-key", s("dlq")),
    ]);
    declare_with(&ch, "work", durable(), args).await.unwrap();
    publish(&ch, "", "work", b"poison").await;
    let mut work = consumer(&ch, "work", "c").await;
    // Delivered, requeued, delivered again, requeued: past the limit.
    for _ in 0..2 {
        let d = next(&mut work).await.expect("a delivery");
        d.nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert_eq!(
        get_eventually(&ch, "dlq").await.as_deref(),
        Some(&b"poison"[..])
    );
}
