//! Test support: a real broker on 127.0.0.1:0 with a temp data dir, and
//! lapin helpers. Each test starts its own broker.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use lapin::{
    options::*, types::FieldTable, BasicProperties, Channel, Connection, ConnectionProperties,
};
use warren::config::Port;
use warren::{Config, Server};

/// A broker running in this process.
pub struct TestBroker {
    pub server: Option<Server>,
    pub addr: std::net::SocketAddr,
    /// The management API's address, when it runs (`start_with_api`).
    pub api: Option<std::net::SocketAddr>,
    /// The Prometheus listener's address, when it runs.
    pub metrics: Option<std::net::SocketAddr>,
    /// The stream protocol's address, when it runs.
    pub streams: Option<std::net::SocketAddr>,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    /// Broker panics recorded before this broker started (see panics.rs).
    panics_before: usize,
}

/// Fails the test if the broker panicked while it ran (tokio would hide a
/// panic inside a connection task).
impl Drop for TestBroker {
    fn drop(&mut self) {
        let new = panics::since(self.panics_before);
        if !new.is_empty() && !std::thread::panicking() {
            panic!("the broker panicked:\n{}", new.join("\n"));
        }
    }
}

/// The management API, called as guest.
pub mod api;
/// Certificates of a CA made by the test, and AMQPS brokers.
pub mod certs;
/// Queue depths and numbered messages.
pub mod counts;
/// Records panics raised in the broker's code.
pub mod forged;
pub mod panics;
/// Scripts that drive a broker with pika.
pub mod pika;

/// A config for tests: loopback, any port, the given data dir.
pub fn config(dir: &Path) -> Config {
    Config {
        bind: [127, 0, 0, 1].into(),
        port: Port::On(0),
        // Off unless a test asks for them (`start_with_api`).
        management_port: Port::Off,
        prometheus_port: Port::Off,
        stream_port: Port::Off,
        data_dir: dir.to_path_buf(),
        store_cache_mb: 16,
        // Refused handshakes are held this long (3 s by default): short, so
        // tests of refusals do not wait; tests of the hold set their own.
        handshake_close_delay_ms: 300,
        ..Config::default()
    }
}

/// Starts a broker with a fresh temp data dir.
pub async fn start() -> TestBroker {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    let mut b = start_with(config(&dir)).await;
    b._tmp = Some(tmp);
    b
}

/// Starts a broker with a fresh temp data dir and the management API on
/// a free port.
pub async fn start_with_api() -> TestBroker {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = config(tmp.path());
    c.management_port = Port::On(0);
    c.prometheus_port = Port::On(0);
    let mut b = start_with(c).await;
    b._tmp = Some(tmp);
    b
}

/// Starts a broker with `config`, whose data dir is in `tmp` (removed
/// with the broker).
pub async fn start_in(tmp: tempfile::TempDir, config: Config) -> TestBroker {
    let mut b = start_with(config).await;
    b._tmp = Some(tmp);
    b
}

/// Starts a broker with `config`.
pub async fn start_with(config: Config) -> TestBroker {
    panics::install();
    // The HTTP client of the API tests (reqwest with rustls) needs a
    // process-wide crypto provider; the broker names its own.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let panics_before = panics::count();
    let dir = config.data_dir.clone();
    let server = Server::start(config).await.expect("broker starts");
    TestBroker {
        addr: server.addr,
        api: server.management_addr,
        metrics: server.prometheus_addr,
        streams: server.stream_addr,
        server: Some(server),
        dir,
        _tmp: None,
        panics_before,
    }
}

impl TestBroker {
    /// amqp:// URI of this broker.
    pub fn uri(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.addr)
    }

    /// A new client connection.
    pub async fn connect(&self) -> Connection {
        Connection::connect(&self.uri(), ConnectionProperties::default())
            .await
            .expect("connect")
    }

    /// A connection and a channel on it.
    pub async fn channel(&self) -> (Connection, Channel) {
        let c = self.connect().await;
        let ch = c.create_channel().await.expect("channel");
        (c, ch)
    }

    /// Stops the broker cleanly.
    pub async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }

    /// Stops and starts again on the same data dir (a clean restart).
    pub async fn restart(&mut self) {
        self.stop().await;
        let mut c = config(&self.dir);
        if self.api.is_some() {
            c.management_port = Port::On(0);
            c.prometheus_port = Port::On(0);
        }
        if self.streams.is_some() {
            c.stream_port = Port::On(0);
        }
        let server = Server::start(c).await.expect("broker restarts");
        self.addr = server.addr;
        self.api = server.management_addr;
        self.metrics = server.prometheus_addr;
        self.streams = server.stream_addr;
        self.server = Some(server);
    }
}

/// Declares a queue with default options.
pub async fn declare(ch: &Channel, name: &str) -> lapin::Queue {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("queue.declare")
}

/// Publishes `body` to `exchange` with `key`.
pub async fn publish(ch: &Channel, exchange: &str, key: &str, body: &[u8]) {
    ch.basic_publish(
        exchange.into(),
        key.into(),
        BasicPublishOptions::default(),
        body,
        BasicProperties::default(),
    )
    .await
    .expect("basic.publish");
}

/// basic.get with no-ack; returns the body.
pub async fn get_body(ch: &Channel, queue: &str) -> Option<Vec<u8>> {
    ch.basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
        .map(|m| m.delivery.data.clone())
}

/// Polls basic.get until a message arrives or 5 s pass.
pub async fn get_eventually(ch: &Channel, queue: &str) -> Option<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(b) = get_body(ch, queue).await {
            return Some(b);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Next delivery from a consumer, or None after 5 s.
pub async fn next(consumer: &mut lapin::Consumer) -> Option<lapin::message::Delivery> {
    match tokio::time::timeout(Duration::from_secs(5), consumer.next()).await {
        Ok(Some(Ok(d))) => Some(d),
        _ => None,
    }
}

/// Asserts that nothing is delivered within a short grace period.
pub async fn assert_no_delivery(consumer: &mut lapin::Consumer) {
    if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(300), consumer.next()).await
    {
        panic!(
            "unexpected delivery: {:?}",
            String::from_utf8_lossy(&d.data)
        );
    }
}

/// The AMQP reply code carried by a lapin error, if any.
pub fn reply_code(e: &lapin::Error) -> Option<u16> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(p) => Some(p.get_id()),
        _ => None,
    }
}

pub mod proxy;
pub mod rabbitmq;
/// A raw AMQP client for protocol-level tests.
pub mod raw;
pub mod streams;

/// Asserts that `conn` still serves requests: a new channel declares a
/// fresh queue, publishes to it and gets the message back.
pub async fn assert_connection_works(conn: &Connection) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ch = conn
        .create_channel()
        .await
        .expect("channel on a live connection");
    let q = ch
        .queue_declare(
            format!("still-alive-{n}").as_str().into(),
            QueueDeclareOptions {
                exclusive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("queue.declare on a live connection");
    let name = q.name().as_str().to_string();
    publish(&ch, "", &name, b"still-alive").await;
    assert_eq!(
        get_eventually(&ch, &name).await.as_deref(),
        Some(&b"still-alive"[..])
    );
    let _ = ch.close(200, "OK".into()).await;
}

/// The `warren` binary as a child process.
pub mod child;

impl TestBroker {
    /// Like `restart`, but retries opening the data dir for up to 5 s while
    /// the previous instance still holds the store's lock, so durability
    /// tests test durability rather than how fast shutdown lets go of it.
    pub async fn restart_when_unlocked(&mut self) {
        self.stop().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let mut c = config(&self.dir);
            if self.api.is_some() {
                c.management_port = Port::On(0);
                c.prometheus_port = Port::On(0);
            }
            if self.streams.is_some() {
                c.stream_port = Port::On(0);
            }
            match Server::start(c).await {
                Ok(server) => {
                    self.addr = server.addr;
                    self.api = server.management_addr;
                    self.metrics = server.prometheus_addr;
                    self.streams = server.stream_addr;
                    self.server = Some(server);
                    return;
                }
                Err(e) if e.contains("lock") && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("broker restarts: {e}"),
            }
        }
    }
}
