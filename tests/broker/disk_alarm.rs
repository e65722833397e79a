//! The free-disk alarm (RabbitMQ's disk_free_limit): under the limit,
//! connections that publish are blocked ("low on disk") while consumers go
//! on, and the API, the health checks and Prometheus say so; above it,
//! publishes flow again. On a small filesystem the test mounts (tmpfs with
//! a size, as root: .ci/run requires it), the alarm follows the free
//! space, and a write that finds the disk full is never confirmed, loses
//! nothing confirmed before it, and holds no connection: the node opens
//! its store again once space is back.

use crate::common;
use crate::helpers;

use std::path::PathBuf;
use std::time::Duration;

use amq_protocol::protocol::{connection, AMQPClass};
use common::child::ChildBroker;
use common::*;
use helpers::*;
use lapin::options::*;
use rabbitmq_http_client::api::{Client, HttpClientError};
use rabbitmq_http_client::responses::HealthCheckFailureDetails;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren::config::{DiskFreeLimit, Port};

/// A limit no disk is under: the alarm is up from the start.
const HUGE: u64 = 1 << 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_are_blocked_under_the_limit_and_every_view_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.disk_free_limit = DiskFreeLimit::Absolute(HUGE);
    cfg.management_port = Port::On(0);
    cfg.prometheus_port = Port::On(0);
    let b = start_with(cfg).await;
    let broker = std::sync::Arc::clone(&b.server.as_ref().unwrap().broker);
    assert!(broker.disk.is_raised() && !broker.memory.is_raised());

    // A publishing connection is told why, and is not read.
    let mut r = raw::Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&raw::queue_declare(1, "q", false, false, false))
        .await;
    let (_, declare_ok) = r.expect_method().await;
    assert!(matches!(declare_ok, AMQPClass::Queue(_)), "{declare_ok:?}");
    r.send(&raw::publish_message(1, "", "q", b"first")).await;
    let (ch, m) = r.expect_method().await;
    assert_eq!(ch, 0);
    match m {
        AMQPClass::Connection(connection::AMQPMethod::Blocked(b)) => {
            assert_eq!(b.reason.as_str(), "low on disk")
        }
        other => panic!("expected connection.blocked, got {other:?}"),
    }
    r.send(&raw::publish_message(1, "", "q", b"second")).await;

    // The API, the health checks and the metrics.
    let endpoint = format!("http://{}/api", b.api.unwrap());
    let rc = Client::new(endpoint, "guest".to_string(), "guest".to_string());
    let node = rc.overview().await.expect("overview").node;
    let info = rc.get_node_info(&node).await.expect("node");
    assert!(info.has_free_disk_space_alarm_in_effect);
    assert!(!info.has_memory_alarm_in_effect);
    assert_eq!(info.free_disk_space_low_watermark, HUGE);
    match rc.health_check_local_alarms().await {
        Err(HttpClientError::HealthCheckFailed {
            status_code,
            details: HealthCheckFailureDetails::AlarmCheck(d),
            ..
        }) => {
            assert_eq!(status_code.as_u16(), 503);
            assert_eq!(d.alarms.len(), 1, "{d:?}");
            assert_eq!(d.alarms[0].resource, "disk");
        }
        other => panic!("expected a failed alarm check, got {other:?}"),
    }
    let metrics = scrape(b.metrics.unwrap()).await;
    assert!(metrics.contains("\nrabbitmq_alarms_free_disk_space_watermark 1\n"));
    assert!(metrics.contains(&format!(
        "\nrabbitmq_disk_space_available_limit_bytes {HUGE}\n"
    )));

    // Consumers go on; the second publish waits unread.
    let (_c, cch) = b.channel().await;
    assert_eq!(
        get_eventually(&cch, "q").await.as_deref(),
        Some(&b"first"[..])
    );
    assert_eq!(get_body(&cch, "q").await, None, "the second is not read");

    broker.disk.set_limit(0);
    let (ch, m) = r.expect_method().await;
    assert_eq!(ch, 0);
    assert!(
        matches!(
            m,
            AMQPClass::Connection(connection::AMQPMethod::Unblocked(_))
        ),
        "expected connection.unblocked, got {m:?}"
    );
    assert_eq!(
        get_eventually(&cch, "q").await.as_deref(),
        Some(&b"second"[..])
    );
    assert!(rc.health_check_local_alarms().await.is_ok());
    let metrics = scrape(b.metrics.unwrap()).await;
    assert!(metrics.contains("\nrabbitmq_alarms_free_disk_space_watermark 0\n"));
}

#[test]
fn limits_are_read_as_rabbitmq_writes_them_and_nonsense_is_refused() {
    let bin = env!("CARGO_BIN_EXE_warren");
    for bad in ["-5", "5 parsecs", "mem_relative:0", "mem_relative:x"] {
        let out = std::process::Command::new(bin)
            .args(["--port", "0", &format!("--disk-free-limit={bad}")])
            .output()
            .expect("run warren");
        assert!(!out.status.success(), "--disk-free-limit {bad} was taken");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("disk-free-limit") || err.contains("disk_free_limit"),
            "{err}"
        );
    }
}

/// GET /metrics from a Prometheus listener: the whole response.
async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    String::from_utf8(raw).expect("UTF-8")
}

/// A tmpfs of `mib` MiB mounted for the test; unmounted when dropped.
struct SmallFs {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl SmallFs {
    /// None (the test says it is skipped) where no filesystem can be
    /// mounted, unless WARREN_REQUIRE_MOUNT is set (.ci/run sets it when
    /// it runs as root).
    fn mount(mib: u64) -> Option<SmallFs> {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("fs");
        std::fs::create_dir(&dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&dir)
            .output()
            .expect("run mount");
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            assert!(
                std::env::var_os("WARREN_REQUIRE_MOUNT").is_none(),
                "cannot mount a small tmpfs (root is needed): {why}"
            );
            eprintln!("skipped: cannot mount a small tmpfs (root is needed): {why}");
            return None;
        }
        Some(SmallFs { dir, _tmp: tmp })
    }

    fn free(&self) -> u64 {
        warren::alarm::disk_free(&self.dir).expect("statvfs")
    }

    /// Writes a file that leaves about `left` bytes free.
    fn fill_to(&self, left: u64) -> PathBuf {
        use std::io::Write;
        let path = self.dir.join("ballast");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let chunk = vec![0x5a; 64 << 10];
        while self.free() > left {
            let n = (self.free() - left).min(chunk.len() as u64) as usize;
            if f.write_all(&chunk[..n.max(4096)]).is_err() {
                break;
            }
        }
        f.sync_all().ok();
        path
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
    }
}

fn data_dir(fs: &SmallFs) -> PathBuf {
    let d = fs.dir.join("data");
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn node_info(api_port: u16) -> serde_json::Value {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", api_port))
        .await
        .unwrap();
    // guest:guest
    let req = "GET /api/nodes HTTP/1.0\r\nHost: localhost\r\n\
               Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\r\n";
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    assert!(head.contains(" 200 "), "{head}");
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
    v[0].clone()
}

async fn alarm_shows(api_port: u16, raised: bool) -> bool {
    for _ in 0..300 {
        if node_info(api_port).await["disk_free_alarm"] == raised {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_small_filesystem_the_alarm_follows_the_free_space() {
    let Some(fs) = SmallFs::mount(64) else { return };
    let log = fs._tmp.path().join("warren.log");
    let b = ChildBroker::spawn_with_api(&data_dir(&fs), &log, &["--disk-free-limit", "24MB"]);
    let conn = b.connect().await;
    let api = b.api_port.unwrap();
    assert!(alarm_shows(api, false).await, "{}", b.log_tail());
    let info = node_info(api).await;
    assert_eq!(info["disk_free_limit"], 24_000_000);
    assert!(info["disk_free"].as_u64().unwrap() > 24_000_000);

    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    durable_queue(&ch).await;
    let ok = publish_persistent(&ch, b"before").await;
    assert!(ok.await.unwrap().is_ack());

    // Something else fills the disk: the alarm goes up; the publisher's
    // next message is taken (it is what blocks the connection, as in
    // RabbitMQ) and the one after it waits.
    let ballast = fs.fill_to(8 << 20);
    assert!(alarm_shows(api, true).await, "{}", b.log_tail());
    let during = publish_persistent(&ch, b"during").await;
    assert!(eventually(|| conn.status().blocked()).await);
    assert!(during.await.unwrap().is_ack());
    // lapin holds frames back once told it is blocked: publish aside.
    let pch = ch.clone();
    let waiting = tokio::spawn(async move {
        let confirm = publish_persistent(&pch, b"waiting").await;
        confirm.await.unwrap()
    });
    let consumer = b.connect().await;
    let cch = consumer.create_channel().await.unwrap();
    assert_eq!(message_count(&cch, "q").await, 2);

    // Space comes back: so do the publishes.
    std::fs::remove_file(ballast).unwrap();
    assert!(alarm_shows(api, false).await, "{}", b.log_tail());
    assert!(eventually(|| !conn.status().blocked()).await);
    assert!(waiting.await.unwrap().is_ack());
    assert_eq!(message_count(&cch, "q").await, 3);
}

async fn durable_queue(ch: &lapin::Channel) {
    let opts = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    declare_with(ch, "q", opts, Default::default())
        .await
        .expect("declare q");
}

async fn publish_persistent(ch: &lapin::Channel, body: &[u8]) -> lapin::PublisherConfirm {
    ch.basic_publish(
        "".into(),
        "q".into(),
        BasicPublishOptions::default(),
        body,
        persistent(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_finds_the_disk_full_is_not_confirmed_and_loses_nothing() {
    let Some(fs) = SmallFs::mount(64) else { return };
    let log = fs._tmp.path().join("warren.log");
    let dir = data_dir(&fs);
    // No alarm: the store itself must meet the full disk.
    let b = ChildBroker::spawn(&dir, &log, &["--disk-free-limit", "0"]);
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    durable_queue(&ch).await;
    let ballast = fs.fill_to(16 << 20);

    // Beside it, a transaction: tx.commit waits for the store, and must
    // get an answer or an error when the disk fills, never hang (a
    // connection waiting for good would hold the node's reopening).
    let tconn = b.connect().await;
    let tch = tconn.create_channel().await.unwrap();
    let opts = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    declare_with(&tch, "t", opts, Default::default())
        .await
        .expect("declare t");
    tch.tx_select().await.unwrap();
    let tx = tokio::spawn(async move {
        let mut committed = 0u32;
        while committed < 2000 {
            let body = [0x44u8; 64 << 10];
            let published = tch
                .basic_publish(
                    "".into(),
                    "t".into(),
                    Default::default(),
                    &body,
                    persistent(),
                )
                .await;
            if published.is_err() {
                break;
            }
            match tokio::time::timeout(Duration::from_secs(60), tch.tx_commit()).await {
                Ok(Ok(())) => committed += 1,
                Ok(Err(_)) => break,
                Err(_) => return Err("tx.commit neither answered nor failed in 60 s"),
            }
        }
        Ok(committed)
    });

    // 64 KiB messages, a window of 16 in flight, until one is refused or
    // goes unconfirmed: the disk is full.
    let body = |i: u32| {
        let mut v = i.to_be_bytes().to_vec();
        v.resize(64 << 10, 0x33);
        v
    };
    let mut confirmed = 0u32;
    let mut window = std::collections::VecDeque::new();
    let mut sent = 0u32;
    let mut refused = false;
    let full = loop {
        while window.len() < 16 && !refused {
            match ch
                .basic_publish(
                    "".into(),
                    "q".into(),
                    BasicPublishOptions::default(),
                    &body(sent),
                    persistent(),
                )
                .await
            {
                Ok(c) => {
                    window.push_back((sent, c));
                    sent += 1;
                }
                Err(_) => refused = true,
            }
        }
        let Some((i, c)) = window.pop_front() else {
            break "publish refused";
        };
        match tokio::time::timeout(Duration::from_secs(5), c).await {
            Ok(Ok(c)) if c.is_ack() => {
                assert_eq!(i, confirmed, "confirms in order");
                confirmed += 1;
            }
            Ok(Ok(_)) => break "nacked",
            Ok(Err(_)) => break "channel closed",
            Err(_) => break "no confirm",
        }
        assert!(
            sent < 2000,
            "64 MiB filled and still confirmed: {}",
            b.log_tail()
        );
    };
    assert!(confirmed > 0, "{full}: {}", b.log_tail());
    assert!(b.is_running(), "the broker keeps running: {}", b.log_tail());
    let committed = tx
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}: {}", b.log_tail()));
    eprintln!("disk full after {confirmed} confirmed, {committed} committed ({full})");

    // Space comes back: the broker takes and confirms publishes again.
    std::fs::remove_file(ballast).unwrap();
    let conn2 = b.connect().await;
    let ch2 = conn2.create_channel().await.unwrap();
    ch2.confirm_select(Default::default()).await.unwrap();
    let after = publish_persistent(&ch2, b"after").await;
    let after = tokio::time::timeout(Duration::from_secs(30), after).await;
    assert!(
        matches!(after, Ok(Ok(ref c)) if c.is_ack()),
        "a publish after space came back: {after:?}; {}",
        b.log_tail()
    );

    // Every confirmed message is there, in order, after a restart.
    drop((conn, conn2, tconn));
    b.kill();
    let b = ChildBroker::spawn(&dir, &log, &["--disk-free-limit", "0"]);
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let mut next = 0u32;
    while let Some(m) = get_body(&ch, "q").await {
        if m == b"after" {
            continue;
        }
        let i = u32::from_be_bytes(m[..4].try_into().unwrap());
        assert!(i >= next, "{i} after {next}: out of order");
        if i == next {
            next += 1;
        }
    }
    assert!(
        next >= confirmed,
        "only {next} of {confirmed} confirmed messages came back"
    );
    let t = message_count(&ch, "t").await;
    assert!(
        t >= committed,
        "only {t} of {committed} committed messages came back"
    );
}
