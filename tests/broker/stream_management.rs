//! Stream protocol connections in the management API, as RabbitMQ's
//! stream management plugin shows them: /api/stream/connections (read by
//! rabbitmq_http_client, the client rabbitmqadmin is built on, and closed
//! with a DELETE), the connections' publishers and consumers with their
//! counters, stream connections among /api/connections with protocol
//! "stream", and the vhost's connection limit counting them.

use crate::common;

use std::time::Duration;

use common::streams::*;
use common::*;
use futures::StreamExt;
use rabbitmq_http_client::api::Client;
use rabbitmq_stream_client::types::{Message, OffsetSpecification};
use rabbitmq_stream_client::Environment;
use serde_json::Value;

/// `method` on the management API at `path` as guest: (status, JSON).
async fn call(b: &TestBroker, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, body) = api_call(b, method, path, body).await;
    let json = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, json)
}

async fn get(b: &TestBroker, path: &str) -> Value {
    let (status, v) = call(b, "GET", path, "").await;
    assert_eq!(status, 200, "GET {path}: {v}");
    v
}

fn listed(v: &Value) -> &Vec<Value> {
    v.as_array().expect("a list")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_connections_publishers_and_consumers_are_listed_and_closed() {
    let b = start_streams_with_api().await;
    let env = env(&b).await;
    env.stream_creator().create("events").await.unwrap();
    let mut producer = env
        .producer()
        .name("app-1")
        .build("events")
        .await
        .expect("a producer");
    for i in 0..10u64 {
        let m = Message::builder().body(body(i)).build();
        assert!(producer.send_with_confirm(m).await.unwrap().confirmed());
    }
    let mut consumer = env
        .consumer()
        .offset(OffsetSpecification::First)
        .build("events")
        .await
        .unwrap();
    let got = take(&mut consumer, 10).await;
    assert_eq!(got.len(), 10);

    // As rabbitmqadmin's client reads them.
    let endpoint = format!("http://{}/api", b.api.unwrap());
    let admin = Client::new(endpoint, "guest".to_string(), "guest".to_string());
    let conns = admin.list_stream_connections().await.expect("listed");
    assert!(conns.len() >= 2, "{conns:?}");
    assert!(conns.iter().all(|c| c.protocol == "stream"), "{conns:?}");
    assert!(conns.iter().all(|c| c.username == "guest"));
    let in_vhost = admin.list_stream_connections_in("/").await.unwrap();
    assert_eq!(in_vhost.len(), conns.len());
    // Among every connection, too.
    let all = get(&b, "/api/connections").await;
    let streams = listed(&all).iter().filter(|c| c["protocol"] == "stream");
    assert_eq!(streams.count(), conns.len());

    // The publisher, with its counters.
    let publishers = get(&b, "/api/stream/publishers").await;
    let [p] = &listed(&publishers)[..] else {
        panic!("one publisher: {publishers}");
    };
    assert_eq!(p["queue"]["name"], "events");
    assert_eq!(p["queue"]["vhost"], "/");
    assert_eq!(p["reference"], "app-1");
    assert_eq!(
        (&p["published"], &p["confirmed"], &p["errored"]),
        (&Value::from(10), &Value::from(10), &Value::from(0))
    );
    let of_stream = get(&b, "/api/stream/publishers/%2F/events").await;
    assert_eq!(listed(&of_stream).len(), 1);
    let (status, _) = call(&b, "GET", "/api/stream/publishers/%2F/nope", "").await;
    assert_eq!(status, 404);
    let publishing = p["connection_details"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let path = |what: &str, name: &str| {
        let name = name.replace(' ', "%20").replace('>', "%3E");
        format!("/api/stream/connections/%2F/{name}{what}")
    };
    let of_conn = get(&b, &path("/publishers", &publishing)).await;
    assert_eq!(listed(&of_conn).len(), 1);
    let one = get(&b, &path("", &publishing)).await;
    assert_eq!(one["protocol"], "stream");
    assert_eq!(one["user"], "guest");

    // The consumer: where it is and what it was sent.
    let consumers = get(&b, "/api/stream/consumers/%2F").await;
    let [c] = &listed(&consumers)[..] else {
        panic!("one consumer: {consumers}");
    };
    assert_eq!(c["queue"]["name"], "events");
    assert_eq!(c["consumed"], 10);
    assert_eq!(c["offset"], 10);
    assert_eq!(c["offset_lag"], 0);
    assert_eq!(c["active"], true);
    let consuming = c["connection_details"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let of_conn = get(&b, &path("/consumers", &consuming)).await;
    assert_eq!(listed(&of_conn).len(), 1);

    // Closed through the API: the consumer's connection ends.
    let (status, v) = call(&b, "DELETE", &path("", &consuming), "").await;
    assert_eq!(status, 204, "{v}");
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(d) = consumer.next().await {
            if d.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the consumer's connection was closed");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = admin.list_stream_connections().await.unwrap();
        if left.iter().all(|c| c.name != consuming) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still listed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let consumers = get(&b, "/api/stream/consumers").await;
    assert!(listed(&consumers).is_empty(), "{consumers}");

    // The vhost's connection limit counts stream connections.
    let open = admin.list_stream_connections().await.unwrap().len();
    let limit = format!("{{\"value\": {open}}}");
    let (status, v) = call(&b, "PUT", "/api/vhost-limits/%2F/max-connections", &limit).await;
    assert!(status == 201 || status == 204, "{status} {v}");
    let refused = Environment::builder()
        .host("127.0.0.1")
        .port(b.streams.unwrap().port())
        .build()
        .await;
    assert!(refused.is_err(), "over the vhost's connection limit");
    producer.close().await.unwrap();
}
