//! RabbitMQ's Grafana "RabbitMQ-Overview" dashboard against Warren: a real
//! Prometheus (Debian's package, which .ci/run installs) scrapes the
//! broker while clients publish, consume, get, confirm and churn queues,
//! channels and connections; then every panel query of the dashboard is
//! evaluated with its variables filled in as Grafana fills them, and each
//! must return data.
//!
//! The dashboard's JSON comes from rabbitmq-server
//! (deps/rabbitmq_prometheus/docker/grafana/dashboards); it is not ours to
//! copy into the project, so the test reads it from
//! `../shared/fixtures/grafana-rabbitmq-overview.json` (or
//! WARREN_GRAFANA_DASHBOARD) and says it is skipped when it is absent.

use crate::common;
use crate::helpers;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use helpers::*;
use lapin::{options::*, BasicProperties};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The dashboard's JSON, if it is here.
fn dashboard() -> Option<Value> {
    let path = std::env::var_os("WARREN_GRAFANA_DASHBOARD")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../shared/fixtures/grafana-rabbitmq-overview.json")
        });
    let text = std::fs::read_to_string(&path).ok()?;
    Some(serde_json::from_str(&text).expect("the dashboard is JSON"))
}

/// Every (panel title, query expression) of the dashboard, nested rows
/// included.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            if let Some(inner) = p["panels"].as_array() {
                walk(inner, out);
            }
            let title = p["title"].as_str().unwrap_or("").to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push((title.clone(), expr.to_string()));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(
        dashboard["panels"]
            .as_array()
            .expect("the dashboard has panels"),
        &mut out,
    );
    out
}

/// A Prometheus server, stopped when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts Prometheus scraping `target`'s /metrics every second; None
/// when it is not installed (an error where .ci/run requires it).
fn prometheus(target: SocketAddr) -> Option<Prometheus> {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: warren\n    metrics_path: /metrics\n    \
             static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .expect("write the config");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let spawned = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    match spawned {
        Ok(child) => Some(Prometheus {
            child,
            addr,
            _dir: dir,
        }),
        Err(e) => {
            assert!(
                std::env::var("WARREN_REQUIRE_PROMTOOL").is_err(),
                "prometheus is required here but does not run: {e}"
            );
            None
        }
    }
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// GET `path` from Prometheus's HTTP API: its `data`, or None if it does
/// not answer (yet).
async fn api_get(p: &Prometheus, path: &str) -> Option<Value> {
    let mut s = tokio::net::TcpStream::connect(p.addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (_, body) = text.split_once("\r\n\r\n")?;
    let v: Value = serde_json::from_str(body).ok()?;
    assert_eq!(v["status"], "success", "{path}: {v}");
    Some(v["data"].clone())
}

/// An instant query's result vector.
async fn query(p: &Prometheus, expr: &str) -> Vec<Value> {
    let data = api_get(p, &format!("/api/v1/query?query={}", encode(expr)))
        .await
        .unwrap_or_else(|| panic!("prometheus did not answer {expr}"));
    data["result"].as_array().cloned().unwrap_or_default()
}

/// Clients doing what the dashboard's panels count, until `stop`: a
/// publisher with confirms (of every size bucket once), unroutable
/// publishes (dropped and returned), consumers with auto and manual
/// ack, a requeue, basic.get of every kind, and queues, channels and
/// connections coming and going.
async fn traffic(b: &TestBroker, stop: Arc<AtomicBool>) {
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare(&ch, "work").await;
    declare(&ch, "polled").await;
    declare(&ch, "empty").await;
    let sizes = [10, 500, 5_000, 50_000, 500_000, 5_000_000, 20_000_000];
    for size in sizes {
        confirmed(&ch, "", "polled", &vec![0u8; size], false).await;
    }
    ch.queue_purge("polled".into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    let consumers = b.connect().await;
    let auto = consumers.create_channel().await.unwrap();
    let manual = consumers.create_channel().await.unwrap();
    let _auto = consume(
        &auto,
        "work",
        "auto",
        BasicConsumeOptions {
            no_ack: true,
            ..Default::default()
        },
        Default::default(),
    )
    .await;
    let mut manual_consumer = consumer(&manual, "work", "manual").await;
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        for _ in 0..20 {
            confirmed(&ch, "", "work", b"work", false).await;
        }
        confirmed(&ch, "", "nowhere", b"dropped", false).await;
        confirmed(&ch, "", "nowhere", b"returned", true).await;
        // A manual-ack consumer requeues one now and then, and acks.
        while let Ok(Some(Ok(d))) =
            tokio::time::timeout(Duration::from_millis(5), manual_consumer.next()).await
        {
            let requeue = round.is_multiple_of(3) && !d.redelivered;
            if requeue {
                d.acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
            } else {
                d.acker.ack(BasicAckOptions::default()).await.unwrap();
            }
        }
        confirmed(&ch, "", "polled", b"polled", false).await;
        confirmed(&ch, "", "polled", b"polled", false).await;
        let got = ch
            .basic_get("polled".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap();
        if let Some(g) = got {
            g.delivery.ack(BasicAckOptions::default()).await.unwrap();
        }
        let _ = ch
            .basic_get("polled".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap();
        let _ = ch
            .basic_get("empty".into(), BasicGetOptions { no_ack: true })
            .await;
        // Churn: a connection with a channel and a queue, gone again.
        let (c2, ch2) = b.channel().await;
        declare(&ch2, "churn").await;
        ch2.queue_delete("churn".into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        ch2.close(200, "bye".into()).await.unwrap();
        c2.close(200, "bye".into()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes and waits for the confirm (a returned message is confirmed
/// too).
async fn confirmed(ch: &lapin::Channel, exchange: &str, key: &str, body: &[u8], mandatory: bool) {
    ch.basic_publish(
        exchange.into(),
        key.into(),
        BasicPublishOptions {
            mandatory,
            ..Default::default()
        },
        body,
        BasicProperties::default(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

/// Waits for enough scrapes, fills in the dashboard's variables as Grafana
/// does from its own queries, and runs every panel query: the ones that
/// return nothing, and the first value of the others by panel title.
async fn evaluate(
    p: &Prometheus,
    panels: &[(String, String)],
) -> (Vec<String>, Vec<(String, Value)>) {
    // Enough scrapes for rate() and irate() over the window.
    let mut samples = 0.0;
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if api_get(p, "/api/v1/query?query=up").await.is_none() {
            continue;
        }
        let r = query(p, "count_over_time(rabbitmq_identity_info[1m])").await;
        samples = r
            .first()
            .and_then(|v| v["value"][1].as_str())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0);
        if samples >= 8.0 {
            break;
        }
    }
    assert!(samples >= 8.0, "prometheus scraped Warren {samples} times");
    let series = api_get(p, "/api/v1/series?match[]=rabbitmq_identity_info")
        .await
        .expect("series");
    let identity = &series[0];
    let label = |k: &str| identity[k].as_str().unwrap_or("").to_string();
    let (namespace, cluster, endpoint) = (
        label("namespace"),
        label("rabbitmq_cluster"),
        label("rabbitmq_endpoint"),
    );
    assert!(!cluster.is_empty(), "{identity}");
    assert_eq!(endpoint, "metrics");
    let fill = |expr: &str| {
        expr.replace("$rabbitmq_cluster", &cluster)
            .replace("$namespace", &namespace)
            .replace("$endpoint", &endpoint)
            .replace("$__rate_interval", "1m")
            .replace("$__range", "1m")
    };
    let mut empty = Vec::new();
    let mut values = Vec::new();
    for (title, expr) in panels {
        let result = query(p, &fill(expr)).await;
        match result.first() {
            None => empty.push(format!("{title}: {expr}")),
            Some(v) => values.push((title.clone(), v["value"][1].clone())),
        }
    }
    (empty, values)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_of_rabbitmqs_overview_dashboard_has_data() {
    let Some(dashboard) = dashboard() else {
        eprintln!(
            "skipped: ../shared/fixtures/grafana-rabbitmq-overview.json is absent \
             (set WARREN_GRAFANA_DASHBOARD to the dashboard's JSON)"
        );
        return;
    };
    let panels = queries(&dashboard);
    assert_eq!(panels.len(), 50, "the dashboard's 50 panel queries");
    let b = start_with_api().await;
    let Some(p) = prometheus(b.metrics.expect("the Prometheus listener runs")) else {
        eprintln!("skipped: prometheus is not installed");
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let checks = async {
        let outcome = evaluate(&p, &panels).await;
        stop.store(true, Ordering::Relaxed);
        outcome
    };
    let ((), (empty, values)) = tokio::join!(traffic(&b, Arc::clone(&stop)), checks);
    assert!(
        empty.is_empty(),
        "{} of {} panel queries return nothing:\n{}",
        empty.len(),
        panels.len(),
        empty.join("\n")
    );
    let value = |title: &str| -> f64 {
        values
            .iter()
            .find(|(t, _)| t == title)
            .and_then(|(_, v)| v.as_str()?.parse().ok())
            .unwrap_or(f64::NAN)
    };
    assert_eq!(value("Nodes"), 1.0);
    assert!(value("Publishers") >= 1.0, "{values:?}");
    assert!(value("Consumers") >= 2.0, "{values:?}");
    assert!(value("Incoming messages / s") > 0.0, "{values:?}");
}
