//! Dynamic shovels (RabbitMQ's shovel plugin): a `shovel` parameter moves
//! messages from a queue or exchange of one broker to another, with the
//! source acked only once the destination confirmed (on-confirm). What a
//! client and the API can see: every message arrives once, in order, the
//! source is left empty, the status shows the shovel running without its
//! credentials, a cut connection loses nothing, and a shovel with
//! `src-delete-after` clears itself once done.

use crate::common;

use std::time::{Duration, Instant};

use common::api::{call, get_json, metrics};
use common::counts::{count, wait_count};
use common::TestBroker;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use serde_json::{json, Value};

async fn durable_queue(ch: &Channel, name: &str) {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("declare");
}

/// Publishes ids `from..to` (8-byte bodies) persistent, confirmed.
async fn publish(ch: &Channel, queue: &str, from: u64, to: u64) {
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut pending = Vec::new();
    for id in from..to {
        let c = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &id.to_be_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish");
        pending.push(c);
    }
    for c in pending {
        assert!(c.await.expect("confirm").is_ack());
    }
}

/// Waits until the first shovel's `forwarded` count (acked at the
/// source) reaches `n`, or 30 s pass.
async fn wait_forwarded(b: &TestBroker, n: u64) {
    let until = Instant::now() + Duration::from_secs(30);
    while get_json(b, "/shovels").await[0]["forwarded"] != n && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every message of `queue`: (id, redelivered, headers).
async fn drain(ch: &Channel, queue: &str) -> Vec<(u64, bool, FieldTable)> {
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .expect("get")
    {
        let d = m.delivery;
        let id = u64::from_be_bytes(d.data[..8].try_into().expect("8 bytes"));
        out.push((
            id,
            d.redelivered,
            d.properties.headers().clone().unwrap_or_default(),
        ));
    }
    out
}

fn shovel_from(src: &TestBroker, extra: Value) -> Value {
    let mut value = json!({
        "src-uri": src.uri(),
        "src-queue": "src",
        "dest-uri": "amqp://guest:guest@/%2f",
        "dest-queue": "dst",
    });
    if let (Some(v), Some(e)) = (value.as_object_mut(), extra.as_object()) {
        v.extend(e.clone());
    }
    json!({ "value": value })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shovel_moves_every_message_once_in_order_and_says_so() {
    let src = common::start_with_api().await;
    let dest = common::start_with_api().await;
    let (sc, sch) = src.channel().await;
    durable_queue(&sch, "src").await;
    publish(&sch, "src", 0, 5000).await;
    let def = shovel_from(
        &src,
        json!({"dest-add-forward-headers": true, "dest-add-timestamp-header": true}),
    );
    let (s, body) = call(&dest, "PUT", "/parameters/shovel/%2f/move", Some(def)).await;
    assert_eq!(s, 201, "{body}");
    let (dc, dch) = dest.channel().await;
    assert_eq!(wait_count(&dc, "dst", 5000).await, 5000);
    // Published while it runs: they follow.
    publish(&sch, "src", 5000, 6000).await;
    assert_eq!(wait_count(&dc, "dst", 6000).await, 6000);
    let until = Instant::now() + Duration::from_secs(30);
    while count(&sc, "src").await > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&sc, "src").await, 0, "everything acked at the source");
    // Nothing ready at the source, and the last acks counted: the status
    // holds still from here.
    wait_forwarded(&dest, 6000).await;

    let status = get_json(&dest, "/shovels").await;
    let s = &status[0];
    assert_eq!(s["forwarded"], 6000);
    assert_eq!(s["name"], "move");
    assert_eq!(s["vhost"], "/");
    assert_eq!(s["type"], "dynamic");
    assert_eq!(s["state"], "running");
    assert_eq!(s["src_queue"], "src");
    assert_eq!(s["dest_queue"], "dst");
    let shown = status.to_string();
    assert!(!shown.contains("guest:guest"), "credentials shown: {shown}");
    assert_eq!(get_json(&dest, "/shovels/%2f").await, status);
    let def = get_json(&dest, "/shovels/vhost/%2f/move").await;
    assert_eq!(def["value"]["src-queue"], "src");
    assert!(!def.to_string().contains("guest:guest"), "{def}");

    let got = drain(&dch, "dst").await;
    let ids: Vec<u64> = got.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(ids, (0..6000).collect::<Vec<_>>(), "once each, in order");
    let headers = got[0].2.inner();
    let Some(AMQPValue::FieldArray(trail)) = headers.get("x-shovelled") else {
        panic!("no x-shovelled: {headers:?}");
    };
    let Some(AMQPValue::FieldTable(t)) = trail.as_slice().first() else {
        panic!("x-shovelled holds no table: {trail:?}");
    };
    let text = |k: &str| match t.inner().get(k) {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(text("shovel-name"), "move");
    assert_eq!(text("shovel-type"), "dynamic");
    assert_eq!(text("src-queue"), "src");
    assert_eq!(text("dest-queue"), "dst");
    assert!(!text("src-uri").contains("guest"), "{}", text("src-uri"));
    assert!(matches!(
        headers.get("x-shovelled-timestamp"),
        Some(AMQPValue::LongLongInt(t)) if *t > 1_700_000_000
    ));

    // Deleted through its own route: it stops and its parameter goes.
    let (s, body) = call(&dest, "DELETE", "/shovels/vhost/%2f/move", None).await;
    assert_eq!(s, 204, "{body}");
    assert_eq!(get_json(&dest, "/shovels").await, json!([]));
    assert_eq!(get_json(&dest, "/parameters/shovel").await, json!([]));
    publish(&sch, "src", 6000, 6010).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count(&sc, "src").await,
        10,
        "a deleted shovel moves nothing"
    );
}

/// The shovel's connection to the source is closed (as by an operator or
/// a network fault) while it moves messages: it reconnects after its
/// delay, and what was in flight comes again, redelivered, never lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_loses_nothing() {
    let src = common::start_with_api().await;
    let dest = common::start_with_api().await;
    let (sc, sch) = src.channel().await;
    durable_queue(&sch, "src").await;
    publish(&sch, "src", 0, 20_000).await;
    let def = shovel_from(
        &src,
        json!({"reconnect-delay": 1, "src-prefetch-count": 100}),
    );
    let (s, body) = call(&dest, "PUT", "/parameters/shovel/%2f/cut", Some(def)).await;
    assert_eq!(s, 201, "{body}");
    let (dc, dch) = dest.channel().await;
    // Cut the shovel's connection at the source twice, mid-way.
    for at in [3000, 9000] {
        wait_count(&dc, "dst", at).await;
        let conns = get_json(&src, "/connections").await;
        let names: Vec<String> = conns
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["client_properties"]["connection_name"] == "Shovel cut")
            .filter_map(|c| c["name"].as_str().map(str::to_string))
            .collect();
        assert!(
            !names.is_empty(),
            "the shovel's connection is listed: {conns}"
        );
        for n in names {
            let encoded: String = n
                .bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' => (b as char).to_string(),
                    _ => format!("%{b:02X}"),
                })
                .collect();
            let path = format!("/connections/{encoded}");
            let (s, body) = call(&src, "DELETE", &path, None).await;
            assert!(s == 204 || s == 404, "{s} {body}");
        }
    }
    wait_count(&dc, "dst", 20_000).await;
    let until = Instant::now() + Duration::from_secs(30);
    while count(&sc, "src").await > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = drain(&dch, "dst").await;
    let mut seen = std::collections::HashMap::new();
    for (id, _, _) in &got {
        *seen.entry(*id).or_insert(0u32) += 1;
    }
    let missing: Vec<u64> = (0..20_000).filter(|id| !seen.contains_key(id)).collect();
    assert!(
        missing.is_empty(),
        "{} lost, from {:?}",
        missing.len(),
        missing.first()
    );
    // A duplicate is one that was in flight when the connection went: the
    // source gave it back redelivered, so at most a prefetch's worth each
    // time.
    let twice = got.len() - seen.len();
    assert!(twice <= 2 * 100, "{twice} duplicates");
    assert_eq!(count(&sc, "src").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_after_queue_length_moves_what_was_there_then_clears_itself() {
    let b = common::start_with_api().await;
    let (c, ch) = b.channel().await;
    durable_queue(&ch, "src").await;
    publish(&ch, "src", 0, 300).await;
    let value = json!({"value": {
        "src-uri": "amqp://guest:guest@/%2f", "src-queue": "src",
        "dest-uri": "amqp://guest:guest@/%2f", "dest-queue": "dst",
        "src-delete-after": "queue-length", "ack-mode": "on-publish"}});
    let (s, body) = call(&b, "PUT", "/parameters/shovel/%2f/once", Some(value)).await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(wait_count(&c, "dst", 300).await, 300);
    let until = Instant::now() + Duration::from_secs(30);
    while get_json(&b, "/parameters/shovel").await != json!([]) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get_json(&b, "/parameters/shovel").await, json!([]));
    assert_eq!(get_json(&b, "/shovels").await, json!([]));
    publish(&ch, "src", 300, 310).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count(&c, "src").await, 10, "done: nothing more moves");
    assert_eq!(count(&c, "dst").await, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_definition_is_refused_whole_and_nothing_runs() {
    let b = common::start_with_api().await;
    for (value, says) in [
        (
            json!({"src-uri": "amqp://h", "src-queue": "a", "src-exchange": "x", "dest-uri": "amqp://h"}),
            "Cannot specify 'src-exchange' and 'src-queue'",
        ),
        (
            json!({"src-uri": "amqp://h", "src-queue": "a"}),
            "Key \"dest-uri\" not found",
        ),
        (
            json!({"src-uri": "amqp://h", "src-queue": "a", "dest-uri": "amqp://h", "dest-protocol": "amqp10"}),
            "AMQP 1.0",
        ),
        (
            json!({"src-uri": "amqp://h", "src-queue": "a", "dest-uri": "amqp://h", "ack-mode": "sometimes"}),
            "ack-mode should be one of",
        ),
        (
            json!({"src-uri": "amqp://h?cacertfile=/ca.pem", "src-queue": "a", "dest-uri": "amqp://h"}),
            "the TLS option 'cacertfile' on an amqp:// URI",
        ),
        (
            json!({"src-uri": "amqp://h", "src-queue": "a", "dest-uri": "amqp://h", "src-predeclared": "yes"}),
            "src-predeclared should be boolean",
        ),
        // guest would be used: refused (RabbitMQ logs in as guest).
        (
            json!({"src-uri": "amqp://localhost", "src-queue": "a", "dest-uri": "amqp://u:p@h"}),
            "needs a user and password",
        ),
        (
            json!({"src-uri": "amqp://u:p@h", "src-queue": "x".repeat(300), "dest-uri": "amqp://u:p@h"}),
            "src-queue should be less than 255 bytes",
        ),
        (
            json!({"src-uri": "amqp://u:p@h", "src-exchange": "x", "src-exchange-key": "k".repeat(256),
                   "dest-uri": "amqp://u:p@h"}),
            "src-exchange-key should be less than 255 bytes",
        ),
        (
            json!({"src-uri": "amqp://u:p@h", "src-queue": "a", "dest-uri": "amqp://u:p@h",
                   "src-prefetch-count": 0}),
            "src-prefetch-count should be a number from 1",
        ),
        (
            json!({"src-uri": "amqp://u:p@h", "src-queue": 5, "dest-uri": "amqp://u:p@h"}),
            "src-queue should be binary, actually was 5",
        ),
    ] {
        let (s, body) = call(
            &b,
            "PUT",
            "/parameters/shovel/%2f/bad",
            Some(json!({"value": value})),
        )
        .await;
        assert_eq!(s, 400, "{body}");
        let reason: Value = serde_json::from_str(&body).expect("json");
        let reason = reason["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("Validation failed\n\n"), "{reason}");
        assert!(reason.contains(says), "{says} in {reason}");
    }
    // A URI's password never shows in the refusal (nor in the log).
    let value =
        json!({"src-uri": "amqp://u:hush@h:0", "src-queue": "a", "dest-uri": "amqp://u:p@h"});
    let (s, body) = call(
        &b,
        "PUT",
        "/parameters/shovel/%2f/bad",
        Some(json!({"value": value})),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    assert!(
        body.contains("amqp://h:0") && !body.contains("hush"),
        "{body}"
    );
    assert_eq!(get_json(&b, "/parameters/shovel").await, json!([]));
    assert_eq!(get_json(&b, "/shovels").await, json!([]));
}

/// A definitions file with a shovel starts it, as RabbitMQ's import does,
/// and a broker restarted runs it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_shovel_runs_and_runs_again_after_a_restart() {
    let mut b = common::start_with_api().await;
    let (c, ch) = b.channel().await;
    durable_queue(&ch, "src").await;
    let defs = json!({"parameters": [{"vhost": "/", "component": "shovel", "name": "imported",
        "value": {"src-uri": "amqp://guest:guest@/%2f", "src-queue": "src",
                  "dest-uri": "amqp://guest:guest@/%2f", "dest-queue": "dst"}}]});
    let (s, body) = call(&b, "POST", "/definitions", Some(defs)).await;
    assert!(s == 200 || s == 204, "{s} {body}");
    publish(&ch, "src", 0, 100).await;
    assert_eq!(wait_count(&c, "dst", 100).await, 100);
    // Acked at the source before the restart: else they come again (at
    // least once), and the count below would hold them twice.
    wait_forwarded(&b, 100).await;
    drop((ch, c));
    b.restart().await;
    let (c, ch) = b.channel().await;
    publish(&ch, "src", 100, 200).await;
    assert_eq!(wait_count(&c, "dst", 200).await, 200);
    let status = get_json(&b, "/shovels").await;
    assert_eq!(status[0]["name"], "imported");
    assert_eq!(status[0]["state"], "running");
}

/// GET /metrics of the broker's Prometheus listener.
/// Pause and resume (LavinMQ's API): a paused shovel moves nothing and
/// says so in its status and in Prometheus; resumed, it moves what
/// waited. Pausing twice, resuming a running shovel and either on an
/// unknown one are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_shovel_moves_nothing_until_resumed() {
    let b = common::start_with_api().await;
    let (c, ch) = b.channel().await;
    durable_queue(&ch, "src").await;
    publish(&ch, "src", 0, 100).await;
    let value = json!({"value": {
        "src-uri": "amqp://guest:guest@/%2f", "src-queue": "src",
        "dest-uri": "amqp://guest:guest@/%2f", "dest-queue": "dst"}});
    let (s, body) = call(&b, "PUT", "/parameters/shovel/%2f/held", Some(value)).await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(wait_count(&c, "dst", 100).await, 100);
    // Counted once acked at the source, a moment after the copies land.
    wait_forwarded(&b, 100).await;
    let text = metrics(&b).await;
    assert!(
        text.contains("rabbitmq_shovel_dynamic{status=\"running\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("rabbitmq_shovel_messages_forwarded_total{vhost=\"/\",shovel=\"held\"} 100"),
        "{text}"
    );

    let (s, body) = call(&b, "PUT", "/shovels/%2f/held/pause", None).await;
    assert_eq!(s, 204, "{body}");
    let (s, body) = call(&b, "PUT", "/shovels/vhost/%2f/held/pause", None).await;
    assert_eq!(s, 422, "paused twice: {body}");
    assert_eq!(get_json(&b, "/shovels").await[0]["state"], "paused");
    assert!(metrics(&b)
        .await
        .contains("rabbitmq_shovel_dynamic{status=\"paused\"} 1"));
    publish(&ch, "src", 100, 150).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&c, "src").await, 50, "a paused shovel moves nothing");
    assert_eq!(count(&c, "dst").await, 100);

    let (s, body) = call(&b, "PUT", "/shovels/vhost/%2f/held/resume", None).await;
    assert_eq!(s, 204, "{body}");
    assert_eq!(wait_count(&c, "dst", 150).await, 150);
    let (s, body) = call(&b, "PUT", "/shovels/%2f/held/resume", None).await;
    assert_eq!(s, 422, "resumed while running: {body}");
    for path in ["/shovels/%2f/nothing/pause", "/shovels/%2f/nothing/resume"] {
        let (s, body) = call(&b, "PUT", path, None).await;
        assert_eq!(s, 404, "{path}: {body}");
    }
    let until = Instant::now() + Duration::from_secs(30);
    while get_json(&b, "/shovels").await[0]["state"] != "running" && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get_json(&b, "/shovels").await[0]["state"], "running");
}

/// A static shovel (the config file's `[shovels.NAME]`) runs with the
/// broker: listed as static, without a vhost, to administrators only as
/// in RabbitMQ, and counted apart in Prometheus. A bad one stops the
/// start, named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_shovel_runs_with_the_broker_and_a_bad_one_stops_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut config = common::config(tmp.path());
    config.management_port = warren::config::Port::On(0);
    config.prometheus_port = warren::config::Port::On(0);
    config.shovels.insert(
        "fixed".into(),
        json!({"src-uri": "amqp://guest:guest@/%2f", "src-queue": "src",
               "dest-uri": "amqp://guest:guest@/%2f", "dest-queue": "dst"}),
    );
    let b = common::start_in(tmp, config).await;
    let (c, ch) = b.channel().await;
    durable_queue(&ch, "src").await;
    publish(&ch, "src", 0, 100).await;
    assert_eq!(wait_count(&c, "dst", 100).await, 100);
    let all = get_json(&b, "/shovels").await;
    assert_eq!(all[0]["name"], "fixed");
    assert_eq!(all[0]["type"], "static");
    assert!(all[0].get("vhost").is_none(), "{all}");
    assert_eq!(get_json(&b, "/shovels/%2f").await, json!([]));
    let text = metrics(&b).await;
    assert!(
        text.contains("rabbitmq_shovel_static{status=\"running\"} 1"),
        "{text}"
    );
    assert!(!text.contains("rabbitmq_shovel_dynamic"), "{text}");
    // A monitor of the vhost does not see it.
    let (s, body) = call(
        &b,
        "PUT",
        "/users/watcher",
        Some(json!({"password": "w", "tags": "monitoring"})),
    )
    .await;
    assert!(s == 201 || s == 204, "{body}");
    let (s, body) = call(
        &b,
        "PUT",
        "/permissions/%2f/watcher",
        Some(json!({"configure": ".*", "write": ".*", "read": ".*"})),
    )
    .await;
    assert!(s == 201 || s == 204, "{body}");
    let url = format!("http://{}/api/shovels", b.api.expect("the API"));
    let r = reqwest::Client::new()
        .get(&url)
        .basic_auth("watcher", Some("w"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await.expect("a body"), "[]");

    let tmp = tempfile::tempdir().expect("tempdir");
    let mut config = common::config(tmp.path());
    config.shovels.insert(
        "broken".into(),
        json!({"src-uri": "amqp://guest:guest@/%2f", "src-queue": "src"}),
    );
    let Err(e) = warren::Server::start(config).await else {
        panic!("a bad static shovel was accepted");
    };
    assert!(
        e.contains("static shovel 'broken'") && e.contains("dest-uri"),
        "{e}"
    );
}

/// A no-ack shovel whose destination takes nothing (its publishers held
/// by the free-disk alarm) reads no further ahead than its prefetch: the
/// rest stays at the source rather than in the shovel's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_ack_shovel_reads_no_further_ahead_than_its_prefetch() {
    const N: usize = 2000;
    let src = common::start_with_api().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = common::config(tmp.path());
    c.management_port = warren::config::Port::On(0);
    c.prometheus_port = warren::config::Port::On(0);
    // A limit no disk is under: publishers are held from the start.
    c.disk_free_limit = warren::config::DiskFreeLimit::Absolute(1 << 60);
    let dest = common::start_in(tmp, c).await;
    let (sc, sch) = src.channel().await;
    durable_queue(&sch, "src").await;
    // 32 KiB each: many more than the prefetch and the sockets' buffers
    // hold.
    let body = vec![7u8; 32 << 10];
    sch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    for _ in 0..N {
        sch.basic_publish(
            "".into(),
            "src".into(),
            BasicPublishOptions::default(),
            &body,
            BasicProperties::default(),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    }
    let def = shovel_from(
        &src,
        json!({"ack-mode": "no-ack", "src-prefetch-count": 10}),
    );
    let (s, body) = call(&dest, "PUT", "/parameters/shovel/%2f/held", Some(def)).await;
    assert_eq!(s, 201, "{body}");
    let until = Instant::now() + Duration::from_secs(20);
    while count(&sc, "src").await as usize == N && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Given time to take more, it does not.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let left = count(&sc, "src").await as usize;
    assert!(left < N, "the shovel read nothing");
    assert!(
        left >= N * 3 / 4,
        "{} of {N} messages left the source for a destination that takes none",
        N - left
    );
    // The status says why it does not move.
    let status = get_json(&dest, "/shovels").await;
    assert_eq!(status[0]["state"], "running", "{status}");
    assert_eq!(status[0]["blocked_status"], "blocked", "{status}");
}

/// `src-predeclared` and `dest-predeclared` (RabbitMQ 3.13's, sent by
/// rabbitmqadmin v2): the shovel leaves declaring the queue to others,
/// says what it waits for, and moves once the queue is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_predeclared_queue_is_waited_for_not_declared() {
    let src = common::start_with_api().await;
    let dest = common::start_with_api().await;
    let (sc, sch) = src.channel().await;
    let def = shovel_from(
        &src,
        json!({"src-predeclared": true, "dest-predeclared": true, "reconnect-delay": 1}),
    );
    let (s, body) = call(&dest, "PUT", "/parameters/shovel/%2f/waits", Some(def)).await;
    assert_eq!(s, 201, "{body}");
    let waits_for = |q: &'static str| {
        move |v: &Value| {
            v[0]["reason"]
                .to_string()
                .contains(&format!("no queue '{q}' yet"))
        }
    };
    let status = wait_status(&dest, waits_for("dst")).await;
    assert_eq!(status[0]["state"], "terminated", "{status}");
    assert!(
        status[0]["reason"].to_string().contains("dest-predeclared"),
        "{status}"
    );
    // Neither end made a queue of its own.
    for (b, q) in [(&src, "src"), (&dest, "dst")] {
        let (s, _) = call(b, "GET", &format!("/queues/%2f/{q}"), None).await;
        assert_eq!(s, 404, "{q} was declared");
    }
    // The destination's queue comes: now the source's is waited for.
    let (dc, dch) = dest.channel().await;
    durable_queue(&dch, "dst").await;
    let status = wait_status(&dest, waits_for("src")).await;
    assert!(
        status[0]["reason"].to_string().contains("src-predeclared"),
        "{status}"
    );
    let (s, _) = call(&src, "GET", "/queues/%2f/src", None).await;
    assert_eq!(s, 404, "src was declared");
    durable_queue(&sch, "src").await;
    publish(&sch, "src", 0, 10).await;
    assert_eq!(wait_count(&dc, "dst", 10).await, 10);
    let until = Instant::now() + Duration::from_secs(30);
    while count(&sc, "src").await > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&sc, "src").await, 0);
}

/// Waits until `f` holds of `/api/shovels` (or 30 s pass); that answer.
async fn wait_status(b: &TestBroker, f: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let v = get_json(b, "/shovels").await;
        if f(&v) || Instant::now() > until {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
