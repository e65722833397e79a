//! A leader's queue past its memory bound keeps only a count of the
//! messages it paged out, and reads them back from the store as the head
//! drains. On a cluster's leader the store shows what is applied, and a
//! message is applied only once its log entry commits: a persistent
//! message paged out was shipped but not staged, so a consumer that caught
//! up with the publishers read a batch without it, the queue took it for
//! gone ("fewer than we counted"), and it stayed invisible until a
//! restart, then came out of order. The same held for the copies a queue
//! writes at once (dead-lettering, delayed releases) and for moves. No
//! fault is needed: a consumer that keeps up with a publisher past the
//! bound is enough.
//! Under this load no leader steps down (one did, for a backlog of
//! commits, before the watchdog watched the sync's progress instead).

use crate::cluster_support;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use cluster_support::api::{http, leader_json};
use cluster_support::total::durable;
use cluster_support::Cluster;
use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How much to publish. By default 4 KiB bodies, 6,000 before the
/// consumer and 6,000 while it consumes: past a queue's 16 MiB in memory.
/// `WARREN_PAGING_LOAD=issue` runs the load that found the bug (issue 23):
/// 256-byte bodies, 120,000 then 60,000, past the 64k messages in memory.
#[derive(Clone, Copy)]
struct Load {
    body: usize,
    before: u64,
    during: u64,
}

fn load() -> Load {
    match std::env::var("WARREN_PAGING_LOAD").as_deref() {
        Err(_) | Ok("" | "default") => Load {
            body: 4096,
            before: 6000,
            during: 6000,
        },
        Ok("issue") => Load {
            body: 256,
            before: 120_000,
            during: 60_000,
        },
        Ok(other) => panic!("WARREN_PAGING_LOAD={other}: use issue or default"),
    }
}

fn body(id: u64, size: usize) -> Vec<u8> {
    let mut b = vec![b'x'; size];
    b[..8].copy_from_slice(&id.to_be_bytes());
    b
}

/// Where the messages go and where they are consumed from.
struct Route<'a> {
    exchange: &'a str,
    key: &'a str,
    /// Headers of every message (x-delay for a delayed-message exchange).
    headers: FieldTable,
    /// Published to this queue, then moved into `queue` through the API
    /// after each batch (queue/transfer.rs).
    moved_from: Option<&'a str>,
    /// The queue consumed.
    queue: &'a str,
    /// Whether they must come in publish order.
    ordered: bool,
}

/// Publishes ids `from..to` through `route` with pipelined confirms;
/// every one must be confirmed.
async fn publish(ch: &Channel, route: &Route<'_>, size: usize, from: u64, to: u64) {
    let mut window = VecDeque::new();
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(route.headers.clone());
    for id in from..to {
        let confirm = ch
            .basic_publish(
                route.exchange.into(),
                route.key.into(),
                BasicPublishOptions::default(),
                &body(id, size),
                props.clone(),
            )
            .await
            .expect("publish");
        window.push_back(confirm);
        while window.len() >= 1000 || (id + 1 == to && !window.is_empty()) {
            let c = window.pop_front().unwrap();
            let c = tokio::time::timeout(Duration::from_secs(30), c)
                .await
                .expect("a confirm in time")
                .expect("confirm");
            assert!(c.is_ack(), "nacked");
        }
    }
}

/// Moves every ready message of `from` into `to` on node `at`.
async fn move_all(cluster: &Cluster, at: usize, from: &str, to: &str) {
    let r = http()
        .post(format!("{}/api/queues/%2F/{from}/actions", cluster.api(at)))
        .basic_auth("guest", Some("guest"))
        .json(&serde_json::json!({"action": "move", "destination": to}))
        .send()
        .await
        .expect("the API answers");
    let status = r.status();
    let answer = r.text().await.unwrap_or_default();
    assert!(status.is_success(), "move: {status} {answer}");
}

/// Consumes `queue` until `n` messages came (or none for 30 s): their ids
/// in delivery order.
async fn consume(ch: &Channel, queue: &str, n: u64) -> Vec<u64> {
    ch.basic_qos(1000, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    while (got.len() as u64) < n {
        let next = tokio::time::timeout(Duration::from_secs(30), consumer.next()).await;
        let Ok(Some(Ok(d))) = next else { break };
        let id = u64::from_be_bytes(d.data[..8].try_into().unwrap());
        got.push(id);
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    got
}

/// Publishes `before` messages with no consumer, then consumes the
/// route's queue while `during` more are published: every one must come
/// once, and in order if the route says so.
async fn past_the_bound(route: Route<'_>, declare: impl AsyncFnOnce(&Channel)) {
    let Load {
        body: size,
        before,
        during,
    } = load();
    let cluster = Arc::new(Cluster::start(3));
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let conn = cluster
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    declare(&ch).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    publish(&ch, &route, size, 0, before).await;
    if let Some(from) = route.moved_from {
        move_all(&cluster, leader, from, route.queue).await;
    }
    let consumer_conn = cluster
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect");
    let cch = consumer_conn.create_channel().await.unwrap();
    let total = before + during;
    let consuming = tokio::spawn({
        let queue = route.queue.to_string();
        // The channel comes back with what it got: a failure report
        // reads its consumer and credit while it is still open.
        async move { (consume(&cch, &queue, total).await, cch) }
    });
    publish(&ch, &route, size, before, total).await;
    if let Some(from) = route.moved_from {
        move_all(&cluster, leader, from, route.queue).await;
    }
    let (mut got, _consuming_channel) = consuming.await.unwrap();
    if !route.ordered {
        got.sort_unstable();
    }
    let seen: std::collections::HashSet<u64> = got.iter().copied().collect();
    let missing = (0..total).filter(|id| !seen.contains(id)).count();
    let first_out_of_order = got.windows(2).position(|w| w[1] != w[0] + 1);
    let delivered_all = missing == 0 && first_out_of_order.is_none() && got.len() as u64 == total;
    let what = match delivered_all {
        true => String::new(),
        false => diagnose(&cluster, &route, (0..total).filter(|id| !seen.contains(id))).await,
    };
    assert!(
        delivered_all,
        "{} of {total} confirmed messages delivered ({missing} missing), out of order at {:?}{what}",
        got.len(),
        first_out_of_order.map(|i| &got[i..(i + 2).min(got.len())])
    );
    // A busy leader is not a failed one: nobody stepped down.
    for i in 0..3 {
        assert!(
            !cluster.log_has(i, "stepping down"),
            "node {} stepped down under load: {}",
            i + 1,
            cluster.logs_tail()
        );
    }
    cluster.assert_no_panics();
}

/// What a failure report needs: which ids went missing (in runs), what
/// the leader's API says of the queues, and what the nodes logged that is
/// not routine.
async fn diagnose(
    cluster: &Cluster,
    route: &Route<'_>,
    missing: impl Iterator<Item = u64>,
) -> String {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for id in missing {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == id => *end = id,
            _ => runs.push((id, id)),
        }
    }
    let mut out = format!("\nmissing ids (runs): {:?}", &runs[..runs.len().min(20)]);
    let mut queues = vec![route.queue.to_string(), route.key.to_string()];
    queues.extend(route.moved_from.map(str::to_string));
    queues.dedup();
    for q in queues {
        let (status, v) = leader_json(cluster, &format!("/api/queues/%2F/{q}")).await;
        let field = |k: &str| v.get(k).cloned().unwrap_or_default();
        out.push_str(&format!(
            "\nqueue {q} ({status}): ready {} unacked {} paged out {} consumers {}",
            field("messages_ready"),
            field("messages_unacknowledged"),
            field("messages_paged_out"),
            field("consumers"),
        ));
    }
    for path in ["/api/consumers", "/api/channels", "/api/connections"] {
        let (status, v) = leader_json(cluster, path).await;
        out.push_str(&format!("\n{path} ({status}): {v}"));
    }
    for i in 0..3 {
        let text = std::fs::read_to_string(&cluster.nodes[i].log).unwrap_or_default();
        let notable: Vec<&str> = text
            .lines()
            .filter(|l| {
                ["WARN", "ERROR", "leading", "panicked"]
                    .iter()
                    .any(|w| l.contains(w))
            })
            .collect();
        let from = notable.len().saturating_sub(30);
        out.push_str(&format!(
            "\n--- node {} ---\n{}",
            i + 1,
            notable[from..].join("\n")
        ));
    }
    out
}

fn direct<'a>(key: &'a str) -> Route<'a> {
    Route {
        exchange: "",
        key,
        headers: FieldTable::default(),
        moved_from: None,
        queue: key,
        ordered: true,
    }
}

async fn declare_durable(ch: &Channel, name: &str, args: FieldTable) {
    ch.queue_declare(name.into(), durable(), args)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_out_messages_are_delivered_in_order_without_a_restart() {
    let _one = ONE_AT_A_TIME.lock().await;
    past_the_bound(direct("paged"), async |ch: &Channel| {
        declare_durable(ch, "paged", FieldTable::default()).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettered_copies_past_the_bound_are_all_delivered() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Not in order: the expiry timer and a publish may each dead-letter a
    // batch at once (RabbitMQ does not promise dead-lettered order either).
    let route = Route {
        queue: "dead",
        ordered: false,
        ..direct("expiring")
    };
    past_the_bound(route, async |ch: &Channel| {
        declare_durable(ch, "dead", FieldTable::default()).await;
        // Every message expires at once and is dead-lettered to "dead":
        // each copy there is written at once (push_written).
        let mut args = FieldTable::default();
        args.insert("x-message-ttl".into(), AMQPValue::LongUInt(0));
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString("dead".into()),
        );
        declare_durable(ch, "expiring", args).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_releases_past_the_bound_are_all_delivered() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Held 1 ms by a delayed-message exchange, then released into "due":
    // each release is written at once (push_written). Released as their
    // timers fire, so not promised in order (nor by the plugin).
    let mut headers = FieldTable::default();
    headers.insert("x-delay".into(), AMQPValue::LongInt(1));
    let route = Route {
        exchange: "later",
        key: "k",
        headers,
        moved_from: None,
        queue: "due",
        ordered: false,
    };
    past_the_bound(route, async |ch: &Channel| {
        let mut args = FieldTable::default();
        args.insert(
            "x-delayed-type".into(),
            AMQPValue::LongString("direct".into()),
        );
        ch.exchange_declare(
            "later".into(),
            lapin::ExchangeKind::Custom("x-delayed-message".into()),
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await
        .unwrap();
        declare_durable(ch, "due", FieldTable::default()).await;
        ch.queue_bind(
            "due".into(),
            "later".into(),
            "k".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_messages_past_the_bound_are_delivered_in_order() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Published to "parked", moved to "moved" through the API before the
    // consumer starts and again while it consumes.
    let route = Route {
        moved_from: Some("parked"),
        queue: "moved",
        ..direct("parked")
    };
    past_the_bound(route, async |ch: &Channel| {
        declare_durable(ch, "parked", FieldTable::default()).await;
        declare_durable(ch, "moved", FieldTable::default()).await;
    })
    .await;
}
