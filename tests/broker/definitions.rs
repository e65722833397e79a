//! Definitions in RabbitMQ's JSON: a file exported from RabbitMQ 3.10.8
//! (tests/fixtures/rabbitmq-3.10, made by the script beside it) imports
//! as it is and its users log in with their old passwords; an export from
//! Warren imported into a fresh Warren exports the same; a malformed file
//! is refused whole, naming what is wrong, and nothing of it is applied;
//! `load_definitions` imports at start.

use crate::common;
use crate::helpers;

use std::sync::Arc;

use common::*;
use helpers::*;
use lapin::{options::*, types::FieldTable, Connection};
use serde_json::{json, Value};
use warren::broker::Broker;
use warren::definitions;

fn broker(b: &TestBroker) -> &Arc<Broker> {
    &b.server.as_ref().expect("running").broker
}

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/rabbitmq-3.10/definitions.json"
    );
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

async fn login(b: &TestBroker, user: &str, pass: &str, vhost: &str) -> lapin::Result<Connection> {
    let uri = format!(
        "amqp://{user}:{pass}@{}/{}",
        b.addr,
        vhost.replace('/', "%2f")
    );
    Connection::connect(&uri, lapin::ConnectionProperties::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_3_10_export_imports_as_it_is_and_its_users_keep_their_passwords() {
    let b = start().await;
    let done = definitions::import(broker(&b), &fixture(), None).expect("the fixture imports");
    assert_eq!(done.users, 6);
    assert!(done.queues >= 6, "{done:?}");
    // SHA-256 (alice), SHA-512 (carol) and MD5 (dave) hashes, as made by RabbitMQ.
    login(&b, "alice", "alice-pw", "prod")
        .await
        .expect("alice logs in");
    login(&b, "carol", "carol-pw", "staging")
        .await
        .expect("carol logs in");
    login(&b, "dave", "dave-pw", "staging")
        .await
        .expect("dave logs in");
    let e = login(&b, "alice", "wrong", "prod")
        .await
        .expect_err("a wrong password");
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    let e = login(&b, "nopass", "", "/")
        .await
        .expect_err("no password, no login");
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    let users = &broker(&b).users;
    assert_eq!(users.get("bob").unwrap().limit("max-connections"), Some(5));
    assert_eq!(
        users.get("bob").unwrap().tags,
        vec!["monitoring", "management"]
    );
    // The vhost as it was made, with its limits and policies.
    let prod = broker(&b).vhost("prod").unwrap();
    let meta = prod.meta();
    assert_eq!(meta.description, "production");
    assert_eq!(meta.tags, vec!["a", "b"]);
    assert_eq!(prod.limits.max_queues(), Some(50));
    assert_eq!(prod.limits.max_connections(), Some(100));
    let q = prod.queue("ttl.q1").expect("ttl.q1");
    assert_eq!(q.policies(), (Some("ttl".into()), Some("op".into())));
    assert_eq!(
        q.live_args().max_length,
        Some(100),
        "the lower of policy and operator policy"
    );
    assert_eq!(
        prod.exchange("in")
            .unwrap()
            .policy
            .read()
            .alternate
            .as_deref(),
        Some("unrouted")
    );
    // Bindings route: alice publishes to events, work gets it.
    let conn = login(&b, "alice", "alice-pw", "prod").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    publish(&ch, "events", "order.urgent", b"now").await;
    assert_eq!(wait_count(&conn, "work", 1).await, 1);
    // Topic permissions came too: bob may not publish outside "bob.".
    assert!(users.topic_permissions("bob", "prod").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warren_export_imported_into_a_fresh_warren_exports_the_same() {
    let a = start().await;
    definitions::import(broker(&a), &fixture(), None).unwrap();
    let (_c, ch) = a.channel().await;
    // Something made over AMQP too, with odd arguments.
    declare_with(
        &ch,
        "made.here",
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        table(&[
            ("x-max-length", lapin::types::AMQPValue::LongInt(7)),
            ("x-note", s("é")),
        ]),
    )
    .await
    .unwrap();
    bind(&ch, "made.here", "amq.topic", "a.#", FieldTable::default()).await;
    let first = definitions::export(broker(&a), None).unwrap();
    let b = start().await;
    definitions::import(broker(&b), &first, None).expect("Warren's own export imports");
    let second = definitions::export(broker(&b), None).unwrap();
    assert_eq!(second, first);
    // And per vhost.
    let one = definitions::export(broker(&a), Some("prod")).unwrap();
    assert!(one.get("users").is_none());
    assert!(one["queues"][0].get("vhost").is_none());
    let c = start().await;
    broker(&c)
        .put_vhost(warren::vhost::Meta::named("copy"))
        .unwrap();
    definitions::import(broker(&c), &one, Some("copy"))
        .expect("a vhost export imports into another vhost");
    assert!(broker(&c).vhost("copy").unwrap().queue("work").is_some());
}

/// A stream and its arguments go out in an export and come back from
/// it a stream, with what it keeps across the restart that follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_round_trips_through_definitions() {
    use lapin::types::AMQPValue;
    let a = start().await;
    let (_c, ch) = a.channel().await;
    let args = table(&[
        ("x-queue-type", s("stream")),
        ("x-max-age", s("7D")),
        ("x-max-length-bytes", AMQPValue::LongLongInt(1 << 30)),
        (
            "x-stream-max-segment-size-bytes",
            AMQPValue::LongLongInt(1 << 20),
        ),
    ]);
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    declare_with(&ch, "audit", durable, args).await.unwrap();
    let exported = definitions::export(broker(&a), None).unwrap();
    let q = exported["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "audit")
        .expect("exported");
    assert_eq!(q["arguments"]["x-queue-type"], "stream");
    assert_eq!(q["arguments"]["x-max-age"], "7D");

    let mut b = start().await;
    definitions::import(broker(&b), &exported, None).expect("imports");
    assert_eq!(definitions::export(broker(&b), None).unwrap(), exported);
    b.restart().await;
    let (_c, ch) = b.channel().await;
    let imported = broker(&b).vhost("/").unwrap().queue("audit").unwrap();
    assert!(imported.stream().is_some(), "a stream again");
    // A redeclare with the exported arguments is equivalent; without
    // them it is not.
    let mut same = FieldTable::default();
    for (k, v) in imported.config.arguments.inner() {
        same.insert(k.clone(), v.clone());
    }
    declare_with(&ch, "audit", durable, same)
        .await
        .expect("equivalent");
    let bare = table(&[("x-queue-type", s("stream"))]);
    expect_code(declare_with(&ch, "audit", durable, bare).await, 406);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_file_is_refused_whole_naming_what_is_wrong() {
    let b = start().await;
    let cases = [
        (
            json!({"users": [{"name": "x", "password_hash": "short", "hashing_algorithm": "rabbit_password_hashing_sha256"}]}),
            "users[0] 'x'",
        ),
        (
            json!({"users": [{"name": "y", "password_hash": ""}], "queues": [{"name": "q", "vhost": "/", "arguments": {"x-message-ttl": -1}}]}),
            "queue 'q'",
        ),
        (
            json!({"users": [{"name": "y", "password_hash": ""}], "queues": [{"name": "q", "vhost": "nowhere"}]}),
            "no vhost 'nowhere'",
        ),
        (
            json!({"users": [{"name": "y", "password_hash": ""}], "bindings": [{"source": "nope", "vhost": "/", "destination": "q", "destination_type": "queue"}]}),
            "no exchange 'nope'",
        ),
        (
            json!({"users": [{"name": "y", "password_hash": ""}], "policies": [{"name": "p", "vhost": "/", "pattern": ".*", "definition": {"max-length": "ten"}}]}),
            "max-length",
        ),
        (
            json!({"users": [{"name": "y", "password_hash": ""}], "permissions": [{"user": "ghost", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}),
            "no user 'ghost'",
        ),
        (
            json!({"users": [{"name": "y", "password_hash": ""}], "exchanges": [{"name": "x", "vhost": "/", "type": "no-such-type"}]}),
            "unknown exchange type",
        ),
        (
            json!({"queues": {"not": "a list"}}),
            "'queues' must be a list",
        ),
        (json!([1, 2]), "must be a JSON object"),
    ];
    for (file, named) in cases {
        let e = definitions::import(broker(&b), &file, None).expect_err("refused");
        assert!(e.contains(named), "{e} should name {named}");
    }
    // Nothing of any of them was applied.
    assert!(broker(&b).users.get("y").is_none());
    assert!(broker(&b).users.get("x").is_none());
    assert!(broker(&b).vhost("/").unwrap().queue("q").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_definitions_imports_at_start_and_a_bad_file_stops_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("defs.json");
    std::fs::write(&file, serde_json::to_vec(&fixture()).unwrap()).unwrap();
    let data = tmp.path().join("data");
    let mut config = config(&data);
    config.load_definitions = Some(file.clone());
    let b = start_with(config.clone()).await;
    login(&b, "alice", "alice-pw", "prod")
        .await
        .expect("alice logs in");
    drop(b);
    std::fs::write(&file, br#"{"queues": [{"name": "amq.bad", "vhost": "/"}]}"#).unwrap();
    config.data_dir = tmp.path().join("data2");
    let e = match warren::Server::start(config).await {
        Ok(_) => panic!("a bad definitions file must stop the start"),
        Err(e) => e,
    };
    assert!(e.contains("amq.bad") && e.contains("defs.json"), "{e}");
}
