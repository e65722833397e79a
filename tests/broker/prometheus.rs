//! Prometheus metrics as rabbitmq_prometheus exposes them: /metrics with
//! the families RabbitMQ's Grafana "RabbitMQ-Overview" dashboard reads
//! (identity and build info, global message counters, queue depths,
//! object counts, memory, disk, file descriptors), /metrics/per-object
//! with one series per queue, and `promtool check metrics` accepting both.

use crate::common;
use crate::helpers;

use std::collections::HashMap;

use common::*;
use helpers::*;
use lapin::{options::*, types::FieldTable, BasicProperties};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GET `path` from `b`'s Prometheus listener: (content type, body).
async fn scrape(b: &TestBroker, path: &str) -> (String, String) {
    let addr = b.metrics.expect("the Prometheus listener runs");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    let ctype = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_string)
        })
        .unwrap_or_default();
    (ctype, body.to_string())
}

/// Series (name with labels) to values.
fn series(body: &str) -> HashMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Runs `promtool check metrics` on `body` when promtool is installed
/// (.ci/run installs Debian's prometheus package); its verdict must be ok.
fn promtool_accepts(body: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        assert!(
            std::env::var("WARREN_REQUIRE_PROMTOOL").is_err(),
            "promtool is required here but not installed"
        );
        eprintln!("promtool not installed: skipping its check");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool refused the metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_rabbitmqs_names_and_count_what_clients_did() {
    let b = start_with_api().await;
    let (c, ch) = b.channel().await;
    declare(&ch, "work").await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for _ in 0..3 {
        ch.basic_publish(
            "".into(),
            "work".into(),
            BasicPublishOptions::default(),
            b"m",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    // One unroutable, dropped.
    ch.basic_publish(
        "".into(),
        "nowhere".into(),
        BasicPublishOptions::default(),
        b"x",
        BasicProperties::default(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let got = ch
        .basic_get("work".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .unwrap();
    got.delivery.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(message_count(&ch, "work").await, 2);
    let (ctype, body) = scrape(&b, "/metrics").await;
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let s = series(&body);
    let id = s
        .keys()
        .find(|k| k.starts_with("rabbitmq_identity_info{"))
        .expect("identity info");
    for label in [
        "rabbitmq_node=",
        "rabbitmq_cluster=",
        "rabbitmq_cluster_permanent_id=",
        "rabbitmq_endpoint=",
    ] {
        assert!(id.contains(label), "{id}");
    }
    assert!(s.keys().any(|k| k.starts_with("rabbitmq_build_info{")));
    let amqp = |n: &str| s[&format!("rabbitmq_global_messages_{n}_total{{protocol=\"amqp091\"}}")];
    assert_eq!(amqp("received"), 4.0);
    assert_eq!(amqp("received_confirm"), 4.0);
    assert_eq!(amqp("routed"), 3.0);
    assert_eq!(amqp("unroutable_dropped"), 1.0);
    assert_eq!(amqp("confirmed"), 4.0);
    let classic = |n: &str| {
        s[&format!(
            "rabbitmq_global_messages_{n}_total{{protocol=\"amqp091\",queue_type=\"rabbit_classic_queue\"}}"
        )]
    };
    assert_eq!(classic("delivered_get_manual_ack"), 1.0);
    assert_eq!(classic("acknowledged"), 1.0);
    assert_eq!(s["rabbitmq_queue_messages"], 2.0);
    assert_eq!(s["rabbitmq_queue_messages_ready"], 2.0);
    assert_eq!(s["rabbitmq_queues"], 1.0);
    assert_eq!(s["rabbitmq_connections"], 1.0);
    assert_eq!(s["rabbitmq_channels"], 1.0);
    assert!(s["rabbitmq_connections_opened_total"] >= 1.0);
    // The one channel that published is a publisher; the uptime the
    // dashboards join the build on is there.
    assert_eq!(s["rabbitmq_global_publishers"], 1.0);
    assert!(s["rabbitmq_erlang_uptime_seconds"] >= 0.0);
    // The four bodies (1 byte each) in the histogram, RabbitMQ 4's buckets.
    let size = |suffix: &str| s[&format!("rabbitmq_message_size_bytes_{suffix}")];
    assert_eq!(size("bucket{protocol=\"amqp091\",le=\"100.0\"}"), 4.0);
    assert_eq!(size("bucket{protocol=\"amqp091\",le=\"1e+08\"}"), 4.0);
    assert_eq!(size("bucket{protocol=\"amqp091\",le=\"+Inf\"}"), 4.0);
    assert_eq!(size("sum{protocol=\"amqp091\"}"), 4.0);
    assert_eq!(size("count{protocol=\"amqp091\"}"), 4.0);
    // One queue declared (passive declares do not count) and created.
    assert_eq!(s["rabbitmq_queues_declared_total"], 1.0);
    assert_eq!(s["rabbitmq_queues_created_total"], 1.0);
    assert_eq!(s["rabbitmq_queues_deleted_total"], 0.0);
    for k in [
        "rabbitmq_process_resident_memory_bytes",
        "rabbitmq_resident_memory_limit_bytes",
        "rabbitmq_disk_space_available_bytes",
        "rabbitmq_process_open_fds",
        "rabbitmq_process_max_fds",
    ] {
        assert!(s[k] > 0.0, "{k}");
    }
    promtool_accepts(&body);
    // Counters do not go back when a channel closes.
    ch.queue_delete("work".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    ch.close(200, "bye".into()).await.unwrap();
    let s = series(&scrape(&b, "/metrics").await.1);
    assert_eq!(
        s["rabbitmq_global_messages_received_total{protocol=\"amqp091\"}"],
        4.0
    );
    assert_eq!(s["rabbitmq_channels_closed_total"], 1.0);
    assert_eq!(s["rabbitmq_queues_deleted_total"], 1.0);
    assert_eq!(s["rabbitmq_global_publishers"], 0.0);
    assert_eq!(
        s["rabbitmq_message_size_bytes_count{protocol=\"amqp091\"}"],
        4.0
    );
    // Sizes land in their buckets, bounds included.
    let ch = c.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for size in [100, 101, 10_000, 1_000_001] {
        ch.basic_publish(
            "".into(),
            "nowhere".into(),
            BasicPublishOptions::default(),
            &vec![0u8; size],
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let s = series(&scrape(&b, "/metrics").await.1);
    let le = |bound: &str| {
        s[&format!("rabbitmq_message_size_bytes_bucket{{protocol=\"amqp091\",le=\"{bound}\"}}")]
    };
    let cumulative: Vec<f64> = [
        "100.0", "1000.0", "10000.0", "100000.0", "1e+06", "1e+07", "5e+07", "1e+08", "+Inf",
    ]
    .iter()
    .map(|b| le(b))
    .collect();
    assert_eq!(cumulative, [5.0, 6.0, 7.0, 7.0, 7.0, 8.0, 8.0, 8.0, 8.0]);
    assert_eq!(
        s["rabbitmq_message_size_bytes_sum{protocol=\"amqp091\"}"],
        (4 + 100 + 101 + 10_000 + 1_000_001) as f64
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_object_metrics_have_one_series_per_queue() {
    let b = start_with_api().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "a").await;
    declare(&ch, "b \"quoted\"").await;
    ch.queue_bind(
        "a".into(),
        "amq.direct".into(),
        "a".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    publish(&ch, "amq.direct", "a", b"1").await;
    assert_eq!(message_count(&ch, "a").await, 1);
    let body = scrape(&b, "/metrics/per-object").await.1;
    let s = series(&body);
    assert_eq!(s["rabbitmq_queue_messages{vhost=\"/\",queue=\"a\"}"], 1.0);
    assert_eq!(
        s["rabbitmq_queue_messages{vhost=\"/\",queue=\"b \\\"quoted\\\"\"}"],
        0.0
    );
    assert!(body.contains("rabbitmq_endpoint=\"per-object\""));
    promtool_accepts(&body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_object_metrics_carry_each_streams_offsets() {
    let b = start_with_api().await;
    let (_c, ch) = b.channel().await;
    let args = table(&[
        ("x-queue-type", s("stream")),
        (
            "x-stream-max-segment-size-bytes",
            lapin::types::AMQPValue::LongLongInt(10),
        ),
    ]);
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    declare_with(&ch, "events", durable, args).await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for _ in 0..3 {
        ch.basic_publish(
            "".into(),
            "events".into(),
            BasicPublishOptions::default(),
            b"0123456789",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let body = scrape(&b, "/metrics/per-object").await.1;
    let s = series(&body);
    let of = |family: &str| s[&format!("{family}{{vhost=\"/\",queue=\"events\"}}")];
    assert_eq!(of("rabbitmq_queue_messages"), 3.0);
    assert_eq!(of("warren_stream_first_offset"), 0.0);
    assert_eq!(of("warren_stream_next_offset"), 3.0);
    assert_eq!(of("warren_stream_segments"), 3.0);
    promtool_accepts(&body);
}
