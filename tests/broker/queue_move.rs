//! Moving messages from one queue to another through the API (the web
//! UI's move, POST /api/queues/{vhost}/{name}/actions {"action": "move"}):
//! a count, persistent messages stay persistent, x-death history is kept,
//! consumers of the destination get them, they survive a restart, and the
//! refusals. A SIGKILL during moves finds each message exactly once.

use crate::common;
use crate::helpers;

use std::collections::HashMap;
use std::time::Duration;

use common::child::ChildBroker;
use common::*;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::Channel;
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::{json, Value};

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// POSTs `body` to queue `q`'s actions as `user`; (status, JSON).
async fn action(api: &str, user: &str, q: &str, body: Value) -> (u16, Value) {
    let r = http()
        .post(format!("http://{api}/api/queues/%2F/{q}/actions"))
        .basic_auth(user, Some(user))
        .json(&body)
        .send()
        .await
        .expect("the API answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn durable(ch: &Channel, name: &str, args: FieldTable) {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await
    .expect("queue.declare");
}

async fn publish_confirmed(ch: &Channel, queue: &str, bodies: impl Iterator<Item = Vec<u8>>) {
    let mut pending = Vec::new();
    for b in bodies {
        pending.push(
            ch.basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &b,
                helpers::persistent(),
            )
            .await
            .expect("publish"),
        );
        if pending.len() >= 1000 {
            for p in pending.drain(..) {
                assert!(p.await.expect("confirm").is_ack());
            }
        }
    }
    for p in pending {
        assert!(p.await.expect("confirm").is_ack());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_move_with_a_count_and_keep_what_they_carry() {
    let mut b = start_with_api().await;
    let api = b.api.expect("API").to_string();
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    // "work" dead-letters into "dlq": rejected messages get x-death there.
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString("dlq".into()),
    );
    durable(&ch, "dlq", FieldTable::default()).await;
    durable(&ch, "work", args).await;
    publish_confirmed(&ch, "work", (0..10).map(|i| format!("m{i}").into_bytes())).await;
    for _ in 0..10 {
        let m = ch
            .basic_get("work".into(), BasicGetOptions::default())
            .await
            .unwrap()
            .expect("a message");
        m.reject(BasicRejectOptions { requeue: false })
            .await
            .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while helpers::message_count(&ch, "dlq").await < 10 {
        assert!(std::time::Instant::now() < deadline, "not dead-lettered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (status, body) = action(
        &api,
        "guest",
        "dlq",
        json!({"action": "move", "destination": "work", "count": 4}),
    )
    .await;
    assert_eq!((status, &body), (200, &json!({"moved": 4})));
    assert_eq!(helpers::message_count(&ch, "dlq").await, 6);
    assert_eq!(helpers::message_count(&ch, "work").await, 4);
    // The head went first, persistent, with its x-death.
    let m = ch
        .basic_get("work".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("a moved message");
    assert_eq!(m.delivery.data, b"m0");
    assert_eq!(m.delivery.properties.delivery_mode(), &Some(2));
    let headers = m.delivery.properties.headers().clone().expect("headers");
    assert!(
        headers.inner().contains_key(&ShortString::from("x-death")),
        "{headers:?}"
    );

    // A consumer of the destination gets what moves in.
    let ch2 = b.connect().await.create_channel().await.unwrap();
    let mut consumer = ch2
        .basic_consume(
            "work".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let (status, body) = action(
        &api,
        "guest",
        "dlq",
        json!({"action": "move", "destination": "work"}),
    )
    .await;
    assert_eq!((status, &body), (200, &json!({"moved": 6})));
    let mut got = Vec::new();
    for _ in 0..9 {
        let d = next(&mut consumer).await.expect("a delivery");
        got.push(String::from_utf8_lossy(&d.data).to_string());
    }
    assert_eq!(got, (1..10).map(|i| format!("m{i}")).collect::<Vec<_>>());
    drop(consumer);
    ch2.close(200, "done".into()).await.unwrap();
    assert_eq!(helpers::message_count(&ch, "dlq").await, 0);

    // Moved messages are durable where they went.
    b.restart().await;
    let api = b.api.expect("API").to_string();
    let (_c, ch) = b.channel().await;
    assert_eq!(helpers::message_count(&ch, "work").await, 9);
    assert_eq!(helpers::message_count(&ch, "dlq").await, 0);
    let (status, body) = action(
        &api,
        "guest",
        "work",
        json!({"action": "move", "destination": "dlq"}),
    )
    .await;
    assert_eq!((status, &body), (200, &json!({"moved": 9})));
    b.restart().await;
    let api = b.api.expect("API").to_string();
    let (_c, ch) = b.channel().await;
    assert_eq!(helpers::message_count(&ch, "work").await, 0);
    assert_eq!(helpers::message_count(&ch, "dlq").await, 9);

    // Refusals: the API's status and reason.
    let (status, _) = action(&api, "guest", "dlq", json!({"action": "explode"})).await;
    assert_eq!(status, 400);
    let (status, _) = action(&api, "guest", "dlq", json!({"action": "move"})).await;
    assert_eq!(status, 400);
    let (status, _) = action(
        &api,
        "guest",
        "dlq",
        json!({"action": "move", "destination": "dlq"}),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = action(
        &api,
        "guest",
        "dlq",
        json!({"action": "move", "destination": "nowhere"}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = action(
        &api,
        "guest",
        "nowhere",
        json!({"action": "move", "destination": "dlq"}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = action(&api, "guest", "dlq", json!({"action": "sync"})).await;
    assert_eq!(status, 204);
    // A stream neither gives nor takes moved messages.
    let mut stream = FieldTable::default();
    stream.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString("stream".into()),
    );
    durable(&ch, "events", stream).await;
    for (from, to) in [("dlq", "events"), ("events", "dlq")] {
        let (status, _) = action(
            &api,
            "guest",
            from,
            json!({"action": "move", "destination": to}),
        )
        .await;
        assert_eq!(status, 400, "{from} to {to}");
    }
    assert_eq!(helpers::message_count(&ch, "dlq").await, 9);
    // A user who may read but not write the destination.
    let admin = http();
    let put = |path: String, body: Value| {
        admin
            .put(format!("http://{api}/api/{path}"))
            .basic_auth("guest", Some("guest"))
            .json(&body)
            .send()
    };
    assert!(put(
        "users/reader".into(),
        json!({"password": "reader", "tags": "management"})
    )
    .await
    .unwrap()
    .status()
    .is_success());
    assert!(put(
        "permissions/%2F/reader".into(),
        json!({"configure": "", "write": "^$", "read": ".*"})
    )
    .await
    .unwrap()
    .status()
    .is_success());
    let (status, _) = action(
        &api,
        "reader",
        "dlq",
        json!({"action": "move", "destination": "work"}),
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(helpers::message_count(&ch, "dlq").await, 9);
    b.stop().await;
}

/// Every body of `queue` (emptying it), counted.
async fn drain(ch: &Channel, queue: &str, into: &mut HashMap<u32, u32>) {
    loop {
        let Some(m) = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        else {
            return;
        };
        let i: u32 = std::str::from_utf8(&m.delivery.data)
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("a numbered body");
        *into.entry(i).or_default() += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_moves_leaves_each_message_exactly_once() {
    const N: u32 = 30_000;
    const ROUNDS: usize = 6;
    let tmp = tempfile::tempdir().unwrap();
    let (data, log) = (tmp.path().join("data"), tmp.path().join("log"));
    let mut broker = ChildBroker::spawn_with_api(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    durable(&ch, "a", FieldTable::default()).await;
    durable(&ch, "b", FieldTable::default()).await;
    publish_confirmed(&ch, "a", (0..N).map(|i| format!("{i:0>100}").into_bytes())).await;
    drop(conn);
    let mut rng = StdRng::seed_from_u64(0x30e5);
    for round in 0..ROUNDS {
        let (from, to) = if round % 2 == 0 {
            ("a", "b")
        } else {
            ("b", "a")
        };
        let api = format!("127.0.0.1:{}", broker.api_port.unwrap());
        // The kill cuts the request off, or it finished first.
        let moving = tokio::spawn(async move {
            http()
                .post(format!("http://{api}/api/queues/%2F/{from}/actions"))
                .basic_auth("guest", Some("guest"))
                .json(&json!({"action": "move", "destination": to}))
                .send()
                .await
        });
        tokio::time::sleep(Duration::from_millis(rng.gen_range(20..500))).await;
        broker.kill();
        let answer = moving.await.map(|r| r.map(|r| r.status().as_u16()));
        eprintln!("round {round}: {from} to {to}: {answer:?}");
        broker = ChildBroker::spawn_with_api(&data, &log, &[]);
        let conn = broker.connect().await;
        let ch = conn.create_channel().await.unwrap();
        let (na, nb) = (
            helpers::message_count(&ch, "a").await,
            helpers::message_count(&ch, "b").await,
        );
        eprintln!("round {round}: a {na}, b {nb}");
        assert_eq!(na + nb, N, "round {round}: a {na} + b {nb}");
        drop(conn);
    }
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let mut seen = HashMap::new();
    drain(&ch, "a", &mut seen).await;
    drain(&ch, "b", &mut seen).await;
    assert_eq!(seen.len(), N as usize);
    assert!(seen.values().all(|&n| n == 1), "a message came back twice");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("panicked"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_destination_that_refuses_takes_only_what_fits() {
    let b = start_with_api().await;
    let api = b.api.expect("API").to_string();
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongInt(5));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    durable(&ch, "small", args).await;
    durable(&ch, "big", FieldTable::default()).await;
    publish_confirmed(
        &ch,
        "small",
        (0..2).map(|i| format!("kept{i}").into_bytes()),
    )
    .await;
    publish_confirmed(&ch, "big", (0..10).map(|i| format!("m{i}").into_bytes())).await;
    let (status, body) = action(
        &api,
        "guest",
        "big",
        json!({"action": "move", "destination": "small"}),
    )
    .await;
    assert_eq!((status, &body), (200, &json!({"moved": 3})));
    assert_eq!(helpers::message_count(&ch, "small").await, 5);
    assert_eq!(helpers::message_count(&ch, "big").await, 7);
    // Nothing of the destination was dropped, and the source kept its order.
    let first = |q: &'static str| {
        let ch = ch.clone();
        async move {
            ch.basic_get(q.into(), BasicGetOptions { no_ack: true })
                .await
                .unwrap()
                .map(|m| String::from_utf8_lossy(&m.delivery.data).to_string())
        }
    };
    assert_eq!(first("small").await.as_deref(), Some("kept0"));
    assert_eq!(first("big").await.as_deref(), Some("m3"));
}
