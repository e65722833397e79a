//! Extra lapin helpers shared by the routing / queue / consume / confirm /
//! tx tests (alongside `common`).
#![allow(dead_code)]

use std::time::Duration;

use futures::StreamExt;
use lapin::{
    options::*,
    types::{AMQPValue, FieldTable, ShortString},
    BasicProperties, Channel, Connection,
};

use super::common::*;

/// A field table from (key, value) pairs.
pub fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

/// A long-string field value.
pub fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(v.into())
}

/// The reply text carried by a lapin error, if any.
pub fn reply_text(e: &lapin::Error) -> Option<String> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(p) => Some(p.get_message().as_str().to_string()),
        _ => None,
    }
}

/// The message count a passive queue.declare reports for `queue` (also a
/// synchronous round trip: what the channel sent before was handled).
pub async fn message_count(ch: &Channel, queue: &str) -> u32 {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("passive queue.declare")
    .message_count()
}

/// Asserts `r` failed with AMQP reply `code`; returns the reply text.
#[track_caller]
pub fn expect_code<T: std::fmt::Debug>(r: Result<T, lapin::Error>, code: u16) -> String {
    match r {
        Ok(v) => panic!("expected error {code}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(reply_code(&e), Some(code), "unexpected error: {e:?}");
            reply_text(&e).unwrap_or_default()
        }
    }
}

/// Declares a queue with options and arguments.
pub async fn declare_with(
    ch: &Channel,
    name: &str,
    opts: QueueDeclareOptions,
    args: FieldTable,
) -> Result<lapin::Queue, lapin::Error> {
    ch.queue_declare(name.into(), opts, args).await
}

/// Declares an exchange.
pub async fn exchange(
    ch: &Channel,
    name: &str,
    kind: lapin::ExchangeKind,
    opts: ExchangeDeclareOptions,
    args: FieldTable,
) -> Result<(), lapin::Error> {
    ch.exchange_declare(name.into(), kind, opts, args).await
}

/// Binds `queue` to `exchange` with `key`.
pub async fn bind(ch: &Channel, queue: &str, exchange: &str, key: &str, args: FieldTable) {
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        key.into(),
        QueueBindOptions::default(),
        args,
    )
    .await
    .expect("queue.bind");
}

/// Publishes with options and properties; returns the publish result.
pub async fn publish_with(
    ch: &Channel,
    exchange: &str,
    key: &str,
    opts: BasicPublishOptions,
    body: &[u8],
    props: BasicProperties,
) -> lapin::PublisherConfirm {
    ch.basic_publish(exchange.into(), key.into(), opts, body, props)
        .await
        .expect("basic.publish")
}

/// A consumer with the given tag and options.
pub async fn consume(
    ch: &Channel,
    queue: &str,
    tag: &str,
    opts: BasicConsumeOptions,
    args: FieldTable,
) -> lapin::Consumer {
    ch.basic_consume(queue.into(), tag.into(), opts, args)
        .await
        .expect("basic.consume")
}

/// A default consumer.
pub async fn consumer(ch: &Channel, queue: &str, tag: &str) -> lapin::Consumer {
    consume(
        ch,
        queue,
        tag,
        BasicConsumeOptions::default(),
        FieldTable::default(),
    )
    .await
}

/// Waits (up to 5 s) until `f` holds.
pub async fn eventually<F: FnMut() -> bool>(mut f: F) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (up to 5 s) until `queue` holds `n` ready messages (passive
/// declare on a fresh channel of `conn`).
pub async fn wait_count(conn: &Connection, queue: &str, n: u32) -> u32 {
    let ch = conn.create_channel().await.expect("channel");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let q = ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive declare");
        if q.message_count() == n || tokio::time::Instant::now() > deadline {
            let _ = ch.close(200, "bye".into()).await;
            return q.message_count();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `queue` exists (passive declare on a fresh channel).
pub async fn queue_exists(conn: &Connection, queue: &str) -> bool {
    let ch = conn.create_channel().await.expect("channel");
    let r = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    match r {
        Ok(_) => {
            let _ = ch.close(200, "bye".into()).await;
            true
        }
        Err(e) => {
            assert_eq!(reply_code(&e), Some(404), "passive declare: {e:?}");
            false
        }
    }
}

/// Polls until `queue` is gone (true) or 5 s pass (false).
pub async fn queue_gone_eventually(conn: &Connection, queue: &str) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if !queue_exists(conn, queue).await {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `exchange` exists (passive declare on a fresh channel).
pub async fn exchange_exists(conn: &Connection, name: &str) -> bool {
    let ch = conn.create_channel().await.expect("channel");
    let r = ch
        .exchange_declare(
            name.into(),
            lapin::ExchangeKind::Direct,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    match r {
        Ok(_) => {
            let _ = ch.close(200, "bye".into()).await;
            true
        }
        Err(e) => {
            assert_eq!(reply_code(&e), Some(404), "passive declare: {e:?}");
            false
        }
    }
}

/// Connection-level error events: create before provoking the error.
pub struct Errors(futures::stream::BoxStream<'static, lapin::Event>);

impl Errors {
    pub fn new(conn: &Connection) -> Self {
        Errors(conn.events_listener().boxed())
    }

    /// The reply code of the next error event (a channel or connection
    /// closed by the server), or None after 5 s.
    pub async fn next_code(&mut self) -> Option<u16> {
        self.next_error().await.and_then(|e| reply_code(&e))
    }

    /// The next error event, or None after 5 s.
    pub async fn next_error(&mut self) -> Option<lapin::Error> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.0.next()).await {
                Ok(Some(lapin::Event::Error(e))) => return Some(e),
                Ok(Some(_)) => continue,
                _ => return None,
            }
        }
    }
}

/// Waits until the channel is no longer usable (closed by the server).
pub async fn channel_closed(ch: &Channel) -> bool {
    eventually(|| !ch.status().connected()).await
}

/// Waits until the connection is no longer usable.
pub async fn connection_closed(conn: &Connection) -> bool {
    eventually(|| !conn.status().connected()).await
}

/// Persistent delivery mode.
pub fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

/// Collects `n` deliveries' bodies as strings, acking none.
pub async fn take(consumer: &mut lapin::Consumer, n: usize) -> Vec<lapin::message::Delivery> {
    let mut out = Vec::new();
    for i in 0..n {
        let d = next(consumer)
            .await
            .unwrap_or_else(|| panic!("delivery {i} of {n} did not arrive"));
        out.push(d);
    }
    out
}

/// A delivery body as a string.
pub fn body(d: &lapin::message::Delivery) -> String {
    String::from_utf8_lossy(&d.data).into_owned()
}

/// Drains every message of `queue` with no-ack basic.get; returns bodies.
pub async fn drain(ch: &Channel, queue: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(b) = get_body(ch, queue).await {
        out.push(String::from_utf8_lossy(&b).into_owned());
    }
    out
}
