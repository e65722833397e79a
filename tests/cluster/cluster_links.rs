//! Shovels and federation links in a cluster of real processes: they run
//! on the leader, and when the leader is killed they start again on the
//! next one, which finishes the work with nothing confirmed lost.

use crate::cluster_support;
use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cluster_support::api::{http, leader_json};
use cluster_support::{count, Cluster};
use common::counts::publish_ids;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::ExchangeKind;
use serde_json::{json, Value};

/// Cluster tests share the machine's two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// PUT `body` to `path` of the leader's API, retried while leadership
/// settles; the status.
async fn put_leader(c: &Cluster, path: &str, body: Value) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(l) = c.leader() {
            let r = http()
                .put(format!("{}/api{path}", c.api(l)))
                .basic_auth("guest", Some("guest"))
                .json(&body)
                .send()
                .await;
            if let Ok(r) = r {
                let s = r.status().as_u16();
                if s < 500 {
                    return s;
                }
            }
        }
        assert!(Instant::now() < deadline, "no leader took PUT {path}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `f` holds of the leader's answer to GET `path` (or `within`
/// passes); that answer.
async fn wait_leader_json(
    c: &Cluster,
    path: &str,
    within: Duration,
    f: impl Fn(&Value) -> bool,
) -> Value {
    let until = Instant::now() + within;
    loop {
        let (_, v) = leader_json(c, path).await;
        if f(&v) || Instant::now() > until {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until node `i`'s `queue` holds at least `n` messages (or 60 s
/// pass); the count.
async fn wait_count(c: &Cluster, i: usize, queue: &str, n: u32) -> u32 {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let got = count(c, i, queue).await;
        if got >= n || Instant::now() > until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The ids (8-byte bodies) taken off `queue` of node `i`, once each
/// copy, until `done` holds of them (what may still be on its way, as a
/// message redelivered at the source, keeps coming) or 30 s pass.
async fn drain_ids(c: &Cluster, i: usize, queue: &str, done: impl Fn(&[u64]) -> bool) -> Vec<u64> {
    let conn = c
        .connect(i, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    let mut ids = Vec::new();
    let until = Instant::now() + Duration::from_secs(30);
    while !done(&ids) && Instant::now() < until {
        while let Some(m) = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("get")
        {
            let d = m.delivery;
            ids.push(u64::from_be_bytes(d.data[..8].try_into().expect("8 bytes")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shovel_resumes_on_the_new_leader_and_loses_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    const N: u64 = 20_000;
    let src = common::start().await;
    let (sc, sch) = src.channel().await;
    sch.queue_declare(
        "src".into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("declare");
    publish_ids(&sch, "", "src", N).await;

    let c = Cluster::start(3);
    let (leader, term) = c.wait_leader(0, Duration::from_secs(30)).await;
    {
        let conn = c.connect(leader, Duration::from_secs(30)).await.unwrap();
        let ch = conn.create_channel().await.unwrap();
        let q = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare("dst".into(), q, FieldTable::default())
            .await
            .unwrap();
    }
    let def = json!({"value": {
        "src-uri": src.uri(),
        "src-queue": "src",
        "src-prefetch-count": 100,
        "dest-uri": "amqp://guest:guest@/%2F",
        "dest-queue": "dst",
        "reconnect-delay": 1,
    }});
    assert_eq!(
        put_leader(&c, "/parameters/shovel/%2F/move", def).await,
        201
    );
    // Part of the way: the leader dies with messages in flight.
    assert!(
        wait_count(&c, leader, "dst", 3000).await >= 3000,
        "{}",
        c.logs_tail()
    );
    c.kill(leader);
    let left = common::counts::count(&sc, "src").await;
    assert!(left > 0, "the shovel was done before its leader died");
    // The old leader stays down until the end: the next one keeps leading.
    let (next, _) = c.wait_leader(term, Duration::from_secs(30)).await;
    let status = wait_leader_json(&c, "/api/shovels", Duration::from_secs(30), |v| {
        v[0]["state"] == "running"
    })
    .await;
    assert_eq!(status[0]["name"], "move", "{status}");
    assert_eq!(status[0]["state"], "running", "{status}");
    assert!(
        wait_count(&c, next, "dst", N as u32).await >= N as u32,
        "{}",
        c.logs_tail()
    );
    // The source is left empty: every message was confirmed by the
    // cluster before it was acked there.
    let until = Instant::now() + Duration::from_secs(30);
    while common::counts::count(&sc, "src").await > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(common::counts::count(&sc, "src").await, 0);
    let every = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<u64>>().len() as u64 == N;
    let ids = drain_ids(&c, next, "dst", every).await;
    let distinct: BTreeSet<u64> = ids.iter().copied().collect();
    assert_eq!(distinct, (0..N).collect(), "every message arrived");
    // At most what was in flight (the prefetch) comes twice.
    assert!(ids.len() as u64 <= N + 100, "{} copies", ids.len());
    c.spawn(leader);
    c.assert_no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_federation_link_resumes_on_the_new_leader() {
    let _one = ONE_AT_A_TIME.lock().await;
    let up = common::start_with_api().await;
    let (s, body) = common::api::call(
        &up,
        "PUT",
        "/cluster-name",
        Some(json!({"name": "upstream-site"})),
    )
    .await;
    assert_eq!(s, 204, "{body}");

    let c = Cluster::start(3);
    let (leader, term) = c.wait_leader(0, Duration::from_secs(30)).await;
    let name = json!({"name": "cluster-site"});
    assert_eq!(put_leader(&c, "/cluster-name", name).await, 204);
    let upstream = json!({"value": {"uri": up.uri(), "reconnect-delay": 1}});
    let s = put_leader(&c, "/parameters/federation-upstream/%2F/up", upstream).await;
    assert!(s == 201 || s == 204, "{s}");
    let policy = json!({"pattern": "^fed", "apply-to": "exchanges",
        "definition": {"federation-upstream": "up"}});
    let s = put_leader(&c, "/policies/%2F/federate", policy).await;
    assert!(s == 201 || s == 204, "{s}");
    {
        let conn = c.connect(leader, Duration::from_secs(30)).await.unwrap();
        let ch = conn.create_channel().await.unwrap();
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.exchange_declare(
            "fed.x".into(),
            ExchangeKind::Direct,
            durable,
            FieldTable::default(),
        )
        .await
        .unwrap();
        let q = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare("here".into(), q, FieldTable::default())
            .await
            .unwrap();
        ch.queue_bind(
            "here".into(),
            "fed.x".into(),
            "k".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    let running = |v: &Value| v[0]["status"] == "running";
    let links = wait_leader_json(
        &c,
        "/api/federation-links",
        Duration::from_secs(30),
        running,
    )
    .await;
    assert!(running(&links), "{links}");
    let bound = |up: &common::TestBroker| {
        let up = up.api;
        async move {
            let url = format!(
                "http://{}/api/exchanges/%2F/fed.x/bindings/source",
                up.expect("api")
            );
            let (_, v) = cluster_support::api::get_json(&url).await;
            v.as_array().is_some_and(|a| !a.is_empty())
        }
    };
    let until = Instant::now() + Duration::from_secs(30);
    while !bound(&up).await && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_uc, uch) = up.channel().await;
    publish_ids(&uch, "fed.x", "k", 1000).await;
    assert_eq!(wait_count(&c, leader, "here", 1000).await, 1000);

    // The leader dies; what is published upstream meanwhile waits in the
    // link's queue there, and the new leader's link brings it.
    c.kill(leader);
    publish_ids(&uch, "fed.x", "k", 500).await;
    // The old leader stays down until the end: the next one keeps leading.
    let (next, _) = c.wait_leader(term, Duration::from_secs(30)).await;
    let links = wait_leader_json(
        &c,
        "/api/federation-links",
        Duration::from_secs(30),
        running,
    )
    .await;
    assert!(running(&links), "{links}");
    assert!(
        wait_count(&c, next, "here", 1500).await >= 1500,
        "{}",
        c.logs_tail()
    );
    // Ids 0..1000, then 0..500 again: each as often at least (a message
    // stored here but not yet acked upstream when the leader died comes
    // once more).
    let copies = |ids: &[u64], id: u64| ids.iter().filter(|&&i| i == id).count();
    let want = |id: u64| if id < 500 { 2 } else { 1 };
    let all = |ids: &[u64]| (0..1000u64).all(|id| copies(ids, id) >= want(id));
    let ids = drain_ids(&c, next, "here", all).await;
    for id in 0..1000u64 {
        let got = copies(&ids, id);
        assert!(got >= want(id), "id {id}: {got} copies");
    }
    c.spawn(leader);
    c.assert_no_panics();
}
