//! The API's defences against browsers driven by other pages and against
//! clients that send more than the API reads: bodies must be JSON, foreign
//! origins are refused unless configured (and then get CORS headers),
//! answers are not cached or sniffed, a body is read only after the
//! caller's tags are checked, and never past `http_max_body_size`.

use crate::common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren::access::User;
use warren::config::Port;

/// A broker with the API on, a 1 MiB body limit and one allowed origin.
async fn broker() -> TestBroker {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = config(tmp.path());
    c.management_port = Port::On(0);
    c.management.http_max_body_size = 1 << 20;
    c.management.cors_allow_origins = vec!["https://ops.example".into()];
    let b = start_in(tmp, c).await;
    let users = &b.server.as_ref().expect("running").broker.users;
    users
        .put_user(User {
            tags: vec!["monitoring".into()],
            ..User::with_password("watcher", "pw")
        })
        .unwrap();
    b
}

/// Sends `head` (request line and headers, no blank line) and then
/// `body`, and reads the answer's head: its status and headers (lower
/// case). The body may be cut short: the answer must come without it.
async fn raw(b: &TestBroker, head: &str, body: &[u8]) -> (u16, String) {
    let addr = b.api.expect("the API is on");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("{head}\r\nHost: {addr}\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("send");
    // The server may answer and close before taking all of it.
    let _ = s.write_all(body).await;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    // Only a broken build waits: the answer does not need the rest.
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("an answer without the rest of the body");
    let text = String::from_utf8_lossy(&got).to_lowercase();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    (status, text)
}

const GUEST: &str = "Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=";
/// "watcher:pw".
const WATCHER: &str = "Authorization: Basic d2F0Y2hlcjpwdw==";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_must_be_json_and_foreign_origins_are_refused() {
    let b = broker().await;
    // A definitions file that would add an administrator, sent as each
    // body a page elsewhere may send without asking first.
    let defs = r#"{"users":[{"name":"intruder","password_hash":"","tags":"administrator"}]}"#;
    for kind in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let head = format!(
            "POST /api/definitions HTTP/1.1\r\n{GUEST}\r\nContent-Type: {kind}\r\nContent-Length: {}",
            defs.len()
        );
        let (status, text) = raw(&b, &head, defs.as_bytes()).await;
        assert_eq!(status, 415, "{kind}: {text}");
    }
    let users = &b.server.as_ref().expect("running").broker.users;
    assert!(
        users.get("intruder").is_none(),
        "a refused body changed nothing"
    );

    // Another origin is refused, even with the right credentials.
    let (status, _) = raw(
        &b,
        &format!("GET /api/overview HTTP/1.1\r\n{GUEST}\r\nOrigin: http://evil.example"),
        b"",
    )
    .await;
    assert_eq!(status, 403);
    let head =
        format!("DELETE /api/queues/%2f/q HTTP/1.1\r\n{GUEST}\r\nOrigin: http://evil.example");
    assert_eq!(raw(&b, &head, b"").await.0, 403);
    // The API's own origin is served, and answers are neither cached nor
    // sniffed.
    let own = format!("http://{}", b.api.expect("on"));
    let (status, text) = raw(
        &b,
        &format!("GET /api/overview HTTP/1.1\r\n{GUEST}\r\nOrigin: {own}"),
        b"",
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("cache-control: no-store"), "{text}");
    assert!(text.contains("x-content-type-options: nosniff"), "{text}");
    assert!(!text.contains("access-control-allow-origin"), "{text}");
    // A configured origin is served with CORS headers, and its preflight
    // is answered.
    let (status, text) = raw(
        &b,
        &format!("GET /api/overview HTTP/1.1\r\n{GUEST}\r\nOrigin: https://ops.example"),
        b"",
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("access-control-allow-origin: https://ops.example"),
        "{text}"
    );
    let (status, text) = raw(
        &b,
        "OPTIONS /api/queues/%2f/q HTTP/1.1\r\nOrigin: https://ops.example\r\n\
         Access-Control-Request-Method: PUT\r\nAccess-Control-Request-Headers: content-type",
        b"",
    )
    .await;
    assert_eq!(status, 204, "{text}");
    assert!(text.contains("access-control-allow-methods"), "{text}");
    assert!(text.contains("access-control-max-age: 1800"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_is_read_only_for_who_may_send_it_and_never_past_the_limit() {
    let b = broker().await;
    // A monitoring user announces 64 MiB and sends a few bytes: refused
    // at once, without the body being waited for.
    let head = format!(
        "POST /api/definitions HTTP/1.1\r\n{WATCHER}\r\nContent-Type: application/json\r\n\
         Content-Length: {}",
        64 << 20
    );
    let (status, text) = raw(&b, &head, b"[0,0,0,0").await;
    assert_eq!(status, 401, "{text}");
    // An administrator announcing more than the limit: 413, unread.
    let head = format!(
        "POST /api/definitions HTTP/1.1\r\n{GUEST}\r\nContent-Type: application/json\r\n\
         Content-Length: {}",
        (1 << 20) + 1
    );
    let (status, text) = raw(&b, &head, b"{\"users\":").await;
    assert_eq!(status, 413, "{text}");
    // And sending more than the limit in chunks, with no length given.
    let chunk = format!("{:x}\r\n{}\r\n", 64 << 10, " ".repeat(64 << 10));
    let body = chunk.repeat(20);
    let head = format!(
        "PUT /api/queues/%2f/q HTTP/1.1\r\n{GUEST}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked"
    );
    let (status, text) = raw(&b, &head, body.as_bytes()).await;
    assert_eq!(status, 413, "{text}");
    // Under the limit, as before.
    let body = "{}";
    let head = format!(
        "PUT /api/queues/%2f/q HTTP/1.1\r\n{GUEST}\r\nContent-Type: application/json\r\n\
         Content-Length: {}",
        body.len()
    );
    assert_eq!(raw(&b, &head, body.as_bytes()).await.0, 201);
}
