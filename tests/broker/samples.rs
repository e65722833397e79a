//! RabbitMQ's `samples` for charts: `lengths_age` / `msg_rates_age` on
//! /api/overview and a queue give the sampler's values of the last
//! minutes (depths as they were, message counters as running totals),
//! newest first; without them there are none; any increment is taken.
//! A depth's `rate` is its change between the last two samples.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const HISTORY: &str = "lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5";

async fn get(api: &str, path: &str) -> (u16, Value) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let r = reqwest::Client::new()
        .get(format!("http://{api}/api{path}"))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .expect("the API answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The newest sample of `details`, if any.
fn newest(details: &Value) -> Option<u64> {
    details["samples"].as_array()?.first()?["sample"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_and_a_queue_give_samples_for_charts() {
    let b = start_with_api().await;
    let api = b.api.expect("API").to_string();
    let (_c, ch) = b.channel().await;
    declare(&ch, "charted").await;
    for _ in 0..3 {
        publish(&ch, "", "charted", b"x").await;
    }
    // The sampler records every 5 s: wait for a sample with all three.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (queue, overview) = loop {
        let (_, q) = get(&api, &format!("/queues/%2F/charted?{HISTORY}")).await;
        let (_, o) = get(&api, &format!("/overview?{HISTORY}")).await;
        if newest(&q["messages_details"]) == Some(3)
            && newest(&q["message_stats"]["publish_details"]) == Some(3)
            && newest(&o["queue_totals"]["messages_details"]) == Some(3)
        {
            break (q, o);
        }
        assert!(Instant::now() < deadline, "no samples: {q}\n{o}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let samples = queue["messages_ready_details"]["samples"]
        .as_array()
        .unwrap();
    let stamps: Vec<u64> = samples
        .iter()
        .filter_map(|s| s["timestamp"].as_u64())
        .collect();
    assert!(
        stamps.windows(2).all(|w| w[0] > w[1]),
        "newest first: {stamps:?}"
    );
    assert!(overview["message_stats"]["publish_details"]["samples"].is_array());

    // Depths' rates: two more messages show as growth until the next
    // sample after the one that saw them.
    for _ in 0..2 {
        publish(&ch, "", "charted", b"x").await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, q) = get(&api, "/queues/%2F/charted").await;
        let (_, o) = get(&api, "/overview").await;
        let rate = |v: &Value| v["rate"].as_f64().unwrap_or(0.0);
        if rate(&q["messages_details"]) > 0.0
            && rate(&o["queue_totals"]["messages_ready_details"]) > 0.0
        {
            break;
        }
        assert!(Instant::now() < deadline, "no depth rate: {q}\n{o}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Without the parameters, no samples; an absurd increment is taken.
    let (status, q) = get(&api, "/queues/%2F/charted").await;
    assert_eq!(status, 200);
    assert!(q["messages_details"].get("samples").is_none(), "{q}");
    let (status, q) = get(
        &api,
        "/queues/%2F/charted?lengths_age=18446744073709551615&lengths_incr=18446744073709551615",
    )
    .await;
    assert_eq!(status, 200);
    assert!(q["messages_details"]["samples"].is_array(), "{q}");
    let (status, _) = get(
        &api,
        "/overview?msg_rates_age=600&msg_rates_incr=18446744073709551615",
    )
    .await;
    assert_eq!(status, 200);
}
