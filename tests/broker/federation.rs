//! Exchange federation (RabbitMQ's federation plugin) between Warren
//! brokers: a policy naming an upstream makes a link that receives, into
//! the exchange here, what is published to the same exchange upstream,
//! for the bindings made here and no others; an unbind stops the flow;
//! messages published while the downstream is away wait upstream; a
//! ring of three stops each message where it began (and at max-hops);
//! queue federation moves messages to where the consumers are; the API
//! lists the links and refuses bad upstreams and policies in RabbitMQ's
//! words.

use crate::common;

use std::time::{Duration, Instant};

use common::api::{call, get_json, metrics};
use common::counts::{count, publish_ids, wait_count};
use common::TestBroker;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};
use serde_json::{json, Value};

/// A broker with the API on, going by `cluster` as its cluster name.
async fn broker(cluster: &str) -> TestBroker {
    let b = common::start_with_api().await;
    let (s, body) = call(&b, "PUT", "/cluster-name", Some(json!({"name": cluster}))).await;
    assert_eq!(s, 204, "{body}");
    b
}

/// Makes `up` an upstream of `down` (max-hops `hops`) and federates
/// `down`'s exchanges whose name starts with `fed` from it.
async fn federate(down: &TestBroker, up: &TestBroker, name: &str, hops: u32) {
    let value = json!({"value": {"uri": up.uri(), "max-hops": hops, "reconnect-delay": 1}});
    let (s, body) = call(
        down,
        "PUT",
        &format!("/parameters/federation-upstream/%2f/{name}"),
        Some(value),
    )
    .await;
    assert!(s == 201 || s == 204, "{body}");
    let policy = json!({"pattern": "^fed", "apply-to": "exchanges",
        "definition": {"federation-upstream-set": "all"}});
    let (s, body) = call(down, "PUT", "/policies/%2f/federate", Some(policy)).await;
    assert!(s == 201 || s == 204, "{body}");
}

async fn topic(ch: &Channel, name: &str) {
    ch.exchange_declare(
        name.into(),
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("exchange");
}

/// A durable queue bound to `exchange` with `key`.
async fn bound_queue(ch: &Channel, queue: &str, exchange: &str, key: &str) {
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

/// Waits until `f` holds of what GET `path` answers (or 30 s pass).
async fn wait_api(b: &TestBroker, path: &str, f: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let v = get_json(b, path).await;
        if f(&v) || Instant::now() > until {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The keys `exchange` of `b` is bound upstream with for federation links.
async fn upstream_keys(b: &TestBroker, exchange: &str) -> Vec<String> {
    let path = format!("/exchanges/%2f/{exchange}/bindings/source");
    let (s, body) = call(b, "GET", &path, None).await;
    if s != 200 {
        return Vec::new();
    }
    let v: Value = serde_json::from_str(&body).expect("json");
    let mut keys: Vec<String> = v
        .as_array()
        .expect("a list")
        .iter()
        .filter(|b| {
            b["destination"]
                .as_str()
                .is_some_and(|d| d.starts_with("federation: "))
        })
        .map(|b| b["routing_key"].as_str().unwrap_or_default().to_string())
        .collect();
    keys.sort();
    keys
}

async fn wait_keys(b: &TestBroker, exchange: &str, want: &[&str]) {
    let until = Instant::now() + Duration::from_secs(30);
    while upstream_keys(b, exchange).await != want && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let keys = upstream_keys(b, exchange).await;
    if keys != want {
        let all = get_json(b, &format!("/exchanges/%2f/{exchange}/bindings/source")).await;
        let links = get_json(b, "/federation-links").await;
        panic!("{exchange}'s federation bindings: {keys:?}, not {want:?}: {all:#}\n{links:#}");
    }
}

fn received_from(h: &FieldTable) -> Vec<FieldTable> {
    match h.inner().get("x-received-from") {
        Some(AMQPValue::FieldArray(a)) => a
            .as_slice()
            .iter()
            .filter_map(|e| match e {
                AMQPValue::FieldTable(t) => Some(t.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn text(t: &FieldTable, k: &str) -> String {
    match t.inner().get(k) {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => format!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bindings_made_here_pull_messages_from_upstream() {
    let up = broker("up").await;
    let down = broker("down").await;
    let (up_conn, up_ch) = up.channel().await;
    let (down_conn, down_ch) = down.channel().await;
    topic(&down_ch, "fed.x").await;
    bound_queue(&down_ch, "here", "fed.x", "a.*").await;
    federate(&down, &up, "up", 1).await;

    // The link runs, and has made the exchange upstream and bound it with
    // the key of the binding here.
    let links = wait_api(&down, "/federation-links", |v| v[0]["status"] == "running").await;
    let link = &links[0];
    assert_eq!(link["status"], "running", "{links}");
    assert_eq!(
        (link["exchange"].as_str(), link["upstream"].as_str()),
        (Some("fed.x"), Some("up"))
    );
    assert_eq!(link["type"], "exchange");
    assert_eq!(link["id"].as_str().map(str::len), Some(8));
    assert!(
        !link["uri"].as_str().unwrap_or_default().contains("guest"),
        "{link}"
    );
    wait_keys(&up, "fed.x", &["a.*"]).await;
    let scraped = metrics(&down).await;
    assert!(
        scraped.contains("rabbitmq_federation_links{status=\"running\"} 1"),
        "{scraped}"
    );

    // Published upstream: what the binding here matches comes, once.
    publish_ids(&up_ch, "fed.x", "a.b", 1000).await;
    publish_ids(&up_ch, "fed.x", "c.d", 10).await;
    assert_eq!(wait_count(&down_conn, "here", 1000).await, 1000);
    let got = down_ch
        .basic_get("here".into(), BasicGetOptions { no_ack: true })
        .await
        .expect("get")
        .expect("a message");
    let hops = received_from(got.properties.headers().as_ref().expect("headers"));
    assert_eq!(hops.len(), 1);
    assert_eq!(text(&hops[0], "cluster-name"), "up");
    assert_eq!(text(&hops[0], "exchange"), "fed.x");
    assert_eq!(text(&hops[0], "vhost"), "/");
    let queue = "federation: fed.x -> down";
    assert_eq!(wait_count(&up_conn, queue, 0).await, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        count(&down_conn, "here").await,
        999,
        "the c.d messages stay away"
    );

    // A second binding with the same key adds nothing upstream; an
    // unbind of both takes the key away, and the flow stops.
    bound_queue(&down_ch, "here2", "fed.x", "a.*").await;
    wait_keys(&up, "fed.x", &["a.*"]).await;
    for q in ["here", "here2"] {
        down_ch
            .queue_unbind(
                q.into(),
                "fed.x".into(),
                "a.*".into(),
                FieldTable::default(),
            )
            .await
            .expect("unbind");
    }
    wait_keys(&up, "fed.x", &[]).await;
    publish_ids(&up_ch, "fed.x", "a.b", 10).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count(&down_conn, "here").await, 999);
    assert_eq!(
        count(&up_conn, queue).await,
        0,
        "nothing routed to the link's queue"
    );

    // The policy goes: so do the link and its queue upstream.
    let (s, _) = call(&down, "DELETE", "/policies/%2f/federate", None).await;
    assert_eq!(s, 204);
    wait_api(&down, "/federation-links", |v| {
        v.as_array().is_some_and(Vec::is_empty)
    })
    .await;
    let until = Instant::now() + Duration::from_secs(30);
    while get_json(&up, "/queues")
        .await
        .as_array()
        .is_some_and(|q| q.iter().any(|q| q["name"] == queue))
        && Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let names: Vec<Value> = get_json(&up, "/queues")
        .await
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !names.iter().any(|q| q["name"] == queue),
        "the upstream queue is deleted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_wait_upstream_while_the_downstream_is_away() {
    let up = broker("up").await;
    let mut down = broker("down").await;
    let (up_conn, up_ch) = up.channel().await;
    {
        let (_c, ch) = down.channel().await;
        topic(&ch, "fed.y").await;
        bound_queue(&ch, "kept", "fed.y", "#").await;
    }
    federate(&down, &up, "up", 1).await;
    wait_keys(&up, "fed.y", &["#"]).await;
    publish_ids(&up_ch, "fed.y", "k", 500).await;
    let down_conn = down.connect().await;
    assert_eq!(wait_count(&down_conn, "kept", 500).await, 500);
    drop(down_conn);

    // Away: the upstream queue collects.
    down.stop().await;
    publish_ids(&up_ch, "fed.y", "k", 2000).await;
    assert_eq!(
        wait_count(&up_conn, "federation: fed.y -> down", 2000).await,
        2000
    );

    // Back: the link starts again from the stored policy and upstream,
    // and everything arrives.
    down.restart().await;
    let down_conn = down.connect().await;
    assert_eq!(wait_count(&down_conn, "kept", 2500).await, 2500);
    assert_eq!(
        wait_count(&up_conn, "federation: fed.y -> down", 0).await,
        0
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count(&down_conn, "kept").await, 2500, "none twice");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ring_of_three_delivers_each_message_once_and_max_hops_shortens_it() {
    let a = broker("a").await;
    let b = broker("b").await;
    let c = broker("c").await;
    let all = [&a, &b, &c];
    let mut conns = Vec::new();
    for x in all {
        let (conn, ch) = x.channel().await;
        topic(&ch, "fed.ring").await;
        bound_queue(&ch, "mine", "fed.ring", "#").await;
        conns.push((conn, ch));
    }
    // a <- c, b <- a, c <- b: a ring, with hops to spare.
    federate(&a, &c, "prev", 10).await;
    federate(&b, &a, "prev", 10).await;
    federate(&c, &b, "prev", 10).await;
    for x in all {
        wait_api(x, "/federation-links", |v| v[0]["status"] == "running").await;
    }
    for x in all {
        // Its own binding, and the one replayed for its downstream (the
        // next broker's comes back here, and stops: a cycle).
        wait_keys(x, "fed.ring", &["#", "#"]).await;
    }
    publish_ids(&conns[0].1, "fed.ring", "k", 1).await;
    for (conn, _) in &conns {
        assert_eq!(wait_count(conn, "mine", 1).await, 1);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (i, (conn, _)) in conns.iter().enumerate() {
        assert_eq!(count(conn, "mine").await, 1, "broker {i} got it once");
    }
    let got = conns[2]
        .1
        .basic_get("mine".into(), BasicGetOptions { no_ack: true })
        .await
        .expect("get")
        .expect("a message");
    let hops = received_from(got.properties.headers().as_ref().expect("headers"));
    let clusters: Vec<String> = hops.iter().map(|h| text(h, "cluster-name")).collect();
    assert_eq!(clusters, ["b", "a"], "c got it from b, which got it from a");
    for (_, ch) in &conns {
        ch.queue_purge("mine".into(), QueuePurgeOptions::default())
            .await
            .expect("purge");
    }

    // One hop: a message from a reaches b, not c.
    for (x, up) in [(&a, &c), (&b, &a), (&c, &b)] {
        federate(x, up, "prev", 1).await;
    }
    for x in all {
        // Only its downstream's own binding: a replayed one has no hop left.
        wait_keys(x, "fed.ring", &["#"]).await;
        wait_api(x, "/federation-links", |v| v[0]["status"] == "running").await;
    }
    publish_ids(&conns[0].1, "fed.ring", "k", 1).await;
    assert_eq!(wait_count(&conns[1].0, "mine", 1).await, 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&conns[0].0, "mine").await, 1, "a: its own");
    assert_eq!(count(&conns[2].0, "mine").await, 0, "c: beyond one hop");
}

#[tokio::test(flavor = "multi_thread")]
async fn upstreams_and_policies_are_checked_and_a_deleted_upstream_stops_its_links() {
    let up = broker("up").await;
    let down = broker("down").await;
    let bad = |v: Value| json!({"value": v});
    let cases = [
        (json!({"ack-mode": "x"}), "ack-mode should be one of"),
        (
            json!({"uri": "amqp://h", "queue": null}),
            "queue should be binary, actually was null",
        ),
        (json!({"uri": 5}), "uri should be list, actually was 5"),
        (json!({"uri": "http://h"}), "not a valid URI"),
        (
            json!({"uri": "amqp://h", "foo": 1}),
            "Unrecognised terms [{<<\\\"foo\\\">>,1}] in u",
        ),
    ];
    for (v, text) in cases {
        let (s, body) = call(
            &down,
            "PUT",
            "/parameters/federation-upstream/%2f/u",
            Some(bad(v)),
        )
        .await;
        assert_eq!(s, 400, "{body}");
        assert!(body.contains("Validation failed"), "{body}");
        assert!(body.contains(text), "{text} in {body}");
    }
    let (s, body) = call(
        &down,
        "PUT",
        "/parameters/federation/%2f/u",
        Some(bad(json!({}))),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("name not recognised"), "{body}");
    let (s, body) = call(
        &down,
        "PUT",
        "/parameters/federation-upstream-set/%2f/s",
        Some(bad(json!([{"max-hops": 1}]))),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    assert!(
        body.contains("Key \\\"upstream\\\" not found in s"),
        "{body}"
    );
    // A URI without credentials is stored (RabbitMQ's clients send one),
    // and its link says why it cannot run.
    let (s, body) = call(
        &down,
        "PUT",
        "/parameters/federation-upstream/%2f/anon",
        Some(bad(json!({"uri": "amqp://localhost:5672/v"}))),
    )
    .await;
    assert_eq!(s, 201, "{body}");
    let stored = get_json(&down, "/parameters/federation-upstream/%2f/anon").await;
    assert_eq!(
        stored["value"]["uri"], "amqp://localhost:5672/v",
        "stored as it came"
    );

    for (policy, text) in [
        (
            json!({"pattern": ".", "apply-to": "exchanges", "definition":
            {"federation-upstream": "a", "federation-upstream-set": "all"}}),
            "cannot specify federation-upstream",
        ),
        (
            json!({"pattern": ".", "apply-to": "exchanges", "definition": {"federation-upstream": 1}}),
            "1 is not a valid federation upstream name",
        ),
        (
            json!({"pattern": ".", "apply-to": "exchanges", "definition": {"federation-upstream-pattern": "("}}),
            "could not compile pattern",
        ),
    ] {
        let (s, body) = call(&down, "PUT", "/policies/%2f/p", Some(policy)).await;
        assert_eq!(s, 400, "{body}");
        assert!(body.contains(text), "{text} in {body}");
    }

    // The credential-less upstream's link fails, saying why.
    let policy = json!({"pattern": "^anon", "apply-to": "exchanges",
        "definition": {"federation-upstream": "anon"}});
    assert_eq!(
        call(&down, "PUT", "/policies/%2f/anon", Some(policy))
            .await
            .0,
        201
    );
    let (_c, ch) = down.channel().await;
    topic(&ch, "anon.x").await;
    let links = wait_api(&down, "/federation-links", |v| v[0]["status"] == "error").await;
    assert!(
        links[0]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("needs a user and password"),
        "{links}"
    );
    assert_eq!(
        get_json(&down, "/federation-links/state/down")
            .await
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        call(&down, "DELETE", "/policies/%2f/anon", None).await.0,
        204
    );
    assert_eq!(
        call(
            &down,
            "DELETE",
            "/parameters/federation-upstream/%2f/anon",
            None
        )
        .await
        .0,
        204
    );

    // A running link, restarted, then its upstream deleted: it stops and
    // leaves the list; the policy stays; a second delete is 404.
    topic(&ch, "fed.z").await;
    bound_queue(&ch, "z", "fed.z", "k").await;
    federate(&down, &up, "up", 1).await;
    let links = wait_api(&down, "/federation-links", |v| {
        v.as_array().is_some_and(|a| {
            a.iter()
                .any(|l| l["exchange"] == "fed.z" && l["status"] == "running")
        })
    })
    .await;
    let link = links
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["exchange"] == "fed.z")
        .unwrap()
        .clone();
    let restart = format!(
        "/federation-links/vhost/%2f/{}/{}/restart",
        link["id"].as_str().unwrap(),
        link["node"].as_str().unwrap()
    );
    assert_eq!(call(&down, "DELETE", &restart, None).await.0, 204);
    assert_eq!(
        call(
            &down,
            "DELETE",
            "/federation-links/vhost/%2f/00000000/x/restart",
            None
        )
        .await
        .0,
        404
    );
    wait_api(&down, "/federation-links", |v| v[0]["status"] == "running").await;
    let (up_conn, up_ch) = up.channel().await;
    wait_keys(&up, "fed.z", &["k"]).await;
    publish_ids(&up_ch, "fed.z", "k", 5).await;
    let down_conn = down.connect().await;
    assert_eq!(wait_count(&down_conn, "z", 5).await, 5);
    assert_eq!(
        call(
            &down,
            "DELETE",
            "/parameters/federation-upstream/%2f/up",
            None
        )
        .await
        .0,
        204
    );
    wait_api(&down, "/federation-links", |v| {
        v.as_array()
            .is_some_and(|a| a.iter().all(|l| l["exchange"] != "fed.z"))
    })
    .await;
    assert_eq!(
        call(
            &down,
            "DELETE",
            "/parameters/federation-upstream/%2f/up",
            None
        )
        .await
        .0,
        404
    );
    assert_eq!(
        call(&down, "GET", "/policies/%2f/federate", None).await.0,
        200
    );
    wait_keys(&up, "fed.z", &[]).await;
    drop(up_conn);
}

#[tokio::test(flavor = "multi_thread")]
async fn queue_federation_moves_work_to_where_the_consumers_are() {
    let up = broker("up").await;
    let down = broker("down").await;
    let (up_conn, up_ch) = up.channel().await;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    up_ch
        .queue_declare("work".into(), durable, FieldTable::default())
        .await
        .expect("queue");
    publish_ids(&up_ch, "", "work", 1000).await;
    let value = json!({"value": {"uri": up.uri(), "prefetch-count": 100}});
    assert_eq!(
        call(
            &down,
            "PUT",
            "/parameters/federation-upstream/%2f/up",
            Some(value)
        )
        .await
        .0,
        201
    );
    let policy = json!({"pattern": "^work$", "apply-to": "queues",
        "definition": {"federation-upstream": "up"}});
    assert_eq!(
        call(&down, "PUT", "/policies/%2f/work", Some(policy))
            .await
            .0,
        201
    );
    let (down_conn, down_ch) = down.channel().await;
    down_ch
        .queue_declare("work".into(), durable, FieldTable::default())
        .await
        .expect("queue");
    let links = wait_api(&down, "/federation-links", |v| v[0]["status"] == "running").await;
    let link = &links[0];
    assert_eq!(link["type"], "queue", "{links}");
    assert_eq!(
        (link["queue"].as_str(), link["upstream_queue"].as_str()),
        (Some("work"), Some("work"))
    );
    assert_eq!(link["consumer_tag"], "federation-link-up");

    // No consumer here: the work stays upstream.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&up_conn, "work").await, 1000);
    assert_eq!(count(&down_conn, "work").await, 0);

    // A consumer here: the work comes, each message once.
    down_ch
        .basic_qos(50, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = down_ch
        .basic_consume(
            "work".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut seen = std::collections::HashSet::new();
    let mut first = None;
    while seen.len() < 1000 {
        let d = tokio::time::timeout(
            Duration::from_secs(30),
            futures::StreamExt::next(&mut consumer),
        )
        .await
        .expect("a delivery within 30 s")
        .expect("a delivery")
        .expect("a delivery");
        let id = u64::from_be_bytes(d.data[..8].try_into().expect("8 bytes"));
        assert!(seen.insert(id), "message {id} came twice");
        if first.is_none() {
            first = d.properties.headers().clone();
        }
        d.acker.ack(BasicAckOptions::default()).await.expect("ack");
    }
    assert_eq!(wait_count(&up_conn, "work", 0).await, 0);
    let headers = first.expect("headers");
    let hops = received_from(&headers);
    assert_eq!(hops.len(), 1);
    assert_eq!(text(&hops[0], "queue"), "work");
    assert_eq!(
        hops[0].inner().get("visit-count"),
        Some(&AMQPValue::LongLongInt(1))
    );
    assert_eq!(text(&headers, "x-original-routing-key"), "work");

    // Its consumer gone, the link stops pulling: later work stays upstream.
    down_ch
        .basic_cancel("c".into(), BasicCancelOptions::default())
        .await
        .expect("cancel");
    drop(consumer);
    tokio::time::sleep(Duration::from_millis(500)).await;
    publish_ids(&up_ch, "", "work", 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&up_conn, "work").await, 10);
}

/// A message the exchange here refuses (a full queue that rejects
/// publishes) is nacked back upstream, and only it: what came before it
/// in the same batch is acked upstream, and the rest stays there.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_message_goes_back_upstream_alone() {
    let up = broker("up").await;
    let down = broker("down").await;
    let (up_conn, up_ch) = up.channel().await;
    let (down_conn, down_ch) = down.channel().await;
    topic(&down_ch, "fed.full").await;
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongInt(5));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    down_ch
        .queue_declare(
            "limited".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await
        .expect("queue");
    down_ch
        .queue_bind(
            "limited".into(),
            "fed.full".into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");
    federate(&down, &up, "up", 1).await;
    wait_keys(&up, "fed.full", &["#"]).await;
    publish_ids(&up_ch, "fed.full", "k", 10).await;
    assert_eq!(wait_count(&down_conn, "limited", 5).await, 5);
    let links = wait_api(&down, "/federation-links", |v| v[0]["status"] == "error").await;
    assert!(
        links[0]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("refused the message"),
        "{links}"
    );
    let queue = "federation: fed.full -> down";
    let until = Instant::now() + Duration::from_secs(10);
    while count(&up_conn, queue).await != 5 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        count(&up_conn, queue).await,
        5,
        "the five that fit were acked upstream"
    );
    for want in 0..5u64 {
        let got = down_ch
            .basic_get("limited".into(), BasicGetOptions { no_ack: true })
            .await
            .expect("get")
            .expect("a message");
        assert_eq!(u64::from_be_bytes(got.data[..8].try_into().unwrap()), want);
    }
}

/// rabbitmq_http_client (what rabbitmqadmin v2 is built on) declares an
/// upstream, reads it back as it was sent, updates and deletes it (a
/// second delete is a 404), and lists a running link, as its own suite
/// does against RabbitMQ.
#[tokio::test(flavor = "multi_thread")]
async fn the_http_api_client_manages_upstreams_and_lists_links() {
    use rabbitmq_http_client::api::Client;
    use rabbitmq_http_client::commons::MessageTransferAcknowledgementMode as Ack;
    use rabbitmq_http_client::requests::{
        ExchangeFederationParams, FederationUpstreamParams, QueueFederationParams,
    };
    use rabbitmq_http_client::responses::FederationType;

    let up = broker("up").await;
    let down = broker("down").await;
    let endpoint = format!("http://{}/api", down.api.expect("the API is on"));
    let client = Client::new(endpoint, "guest".to_string(), "guest".to_string());
    // As the client's suite sends it: a URI without credentials is stored.
    let uri = "amqp://localhost:5672/%2f";
    let params = FederationUpstreamParams::new_queue_federation_upstream(
        "/",
        "qf",
        uri,
        QueueFederationParams::new("test-queue"),
    );
    client
        .declare_federation_upstream(params)
        .await
        .expect("declared");
    let all = client.list_federation_upstreams().await.expect("listed");
    let u = all
        .iter()
        .find(|u| u.name == "qf" && u.vhost == "/")
        .expect("listed");
    assert_eq!(
        (u.uri.as_str(), u.queue.as_deref()),
        (uri, Some("test-queue"))
    );
    assert_eq!(u.ack_mode, Ack::WhenConfirmed);

    let mut params = FederationUpstreamParams::new_queue_federation_upstream(
        "/",
        "qf",
        uri,
        QueueFederationParams::new_with_consumer_tag("updated-queue", "updated-tag"),
    );
    params.ack_mode = Ack::WhenPublished;
    params.trust_user_id = true;
    params.reconnect_delay = 15;
    params.prefetch_count = 2000;
    client
        .declare_federation_upstream(params)
        .await
        .expect("updated");
    let u = client
        .get_federation_upstream("/", "qf")
        .await
        .expect("read");
    assert_eq!(u.ack_mode, Ack::WhenPublished);
    assert_eq!(
        (u.trust_user_id, u.reconnect_delay, u.prefetch_count),
        (Some(true), Some(15), Some(2000))
    );
    assert_eq!(
        (u.queue.as_deref(), u.consumer_tag.as_deref()),
        (Some("updated-queue"), Some("updated-tag"))
    );
    client
        .delete_federation_upstream("/", "qf", false)
        .await
        .expect("deleted");
    client
        .delete_federation_upstream("/", "qf", true)
        .await
        .expect("idempotent");
    assert!(client
        .delete_federation_upstream("/", "qf", false)
        .await
        .is_err());

    // An exchange upstream, a policy, and the link it runs, listed.
    let upstream_uri = up.uri();
    let params = FederationUpstreamParams::new_exchange_federation_upstream(
        "/",
        "xf",
        &upstream_uri,
        ExchangeFederationParams {
            max_hops: Some(2),
            ..Default::default()
        },
    );
    client
        .declare_federation_upstream(params)
        .await
        .expect("declared");
    let policy = json!({"pattern": "^fed\\.c$", "apply-to": "exchanges",
        "definition": {"federation-upstream": "xf"}});
    assert_eq!(
        call(&down, "PUT", "/policies/%2f/c", Some(policy)).await.0,
        201
    );
    let (_conn, ch) = down.channel().await;
    topic(&ch, "fed.c").await;
    wait_api(&down, "/federation-links", |v| v[0]["status"] == "running").await;
    let links = client.list_federation_links().await.expect("links");
    assert_eq!(links.len(), 1, "{links:?}");
    assert_eq!(
        (links[0].typ.clone(), links[0].upstream.as_str()),
        (FederationType::Exchange, "xf")
    );
    assert_eq!(links[0].status, "running");
    assert!(!links[0].uri.contains("guest"), "{}", links[0].uri);
}
