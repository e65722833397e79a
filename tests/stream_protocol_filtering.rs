//! Stream filtering over RabbitMQ's stream protocol, with RabbitMQ's Rust
//! stream client: a producer labels messages with filter values (publish
//! version 2), a consumer asks for some values (`filter.N`,
//! `match-unfiltered`) and gets exactly those messages, with their own
//! offsets; labels cross to AMQP 0-9-1's `x-stream-filter` and back.

mod common;
mod helpers;
mod stream_support;

use std::time::Duration;

use common::streams::*;
use futures::StreamExt;
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
        let d = tokio::time::timeout(Duration::from_secs(10), c.next())
            .await
            .expect("a delivery in time")
            .expect("the consumer is open")
            .expect("a delivery");
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
