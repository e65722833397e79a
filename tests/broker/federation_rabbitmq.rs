//! Federation between RabbitMQ 3.10.8 (with its federation plugin) and
//! Warren, both ways: an exchange of Warren federated from RabbitMQ, an
//! exchange of RabbitMQ federated from Warren (RabbitMQ's link declares
//! its queue and an `x-federation-upstream` exchange here), and a queue
//! of RabbitMQ federated from a queue of Warren. What a client sees:
//! every message published upstream for a binding downstream arrives
//! downstream once, saying where it came from, and each side's API shows
//! its link running.
//!
//! RabbitMQ is Debian's `rabbitmq-server`, started by the test as a
//! private node (tests/common/rabbitmq.rs); absent it the test skips,
//! unless WARREN_REQUIRE_RABBITMQ is set (.ci/run installs it and sets it).

use crate::common;

use std::time::{Duration, Instant};

use common::api::{call, get_json};
use common::counts::{publish_ids, wait_count};
use common::rabbitmq::{self, RabbitNode};
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};
use serde_json::{json, Value};

const N: u64 = 1000;

async fn topic_with_queue(ch: &Channel, exchange: &str, queue: &str, key: &str) {
    ch.exchange_declare(
        exchange.into(),
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("exchange");
    durable_queue(ch, queue).await;
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        key.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("bind");
}

async fn durable_queue(ch: &Channel, queue: &str) {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("queue");
}

/// Waits until `exchange`'s bindings (as `bindings` reads them) include
/// one to a federation exchange.
async fn wait_federated<F, Fut>(what: &str, bindings: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<Value>>,
{
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let v = bindings().await.unwrap_or(Value::Null);
        let bound = v.as_array().is_some_and(|a| {
            a.iter().any(|b| {
                b["destination"]
                    .as_str()
                    .is_some_and(|d| d.starts_with("federation: "))
            })
        });
        if bound {
            return;
        }
        assert!(Instant::now() < until, "{what}: no federation binding: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn first_hop_cluster(h: &FieldTable) -> String {
    match h.inner().get("x-received-from") {
        Some(AMQPValue::FieldArray(a)) => match a.as_slice().first() {
            Some(AMQPValue::FieldTable(t)) => match t.inner().get("cluster-name") {
                Some(AMQPValue::LongString(s)) => {
                    String::from_utf8_lossy(s.as_bytes()).into_owned()
                }
                other => format!("{other:?}"),
            },
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

async fn rabbit_put(r: &RabbitNode, path: &str, body: Value) {
    let (s, text) = r.call("PUT", path, Some(body)).await;
    assert!(s == 201 || s == 204, "RabbitMQ PUT {path}: {s} {text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn federation_runs_both_ways_between_rabbitmq_and_warren() {
    let Some(rabbit) =
        rabbitmq::start(&["rabbitmq_federation", "rabbitmq_federation_management"]).await
    else {
        return;
    };
    let warren = common::start_with_api().await;
    assert_eq!(
        call(
            &warren,
            "PUT",
            "/cluster-name",
            Some(json!({"name": "warren-fed"}))
        )
        .await
        .0,
        204
    );
    rabbit_put(&rabbit, "/cluster-name", json!({"name": "rabbit-fed"})).await;
    let rconn = rabbit.connect().await;
    let rch = rconn.create_channel().await.expect("channel");
    let (wconn, wch) = warren.channel().await;

    // Warren federates its exchange from RabbitMQ.
    topic_with_queue(&wch, "fed.rw", "from-rabbit", "k.#").await;
    let up = json!({"value": {"uri": rabbit.uri(), "reconnect-delay": 1}});
    assert_eq!(
        call(
            &warren,
            "PUT",
            "/parameters/federation-upstream/%2f/rabbit",
            Some(up)
        )
        .await
        .0,
        201
    );
    let policy = json!({"pattern": "^fed\\.rw$", "apply-to": "exchanges",
        "definition": {"federation-upstream": "rabbit"}});
    assert_eq!(
        call(&warren, "PUT", "/policies/%2f/from-rabbit", Some(policy))
            .await
            .0,
        201
    );
    wait_federated("RabbitMQ's fed.rw", || {
        rabbit.get("/exchanges/%2f/fed.rw/bindings/source")
    })
    .await;
    publish_ids(&rch, "fed.rw", "k.1", N).await;
    publish_ids(&rch, "fed.rw", "other", 10).await;
    assert_eq!(wait_count(&wconn, "from-rabbit", N as u32).await, N as u32);
    let got = wch
        .basic_get("from-rabbit".into(), BasicGetOptions { no_ack: true })
        .await
        .expect("get")
        .expect("a message");
    assert_eq!(
        first_hop_cluster(got.properties.headers().as_ref().expect("headers")),
        "rabbit-fed"
    );
    let links = get_json(&warren, "/federation-links").await;
    assert_eq!(links[0]["status"], "running", "{links}");

    // RabbitMQ federates its exchange from Warren: its link declares its
    // queue and an x-federation-upstream exchange here.
    topic_with_queue(&rch, "fed.wr", "from-warren", "k.#").await;
    rabbit_put(
        &rabbit,
        "/parameters/federation-upstream/%2f/warren",
        json!({"value": {"uri": warren.uri(), "reconnect-delay": 1}}),
    )
    .await;
    rabbit_put(
        &rabbit,
        "/policies/%2f/from-warren",
        json!({"pattern": "^fed\\.wr$|^work$", "apply-to": "all",
            "definition": {"federation-upstream": "warren"}}),
    )
    .await;
    wait_federated("Warren's fed.wr", || async {
        let (s, body) = call(
            &warren,
            "GET",
            "/exchanges/%2f/fed.wr/bindings/source",
            None,
        )
        .await;
        (s == 200)
            .then(|| serde_json::from_str(&body).ok())
            .flatten()
    })
    .await;
    let internal: Vec<Value> = get_json(&warren, "/exchanges/%2f")
        .await
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        internal
            .iter()
            .any(|x| x["type"] == "x-federation-upstream"),
        "RabbitMQ's link declared its exchange type here: {internal:?}"
    );
    publish_ids(&wch, "fed.wr", "k.2", N).await;
    publish_ids(&wch, "fed.wr", "other", 10).await;
    assert_eq!(wait_count(&rconn, "from-warren", N as u32).await, N as u32);
    let got = rch
        .basic_get("from-warren".into(), BasicGetOptions { no_ack: true })
        .await
        .expect("get")
        .expect("a message");
    assert_eq!(
        first_hop_cluster(got.properties.headers().as_ref().expect("headers")),
        "warren-fed"
    );

    // RabbitMQ's queue pulls from Warren's queue once it has a consumer.
    durable_queue(&wch, "work").await;
    publish_ids(&wch, "", "work", N).await;
    durable_queue(&rch, "work").await;
    let cch = rconn.create_channel().await.expect("channel");
    cch.basic_qos(100, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = cch
        .basic_consume(
            "work".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut seen = std::collections::HashSet::new();
    while seen.len() < N as usize {
        let d = tokio::time::timeout(
            Duration::from_secs(60),
            futures::StreamExt::next(&mut consumer),
        )
        .await
        .expect("a delivery within 60 s")
        .expect("a delivery")
        .expect("a delivery");
        let id = u64::from_be_bytes(d.data[..8].try_into().expect("8 bytes"));
        assert!(seen.insert(id), "message {id} came twice");
        d.acker.ack(BasicAckOptions::default()).await.expect("ack");
    }
    assert_eq!(wait_count(&wconn, "work", 0).await, 0);
    let links = rabbit
        .get("/federation-links")
        .await
        .expect("RabbitMQ's links");
    let running = links
        .as_array()
        .map(|a| a.iter().filter(|l| l["status"] == "running").count())
        .unwrap_or(0);
    assert_eq!(running, 2, "RabbitMQ's exchange and queue links: {links}");
}
