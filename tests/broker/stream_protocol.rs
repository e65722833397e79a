//! RabbitMQ's stream protocol, driven by RabbitMQ's own Rust stream
//! client (rabbitmq-stream-client): streams created and deleted, publish
//! with confirms, every offset specification, credit, stored offsets, a
//! named publisher's deduplication across reconnects and a restart, a
//! message published over AMQP 0-9-1 read over the stream protocol with
//! its properties and one published here read over AMQP 0-9-1 and the
//! management API with its properties, and the refusals a client can see.

use crate::common;

use std::time::Duration;

use common::streams::*;
use common::*;
use futures::StreamExt;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use rabbitmq_stream_client::error::{ConsumerCreateError, StreamCreateError};
use rabbitmq_stream_client::types::{Message, OffsetSpecification, ResponseCode};
use rabbitmq_stream_client::Environment;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren::config::Port;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_confirms_and_read_from_every_offset_specification() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator()
        .create("events")
        .await
        .expect("created");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    publish_to(&env, "events", 0..100).await;

    let mut first = env
        .consumer()
        .offset(OffsetSpecification::First)
        .build("events")
        .await
        .expect("a consumer");
    let got = take(&mut first, 100).await;
    let want: Vec<_> = (0..100).map(|i| (i, body(i))).collect();
    assert_eq!(got, want, "every message, in order, at its offset");

    let mut at = env
        .consumer()
        .offset(OffsetSpecification::Offset(60))
        .build("events")
        .await
        .unwrap();
    assert_eq!(take(&mut at, 40).await, want[60..].to_vec());
    assert_nothing_more(&mut at).await;

    let mut last = env
        .consumer()
        .offset(OffsetSpecification::Last)
        .build("events")
        .await
        .unwrap();
    assert_eq!(take(&mut last, 1).await, vec![(99, body(99))]);

    let mut since = env
        .consumer()
        .offset(OffsetSpecification::Timestamp(before - 1000))
        .build("events")
        .await
        .unwrap();
    assert_eq!(take(&mut since, 100).await, want);

    let mut next = env
        .consumer()
        .offset(OffsetSpecification::Next)
        .build("events")
        .await
        .unwrap();
    assert_nothing_more(&mut next).await;
    // Readers at the end get what comes next; the first has credit left
    // for it too.
    publish_to(&env, "events", 100..105).await;
    let more: Vec<_> = (100..105).map(|i| (i, body(i))).collect();
    assert_eq!(take(&mut next, 5).await, more);
    assert_eq!(take(&mut first, 5).await, more);
    assert_eq!(take(&mut last, 5).await, more);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn properties_survive_the_trip_and_amqp_091_messages_read_as_amqp_10() {
    let b = start_streams().await;
    let env = env(&b).await;
    // Declared and published over AMQP 0-9-1.
    let (_c, ch) = b.channel().await;
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from("stream")),
    );
    ch.queue_declare(
        "mixed".into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await
    .unwrap();
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from("colour"),
        AMQPValue::LongString(LongString::from("blue")),
    );
    ch.confirm_select(Default::default()).await.unwrap();
    ch.basic_publish(
        "".into(),
        "mixed".into(),
        BasicPublishOptions::default(),
        b"from amqp",
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_content_type("text/plain".into())
            .with_headers(headers),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    // And over the stream protocol, with properties of its own.
    let producer = env.producer().build("mixed").await.unwrap();
    let m = Message::builder()
        .body(b"from streams".to_vec())
        .properties()
        .message_id("m-2".to_string())
        .content_type("application/json")
        .message_builder()
        .application_properties()
        .insert("colour", "red")
        .message_builder()
        .build();
    assert!(producer.send_with_confirm(m).await.unwrap().confirmed());

    let mut consumer = env
        .consumer()
        .offset(OffsetSpecification::First)
        .build("mixed")
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let m = d.message();
        let p = m.properties().expect("properties");
        seen.push((
            d.offset(),
            m.data().map(<[u8]>::to_vec),
            format!("{:?}", p.message_id),
            format!("{:?}", p.content_type),
            format!("{:?}", m.application_properties()),
        ));
    }
    assert_eq!(seen[0].0, 0);
    assert_eq!(seen[0].1.as_deref(), Some(&b"from amqp"[..]));
    assert!(seen[0].2.contains("m-1"), "{:?}", seen[0]);
    assert!(seen[0].3.contains("text/plain"), "{:?}", seen[0]);
    assert!(
        seen[0].4.contains("colour") && seen[0].4.contains("blue"),
        "{:?}",
        seen[0]
    );
    assert!(!seen[0].4.contains("x-stream-offset"), "{:?}", seen[0]);
    assert_eq!(seen[1].0, 1);
    assert_eq!(seen[1].1.as_deref(), Some(&b"from streams"[..]));
    assert!(seen[1].2.contains("m-2"), "{:?}", seen[1]);
    assert!(seen[1].3.contains("application/json"), "{:?}", seen[1]);
    assert!(seen[1].4.contains("red"), "{:?}", seen[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_protocol_message_reads_over_amqp_091_and_the_api_with_its_properties() {
    let b = start_streams_with_api().await;
    let env = env(&b).await;
    env.stream_creator().create("events").await.unwrap();
    let producer = env.producer().build("events").await.unwrap();
    for i in 0..2u32 {
        let m = Message::builder()
            .body(format!("event {i}").into_bytes())
            .properties()
            .message_id(format!("e-{i}"))
            .correlation_id(7u64)
            .content_type("application/json")
            .group_id("billing")
            .message_builder()
            .application_properties()
            .insert("colour", "red")
            .insert("n", i as i32)
            .message_builder()
            .build();
        assert!(producer.send_with_confirm(m).await.unwrap().confirmed());
    }
    // An AMQP 0-9-1 consumer of the stream.
    let (_c, ch) = b.channel().await;
    ch.basic_qos(10, Default::default()).await.unwrap();
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-stream-offset"),
        AMQPValue::LongString(LongString::from("first")),
    );
    let mut consumer = ch
        .basic_consume("events".into(), "reader".into(), Default::default(), args)
        .await
        .unwrap();
    for i in 0..2u32 {
        let d = next(&mut consumer).await.expect("a delivery");
        assert_eq!(d.data, format!("event {i}").into_bytes());
        let p = &d.properties;
        assert_eq!(
            p.message_id().as_ref().map(|s| s.as_str()),
            Some(&*format!("e-{i}"))
        );
        assert_eq!(p.correlation_id().as_ref().map(|s| s.as_str()), Some("7"));
        assert_eq!(
            p.content_type().as_ref().map(|s| s.as_str()),
            Some("application/json")
        );
        assert_eq!(p.app_id().as_ref().map(|s| s.as_str()), Some("billing"));
        let h = p.headers().as_ref().expect("headers").inner().clone();
        assert_eq!(h.get("colour"), Some(&AMQPValue::LongString("red".into())));
        assert_eq!(h.get("n"), Some(&AMQPValue::LongInt(i as i32)));
        assert_eq!(
            h.get("x-stream-offset"),
            Some(&AMQPValue::LongLongInt(i as i64))
        );
        assert_eq!(h.get("x-amqp-1.0"), None, "the stored marker is not shown");
        d.ack(Default::default()).await.unwrap();
    }
    // The management API's get.
    let (status, body) = api_call(
        &b,
        "POST",
        "/api/queues/%2f/events/get",
        r#"{"count":1,"ackmode":"ack_requeue_true","encoding":"auto","offset":1}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let got: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(got[0]["payload"], "event 1");
    assert_eq!(got[0]["properties"]["message_id"], "e-1");
    assert_eq!(got[0]["properties"]["headers"]["colour"], "red");
    assert_eq!(got[0]["properties"]["headers"]["x-stream-offset"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_publisher_is_deduplicated_across_reconnects_and_a_restart() {
    let mut b = start_streams().await;
    let env1 = env(&b).await;
    env1.stream_creator().create("orders").await.unwrap();
    let send = |env: Environment, ids: std::ops::Range<u64>| async move {
        let mut producer = env.producer().name("app-1").build("orders").await.unwrap();
        for id in ids {
            let m = Message::builder().body(body(id)).publishing_id(id).build();
            let status = producer.send_with_confirm(m).await.unwrap();
            assert!(status.confirmed(), "{id} confirmed (duplicates too)");
        }
        producer.close().await.unwrap();
    };
    // A new name starts at 0, as the client starts it.
    send(env1.clone(), 0..10).await;
    // Reconnected: 5..9 again (as after a lost confirm), then 10..14.
    send(env(&b).await, 5..15).await;
    drop(env1);
    b.restart().await;
    let env2 = env(&b).await;
    // After a restart the sequence holds: 11..14 again are dropped.
    send(env2.clone(), 11..17).await;
    let mut c = env2
        .consumer()
        .offset(OffsetSpecification::First)
        .build("orders")
        .await
        .unwrap();
    let got = take(&mut c, 17).await;
    let want: Vec<_> = (0..17).map(|id| (id, body(id))).collect();
    assert_eq!(got, want, "each publishing id stored once");
    assert_nothing_more(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_offsets_and_credit() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("tracked").await.unwrap();
    publish_to(&env, "tracked", 0..50).await;
    let mut c = env
        .consumer()
        .name("reader-1")
        .offset(OffsetSpecification::First)
        .build("tracked")
        .await
        .unwrap();
    assert!(c.query_offset().await.is_err(), "nothing stored yet");
    assert_eq!(take(&mut c, 50).await.len(), 50);
    c.store_offset(41).await.unwrap();
    // Stored offsets are read back (the store has no answer of its own;
    // the query comes after it on the connection).
    assert_eq!(c.query_offset().await.unwrap(), 41);
    c.handle().close().await.unwrap();
    let again = env
        .consumer()
        .name("reader-1")
        .offset(OffsetSpecification::First)
        .build("tracked")
        .await
        .unwrap();
    assert_eq!(again.query_offset().await.unwrap(), 41);
}

/// Readers of one stream share the chunks one of them read, and a chunk
/// ends at a multiple of 512 offsets or at the frame's budget, so readers
/// that start anywhere meet at the same chunks. 1,300 messages of 8 KiB
/// (more than the 8 MiB a stream keeps in memory, so the oldest are read
/// back from the log): two readers from the first offset and one from
/// the middle of a chunk each get exactly their offsets, in order, with
/// their bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_one_stream_share_its_chunks_and_each_reads_all_in_order() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("shared").await.unwrap();
    let big = |i: u64| format!("{i:08}").repeat(1000).into_bytes();
    publish_batches(&env, "shared", 1300, 100, big).await;
    let mut readers = Vec::new();
    for start in [0, 0, 700] {
        let spec = match start {
            0 => OffsetSpecification::First,
            n => OffsetSpecification::Offset(n),
        };
        let c = env.consumer().offset(spec).build("shared").await.unwrap();
        readers.push((start, c));
    }
    for (start, mut c) in readers {
        let want: Vec<_> = (start..1300).map(|i| (i, big(i))).collect();
        let got = take(&mut c, want.len()).await;
        let first_wrong = got.iter().zip(&want).position(|(g, w)| g != w);
        assert_eq!(first_wrong, None, "reader from {start}");
        assert_nothing_more(&mut c).await;
    }
}

/// Chunks read back from the log go out as the log holds a stream
/// batch (its entries sent from the file, their CRC the one stored with
/// them), joined with entries copied for a reader that starts inside a
/// batch: each Deliver frame's chunk says its entry count, data length
/// and CRC as a client that checks them (Java's, Go's) finds them, and
/// its entries are the next offsets with their bodies, before and after
/// a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_sent_from_the_log_check_as_clients_check_them() {
    let mut b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("stored").await.unwrap();
    // Past the 8 MiB a stream keeps in memory: the oldest are read back.
    let big = |i: u64| format!("{i:08}").repeat(1000).into_bytes();
    publish_batches(&env, "stored", 1300, 100, big).await;
    drop(env);
    for restarted in [false, true] {
        if restarted {
            b.restart().await;
        }
        for start in [0u64, 750] {
            let mut s = raw_open(&b).await;
            subscribe_at(&mut s, "stored", start).await;
            read_checked_chunks(&mut s, start, 1300, big).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_have_the_protocols_codes() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("here").await.unwrap();
    match env.stream_creator().create("here").await {
        Err(StreamCreateError::Create { status, .. }) => {
            assert_eq!(status, ResponseCode::StreamAlreadyExists)
        }
        other => panic!("a second create: {other:?}"),
    }
    match env.consumer().build("nowhere").await {
        Err(ConsumerCreateError::StreamDoesNotExist { .. }) => {}
        other => panic!("a consumer of no stream: {:?}", other.err()),
    }
    assert!(env.producer().build("nowhere").await.is_err());
    // A queue that is not a stream is not one here either.
    let (_c, ch) = b.channel().await;
    declare(&ch, "classic").await;
    assert!(env.consumer().build("classic").await.is_err());
    // A wrong password.
    let at = b.streams.unwrap();
    let wrong = Environment::builder()
        .host("127.0.0.1")
        .port(at.port())
        .password("wrong")
        .build()
        .await;
    assert!(wrong.is_err(), "a wrong password is refused");
    // An unknown vhost.
    let vhost = Environment::builder()
        .host("127.0.0.1")
        .port(at.port())
        .virtual_host("nope")
        .build()
        .await;
    assert!(vhost.is_err(), "an unknown vhost is refused");
    env.delete_stream("here").await.unwrap();
    assert!(env.delete_stream("here").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_frames_end_the_connection_without_harm() {
    let b = start_streams().await;
    let at = b.streams.unwrap();
    let cases: Vec<Vec<u8>> = vec![
        // A size past any frame max.
        vec![0x7f, 0xff, 0xff, 0xff, 0, 17, 0, 1],
        // A frame too short for its key.
        vec![0, 0, 0, 1, 0],
        // Peer properties whose count lies.
        vec![0, 0, 0, 12, 0, 17, 0, 1, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff],
        // A command before authentication.
        vec![0, 0, 0, 8, 0, 13, 0, 1, 0, 0, 0, 1],
        // Garbage.
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
    ];
    for bytes in cases {
        let mut s = tokio::net::TcpStream::connect(at).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        let mut sink = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink)).await;
        assert!(read.is_ok(), "the broker ends the connection: {bytes:?}");
    }
    // And still serves.
    let env = env(&b).await;
    env.stream_creator().create("after").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_connections_count_against_the_node_connection_limit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = config(tmp.path());
    c.stream_port = Port::On(0);
    c.connection_max = 1;
    let b = start_in(tmp, c).await;
    let amqp = b.connect().await;
    let at = b.streams.unwrap();
    let refused = Environment::builder()
        .host("127.0.0.1")
        .port(at.port())
        .build()
        .await;
    assert!(
        refused.is_err(),
        "past connection_max a stream client is refused"
    );
    amqp.close(200, "bye".into()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let env = env(&b).await;
    env.stream_creator().create("fits").await.unwrap();
}

/// Writes one frame of `key` (version 1) and `body`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_without_properties_and_a_forged_marker() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("raw").await.unwrap();
    // An AMQP 0-9-1 message whose only property is the header Warren marks
    // AMQP 1.0 messages with: still an AMQP 0-9-1 message.
    let (_c, ch) = b.channel().await;
    let mut headers = FieldTable::default();
    headers.insert(ShortString::from("x-amqp-1.0"), AMQPValue::Boolean(true));
    ch.confirm_select(Default::default()).await.unwrap();
    ch.basic_publish(
        "".into(),
        "raw".into(),
        BasicPublishOptions::default(),
        b"not amqp 1.0",
        BasicProperties::default().with_headers(headers),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let mut c = env
        .consumer()
        .offset(OffsetSpecification::First)
        .build("raw")
        .await
        .unwrap();
    assert_eq!(take(&mut c, 1).await, vec![(0, b"not amqp 1.0".to_vec())]);
    // The Java client leaves out an empty properties array.
    let mut s = raw_open(&b).await;
    let mut sub = vec![0, 0, 0, 9, 1];
    sub.extend(string("raw"));
    sub.extend([0, 1]); // first
    sub.extend([0, 10]); // credit
    send_frame(&mut s, 7, &sub).await;
    let ok = read_until(&mut s, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 9, 0, 1], "subscribed");
    let chunk = read_until(&mut s, 8).await;
    assert_eq!(chunk[0], 1, "a chunk for subscription 1");
}

/// Two publishers with one reference on one stream (a reconnect racing
/// the connection it replaces) share the stream's record of the highest
/// id: what one stored, the other's resend does not store again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_sharing_a_reference_share_its_deduplication() {
    let b = start_streams().await;
    let (env1, env2) = (env(&b).await, env(&b).await);
    env1.stream_creator().create("shared").await.unwrap();
    // Both declared before either publishes.
    let mut old = env1.producer().name("app").build("shared").await.unwrap();
    let mut new = env2.producer().name("app").build("shared").await.unwrap();
    for id in 0..10 {
        let m = Message::builder().body(body(id)).publishing_id(id).build();
        assert!(new.send_with_confirm(m).await.unwrap().confirmed());
    }
    // The old connection resends 5..11: 5..9 are duplicates.
    for id in 5..12 {
        let m = Message::builder().body(body(id)).publishing_id(id).build();
        assert!(old.send_with_confirm(m).await.unwrap().confirmed());
    }
    let mut c = env1
        .consumer()
        .offset(OffsetSpecification::First)
        .build("shared")
        .await
        .unwrap();
    let got = take(&mut c, 12).await;
    let want: Vec<_> = (0..12).map(|id| (id, body(id))).collect();
    assert_eq!(got, want, "each publishing id stored once");
    assert_nothing_more(&mut c).await;
    old.close().await.unwrap();
    new.close().await.unwrap();
}

/// A subscription without credit still learns that its stream was
/// deleted (MetadataUpdate "stream not available").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_without_credit_is_told_its_stream_went() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("going").await.unwrap();
    let mut s = raw_open(&b).await;
    let mut sub = vec![0, 0, 0, 9, 1];
    sub.extend(string("going"));
    sub.extend([0, 1]); // first
    sub.extend([0, 0]); // no credit
    sub.extend([0, 0, 0, 0]); // no properties
    send_frame(&mut s, 7, &sub).await;
    let ok = read_until(&mut s, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 9, 0, 1], "subscribed");
    env.delete_stream("going").await.unwrap();
    let update = read_until(&mut s, 16).await;
    assert_eq!(&update[..2], &[0, 6], "stream not available");
    assert_eq!(&update[2..], &string("going")[..]);
}

/// A publisher whose stream is deleted (by another connection) is told
/// so (MetadataUpdate "stream not available") and dropped: publishing
/// with its id then gets "publisher does not exist".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_is_told_its_stream_went() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("leaving").await.unwrap();
    let mut s = raw_open(&b).await;
    let mut declare = vec![0, 0, 0, 5, 7, 0xff, 0xff];
    declare.extend(string("leaving"));
    send_frame(&mut s, 1, &declare).await;
    let ok = read_until(&mut s, 0x8001).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 5, 0, 1], "declared");
    env.delete_stream("leaving").await.unwrap();
    let update = read_until(&mut s, 16).await;
    assert_eq!(&update[..2], &[0, 6], "stream not available");
    assert_eq!(&update[2..], &string("leaving")[..]);
    // Publisher 7 is no more.
    let mut publish = vec![7, 0, 0, 0, 1];
    publish.extend(1u64.to_be_bytes());
    publish.extend(2u32.to_be_bytes());
    publish.extend(b"hi");
    send_frame(&mut s, 2, &publish).await;
    let error = read_until(&mut s, 4).await;
    assert_eq!(error[0], 7, "publisher 7");
    assert_eq!(&error[13..15], &[0, 0x12], "publisher does not exist");
}

/// Publishes messages 0..`n` to `stream` with `body(i)`, `batch` at a
/// time, each batch confirmed.
async fn publish_batches(
    env: &Environment,
    stream: &str,
    n: u64,
    batch: u64,
    body: impl Fn(u64) -> Vec<u8>,
) {
    let producer = env.producer().build(stream).await.unwrap();
    for from in (0..n).step_by(batch as usize) {
        let messages = (from..(from + batch).min(n))
            .map(|i| Message::builder().body(body(i)).build())
            .collect();
        let statuses = producer.batch_send_with_confirm(messages).await.unwrap();
        assert!(statuses.iter().all(|s| s.confirmed()));
    }
    producer.close().await.unwrap();
}

/// Subscribes (subscription 1, correlation 9) to `stream` from its first
/// offset with one credit, on a raw connection.
async fn subscribe_first(s: &mut tokio::net::TcpStream, stream: &str) {
    let mut sub = vec![0, 0, 0, 9, 1];
    sub.extend(string(stream));
    sub.extend([0, 1]); // first
    sub.extend([0, 1]); // one credit
    sub.extend([0, 0, 0, 0]);
    send_frame(s, 7, &sub).await;
    let ok = read_until(s, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 9, 0, 1], "subscribed");
}

/// A client that says it takes Deliver version 2 gets it, with the last
/// committed offset before each chunk; one that does not gets version 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_2_names_the_committed_offset_for_a_client_that_takes_it() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("committed").await.unwrap();
    publish_to(&env, "committed", 0..3).await;
    for v2 in [true, false] {
        let mut s = raw_open(&b).await;
        if v2 {
            assert_eq!(ask_deliver_v2(&mut s).await, (1, 2));
        }
        subscribe_first(&mut s, "committed").await;
        let (version, d) = read_versioned(&mut s, 8).await;
        assert_eq!(d[0], 1, "subscription 1");
        let chunk = if v2 {
            assert_eq!(version, 2);
            let committed = u64::from_be_bytes(d[1..9].try_into().unwrap());
            assert_eq!(committed, 2, "the last offset committed");
            &d[9..]
        } else {
            assert_eq!(version, 1);
            &d[1..]
        };
        let first = u64::from_be_bytes(chunk[24..32].try_into().unwrap());
        assert_eq!(first, 0, "the chunk from the first offset");
    }
}

/// A chunk's timestamp is when its messages were stored, as osiris
/// stamps a chunk when it writes it: read a while later, and again after
/// a restart, it still says when they came, not when they were read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_is_stamped_with_when_its_messages_were_stored() {
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let mut b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("stamped").await.unwrap();
    let before = now_ms();
    publish_to(&env, "stamped", 0..3).await;
    let after = now_ms();
    drop(env);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for restarted in [false, true] {
        if restarted {
            b.restart().await;
        }
        let mut s = raw_open(&b).await;
        subscribe_first(&mut s, "stamped").await;
        let d = read_until(&mut s, 8).await;
        let chunk = &d[1..];
        let stamp = i64::from_be_bytes(chunk[8..16].try_into().unwrap());
        assert!(
            (before..=after).contains(&stamp),
            "restarted {restarted}: stamped {stamp}, stored in {before}..={after}"
        );
    }
}

/// Small messages go 4,096 to a chunk (512 for large ones): a chunk
/// costs a credit round trip whatever it holds. A reader from the start
/// gets the first 4,096 in one chunk, and a client reading from offset
/// 5,000 (mid-chunk) gets every message after it, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_messages_go_thousands_to_a_chunk() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("small").await.unwrap();
    publish_batches(&env, "small", 9000, 1000, |i| i.to_string().into_bytes()).await;
    let mut s = raw_open(&b).await;
    subscribe_first(&mut s, "small").await;
    let d = read_until(&mut s, 8).await;
    let entries = u16::from_be_bytes(d[1 + 2..1 + 4].try_into().unwrap());
    let first = u64::from_be_bytes(d[1 + 24..1 + 32].try_into().unwrap());
    assert_eq!((first, entries), (0, 4096), "the first chunk");
    let mut c = env
        .consumer()
        .offset(OffsetSpecification::Offset(5000))
        .build("small")
        .await
        .unwrap();
    let got = take(&mut c, 4000).await;
    let want: Vec<_> = (5000..9000)
        .map(|i| (i, i.to_string().into_bytes()))
        .collect();
    assert_eq!(got, want);
}

/// Super streams: made with CreateSuperStream (a direct exchange and its
/// partition streams, bound in order), routed by key (Route) and by hash
/// (Partitions) by the Rust client's super stream producer, by the
/// exchange itself over AMQP 0-9-1, read whole by its super stream
/// consumer, and deleted with all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn super_streams_route_by_key_and_hash_and_go_whole() {
    use rabbitmq_stream_client::types::{
        HashRoutingMurmurStrategy, RoutingKeyRoutingStrategy, RoutingStrategy,
    };
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator()
        .create_super_stream("invoices", 3, None)
        .await
        .unwrap();
    match env
        .stream_creator()
        .create_super_stream("invoices", 3, None)
        .await
    {
        Err(StreamCreateError::Create { status, .. }) => {
            assert_eq!(status, ResponseCode::StreamAlreadyExists)
        }
        other => panic!("a second create: {other:?}"),
    }
    // Over AMQP 0-9-1 the exchange routes by the binding keys "0".."2".
    let (_c, ch) = b.channel().await;
    ch.confirm_select(Default::default()).await.unwrap();
    ch.basic_publish(
        "invoices".into(),
        "2".into(),
        BasicPublishOptions::default(),
        b"k2 over amqp",
        BasicProperties::default(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    // By routing key (Route).
    use rabbitmq_stream_client::error::ProducerPublishError;
    use rabbitmq_stream_client::ConfirmationStatus;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let confirmed = std::sync::Arc::new(AtomicUsize::new(0));
    let count = |c: &std::sync::Arc<AtomicUsize>| {
        let c = std::sync::Arc::clone(c);
        move |r: Result<ConfirmationStatus, ProducerPublishError>| {
            let c = std::sync::Arc::clone(&c);
            async move {
                if r.is_ok_and(|s| s.confirmed()) {
                    c.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    };
    let mut by_key = env
        .super_stream_producer(RoutingStrategy::RoutingKeyStrategy(
            RoutingKeyRoutingStrategy {
                routing_extractor: &key_of,
            },
        ))
        .build("invoices")
        .await
        .unwrap();
    for body in ["k0 a", "k1 b", "k0 c"] {
        let m = Message::builder().body(body.as_bytes().to_vec()).build();
        by_key.send(m, count(&confirmed)).await.unwrap();
    }
    // A key no binding has reaches nothing: the client refuses the send.
    let m = Message::builder().body(b"k9 none".to_vec()).build();
    assert!(by_key.send(m, count(&confirmed)).await.is_err());
    // By hash over the partitions (Partitions).
    let mut by_hash = env
        .super_stream_producer(RoutingStrategy::HashRoutingStrategy(
            HashRoutingMurmurStrategy {
                routing_extractor: &key_of,
            },
        ))
        .build("invoices")
        .await
        .unwrap();
    for i in 0..6 {
        let m = Message::builder()
            .body(format!("h{i} hashed").into_bytes())
            .build();
        by_hash.send(m, count(&confirmed)).await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while confirmed.load(Ordering::SeqCst) < 9 {
        assert!(std::time::Instant::now() < deadline, "9 confirms");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Read whole with the super stream consumer: each keyed message in
    // its partition, the hashed ones somewhere.
    let mut consumer = env
        .super_stream_consumer()
        .offset(OffsetSpecification::First)
        .build("invoices")
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 10 {
        let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("a delivery in time")
            .expect("open")
            .expect("a delivery");
        let body = d.message().data().unwrap_or_default().to_vec();
        seen.push((d.stream().clone(), String::from_utf8(body).unwrap()));
    }
    assert!(seen.contains(&("invoices-2".into(), "k2 over amqp".into())));
    assert!(seen.contains(&("invoices-1".into(), "k1 b".into())));
    assert!(seen.contains(&("invoices-0".into(), "k0 a".into())));
    assert!(seen.contains(&("invoices-0".into(), "k0 c".into())));
    assert_eq!(seen.iter().filter(|(_, b)| b.starts_with('h')).count(), 6);
    consumer.handle().close().await.unwrap();
    by_key.close().await.unwrap();
    by_hash.close().await.unwrap();
    // Deleted: the exchange and its partitions.
    env.delete_super_stream("invoices").await.unwrap();
    assert!(env.delete_super_stream("invoices").await.is_err());
    let (_c2, ch2) = b.channel().await;
    let gone = ch2
        .queue_declare(
            "invoices-0".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    assert!(gone.is_err(), "the partitions went with it");
}

/// A client that stops reading is let go once a write has waited
/// `send_timeout` (its connection closed), rather than held open with
/// its subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_let_go() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = config(tmp.path());
    c.stream_port = Port::On(0);
    c.send_timeout_ms = 500;
    let b = start_in(tmp, c).await;
    let env = env(&b).await;
    env.stream_creator().create("big").await.unwrap();
    // 16 MiB: more than the sockets' buffers hold.
    let producer = env.producer().build("big").await.unwrap();
    for _ in 0..64 {
        let m = Message::builder().body(vec![7u8; 256 << 10]).build();
        assert!(producer.send_with_confirm(m).await.unwrap().confirmed());
    }
    let mut s = raw_open(&b).await;
    let mut sub = vec![0, 0, 0, 9, 1];
    sub.extend(string("big"));
    sub.extend([0, 1]); // first
    sub.extend([0, 100]); // credit
    sub.extend([0, 0, 0, 0]); // no properties
    send_frame(&mut s, 7, &sub).await;
    read_until(&mut s, 0x8007).await;
    // Not reading for a while: the broker's writes wait, then give up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut sink = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut sink)).await;
    assert!(ended.is_ok(), "the broker closed the connection");
}
