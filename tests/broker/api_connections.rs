//! Hostile HTTP clients: a request's headers must arrive within the header
//! timeout, an idle kept-alive connection is closed after it, and the
//! connections one address (and one listener) may hold at once are
//! capped; a normal request is answered meanwhile.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use warren::config::Port;

async fn broker() -> TestBroker {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = config(tmp.path());
    c.management_port = Port::On(0);
    c.management.header_timeout_ms = 1000;
    c.management.max_connections = 24;
    c.management.max_connections_per_source = 8;
    start_in(tmp, c).await
}

fn api(b: &TestBroker) -> SocketAddr {
    let a = b.api.expect("the API is on");
    SocketAddr::from(([127, 0, 0, 1], a.port()))
}

/// A connection to the API from loopback address 127.0.0.`from`.
async fn connect_from(b: &TestBroker, from: u8) -> TcpStream {
    let s = TcpSocket::new_v4().expect("socket");
    let ip = IpAddr::from([127, 0, 0, from]);
    s.bind(SocketAddr::new(ip, 0)).expect("bind");
    s.connect(api(b)).await.expect("connect")
}

/// Whether the server closes `s` within `within` (what it sends first,
/// a 408 or nothing, does not matter).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read).await.is_ok()
}

/// GET /api/overview as guest, on a new connection from 127.0.0.1.
async fn overview(b: &TestBroker) -> u16 {
    let url = format!("http://{}/api/overview", api(b));
    let r = reqwest::Client::new()
        .get(url)
        .basic_auth("guest", Some("guest"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("an answer");
    r.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_headers_time_out_and_each_address_has_a_cap() {
    let b = broker().await;
    // Eight connections from one address that never finish their headers.
    let mut slow = Vec::new();
    for _ in 0..8 {
        let mut s = connect_from(&b, 2).await;
        s.write_all(b"GET /api/overview HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    // A ninth from it is closed at once.
    let mut ninth = connect_from(&b, 2).await;
    assert!(closed_within(&mut ninth, Duration::from_secs(5)).await);
    // Another address is served meanwhile.
    assert_eq!(overview(&b).await, 200);
    // The header timeout ends the slow ones.
    for s in &mut slow {
        assert!(closed_within(s, Duration::from_secs(10)).await);
    }
    // And the address may connect again.
    let mut s = connect_from(&b, 2).await;
    let head = format!("GET /api/overview HTTP/1.1\r\nHost: {}\r\n\r\n", api(&b));
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 401");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed() {
    let b = broker().await;
    let mut s = connect_from(&b, 3).await;
    let head = format!("GET /api/overview HTTP/1.1\r\nHost: {}\r\n\r\n", api(&b));
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 401");
    // Kept alive, then idle past the timeout: closed.
    assert!(closed_within(&mut s, Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_holds_at_most_its_cap() {
    let b = broker().await;
    // 24 idle connections from three addresses fill the listener.
    let mut held = Vec::new();
    for from in 10..13 {
        for _ in 0..8 {
            held.push(connect_from(&b, from).await);
        }
    }
    // Accepted in order: by the time the 25th is refused, all 24 hold.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut over = connect_from(&b, 20).await;
    assert!(closed_within(&mut over, Duration::from_secs(5)).await);
    drop(held);
    // Given back: served again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = connect_from(&b, 21).await;
        let head = format!("GET /api/overview HTTP/1.1\r\nHost: {}\r\n\r\n", api(&b));
        let _ = s.write_all(head.as_bytes()).await;
        let mut buf = [0u8; 12];
        if s.read_exact(&mut buf).await.is_ok() {
            assert_eq!(&buf, b"HTTP/1.1 401");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not served again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
