//! Stream filtering over RabbitMQ's stream protocol, with RabbitMQ's Rust
//! stream client: a producer labels messages with filter values (publish
//! version 2), a consumer asks for some values (`filter.N`,
//! `match-unfiltered`) and gets exactly those messages, with their own
//! offsets; labels cross to AMQP 0-9-1's `x-stream-filter` and back.

use crate::common;
use crate::helpers;
use crate::stream_support;

use common::streams::*;
use helpers::{s, table};
use rabbitmq_stream_client::types::{Message, OffsetSpecification};
use rabbitmq_stream_client::{Consumer, FilterConfiguration};
use stream_support::*;

/// The filter value of a test message: its body's first word.
fn colour(m: &Message) -> String {
    let body = String::from_utf8_lossy(m.data().unwrap_or_default()).into_owned();
    body.split(' ').next().unwrap_or_default().to_string()
}

/// The next `n` deliveries: (offset, body).
async fn bodies(c: &mut Consumer, n: usize) -> Vec<(u64, String)> {
    let mut got = Vec::new();
    while got.len() < n {
        let d = next_delivery(c).await;
        let body = d.message().data().unwrap_or_default();
        got.push((d.offset(), String::from_utf8_lossy(body).into_owned()));
    }
    got
}

fn at(pairs: &[(u64, &str)]) -> Vec<(u64, String)> {
    pairs.iter().map(|(o, b)| (*o, b.to_string())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_subscription_gets_exactly_its_values() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("colours").await.unwrap();
    let labelled = env
        .producer()
        .filter_value_extractor(colour)
        .build("colours")
        .await
        .expect("the server speaks publish version 2");
    for body in ["red 0", "blue 1", "red 2", "green 3"] {
        let m = Message::builder().body(body.as_bytes().to_vec()).build();
        assert!(labelled.send_with_confirm(m).await.unwrap().confirmed());
    }
    // Unlabelled (publish version 1).
    publish_to(&env, "colours", 4..5).await;
    // Over AMQP 0-9-1, labelled by the x-stream-filter-value header.
    let (conn, ch) = b.channel().await;
    publish_labelled(&ch, "colours", &[("red 5", Some("red")), ("none 6", None)]).await;

    let filtered = |values: &[&str], unfiltered| {
        let values = values.iter().map(|v| v.to_string()).collect();
        env.consumer()
            .offset(OffsetSpecification::First)
            .filter_input(Some(FilterConfiguration::new(values, unfiltered)))
    };
    // No post-filter on the client: what arrives is what the server sent.
    let mut red = filtered(&["red"], false).build("colours").await.unwrap();
    let want = at(&[(0, "red 0"), (2, "red 2"), (5, "red 5")]);
    assert_eq!(bodies(&mut red, 3).await, want, "each at its own offset");
    assert_nothing_more(&mut red).await;

    let mut some = filtered(&["blue", "green"], true)
        .build("colours")
        .await
        .unwrap();
    let want = at(&[
        (1, "blue 1"),
        (3, "green 3"),
        (4, "message 4"),
        (6, "none 6"),
    ]);
    let got = bodies(&mut some, 4).await;
    assert_eq!(got, want, "the values asked for, and the unlabelled");
    assert_nothing_more(&mut some).await;

    // A stream client's label filters an AMQP 0-9-1 reader too.
    let args = table(&[
        ("x-stream-offset", s("first")),
        ("x-stream-filter", s("blue")),
    ]);
    let (_r, mut reader) = reader_with(&conn, "colours", "", 10, args).await.unwrap();
    assert_eq!(bodies_acking(&mut reader, 1).await, ["blue 1"]);

    // A later label reaches a filtered subscription that is waiting.
    let m = Message::builder().body(b"red 7".to_vec()).build();
    assert!(labelled.send_with_confirm(m).await.unwrap().confirmed());
    assert_eq!(bodies(&mut red, 1).await, at(&[(7, "red 7")]));
}

/// A frame with `version` (the shared helper writes version 1).
async fn send_versioned(s: &mut tokio::net::TcpStream, key: u16, version: u16, body: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let mut f = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    f.extend_from_slice(&key.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(body);
    s.write_all(&f).await.unwrap();
}

/// A label is any bytes, as RabbitMQ takes it (one that is not UTF-8
/// is stored, rather than closing the connection with the batch half
/// stored); a subscription naming more than 64 values is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_are_bytes_and_filters_are_bounded() {
    let b = start_streams().await;
    let env = env(&b).await;
    env.stream_creator().create("raw").await.unwrap();
    let mut s = raw_open(&b).await;
    let mut declare = vec![0, 0, 0, 1, 7];
    declare.extend([0xff, 0xff]); // no reference
    declare.extend(string("raw"));
    send_frame(&mut s, 1, &declare).await;
    let ok = read_until(&mut s, 0x8001).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 1, 0, 1], "declared");
    let mut publish = vec![7, 0, 0, 0, 2];
    for (id, label) in [(0u64, &b"\xffbin"[..]), (1, b"red")] {
        publish.extend(id.to_be_bytes());
        publish.extend((label.len() as u16).to_be_bytes());
        publish.extend(label);
        let body = [0x00, 0x53, 0x75, 0xa0, 1, b'x'];
        publish.extend((body.len() as u32).to_be_bytes());
        publish.extend(body);
    }
    send_versioned(&mut s, 2, 2, &publish).await;
    let mut confirmed = 0;
    while confirmed < 2 {
        let c = read_until(&mut s, 3).await;
        assert_eq!(c[0], 7, "publisher 7");
        confirmed += u32::from_be_bytes(c[1..5].try_into().unwrap());
    }
    // A subscription for "red" gets offset 1 alone (offset 0, labelled
    // with bytes that are not UTF-8, was stored and is passed over).
    let mut s = raw_open(&b).await;
    let mut sub = vec![0, 0, 0, 3, 1];
    sub.extend(string("raw"));
    sub.extend([0, 1, 0, 10]);
    sub.extend(1u32.to_be_bytes());
    sub.extend(string("filter.0"));
    sub.extend(string("red"));
    send_frame(&mut s, 7, &sub).await;
    let ok = read_until(&mut s, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 3, 0, 1]);
    let chunk = read_until(&mut s, 8).await;
    let first = u64::from_be_bytes(chunk[25..33].try_into().unwrap());
    assert_eq!((first, &chunk[3..5]), (1, &[0u8, 1][..]), "offset 1 alone");
    // 65 values: refused.
    let mut sub = vec![0, 0, 0, 4, 2];
    sub.extend(string("raw"));
    sub.extend([0, 1, 0, 10]);
    sub.extend(65u32.to_be_bytes());
    for i in 0..65 {
        sub.extend(string(&format!("filter.{i}")));
        sub.extend(string("v"));
    }
    send_frame(&mut s, 7, &sub).await;
    let refused = read_until(&mut s, 0x8007).await;
    assert_eq!(&refused[..6], &[0, 0, 0, 4, 0, 0x11], "precondition failed");
}
