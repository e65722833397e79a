//! What the stream tests share: declaring a stream, publishing to it
//! with confirms, readers from an offset, and reading what they get.

#![allow(dead_code)]

use lapin::{
    options::*,
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel,
};

use super::common::next;
use super::helpers::{declare_with, s, table};

pub fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

pub fn stream(extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut pairs = vec![("x-queue-type", s("stream"))];
    pairs.extend(extra.iter().cloned());
    table(&pairs)
}

pub async fn declare_stream(ch: &Channel, name: &str) {
    declare_with(ch, name, durable(), stream(&[]))
        .await
        .expect("stream declared");
}

/// Publishes `bodies` to `name` with confirms, all confirmed.
pub async fn publish_confirmed(ch: &Channel, name: &str, bodies: impl IntoIterator<Item = String>) {
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap_or_default();
    let mut confirms = Vec::new();
    for b in bodies {
        let c = ch
            .basic_publish(
                "".into(),
                name.into(),
                BasicPublishOptions::default(),
                b.as_bytes(),
                BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_headers(table(&[("app", s("kept"))])),
            )
            .await
            .expect("publish");
        confirms.push(c);
    }
    for c in confirms {
        assert!(c.await.expect("confirm").is_ack());
    }
}

/// A consumer of stream `name` with prefetch `prefetch`, starting at
/// `offset` (None: the default).
pub async fn reader(
    conn: &lapin::Connection,
    name: &str,
    prefetch: u16,
    offset: Option<AMQPValue>,
) -> (Channel, lapin::Consumer) {
    let ch = conn.create_channel().await.unwrap();
    ch.basic_qos(prefetch, BasicQosOptions::default())
        .await
        .unwrap();
    let args = match offset {
        Some(v) => table(&[("x-stream-offset", v)]),
        None => FieldTable::default(),
    };
    let c = ch
        .basic_consume(name.into(), "".into(), BasicConsumeOptions::default(), args)
        .await
        .expect("consume");
    (ch, c)
}

pub fn offset_of(d: &lapin::message::Delivery) -> i64 {
    let headers = d.properties.headers().clone().expect("headers");
    match headers.inner().get("x-stream-offset") {
        Some(AMQPValue::LongLongInt(n)) => *n,
        other => panic!("x-stream-offset header: {other:?}"),
    }
}

/// Reads `n` deliveries, acking each; their (offset, body).
pub async fn read_acking(c: &mut lapin::Consumer, n: usize) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    for i in 0..n {
        let d = next(c)
            .await
            .unwrap_or_else(|| panic!("delivery {i} of {n} did not arrive"));
        out.push((offset_of(&d), String::from_utf8_lossy(&d.data).into_owned()));
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    out
}

pub fn numbered(range: std::ops::Range<i64>) -> Vec<(i64, String)> {
    range.map(|i| (i, format!("m{i}"))).collect()
}

/// A consumer of stream `name` tagged `tag` ("": the server names it),
/// with prefetch `prefetch` and consumer arguments `args`.
pub async fn reader_with(
    conn: &lapin::Connection,
    name: &str,
    tag: &str,
    prefetch: u16,
    args: FieldTable,
) -> Result<(Channel, lapin::Consumer), lapin::Error> {
    let ch = conn.create_channel().await?;
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let c = ch
        .basic_consume(
            name.into(),
            tag.into(),
            BasicConsumeOptions::default(),
            args,
        )
        .await?;
    Ok((ch, c))
}

/// Publishes `(body, filter value)` pairs to `name` with confirms, the
/// value (if any) in the x-stream-filter-value header.
pub async fn publish_labelled(ch: &Channel, name: &str, messages: &[(&str, Option<&str>)]) {
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap_or_default();
    let mut confirms = Vec::new();
    for (body, value) in messages {
        let props = match value {
            Some(v) => {
                BasicProperties::default().with_headers(table(&[("x-stream-filter-value", s(v))]))
            }
            None => BasicProperties::default(),
        };
        let c = ch
            .basic_publish(
                "".into(),
                name.into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                props,
            )
            .await
            .expect("publish");
        confirms.push(c);
    }
    for c in confirms {
        assert!(c.await.expect("confirm").is_ack());
    }
}

/// Reads `n` deliveries, acking each; their bodies.
pub async fn bodies_acking(c: &mut lapin::Consumer, n: usize) -> Vec<String> {
    read_acking(c, n)
        .await
        .into_iter()
        .map(|(_, b)| b)
        .collect()
}
