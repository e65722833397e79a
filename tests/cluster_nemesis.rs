//! A nemesis in the style of Jepsen's: three real nodes, each in its own
//! network namespace, under faults drawn at random while clients publish
//! with pipelined confirms (moving between nodes when one fails) and a
//! consumer on every node acks what it gets. Messages reach the checked
//! queue four ways: directly; through a queue whose TTL dead-letters them
//! into it; through a delayed-message exchange; and through a side queue
//! that the management API's move action empties into it now and then.
//! Bodies are 4 KiB and the consumers start late, so the queue passes its
//! memory bound and pages messages out.
//!
//! Faults: SIGKILL and restart; SIGSTOP then SIGCONT; the leader or a
//! follower cut off from the others; a one-way cut; a slow link that
//! drops what it cannot carry (tc tbf: netem needs a kernel module the CI
//! machines may lack); a stalled log sync (a restart with the `raft-log-sync` fail
//! point); every node restarted. Each lasts a few seconds, then heals.
//!
//! The check, after healing and draining: every confirmed message was
//! dequeued at least once, nothing was dequeued that was never published,
//! and a message dequeued twice carries redelivered the later time.
//!
//! About two minutes by default (.ci/run); WARREN_NEMESIS_SECS sets the
//! length, WARREN_NEMESIS_SEED replays a run's draw of faults.

mod cluster_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::api::http;
use cluster_support::netns::{self, Net};
use cluster_support::total::{
    check, consume_into, id_of, queue_args, record, Route, Workload, QUEUE,
};
use cluster_support::Cluster;
use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use parking_lot::Mutex;

/// Deliveries seen by the consumers: id -> (times, later ones flagged).
type Seen = Arc<Mutex<BTreeMap<u64, (u32, bool)>>>;

/// A small xorshift generator: the faults of a seed are the same each run.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert((*k).into(), v.clone());
    }
    t
}

/// The queues and the exchange every route needs.
async fn declare(c: &Cluster, at: usize) {
    let conn = c
        .connect(at, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(QUEUE.into(), durable, queue_args())
        .await
        .unwrap();
    let mut ttl = FieldTable::default();
    ttl.insert("x-message-ttl".into(), AMQPValue::LongUInt(300));
    ttl.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    ttl.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(QUEUE.into()),
    );
    // Classic durable queues: their persistent messages are replicated too.
    ch.queue_declare("ttl".into(), durable, ttl).await.unwrap();
    ch.queue_declare("side".into(), durable, FieldTable::default())
        .await
        .unwrap();
    ch.exchange_declare(
        "delayed".into(),
        lapin::ExchangeKind::Custom("x-delayed-message".into()),
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        table(&[("x-delayed-type", AMQPValue::LongString("direct".into()))]),
    )
    .await
    .unwrap();
    ch.queue_bind(
        QUEUE.into(),
        "delayed".into(),
        QUEUE.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let _ = conn.close(200, "done".into()).await;
}

/// Message `id`'s way into the checked queue.
fn route() -> Route {
    Arc::new(|id| match id % 4 {
        0 => ("".into(), QUEUE.into(), FieldTable::default(), 4096),
        1 => ("".into(), "ttl".into(), FieldTable::default(), 4096),
        2 => (
            "delayed".into(),
            QUEUE.into(),
            table(&[("x-delay", AMQPValue::LongInt(500))]),
            4096,
        ),
        _ => ("".into(), "side".into(), FieldTable::default(), 4096),
    })
}

/// A consumer through node `i` until `stop`, reconnecting as needed.
async fn consume(c: Arc<Cluster>, i: usize, seen: Seen, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Some(conn) = c.connect(i, Duration::from_secs(5)).await else {
            continue;
        };
        let Ok(ch) = conn.create_channel().await else {
            continue;
        };
        if ch.basic_qos(200, BasicQosOptions::default()).await.is_err() {
            continue;
        }
        let tag = format!("c{i}");
        let Ok(mut consumer) = ch
            .basic_consume(
                QUEUE.into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
        else {
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            let next = tokio::time::timeout(Duration::from_secs(1), consumer.next()).await;
            let d = match next {
                Err(_) => continue,
                Ok(Some(Ok(d))) => d,
                Ok(_) => break,
            };
            record(&mut seen.lock(), id_of(&d.data), d.redelivered);
            if d.ack(BasicAckOptions::default()).await.is_err() {
                break;
            }
        }
        let _ = conn.close(200, "done".into()).await;
    }
}

/// Moves what the side queue holds into the checked queue, through the
/// leader's API (a failure, during a fault, is tried again later).
async fn move_side(c: &Cluster) -> bool {
    let Some(l) = c.leader() else { return false };
    let url = format!("{}/api/queues/%2F/side/actions", c.api(l));
    let body = serde_json::json!({"action": "move", "destination": QUEUE});
    let sent = http()
        .post(url)
        .basic_auth("guest", Some("guest"))
        .json(&body)
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    sent.is_ok_and(|r| r.status().is_success())
}

/// Runs `ip netns exec <ns of node i> <args>`.
fn in_ns(net: &Net, i: usize, args: &[&str]) -> bool {
    std::process::Command::new("ip")
        .args(["netns", "exec", &net.ns(i)])
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// One fault, held for `hold`, then healed. Returns its name.
async fn fault(c: &Cluster, net: &Net, d: &mut Draw, hold: Duration) -> String {
    let leader = c.leader();
    let any = d.below(3) as usize;
    let target = match d.below(2) {
        0 => leader.unwrap_or(any),
        _ => any,
    };
    let node = target + 1;
    match d.below(7) {
        0 => {
            c.kill(target);
            tokio::time::sleep(hold).await;
            c.spawn(target);
            format!("SIGKILL node {node}")
        }
        1 => {
            c.signal(target, libc::SIGSTOP);
            tokio::time::sleep(hold).await;
            c.signal(target, libc::SIGCONT);
            format!("SIGSTOP node {node}")
        }
        2 => {
            net.isolate(node, true);
            tokio::time::sleep(hold).await;
            net.isolate(node, false);
            format!("partition isolating node {node}")
        }
        3 => {
            // Node `node` cannot send to the next one; the other way works.
            let other = node % 3 + 1;
            let dst = format!("{}/32", net.host(other));
            assert!(in_ns(net, node, &["ip", "route", "add", "blackhole", &dst]));
            tokio::time::sleep(hold).await;
            in_ns(net, node, &["ip", "route", "del", "blackhole", &dst]);
            format!("one-way cut from node {node} to node {other}")
        }
        4 => {
            // tbf, not netem (which this kernel may lack): 4 Mbit/s, and
            // what waits over 20 ms is dropped.
            let dev = net.dev(node);
            let tbf = [
                "tc", "qdisc", "add", "dev", &dev, "root", "tbf", "rate", "4mbit", "burst", "16kb",
                "latency", "20ms",
            ];
            assert!(in_ns(net, node, &tbf));
            tokio::time::sleep(hold).await;
            in_ns(net, node, &["tc", "qdisc", "del", "dev", &dev, "root"]);
            format!("slow, dropping link at node {node}")
        }
        5 => {
            // The 50th log sync from the start stalls for the hold.
            let ms = hold.as_millis();
            c.kill(target);
            c.nodes[target].env.lock().unwrap().push((
                "FAILPOINTS".into(),
                format!("raft-log-sync=50*off->1*sleep({ms})->off"),
            ));
            c.spawn(target);
            tokio::time::sleep(hold + Duration::from_secs(3)).await;
            c.nodes[target].env.lock().unwrap().clear();
            format!("stalled log sync at node {node}")
        }
        _ => {
            for i in 0..3 {
                c.kill(i);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            for i in 0..3 {
                c.spawn(i);
            }
            "every node restarted".to_string()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nemesis_loses_nothing() {
    let Some(net) = Net::new() else {
        assert!(!netns::required(), "cannot make network namespaces");
        eprintln!("skipped: network namespaces need root and iproute2");
        return;
    };
    let secs: u64 = std::env::var("WARREN_NEMESIS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(110);
    let seed: u64 = std::env::var("WARREN_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    eprintln!("nemesis: {secs} s, WARREN_NEMESIS_SEED={seed}");
    let mut draw = Draw(seed);
    let hosts: Vec<(String, Option<String>)> =
        (1..=3).map(|i| (net.host(i), Some(net.ns(i)))).collect();
    let c = Arc::new(Cluster::start_on(&hosts, "loopback_users = []\n"));
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    declare(&c, leader).await;

    let work = Workload::start_routed(&c, vec![0, 1, 2], route());
    let seen: Seen = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    // The consumers start late: the queue grows past its memory bound.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let consumers: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(consume(
                Arc::clone(&c),
                i,
                Arc::clone(&seen),
                Arc::clone(&stop),
            ))
        })
        .collect();

    let start = Instant::now();
    let mut faults = Vec::new();
    while start.elapsed() < Duration::from_secs(secs) {
        let hold = Duration::from_millis(2000 + draw.below(4000));
        let what = fault(&c, &net, &mut draw, hold).await;
        eprintln!("nemesis {:>5.1} s: {what}", start.elapsed().as_secs_f64());
        faults.push(what);
        // Calm between faults: a leader, and the side queue moved on.
        tokio::time::sleep(Duration::from_secs(2 + draw.below(3))).await;
        move_side(&c).await;
    }

    // Healed: let the cluster settle, stop publishing, let the TTL and
    // delayed routes deliver, empty the side queue, and drain.
    c.wait_leader(0, Duration::from_secs(60)).await;
    let history = work.stop().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !move_side(&c).await {
        assert!(Instant::now() < deadline, "no move: {}", c.logs_tail());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for h in consumers {
        let _ = tokio::time::timeout(Duration::from_secs(30), h).await;
    }
    // The drain comes after every live delivery, into the same count.
    let at = c.leader().expect("a leader");
    let mut got = std::mem::take(&mut *seen.lock());
    consume_into(&c, at, &mut got).await;
    let lost = history
        .confirmed
        .iter()
        .filter(|id| !got.contains_key(id))
        .count();
    let unflagged = got.values().filter(|(t, f)| *t > 1 && !*f).count();
    eprintln!(
        "nemesis: {:.1} min, {} faults, {} published, {} confirmed, {} lost, {} duplicates \
         without redelivered",
        start.elapsed().as_secs_f64() / 60.0,
        faults.len(),
        history.published.len(),
        history.confirmed.len(),
        lost,
        unflagged
    );
    assert!(
        history.confirmed.len() > 1000,
        "too few confirmed to mean anything: {}",
        history.confirmed.len()
    );
    check(&history, &got);
    c.assert_no_panics();
}
