//! The HTTP API checks what AMQP checks: a dead-letter or alternate
//! exchange needs the same permissions as over AMQP, another connection's
//! exclusive queue is locked, the aliveness test needs the permissions its
//! declare, publish and get would, max_message_size holds for the API's
//! publishes, and parameters of a component nothing runs are refused,
//! not stored.

use crate::common;

use common::*;
use lapin::options::{QueueDeclareOptions, QueuePurgeOptions};
use lapin::types::FieldTable;
use serde_json::{json, Value};
use warren::access::User;
use warren::config::Port;

/// `method path` with a JSON `body` as `user`: the status and the body.
async fn call(
    b: &TestBroker,
    user: (&str, &str),
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, String) {
    let url = format!("http://{}/api{path}", b.api.expect("the API is on"));
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
    let mut req = reqwest::Client::new()
        .request(method, &url)
        .basic_auth(user.0, Some(user.1));
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let r = req.send().await.expect("an answer");
    let status = r.status().as_u16();
    (status, r.text().await.expect("a body"))
}

const GUEST: (&str, &str) = ("guest", "guest");

/// A management user with the permissions `configure`, `write`, `read`
/// on "/".
fn user(b: &TestBroker, name: &str, configure: &str, write: &str, read: &str) {
    let users = &b.server.as_ref().expect("running").broker.users;
    users
        .put_user(User {
            tags: vec!["management".into()],
            ..User::with_password(name, "pw")
        })
        .unwrap();
    users
        .set_permission(name, "/", configure, write, read)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_and_alternate_exchanges_need_what_amqp_needs() {
    let b = start_with_api().await;
    // May configure anything, write only app-*, read only app-*.
    user(&b, "app", ".*", "^app-", "^app-");
    let app = ("app", "pw");
    for x in ["audit", "app-dlx"] {
        let (s, body) = call(
            &b,
            GUEST,
            "PUT",
            &format!("/exchanges/%2f/{x}"),
            Some(json!({"type": "fanout"})),
        )
        .await;
        assert_eq!(s, 201, "{body}");
    }
    // A queue that would dead-letter into audit, which app may not write.
    let dlx = |x: &str| json!({"durable": true, "arguments": {"x-dead-letter-exchange": x}});
    let (s, body) = call(&b, app, "PUT", "/queues/%2f/app-q", Some(dlx("audit"))).await;
    assert_eq!(s, 401, "{body}");
    // Read on the queue is needed too.
    let (s, body) = call(&b, app, "PUT", "/queues/%2f/other-q", Some(dlx("app-dlx"))).await;
    assert_eq!(s, 401, "{body}");
    let (s, body) = call(&b, app, "PUT", "/queues/%2f/app-q", Some(dlx("app-dlx"))).await;
    assert_eq!(s, 201, "{body}");
    // An exchange whose alternate is audit; then one without read on it.
    let ae = |x: &str| json!({"type": "direct", "arguments": {"alternate-exchange": x}});
    let (s, body) = call(&b, app, "PUT", "/exchanges/%2f/app-x", Some(ae("audit"))).await;
    assert_eq!(s, 401, "{body}");
    let (s, body) = call(
        &b,
        app,
        "PUT",
        "/exchanges/%2f/other-x",
        Some(ae("app-dlx")),
    )
    .await;
    assert_eq!(s, 401, "{body}");
    let (s, body) = call(&b, app, "PUT", "/exchanges/%2f/app-x", Some(ae("app-dlx"))).await;
    assert_eq!(s, 201, "{body}");
    // Nothing refused was made.
    for path in ["/queues/%2f/other-q", "/exchanges/%2f/other-x"] {
        let (s, _) = call(&b, GUEST, "GET", path, None).await;
        assert_eq!(s, 404, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_connections_exclusive_queue_is_locked_to_the_api() {
    let b = start_with_api().await;
    let (_conn, ch) = b.channel().await;
    let opts = QueueDeclareOptions {
        exclusive: true,
        ..Default::default()
    };
    ch.queue_declare("mine".into(), opts, FieldTable::default())
        .await
        .expect("declare");
    ch.queue_declare("other".into(), Default::default(), FieldTable::default())
        .await
        .expect("declare");
    publish(&ch, "", "mine", b"kept").await;
    let refused = [
        (
            "POST",
            "/queues/%2f/mine/get",
            Some(json!({"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})),
        ),
        ("PUT", "/queues/%2f/mine", Some(json!({"durable": false}))),
        ("DELETE", "/queues/%2f/mine/contents", None),
        ("DELETE", "/queues/%2f/mine", None),
        (
            "POST",
            "/queues/%2f/mine/actions",
            Some(json!({"action": "move", "destination": "other"})),
        ),
        (
            "POST",
            "/queues/%2f/other/actions",
            Some(json!({"action": "move", "destination": "mine"})),
        ),
    ];
    for (method, path, body) in refused {
        let (s, text) = call(&b, GUEST, method, path, body).await;
        assert_eq!(s, 400, "{method} {path}: {text}");
        assert!(
            text.contains("cannot obtain exclusive access to locked queue"),
            "{method} {path}: {text}"
        );
        // As RabbitMQ's: the code only where it gets over a channel.
        let over_channel = path.ends_with("/get");
        assert_eq!(
            text.contains("405 RESOURCE_LOCKED - "),
            over_channel,
            "{method} {path}: {text}"
        );
    }
    // The owner still has its queue and its message.
    let n = ch
        .queue_purge("mine".into(), QueuePurgeOptions::default())
        .await
        .expect("the owner purges");
    assert_eq!(n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliveness_publish_size_and_unknown_components_are_checked() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = config(tmp.path());
    c.management_port = Port::On(0);
    c.max_message_size = 1024;
    let b = start_in(tmp, c).await;

    // The aliveness test declares, publishes and gets: a reader only may not.
    user(&b, "reader", "", "", ".*");
    let (s, body) = call(&b, ("reader", "pw"), "GET", "/aliveness-test/%2f", None).await;
    assert_eq!(s, 401, "{body}");
    let (s, body) = call(&b, GUEST, "GET", "/aliveness-test/%2f", None).await;
    assert_eq!(s, 200, "{body}");

    // max_message_size over HTTP as over AMQP.
    let (s, body) = call(&b, GUEST, "PUT", "/queues/%2f/q", Some(json!({}))).await;
    assert_eq!(s, 201, "{body}");
    let msg = |n: usize| json!({"routing_key": "q", "payload": "x".repeat(n), "payload_encoding": "string", "properties": {}});
    let (s, body) = call(
        &b,
        GUEST,
        "POST",
        "/exchanges/%2f/amq.default/publish",
        Some(msg(1025)),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("PRECONDITION_FAILED"), "{body}");
    let (s, body) = call(
        &b,
        GUEST,
        "POST",
        "/exchanges/%2f/amq.default/publish",
        Some(msg(1024)),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert!(body.contains("\"routed\":true"), "{body}");

    // A shovel that would connect to this broker as no one in particular
    // (RabbitMQ's all-powerful internal user) is refused, and a
    // component nothing provides in a definitions file, and
    // nothing is stored.
    let shovel = json!({"value": {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "dest-queue": "r"}});
    let (s, body) = call(&b, GUEST, "PUT", "/parameters/shovel/%2f/s1", Some(shovel)).await;
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("needs a user and password"), "{body}");
    let defs = json!({"parameters": [{"vhost": "/", "component": "no-such-plugin", "name": "up",
        "value": {"uri": "amqp://elsewhere"}}], "queues": [{"name": "from-defs", "vhost": "/",
        "durable": true, "auto_delete": false, "arguments": {}}]});
    let (s, body) = call(&b, GUEST, "POST", "/definitions", Some(defs)).await;
    assert_eq!(s, 400, "{body}");
    assert!(
        body.contains("component no-such-plugin not found"),
        "{body}"
    );
    let (s, body) = call(&b, GUEST, "GET", "/parameters", None).await;
    assert_eq!((s, body.as_str()), (200, "[]"));
    let (s, _) = call(&b, GUEST, "GET", "/queues/%2f/from-defs", None).await;
    assert_eq!(s, 404, "a refused definitions file changes nothing");
}
