//! Shovels between RabbitMQ 3.10.8 and Warren, on-confirm, while things
//! go wrong: 100,000 persistent messages move from a RabbitMQ queue into
//! Warren (and, in the other test, from Warren into RabbitMQ) while Warren
//! is killed (SIGKILL) twice and the connection to RabbitMQ is cut once.
//! What a client can see at the end: every message arrived, first
//! arrivals in the source's order, the source holds nothing (every
//! message was acked there, so every one was confirmed at the
//! destination), and the only duplicates are what the source delivered
//! again after a fault (one replay per fault at most): from RabbitMQ at
//! most a prefetch's worth each time; from Warren also what it had acked
//! since its last group commit (it flags them redelivered).
//!
//! RabbitMQ is Debian's `rabbitmq-server`, started by the test as a
//! private node (tests/common/rabbitmq.rs); absent it the tests skip,
//! unless WARREN_REQUIRE_RABBITMQ is set (.ci/run installs it and sets it).

use crate::common;

use std::time::{Duration, Instant};

use common::child::ChildBroker;
use common::proxy::Proxy;
use common::rabbitmq::{self, RabbitNode};
use futures::StreamExt;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use serde_json::{json, Value};

const N: u64 = 100_000;
const PREFETCH: u64 = 500;

/// What is done to the shovel when the destination holds so many.
#[derive(Debug, Clone, Copy)]
enum Fault {
    KillWarren,
    CutRabbitMq,
}

const FAULTS: [(u32, Fault); 3] = [
    (20_000, Fault::KillWarren),
    (50_000, Fault::KillWarren),
    (75_000, Fault::CutRabbitMq),
];

/// A Warren child broker with its API, on `dir` (kept across kills).
struct Warren {
    broker: ChildBroker,
    dir: tempfile::TempDir,
}

impl Warren {
    fn start() -> Warren {
        let dir = tempfile::tempdir().expect("temp dir");
        let broker = Self::spawn(dir.path());
        Warren { broker, dir }
    }

    fn spawn(dir: &std::path::Path) -> ChildBroker {
        ChildBroker::spawn_with_api(&dir.join("data"), &dir.join("warren.log"), &[])
    }

    /// SIGKILL, then start again on the same data dir.
    fn kill_and_restart(&mut self) {
        self.broker.kill();
        self.broker = Self::spawn(self.dir.path());
    }

    /// A request to its API as guest, retried while it is starting.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
        let port = self.broker.api_port.expect("the API is on");
        let url = format!("http://127.0.0.1:{port}/api{path}");
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let mut req = reqwest::Client::new()
                .request(
                    reqwest::Method::from_bytes(method.as_bytes()).expect("a method"),
                    &url,
                )
                .basic_auth("guest", Some("guest"));
            if let Some(b) = &body {
                req = req
                    .header("content-type", "application/json")
                    .body(b.to_string());
            }
            match req.send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    return (status, r.text().await.unwrap_or_default());
                }
                Err(e) => {
                    assert!(
                        Instant::now() < until,
                        "no answer from Warren's API: {e}; {}",
                        self.broker.log_tail()
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn put_shovel(&self, name: &str, value: Value) {
        let path = format!("/parameters/shovel/%2f/{name}");
        let (s, body) = self
            .call("PUT", &path, Some(json!({ "value": value })))
            .await;
        assert_eq!(s, 201, "{body}");
    }

    /// Ready and unacknowledged messages of `queue`, as the API counts.
    async fn messages(&self, queue: &str) -> Option<u64> {
        let (s, body) = self
            .call("GET", &format!("/queues/%2f/{queue}"), None)
            .await;
        if s != 200 {
            return None;
        }
        let v: Value = serde_json::from_str(&body).ok()?;
        v["messages"].as_u64()
    }

    async fn shovels(&self) -> String {
        self.call("GET", "/shovels", None).await.1
    }
}

/// Messages ready in `queue`; None when it cannot be read (no queue, or
/// the broker is gone).
async fn ready(conn: &Connection, queue: &str) -> Option<u32> {
    let ch = conn.create_channel().await.ok()?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let n = ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .ok()?
        .message_count();
    let _ = ch.close(200, "".into()).await;
    Some(n)
}

async fn durable_queue(ch: &Channel, name: &str) {
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(name.into(), durable, FieldTable::default())
        .await
        .expect("declare");
}

/// Publishes ids 0..N (8-byte bodies), persistent, confirmed, in windows.
async fn fill(conn: &Connection, queue: &str) {
    let ch = conn.create_channel().await.expect("channel");
    durable_queue(&ch, queue).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut pending = Vec::with_capacity(5000);
    for id in 0..N {
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &id.to_be_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish");
        pending.push(confirm);
        if pending.len() == 5000 {
            for c in pending.drain(..) {
                assert!(c.await.expect("confirm").is_ack());
            }
        }
    }
    for c in pending {
        assert!(c.await.expect("confirm").is_ack());
    }
}

/// Takes every message of `queue` (no-ack): their ids, in order.
async fn take_all(conn: &Connection, queue: &str) -> Vec<u64> {
    let n = ready(conn, queue).await.expect("the queue is there");
    let ch = conn.create_channel().await.expect("channel");
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "check".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut ids = Vec::with_capacity(n as usize);
    while ids.len() < n as usize {
        let d = tokio::time::timeout(Duration::from_secs(30), consumer.next())
            .await
            .unwrap_or_else(|_| panic!("{} of {n} delivered, then nothing", ids.len()))
            .expect("a delivery")
            .expect("a delivery");
        ids.push(u64::from_be_bytes(d.data[..8].try_into().expect("8 bytes")));
    }
    ids
}

/// Every id arrived, first arrivals in order, and duplicates only where a
/// fault made the source deliver again: each replay is one step back in
/// the ids (at most one per fault), and with `bound` there are at most
/// that many duplicates in all.
fn check(got: &[u64], bound: Option<u64>) {
    let mut seen = vec![false; N as usize];
    let mut next = 0u64;
    let mut replays = 0;
    let mut last = None;
    for &id in got {
        let slot = &mut seen[id as usize];
        if !*slot {
            assert_eq!(id, next, "a first arrival out of the source's order");
            *slot = true;
            next += 1;
        }
        if last.is_some_and(|l| id <= l) {
            replays += 1;
        }
        last = Some(id);
    }
    assert_eq!(next, N, "{} of {N} arrived", next);
    let duplicates = got.len() as u64 - N;
    eprintln!("{N} arrived; {duplicates} duplicates in {replays} replays");
    assert!(
        replays <= FAULTS.len(),
        "{replays} replays ({duplicates} duplicates) for {} faults",
        FAULTS.len()
    );
    if let Some(bound) = bound {
        assert!(
            duplicates <= bound,
            "{duplicates} duplicates, more than {} faults with a prefetch of {PREFETCH} explain",
            FAULTS.len()
        );
    }
}

/// Reads `read` every 100 ms until `done` holds for what it read (or
/// 300 s pass); the last reading.
async fn poll<T, F, Fut>(mut read: F, done: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        let last = read().await;
        if done(&last) || Instant::now() > until {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `count` says at least `n`; fails after 300 s naming `what`.
async fn wait_until<F, Fut>(n: u32, what: &str, count: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<u32>>,
{
    let last = poll(count, |c| c.is_some_and(|c| c >= n)).await;
    assert!(
        last.is_some_and(|c| c >= n),
        "{what}: {last:?} after 300 s, waiting for {n}"
    );
}

async fn rabbit() -> Option<RabbitNode> {
    rabbitmq::start(&[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_into_warren_loses_nothing_through_two_kills_and_a_cut() {
    let Some(rabbit) = rabbit().await else {
        return;
    };
    let proxy = Proxy::start(rabbit.addr()).await;
    let rconn = rabbit.connect().await;
    fill(&rconn, "moving").await;

    let mut warren = Warren::start();
    warren
        .put_shovel(
            "from-rabbitmq",
            json!({
                "src-uri": format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port),
                "src-queue": "moving",
                "dest-uri": "amqp://guest:guest@/%2f",
                "dest-queue": "moved",
                "src-prefetch-count": PREFETCH,
                "reconnect-delay": 1,
            }),
        )
        .await;
    let mut wconn = warren.broker.connect().await;
    for (at, fault) in FAULTS {
        wait_until(at, "messages in Warren", || ready(&wconn, "moved")).await;
        match fault {
            Fault::KillWarren => {
                warren.kill_and_restart();
                wconn = warren.broker.connect().await;
            }
            Fault::CutRabbitMq => {
                assert!(proxy.cut() > 0, "the shovel was connected to RabbitMQ");
            }
        }
    }
    // Everything acked at RabbitMQ: nothing ready, nothing in flight.
    let left = poll(
        || rabbit.get("/queues/%2F/moving"),
        |q| q.as_ref().is_some_and(|q| q["messages"] == 0),
    )
    .await;
    assert!(
        left.as_ref().is_some_and(|q| q["messages"] == 0),
        "RabbitMQ still holds {:?}; shovels: {}",
        left.map(|q| q["messages"].clone()),
        warren.shovels().await
    );
    // RabbitMQ gives back only what it had not seen acked: at most a
    // prefetch's worth per fault.
    check(
        &take_all(&wconn, "moved").await,
        Some(FAULTS.len() as u64 * PREFETCH),
    );
    assert_eq!(ready(&rconn, "moving").await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warren_into_rabbitmq_loses_nothing_through_two_kills_and_a_cut() {
    let Some(rabbit) = rabbit().await else {
        return;
    };
    let proxy = Proxy::start(rabbit.addr()).await;
    let rconn = rabbit.connect().await;

    let mut warren = Warren::start();
    fill(&warren.broker.connect().await, "outbound").await;
    warren
        .put_shovel(
            "into-rabbitmq",
            json!({
                "src-uri": "amqp://guest:guest@/%2f",
                "src-queue": "outbound",
                "dest-uri": format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port),
                "dest-queue": "inbound",
                "src-prefetch-count": PREFETCH,
                "reconnect-delay": 1,
            }),
        )
        .await;
    for (at, fault) in FAULTS {
        wait_until(at, "messages in RabbitMQ", || ready(&rconn, "inbound")).await;
        match fault {
            Fault::KillWarren => warren.kill_and_restart(),
            Fault::CutRabbitMq => {
                assert!(proxy.cut() > 0, "the shovel was connected to RabbitMQ");
            }
        }
    }
    // Everything acked at Warren: nothing ready, nothing in flight.
    let left = poll(|| warren.messages("outbound"), |n| *n == Some(0)).await;
    assert_eq!(
        left,
        Some(0),
        "Warren still holds messages; shovels: {}",
        warren.shovels().await
    );
    // Warren, the source, writes acks with its next group commit: killed,
    // it also delivers again (flagged redelivered) what was acked since,
    // so the replays are counted, not bounded by the prefetch.
    check(&take_all(&rconn, "inbound").await, None);
}
