//! A nemesis in the style of Jepsen's: three real nodes (five with
//! WARREN_NEMESIS_NODES=5), each in its own network namespace, under
//! faults drawn at random while clients publish with pipelined confirms
//! (moving between nodes when one fails) and a consumer on every node acks
//! what it gets. Messages reach the checked queue four ways: directly;
//! through a queue whose TTL dead-letters them into it; through a
//! delayed-message exchange; and through a side queue that the management
//! API's move action empties into it now and then. Bodies are 4 KiB and the
//! consumers start late, so the queue passes its memory bound and pages
//! messages out.
//!
//! Faults: SIGKILL and restart; SIGSTOP then SIGCONT; the leader or a
//! follower cut off from the others; a one-way cut; a slow link that
//! drops what it cannot carry (tc tbf: netem needs a kernel module the CI
//! machines may lack); a stalled log sync (a restart with the `raft-log-sync` fail
//! point); every node restarted; a member replaced (a new node with a new
//! id and an empty data directory added in its namespace, then the old one
//! removed and stopped, as `warren cluster replace` does). Each lasts a few
//! seconds, then heals.
//!
//! The check, after healing and draining: every confirmed message was
//! dequeued at least once, nothing was dequeued that was never published,
//! a message dequeued twice carries redelivered every time but the first
//! the servers sent (`unflagged_later`: receive order across connections
//! is not send order, so only a provable breach counts), and no
//! message was delivered by two servers in the same period (`same_period`:
//! a connection lives within one leader's term, so a message delivered on
//! one connection and later on another, sent after the first connection
//! opened, means the first one's server had stopped; it must provably send
//! nothing after that).
//!
//! About two minutes by default (.ci/run); WARREN_NEMESIS_SECS sets the
//! length, WARREN_NEMESIS_SEED replays a run's draw of faults.

mod cluster_support;
#[allow(unused)] // cluster_support takes its ports from common
mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::api::http;
use cluster_support::netns::{self, Net};
use cluster_support::total::{
    check_delivered, consume_into, id_of, queue_args, record, Order, Route, Workload, QUEUE,
};
use cluster_support::Cluster;
use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use parking_lot::Mutex;

/// What the consumers saw: id -> (times, later ones flagged), and every
/// delivery (`Delivery`).
#[derive(Default)]
struct Deliveries {
    got: BTreeMap<u64, (u32, bool)>,
    log: Vec<Delivery>,
    /// When each connection was open (its server was serving by then).
    opened: BTreeMap<u32, u32>,
}

/// One delivery as a consumer saw it; times in ms since the consumers
/// started.
#[derive(Clone, Copy)]
struct Delivery {
    id: u64,
    /// The connection (numbered as opened).
    conn: u32,
    /// When the consumer received it.
    at: u32,
    /// A time before which the server cannot have sent it: the consumer
    /// had sent the ack that freed the prefetch slot it took (the ack of
    /// the delivery PREFETCH before it on the connection), or 0.
    credit: u32,
    /// Whether it came flagged redelivered.
    redelivered: bool,
}

/// The consumers' prefetch (per consumer).
const PREFETCH: u16 = 200;

type Seen = Arc<Mutex<Deliveries>>;

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

/// The cluster under test and which node holds each namespace's place.
struct Ring {
    c: Arc<Cluster>,
    net: Net,
    /// members[s]: the node (index) in namespace s + 1.
    members: Order,
    /// spares[s]: the unused nodes made for namespace s + 1.
    spares: Vec<Vec<usize>>,
}

impl Ring {
    fn member(&self, slot: usize) -> usize {
        self.members.lock()[slot]
    }

    fn size(&self) -> usize {
        self.spares.len()
    }

    /// The slot of the node that leads, if one does.
    fn leader_slot(&self) -> Option<usize> {
        let l = self.c.leader()?;
        self.members.lock().iter().position(|&m| m == l)
    }
}

/// How long a consumer waits for an answer (channel, qos, consume, an
/// ack written) before it reports the step and drops the connection: a
/// server that leaves a request unanswered while heartbeats still flow
/// would otherwise hold the consumer, and the queue would only grow.
const ANSWER: Duration = Duration::from_secs(30);
/// A consumer given nothing this long while publishers publish reports it
/// and reconnects.
const IDLE: Duration = Duration::from_secs(120);

/// `step` of connection `me` through node `id`, given `ANSWER`; None (and
/// a line, and a stall counted) if it failed or went unanswered.
async fn within<T, E>(
    me: u32,
    id: u64,
    step: &str,
    stalls: &AtomicU32,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    match tokio::time::timeout(ANSWER, fut).await {
        Ok(r) => r.ok(),
        Err(_) => {
            stalls.fetch_add(1, Ordering::Relaxed);
            eprintln!("nemesis conn {me}: {step} unanswered for {ANSWER:?} through node {id}");
            None
        }
    }
}

/// What the consumers share.
#[derive(Clone)]
struct Consumers {
    c: Arc<Cluster>,
    members: Order,
    seen: Seen,
    stop: Arc<AtomicBool>,
    /// Connections opened so far (each one's number).
    conns: Arc<AtomicU32>,
    /// Steps left unanswered, and consumers given nothing for `IDLE`.
    stalls: Arc<AtomicU32>,
    t0: Instant,
}

/// A consumer through the node in slot `slot` until `stop`, reconnecting
/// as needed; each connection gets a number of its own.
async fn consume(k: Consumers, slot: usize) {
    let Consumers {
        c,
        members,
        seen,
        stop,
        conns,
        stalls,
        t0,
    } = k;
    while !stop.load(Ordering::Relaxed) {
        let node = members.lock()[slot];
        let Some(conn) = c.connect(node, Duration::from_secs(5)).await else {
            continue;
        };
        let id = c.nodes[node].id;
        let me = conns.fetch_add(1, Ordering::Relaxed);
        let opened = t0.elapsed().as_millis() as u32;
        seen.lock().opened.insert(me, opened);
        // For reading a failed check against the nodes' logs.
        eprintln!("nemesis conn {me}: consumer through node {id} at {opened} ms");
        // When each ack on this connection was sent (just before).
        let mut acked: Vec<u32> = Vec::new();
        let Some(ch) = within(me, id, "channel.open", &stalls, conn.create_channel()).await else {
            continue;
        };
        let qos = ch.basic_qos(PREFETCH, BasicQosOptions::default());
        if within(me, id, "basic.qos", &stalls, qos).await.is_none() {
            continue;
        }
        let tag = format!("c{slot}");
        let consume = ch.basic_consume(
            QUEUE.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        let Some(mut consumer) = within(me, id, "basic.consume", &stalls, consume).await else {
            continue;
        };
        let mut last = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let next = tokio::time::timeout(Duration::from_secs(1), consumer.next()).await;
            let d = match next {
                Err(_) if last.elapsed() < IDLE => continue,
                Err(_) => {
                    stalls.fetch_add(1, Ordering::Relaxed);
                    eprintln!(
                        "nemesis conn {me}: nothing delivered for {IDLE:?} through node {id}"
                    );
                    break;
                }
                Ok(Some(Ok(d))) => d,
                Ok(_) => break,
            };
            last = Instant::now();
            let msg = id_of(&d.data);
            let at = t0.elapsed().as_millis() as u32;
            // The n-th delivery needed the ack of the (n - PREFETCH)-th.
            let n = acked.len();
            let credit = n
                .checked_sub(PREFETCH as usize)
                .map_or(0, |freed| acked[freed]);
            {
                let mut s = seen.lock();
                record(&mut s.got, msg, d.redelivered);
                s.log.push(Delivery {
                    id: msg,
                    conn: me,
                    at,
                    credit,
                    redelivered: d.redelivered,
                });
            }
            acked.push(t0.elapsed().as_millis() as u32);
            let ack = d.ack(BasicAckOptions::default());
            if within(me, id, "basic.ack", &stalls, ack).await.is_none() {
                break;
            }
        }
        let _ = tokio::time::timeout(ANSWER, conn.close(200, "done".into())).await;
    }
}

/// Messages delivered by two servers in the same period: a message
/// delivered on connection A, then on connection B at time t, sent to B
/// after A opened, while A's server still delivered after t. A connection
/// lives within one server's term (a leader that steps down closes its
/// clients; a follower carries a client to one leader), and a correct
/// cluster's terms do not overlap: a server that sent the message to B
/// after A's server began serving took it over once A's had stopped.
/// Receive times cannot show when a server sent (a delivery can sit in a
/// socket, a paused process's kernel buffers or a slow link for seconds),
/// so B's copy counts as sent after A opened only on proof (published, or
/// sent into a prefetch slot that an ack freed, after A opened), and A's
/// server counts as delivering after t only on proof: a delivery on A of
/// a message published after t, or one sent into a prefetch slot that an
/// ack sent after t freed. Returns (id, A, its delivery, B, t, the
/// proof's time).
fn same_period(
    log: &[Delivery],
    sent: &BTreeMap<u64, u32>,
    opened: &BTreeMap<u32, u32>,
) -> Vec<(u64, u32, u32, u32, u32, u32)> {
    // The latest time each connection's server is known to have sent at.
    let mut proof: BTreeMap<u32, u32> = BTreeMap::new();
    let not_before = |d: &Delivery| sent.get(&d.id).copied().unwrap_or(0).max(d.credit);
    for d in log {
        let p = proof.entry(d.conn).or_default();
        *p = (*p).max(not_before(d));
    }
    let mut sorted = log.to_vec();
    sorted.sort_unstable_by_key(|d| (d.id, d.at));
    sorted
        .windows(2)
        .filter(|w| w[0].id == w[1].id && w[0].conn != w[1].conn)
        .filter(|w| not_before(&w[1]) > opened.get(&w[0].conn).copied().unwrap_or(0))
        .filter(|w| proof[&w[0].conn] > w[1].at)
        .map(|w| {
            (
                w[0].id,
                w[0].conn,
                w[0].at,
                w[1].conn,
                w[1].at,
                proof[&w[0].conn],
            )
        })
        .collect()
}

/// Messages delivered again without the redelivered flag. The rule: of a
/// message's deliveries, only the first the servers sent may lack the
/// flag. Which one that was, the consumers cannot always see: receive
/// order across connections is not send order (a copy can sit in a
/// socket, a proxy or a slow link, or a busy consumer can get to it
/// late, after another connection's consumer took a later copy). So a
/// delivery U without the flag breaks the rule if another delivery also
/// lacks it (one of the two was sent later), or if another copy F arrived
/// before U was provably sent: on U's own connection (one server, in
/// order), or before U's connection opened or before the ack that freed
/// U's prefetch slot was sent. Returns those ids, and the ids whose copy
/// without the flag arrived after a flagged one with no such proof.
fn unflagged_later(log: &[Delivery], opened: &BTreeMap<u32, u32>) -> (Vec<u64>, Vec<u64>) {
    let mut by_id: BTreeMap<u64, Vec<&Delivery>> = BTreeMap::new();
    for d in log {
        by_id.entry(d.id).or_default().push(d);
    }
    let (mut later, mut unproven) = (Vec::new(), Vec::new());
    for (id, ds) in by_id.into_iter().filter(|(_, ds)| ds.len() > 1) {
        let bare: Vec<&&Delivery> = ds.iter().filter(|d| !d.redelivered).collect();
        let [u] = bare[..] else {
            if bare.len() > 1 {
                later.push(id);
            }
            continue;
        };
        let sent_after = opened.get(&u.conn).copied().unwrap_or(0).max(u.credit);
        let earlier = ds.iter().filter(|f| f.redelivered && f.at <= u.at);
        let mut proven = false;
        let mut seen_before = false;
        for f in earlier {
            seen_before = true;
            proven |= f.conn == u.conn || f.at < sent_after;
        }
        if proven {
            later.push(id);
        } else if seen_before {
            unproven.push(id);
        }
    }
    (later, unproven)
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

/// Sends `method` to the leader's /api/cluster/members/{id}, once:
/// its status, or None if nothing answered.
async fn membership(
    c: &Cluster,
    method: reqwest::Method,
    id: u64,
    body: serde_json::Value,
) -> Option<(u16, String)> {
    let l = c.leader()?;
    let r = http()
        .request(method, format!("{}/api/cluster/members/{id}", c.api(l)))
        .basic_auth("guest", Some("guest"))
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().await.unwrap_or_default()))
}

/// Replaces the member in `slot` as `warren cluster replace` does: a new
/// node (new id, empty data directory) in the same namespace is started
/// and added, then the old one is removed and stopped, each once the API
/// said it was done (a membership change answers once committed). None if
/// no spare is left.
async fn replace(r: &mut Ring, slot: usize) -> Option<String> {
    let new = r.spares[slot].pop()?;
    let old = r.member(slot);
    let c = &r.c;
    let (old_id, new_id) = (c.nodes[old].id, c.nodes[new].id);
    c.spawn_joining(new);
    let raft = format!("{}:{}", c.nodes[new].host, c.nodes[new].raft);
    // A member added under load gets a snapshot of the whole backlog
    // (gigabytes, in a long run) and then catches up: as `warren cluster
    // replace` waits.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut asked = Instant::now();
    loop {
        let body = serde_json::json!({ "raft": raft });
        let added = membership(c, reqwest::Method::PUT, new_id, body).await;
        // 204: a request that gave up waiting had made it a voter.
        if added.as_ref().is_some_and(|(s, _)| *s == 201 || *s == 204) {
            break;
        }
        if asked.elapsed() >= Duration::from_secs(60) {
            asked = Instant::now();
            eprintln!("nemesis: adding node {new_id}: {added:?}");
        }
        if Instant::now() >= deadline {
            keep_logs(c);
            panic!(
                "node {new_id} not added in 600 s: {added:?} {}",
                c.logs_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Clients go to the new node from here on.
    r.members.lock()[slot] = new;
    loop {
        let body = serde_json::Value::Null;
        let removed = membership(c, reqwest::Method::DELETE, old_id, body).await;
        // Asked again after a removal that answered too late: it is gone.
        let gone = |(s, text): &(u16, String)| {
            *s == 204 || (*s == 400 && text.contains("not a voting member"))
        };
        if removed.as_ref().is_some_and(gone) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {old_id} not removed in 600 s: {removed:?} {}",
            c.logs_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    c.kill(old);
    // Its disk goes with it (a long run replaces dozens).
    let _ = std::fs::remove_dir_all(&c.nodes[old].dir);
    Some(format!("node {old_id} replaced by node {new_id}"))
}

/// One fault, held for `hold`, then healed. Returns its name.
async fn fault(r: &mut Ring, d: &mut Draw, hold: Duration) -> String {
    let n = r.size();
    let any = d.below(n as u64) as usize;
    let slot = match d.below(2) {
        0 => r.leader_slot().unwrap_or(any),
        _ => any,
    };
    let target = r.member(slot);
    let (c, net) = (&r.c, &r.net);
    let id = c.nodes[target].id;
    // Namespaces are 1-based.
    let ns = slot + 1;
    match d.below(8) {
        0 => {
            c.kill(target);
            tokio::time::sleep(hold).await;
            c.spawn(target);
            format!("SIGKILL node {id}")
        }
        1 => {
            c.signal(target, libc::SIGSTOP);
            tokio::time::sleep(hold).await;
            c.signal(target, libc::SIGCONT);
            format!("SIGSTOP node {id}")
        }
        2 => {
            net.isolate(ns, true);
            tokio::time::sleep(hold).await;
            net.isolate(ns, false);
            format!("partition isolating node {id}")
        }
        3 => {
            // Node `id` cannot send to the next one; the other way works.
            let other = ns % n + 1;
            let dst = format!("{}/32", net.host(other));
            assert!(in_ns(net, ns, &["ip", "route", "add", "blackhole", &dst]));
            tokio::time::sleep(hold).await;
            in_ns(net, ns, &["ip", "route", "del", "blackhole", &dst]);
            let to = c.nodes[r.member(other - 1)].id;
            format!("one-way cut from node {id} to node {to}")
        }
        4 => {
            // tbf, not netem (which this kernel may lack): 4 Mbit/s, and
            // what waits over 20 ms is dropped.
            let dev = net.dev(ns);
            let tbf = [
                "tc", "qdisc", "add", "dev", &dev, "root", "tbf", "rate", "4mbit", "burst", "16kb",
                "latency", "20ms",
            ];
            assert!(in_ns(net, ns, &tbf));
            tokio::time::sleep(hold).await;
            in_ns(net, ns, &["tc", "qdisc", "del", "dev", &dev, "root"]);
            format!("slow, dropping link at node {id}")
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
            format!("stalled log sync at node {id}")
        }
        6 => {
            let all: Vec<usize> = r.members.lock().clone();
            for &i in &all {
                c.kill(i);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            for &i in &all {
                c.spawn(i);
            }
            "every node restarted".to_string()
        }
        _ => match replace(r, slot).await {
            Some(what) => what,
            None => "no spare left: nothing".to_string(),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nemesis_loses_nothing() {
    let n: usize = std::env::var("WARREN_NEMESIS_NODES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    assert!(n == 3 || n == 5, "WARREN_NEMESIS_NODES is 3 or 5");
    let Some(net) = Net::with(n) else {
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
    eprintln!("nemesis: {n} nodes, {secs} s, WARREN_NEMESIS_SEED={seed}");
    let mut draw = Draw(seed);
    let hosts: Vec<(String, Option<String>)> =
        (1..=n).map(|i| (net.host(i), Some(net.ns(i)))).collect();
    // Spares for replaced members: about one fault in eight is one, a
    // fault every 10 s or so, spread over the namespaces.
    let per = (secs / 80 / n as u64 + 1) as usize;
    let spares: Vec<(String, Option<String>)> = (0..per).flat_map(|_| hosts.clone()).collect();
    let c = Arc::new(Cluster::start_on_with_spares(
        &hosts,
        &spares,
        "loopback_users = []\n",
    ));
    let mut free: Vec<Vec<usize>> = vec![Vec::new(); n];
    for k in 0..per * n {
        free[k % n].push(n + k);
    }
    let mut ring = Ring {
        c: Arc::clone(&c),
        net,
        members: Arc::new(Mutex::new((0..n).collect())),
        spares: free,
    };
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    declare(&c, leader).await;

    let work = Workload::start_on(&c, Arc::clone(&ring.members), route());
    let seen: Seen = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    // The consumers start late: the queue grows past its memory bound.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let t0 = Instant::now();
    // The consumers' times count from here: the nodes' logs are in UTC.
    eprintln!(
        "nemesis: the consumers' clock starts at unix time {:.3} s",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64()
    );
    let shared = Consumers {
        c: Arc::clone(&c),
        members: Arc::clone(&ring.members),
        seen: Arc::clone(&seen),
        stop: Arc::clone(&stop),
        conns: Arc::default(),
        stalls: Arc::default(),
        t0,
    };
    let consumers: Vec<_> = (0..n)
        .map(|slot| tokio::spawn(consume(shared.clone(), slot)))
        .collect();

    let start = Instant::now();
    let mut faults = Vec::new();
    let mut next_progress = Duration::from_secs(60);
    while start.elapsed() < Duration::from_secs(secs) {
        let hold = Duration::from_millis(2000 + draw.below(4000));
        let what = fault(&mut ring, &mut draw, hold).await;
        eprintln!("nemesis {:>5.1} s: {what}", start.elapsed().as_secs_f64());
        faults.push(what);
        if start.elapsed() >= next_progress {
            next_progress += Duration::from_secs(60);
            let confirmed = work.history().lock().confirmed.len();
            let s = seen.lock();
            eprintln!(
                "nemesis progress: {confirmed} confirmed, {} delivered ({} distinct), {} \
                 connections, {} stalls",
                s.log.len(),
                s.got.len(),
                shared.conns.load(Ordering::Relaxed),
                shared.stalls.load(Ordering::Relaxed),
            );
        }
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
    let Deliveries {
        got: live,
        log,
        opened,
    } = std::mem::take(&mut *seen.lock());
    // The drain's connection opened after every live delivery arrived:
    // each of its deliveries of a message seen before must be flagged.
    let mut got: BTreeMap<u64, (u32, bool)> = live
        .iter()
        .map(|(id, (times, _))| (*id, (*times, true)))
        .collect();
    consume_into(&c, at, &mut got).await;
    let lost = history
        .confirmed
        .iter()
        .filter(|id| !got.contains_key(id))
        .count();
    // Lost, by the way each went (route(): direct, ttl, delayed, side).
    let mut lost_by_route = [0usize; 4];
    for id in history.confirmed.iter().filter(|id| !got.contains_key(id)) {
        lost_by_route[(id % 4) as usize] += 1;
    }
    let drained_unflagged: Vec<u64> = got
        .iter()
        .filter(|(_, (t, f))| *t > 1 && !*f)
        .map(|(id, _)| *id)
        .collect();
    let (later, unproven) = unflagged_later(&log, &opened);
    let unflagged = later.len() + drained_unflagged.len();
    // When each id was published, on the consumers' clock (0: before).
    let sent: BTreeMap<u64, u32> = history
        .sent_at
        .iter()
        .map(|(id, t)| (*id, t.saturating_duration_since(t0).as_millis() as u32))
        .collect();
    let overlapping = same_period(&log, &sent, &opened);
    let stalls = shared.stalls.load(Ordering::Relaxed);
    eprintln!(
        "nemesis: {:.1} min, {} faults, {} published, {} confirmed, {} lost (direct, ttl, \
         delayed, side: {:?}), {} duplicates without redelivered ({} more whose order is \
         unproven), {} delivered in the same period by two connections ({} connections, {} \
         consumer stalls)",
        start.elapsed().as_secs_f64() / 60.0,
        faults.len(),
        history.published.len(),
        history.confirmed.len(),
        lost,
        lost_by_route,
        unflagged,
        unproven.len(),
        overlapping.len(),
        shared.conns.load(Ordering::Relaxed),
        stalls,
    );
    if lost > 0 || unflagged > 0 || !unproven.is_empty() || !overlapping.is_empty() || stalls > 0 {
        keep_logs(&c);
    }
    if unflagged > 0 || !unproven.is_empty() {
        let ids = later.iter().chain(&unproven).chain(&drained_unflagged);
        tell_unflagged(ids, &log, &sent, &opened);
        tell_unproven(&unproven, &log);
    }
    assert!(
        history.confirmed.len() > 1000,
        "too few confirmed to mean anything: {}",
        history.confirmed.len()
    );
    check_delivered(&history, &got);
    assert!(
        later.is_empty() && drained_unflagged.is_empty(),
        "delivered again without redelivered, provably after an earlier copy arrived: \
         {later:?}; in the drain: {drained_unflagged:?} (the live copies were {:?})",
        drained_unflagged
            .iter()
            .map(|id| live.get(id))
            .collect::<Vec<_>>(),
    );
    assert!(
        overlapping.is_empty(),
        "delivered by two servers in the same period (id, conn, ms, conn, ms, when the \
         first conn's server provably still sent): {:?}",
        &overlapping[..overlapping.len().min(10)]
    );
    c.assert_no_panics();
}

/// Prints every live delivery of the first 20 of `ids`, for reading
/// against the nodes' logs (which connection went through which node is
/// in the `nemesis conn` lines; the drain's own deliveries are not in
/// `log`).
fn tell_unflagged<'a>(
    ids: impl Iterator<Item = &'a u64>,
    log: &[Delivery],
    sent: &BTreeMap<u64, u32>,
    opened: &BTreeMap<u32, u32>,
) {
    for &id in ids.take(20) {
        let sent_at = sent.get(&id).copied().unwrap_or(0);
        eprintln!("nemesis: message {id} (published at {sent_at} ms), delivered:");
        for d in log.iter().filter(|d| d.id == id) {
            eprintln!(
                "nemesis:   at {} ms on conn {} (opened at {} ms), redelivered {}, its slot \
                 freed at {} ms",
                d.at,
                d.conn,
                opened.get(&d.conn).copied().unwrap_or(0),
                d.redelivered,
                d.credit,
            );
        }
    }
}

/// Sums up the copies without the flag whose order is unproven, by the
/// connection that took one and the connection that had taken a flagged
/// copy first: each pair is one episode to read in the nodes' logs.
fn tell_unproven(unproven: &[u64], log: &[Delivery]) {
    let ids: std::collections::BTreeSet<u64> = unproven.iter().copied().collect();
    let mut firsts: BTreeMap<u64, &Delivery> = BTreeMap::new();
    for d in log.iter().filter(|d| d.redelivered && ids.contains(&d.id)) {
        firsts.entry(d.id).or_insert(d);
    }
    // (bare conn, flagged conn) -> (copies, first and last bare arrival)
    let mut pairs: BTreeMap<(u32, u32), (u32, u32, u32)> = BTreeMap::new();
    for u in log.iter().filter(|d| !d.redelivered && ids.contains(&d.id)) {
        let Some(f) = firsts.get(&u.id) else { continue };
        let e = pairs.entry((u.conn, f.conn)).or_insert((0, u.at, u.at));
        *e = (e.0 + 1, e.1.min(u.at), e.2.max(u.at));
    }
    for ((bare, flagged), (n, from, to)) in pairs.into_iter().take(50) {
        eprintln!(
            "nemesis: {n} copies without the flag on conn {bare} from {from} to {to} ms, \
             after flagged copies on conn {flagged}"
        );
    }
}

/// Copies every node's log to target/nemesis-logs/ (the cluster's own
/// directory goes with it), for reading a failed check.
fn keep_logs(c: &Cluster) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/nemesis-logs");
    let _ = std::fs::create_dir_all(&dir);
    for n in &c.nodes {
        let to = dir.join(format!("node{}.log", n.id));
        if std::fs::copy(&n.log, &to).is_ok() {
            eprintln!("nemesis: node {} log kept at {}", n.id, to.display());
        }
    }
}

#[test]
fn same_period_needs_proof_that_the_first_server_still_sent() {
    let d = |id, conn, at, credit| Delivery {
        id,
        conn,
        at,
        credit,
        redelivered: false,
    };
    let sent: BTreeMap<u64, u32> = [(1, 0), (2, 0), (3, 600), (4, 50)].into();
    let opened: BTreeMap<u32, u32> = [(0, 20), (1, 10)].into();
    // Connection 0 gets message 1, then 2 late (it sat in a slow link),
    // after connection 1 got 1 again: no proof that 0's server still sent.
    let late = [d(1, 0, 100, 0), d(1, 1, 500, 30), d(2, 0, 900, 0)];
    assert!(same_period(&late, &sent, &opened).is_empty());
    // 0 then gets message 3, published after 1 got message 1.
    let published_later = [d(1, 0, 100, 0), d(1, 1, 500, 30), d(3, 0, 700, 0)];
    assert_eq!(
        same_period(&published_later, &sent, &opened),
        vec![(1, 0, 100, 1, 500, 600)]
    );
    // Or a delivery into a slot freed by an ack sent after 500.
    let freed_later = [d(1, 0, 100, 0), d(1, 1, 500, 30), d(2, 0, 900, 650)];
    assert_eq!(same_period(&freed_later, &sent, &opened).len(), 1);
    // But 1's copy may have been sent before 0 opened (it sat in a
    // paused server's buffers): the older server's copy arrived last.
    let sent_before = [d(1, 0, 100, 0), d(1, 1, 500, 0), d(3, 0, 700, 0)];
    assert!(same_period(&sent_before, &sent, &opened).is_empty());
    // Unless it was published after 0 opened.
    let published_after = [d(4, 0, 100, 0), d(4, 1, 500, 0), d(3, 0, 700, 0)];
    assert_eq!(same_period(&published_after, &sent, &opened).len(), 1);
}

#[test]
fn a_copy_without_the_flag_is_late_only_on_proof() {
    let d = |id, conn, at, credit, redelivered| Delivery {
        id,
        conn,
        at,
        credit,
        redelivered,
    };
    let opened: BTreeMap<u32, u32> = [(0, 10), (1, 20), (2, 600)].into();
    // The flagged copy came first on connection 1; the bare one on 0,
    // which opened earlier, maybe sent first and read late.
    let reordered = [d(1, 1, 100, 0, true), d(1, 0, 500, 0, false)];
    assert_eq!(unflagged_later(&reordered, &opened), (vec![], vec![1]));
    // The bare one came on a connection opened after the flagged arrived.
    let reopened = [d(2, 1, 100, 0, true), d(2, 2, 700, 0, false)];
    assert_eq!(unflagged_later(&reopened, &opened), (vec![2], vec![]));
    // Or into a slot an ack freed after it arrived.
    let freed = [d(3, 1, 100, 0, true), d(3, 0, 700, 150, false)];
    assert_eq!(unflagged_later(&freed, &opened), (vec![3], vec![]));
    // Or on the same connection, after it.
    let same = [d(4, 0, 100, 0, true), d(4, 0, 200, 0, false)];
    assert_eq!(unflagged_later(&same, &opened), (vec![4], vec![]));
    // Two bare copies: one of them was sent later.
    let both = [d(5, 0, 100, 0, false), d(5, 1, 200, 0, false)];
    assert_eq!(unflagged_later(&both, &opened), (vec![5], vec![]));
    // The bare copy first, then flagged ones: as it should be.
    let fine = [
        d(6, 0, 100, 0, false),
        d(6, 1, 200, 0, true),
        d(6, 2, 900, 0, true),
    ];
    assert_eq!(unflagged_later(&fine, &opened), (vec![], vec![]));
}
