//! The management API of a test cluster, over reqwest.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::Cluster;

/// An HTTP client (reqwest over rustls, with ring as its provider).
pub fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

pub async fn get_json(url: &str) -> (u16, Value) {
    let r = http()
        .get(url)
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// GET on the leader's API, retried while leadership settles.
pub async fn leader_json(c: &Cluster, path: &str) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(l) = c.leader() {
            if let Ok(r) = http()
                .get(format!("{}{path}", c.api(l)))
                .basic_auth("guest", Some("guest"))
                .send()
                .await
            {
                let status = r.status().as_u16();
                return (status, r.json().await.unwrap_or(Value::Null));
            }
        }
        assert!(Instant::now() < deadline, "no API answers {path}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
