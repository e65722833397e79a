//! The management API as a test calls it (as guest, JSON in and out),
//! and the Prometheus listener's /metrics.

use serde_json::Value;

use super::TestBroker;

/// Calls the API of `b` as guest: (status, body).
pub async fn call(b: &TestBroker, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
    let url = format!("http://{}/api{path}", b.api.expect("the API is on"));
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
    let mut req = reqwest::Client::new()
        .request(method, &url)
        .basic_auth("guest", Some("guest"));
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let r = req.send().await.expect("an answer");
    let status = r.status().as_u16();
    (status, r.text().await.expect("a body"))
}

/// GETs `path`, which must answer 200 with JSON.
pub async fn get_json(b: &TestBroker, path: &str) -> Value {
    let (s, body) = call(b, "GET", path, None).await;
    assert_eq!(s, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("json")
}

/// What `b`'s Prometheus listener says at /metrics.
pub async fn metrics(b: &TestBroker) -> String {
    let addr = b.metrics.expect("the Prometheus listener runs");
    let r = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("an answer");
    assert_eq!(r.status().as_u16(), 200);
    r.text().await.expect("a body")
}
