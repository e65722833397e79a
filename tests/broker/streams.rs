//! Streams over AMQP 0-9-1 (x-queue-type=stream) on a single node: what a
//! declare refuses, every x-stream-offset form, acks as credit, many
//! readers each reading everything, reads past what memory keeps, the
//! refusals RabbitMQ makes (basic.get, automatic acks and a global
//! prefetch close the connection with 540; no prefetch is a 406), and a stream kept across a restart.

use crate::common;
use crate::helpers;
use crate::stream_support;

use common::*;
use helpers::{declare_with, expect_code, message_count, s, table};
use lapin::{
    options::*,
    types::{AMQPValue, FieldTable},
};
use stream_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_declares_refuse_what_rabbitmq_refuses() {
    let b = start().await;
    let c = b.connect().await;
    let cases: Vec<(&str, QueueDeclareOptions, FieldTable, &str)> = vec![
        (
            "st-transient",
            QueueDeclareOptions::default(),
            stream(&[]),
            "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'st-transient' in vhost '/'",
        ),
        (
            "st-ad",
            QueueDeclareOptions {
                durable: true,
                auto_delete: true,
                ..Default::default()
            },
            stream(&[]),
            "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'st-ad' in vhost '/'",
        ),
        (
            "",
            durable(),
            stream(&[]),
            "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue",
        ),
        (
            "st-ttl",
            durable(),
            stream(&[("x-message-ttl", AMQPValue::LongInt(1000))]),
            "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue 'st-ttl' in vhost '/' of queue type rabbit_stream_queue",
        ),
        (
            "st-dlx",
            durable(),
            stream(&[("x-dead-letter-exchange", s("dlx"))]),
            "PRECONDITION_FAILED - invalid arg 'x-dead-letter-exchange' for queue 'st-dlx' in vhost '/' of queue type rabbit_stream_queue",
        ),
        (
            "st-age",
            durable(),
            stream(&[("x-max-age", s("7x"))]),
            "PRECONDITION_FAILED - invalid arg 'x-max-age' for queue 'st-age' in vhost '/': invalid_max_age",
        ),
        (
            "st-placed",
            durable(),
            stream(&[("x-initial-cluster-size", AMQPValue::LongInt(0))]),
            "PRECONDITION_FAILED - invalid arg 'x-initial-cluster-size' for queue 'st-placed' in vhost '/': {value_zero,0}",
        ),
        (
            "st-filter-size",
            durable(),
            stream(&[("x-stream-filter-size-bytes", AMQPValue::LongInt(300))]),
            "PRECONDITION_FAILED - invalid arg 'x-stream-filter-size-bytes' for queue 'st-filter-size' in vhost '/': {value_out_of_range,300}",
        ),
    ];
    for (name, opts, args, text) in cases {
        let ch = c.create_channel().await.unwrap();
        let got = expect_code(declare_with(&ch, name, opts, args).await, 406);
        assert_eq!(got, text);
    }
    // A stream is declared again with the same arguments; it is listed
    // as one.
    let ch = c.create_channel().await.unwrap();
    declare_stream(&ch, "st").await;
    declare_stream(&ch, "st").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_start_at_every_offset_form() {
    let b = start().await;
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    declare_stream(&ch, "events").await;
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    publish_confirmed(&ch, "events", (0..10).map(|i| format!("m{i}"))).await;

    let (_a, mut first) = reader(&conn, "events", 100, Some(s("first"))).await;
    assert_eq!(read_acking(&mut first, 10).await, numbered(0..10));
    let (_b, mut at5) = reader(&conn, "events", 100, Some(AMQPValue::LongLongInt(5))).await;
    assert_eq!(read_acking(&mut at5, 5).await, numbered(5..10));
    let (_c, mut last) = reader(&conn, "events", 100, Some(s("last"))).await;
    assert_eq!(read_acking(&mut last, 1).await, numbered(9..10));
    let (_d, mut next_one) = reader(&conn, "events", 100, Some(s("next"))).await;
    let (_e, mut default) = reader(&conn, "events", 100, None).await;
    let (_f, mut past) = reader(&conn, "events", 100, Some(AMQPValue::LongLongInt(1000))).await;
    let (_g, mut since) = reader(&conn, "events", 100, Some(AMQPValue::Timestamp(before))).await;
    assert_eq!(read_acking(&mut since, 10).await, numbered(0..10));
    let (_h, mut hour) = reader(&conn, "events", 100, Some(s("1h"))).await;
    assert_eq!(read_acking(&mut hour, 10).await, numbered(0..10));
    let (_i, mut future) = reader(
        &conn,
        "events",
        100,
        Some(AMQPValue::Timestamp(before + 3600)),
    )
    .await;
    for c in [&mut next_one, &mut default, &mut past, &mut future] {
        assert_no_delivery(c).await;
    }
    // Readers at the end wait for what comes next, and every reader gets
    // it.
    publish_confirmed(&ch, "events", ["m10".to_string()]).await;
    for c in [
        &mut first,
        &mut at5,
        &mut last,
        &mut next_one,
        &mut default,
        &mut past,
        &mut since,
        &mut hour,
        &mut future,
    ] {
        assert_eq!(read_acking(c, 1).await, numbered(10..11));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_are_credit_and_nothing_is_removed() {
    let b = start().await;
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    declare_stream(&ch, "credit").await;
    publish_confirmed(&ch, "credit", (0..6).map(|i| format!("m{i}"))).await;
    let (_rch, mut c) = reader(&conn, "credit", 2, Some(s("first"))).await;
    let held = [next(&mut c).await.unwrap(), next(&mut c).await.unwrap()];
    // The prefetch is full: nothing more until an ack.
    assert_no_delivery(&mut c).await;
    held[0].ack(BasicAckOptions::default()).await.unwrap();
    let third = next(&mut c).await.expect("credit came back");
    assert_eq!(offset_of(&third), 2);
    // A nack is credit too; nothing comes back redelivered.
    held[1]
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let fourth = next(&mut c).await.expect("credit came back");
    assert_eq!(offset_of(&fourth), 3);
    assert!(!fourth.redelivered);
    // Everything is still there for a new reader, and the stream counts it.
    let (_r2, mut again) = reader(&conn, "credit", 10, Some(s("first"))).await;
    assert_eq!(read_acking(&mut again, 6).await, numbered(0..6));
    assert_eq!(message_count(&ch, "credit").await, 6);
    // Properties and headers are kept as published, the offset added.
    let headers = third.properties.headers().clone().unwrap();
    assert_eq!(headers.inner().get("app"), Some(&s("kept")));
    assert_eq!(third.properties.delivery_mode(), &Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_stream_refuses_its_consumers() {
    let b = start().await;
    let (_keep, ch) = b.channel().await;
    declare_stream(&ch, "strict").await;
    // 540 is a connection error: each refusal on a connection of its own.

    let (_conn, ch) = b.channel().await;
    let got = expect_code(
        ch.basic_get("strict".into(), BasicGetOptions::default())
            .await,
        540,
    );
    assert_eq!(
        got,
        "NOT_IMPLEMENTED - basic.get not supported by stream queues queue 'strict' in vhost '/'"
    );

    let (_conn, ch) = b.channel().await;
    let got = expect_code(
        ch.basic_consume(
            "strict".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await,
        406,
    );
    assert_eq!(
        got,
        "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue 'strict' in vhost '/''"
    );

    let (_conn, ch) = b.channel().await;
    ch.basic_qos(10, BasicQosOptions::default()).await.unwrap();
    let got = expect_code(
        ch.basic_consume(
            "strict".into(),
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await,
        540,
    );
    assert_eq!(
        got,
        "NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue 'strict' in vhost '/'"
    );

    let (_conn, ch) = b.channel().await;
    ch.basic_qos(10, BasicQosOptions::default()).await.unwrap();
    ch.basic_qos(10, BasicQosOptions { global: true })
        .await
        .unwrap();
    let got = expect_code(
        ch.basic_consume(
            "strict".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await,
        540,
    );
    assert_eq!(
        got,
        "NOT_IMPLEMENTED - queue 'strict' in vhost '/' does not support global qos"
    );

    let (_conn, ch) = b.channel().await;
    ch.basic_qos(10, BasicQosOptions::default()).await.unwrap();
    let got = expect_code(
        ch.basic_consume(
            "strict".into(),
            "".into(),
            BasicConsumeOptions::default(),
            table(&[("x-stream-offset", s("yesterday"))]),
        )
        .await,
        406,
    );
    assert_eq!(
        got,
        "PRECONDITION_FAILED - invalid x-stream-offset 'yesterday'"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_read_past_what_memory_keeps_and_after_a_restart() {
    let mut b = start().await;
    let (conn, ch) = b.channel().await;
    declare_stream(&ch, "long").await;
    // 12 MiB: more than the 8 MiB a stream keeps in memory.
    let big = "x".repeat(1024);
    publish_confirmed(&ch, "long", (0..12_288).map(|i| format!("{i}:{big}"))).await;
    let (_r, mut c) = reader(&conn, "long", 500, Some(s("first"))).await;
    for i in 0..12_288i64 {
        let d = next(&mut c).await.unwrap_or_else(|| panic!("offset {i}"));
        assert_eq!(offset_of(&d), i);
        assert!(d.data.starts_with(format!("{i}:").as_bytes()));
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    drop(conn);

    b.restart().await;
    let (conn, ch) = b.channel().await;
    let (_r, mut c) = reader(&conn, "long", 500, Some(AMQPValue::LongLongInt(12_280))).await;
    for i in 12_280..12_288i64 {
        let d = next(&mut c).await.unwrap_or_else(|| panic!("offset {i}"));
        assert_eq!(offset_of(&d), i);
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    // New messages follow on from the offsets the stream had.
    publish_confirmed(&ch, "long", ["after".to_string()]).await;
    let d = next(&mut c).await.expect("the new message");
    assert_eq!((offset_of(&d), &d.data[..]), (12_288, &b"after"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_by_size_drops_whole_segments_from_the_start() {
    let b = start().await;
    let (conn, ch) = b.channel().await;
    let args = stream(&[
        ("x-max-length-bytes", AMQPValue::LongLongInt(300_000)),
        (
            "x-stream-max-segment-size-bytes",
            AMQPValue::LongLongInt(100_000),
        ),
    ]);
    declare_with(&ch, "sized", durable(), args)
        .await
        .expect("declared");
    let big = "x".repeat(1019);
    publish_confirmed(&ch, "sized", (0..1000).map(|i| format!("{i:04}:{big}"))).await;
    // A segment holds 98 messages of 1 KiB (it fills at 100,000 bytes);
    // after a drop the stream holds at most 300,000 bytes, and a segment
    // more until the next.
    let kept = message_count(&ch, "sized").await;
    assert!(
        ((300_000 - 100_352) / 1024..=(300_000 + 100_352) / 1024).contains(&kept),
        "{kept} kept"
    );
    let (_r, mut c) = reader(&conn, "sized", 10, Some(s("first"))).await;
    let first = read_acking(&mut c, 1).await.remove(0);
    assert_eq!(first.0 % 98, 0, "a segment's start: {first:?}");
    assert_eq!(first.0 as u32, 1000 - kept);
    assert!(first.1.starts_with(&format!("{:04}:", first.0)));
    // A numeric offset below what is kept starts at the first kept.
    let (_r2, mut below) = reader(&conn, "sized", 10, Some(AMQPValue::LongLongInt(3))).await;
    assert_eq!(read_acking(&mut below, 1).await[0].0, first.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_by_age_runs_while_nobody_publishes() {
    let b = start().await;
    let (conn, ch) = b.channel().await;
    let args = stream(&[
        ("x-max-age", s("2s")),
        (
            "x-stream-max-segment-size-bytes",
            AMQPValue::LongLongInt(10_000),
        ),
    ]);
    declare_with(&ch, "aging", durable(), args)
        .await
        .expect("declared");
    let big = "y".repeat(995);
    publish_confirmed(&ch, "aging", (0..50).map(|i| format!("{i:04}:{big}"))).await;
    assert_eq!(message_count(&ch, "aging").await, 50);
    // Nothing is published from here on: the timer drops every segment
    // but the last (10 messages of 1,000 bytes fill one).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while message_count(&ch, "aging").await > 10 {
        assert!(std::time::Instant::now() < deadline, "nothing aged out");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (_r, mut c) = reader(&conn, "aging", 100, Some(s("first"))).await;
    assert_eq!(read_acking(&mut c, 10).await[0].0, 40);
    assert_no_delivery(&mut c).await;
}
