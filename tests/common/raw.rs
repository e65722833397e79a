//! A raw AMQP 0-9-1 client over a plain `TcpStream`, for tests that must
//! send what a real client library never would: a small frame encoder, a
//! frame reader, and the start / tune / open handshake. Well-formed methods
//! are encoded with amq-protocol; malformed ones are built by hand with
//! `frame` and `method_payload`.

use std::net::SocketAddr;
use std::time::Duration;

use amq_protocol::frame::{gen_frame, AMQPFrame, WriteContext};
use amq_protocol::protocol::{basic, channel, connection, queue, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const FRAME_METHOD: u8 = 1;
pub const FRAME_HEADER: u8 = 2;
pub const FRAME_BODY: u8 = 3;
pub const FRAME_HEARTBEAT: u8 = 8;
pub const FRAME_END: u8 = 0xCE;

/// The AMQP 0-9-1 protocol header.
pub const HEADER_091: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
/// The AMQP 0-9 protocol header (Qpid-style), which RabbitMQ also accepts.
pub const HEADER_09: &[u8; 8] = b"AMQP\x01\x01\x00\x09";

/// How long a test waits for something the broker should send.
pub const WAIT: Duration = Duration::from_secs(10);

/// One frame off the wire.
#[derive(Debug, Clone)]
pub struct RawFrame {
    pub kind: u8,
    pub channel: u16,
    pub payload: Vec<u8>,
}

impl RawFrame {
    /// The method of a method frame, parsed with amq-protocol.
    pub fn method(&self) -> Option<AMQPClass> {
        if self.kind != FRAME_METHOD {
            return None;
        }
        match amq_protocol::protocol::parse_class(&self.payload[..]) {
            Ok((_, m)) => Some(m),
            Err(_) => None,
        }
    }

    /// (class id, method id) of a method frame.
    pub fn method_ids(&self) -> Option<(u16, u16)> {
        if self.kind != FRAME_METHOD || self.payload.len() < 4 {
            return None;
        }
        let p = &self.payload;
        Some((
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        ))
    }
}

/// What a read produced.
#[derive(Debug)]
pub enum Read {
    Frame(RawFrame),
    /// The broker closed the socket (EOF or reset).
    Closed,
    /// Nothing within the time allowed.
    Timeout,
}

/// Encodes one frame.
pub fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(payload.len() + 8);
    f.push(kind);
    f.extend_from_slice(&channel.to_be_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f.push(FRAME_END);
    f
}

/// Encodes a method frame with amq-protocol.
pub fn method(channel: u16, m: AMQPClass) -> Vec<u8> {
    let f = AMQPFrame::Method(channel, m);
    let out = gen_frame(&f)(WriteContext::from(Vec::new()))
        .expect("encode method")
        .write;
    out
}

/// A method payload: class id, method id, then `args` as given.
pub fn method_payload(class: u16, method: u16, args: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(args.len() + 4);
    p.extend_from_slice(&class.to_be_bytes());
    p.extend_from_slice(&method.to_be_bytes());
    p.extend_from_slice(args);
    p
}

/// A heartbeat frame on `channel`.
pub fn heartbeat(channel: u16) -> Vec<u8> {
    frame(FRAME_HEARTBEAT, channel, &[])
}

/// A content header frame for class 60: no properties, or only
/// delivery-mode 2 when `persistent`.
pub fn content_header(channel: u16, body_size: u64, persistent: bool) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&60u16.to_be_bytes());
    p.extend_from_slice(&0u16.to_be_bytes());
    p.extend_from_slice(&body_size.to_be_bytes());
    if persistent {
        // property flags: delivery-mode is bit 12 (0x1000)
        p.extend_from_slice(&0x1000u16.to_be_bytes());
        p.push(2);
    } else {
        p.extend_from_slice(&0u16.to_be_bytes());
    }
    frame(FRAME_HEADER, channel, &p)
}

/// A body frame.
pub fn body(channel: u16, data: &[u8]) -> Vec<u8> {
    frame(FRAME_BODY, channel, data)
}

/// basic.publish (method frame only).
pub fn basic_publish(
    channel: u16,
    exchange: &str,
    key: &str,
    mandatory: bool,
    immediate: bool,
) -> Vec<u8> {
    method(
        channel,
        AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
            exchange: exchange.into(),
            routing_key: key.into(),
            mandatory,
            immediate,
        })),
    )
}

/// basic.publish + header + one body frame.
pub fn publish_message(channel: u16, exchange: &str, key: &str, data: &[u8]) -> Vec<u8> {
    let mut out = basic_publish(channel, exchange, key, false, false);
    out.extend(content_header(channel, data.len() as u64, false));
    if !data.is_empty() {
        out.extend(body(channel, data));
    }
    out
}

/// channel.open.
pub fn channel_open(channel: u16) -> Vec<u8> {
    method(
        channel,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    )
}

/// queue.declare with the given flags.
pub fn queue_declare(
    channel: u16,
    name: &str,
    passive: bool,
    durable: bool,
    exclusive: bool,
) -> Vec<u8> {
    method(
        channel,
        AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
            queue: name.into(),
            passive,
            durable,
            exclusive,
            auto_delete: false,
            nowait: false,
            arguments: FieldTable::default(),
        })),
    )
}

/// connection.close-ok.
pub fn close_ok() -> Vec<u8> {
    method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
    )
}

/// connection.close from the client.
pub fn connection_close(code: u16, text: &str) -> Vec<u8> {
    method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
            reply_code: code,
            reply_text: text.into(),
            class_id: 0,
            method_id: 0,
        })),
    )
}

/// Client properties advertising the capabilities lapin and the RabbitMQ
/// Java client advertise (or none at all).
pub fn client_properties(with_caps: bool) -> FieldTable {
    let mut props = FieldTable::default();
    props.insert("product".into(), AMQPValue::LongString("raw-test".into()));
    if with_caps {
        let mut caps = FieldTable::default();
        for c in [
            "publisher_confirms",
            "exchange_exchange_bindings",
            "basic.nack",
            "consumer_cancel_notify",
            "connection.blocked",
            "authentication_failure_close",
        ] {
            caps.insert(c.into(), AMQPValue::Boolean(true));
        }
        props.insert("capabilities".into(), AMQPValue::FieldTable(caps));
    }
    props
}

/// connection.start-ok with PLAIN credentials.
pub fn start_ok(user: &str, pass: &str, with_caps: bool) -> Vec<u8> {
    let response = format!("\0{user}\0{pass}");
    method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
            client_properties: client_properties(with_caps),
            mechanism: "PLAIN".into(),
            response: LongString::from(response.as_bytes()),
            locale: "en_US".into(),
        })),
    )
}

/// connection.tune-ok.
pub fn tune_ok(channel_max: u16, frame_max: u32, heartbeat: u16) -> Vec<u8> {
    method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
            channel_max,
            frame_max,
            heartbeat,
        })),
    )
}

/// connection.open.
pub fn connection_open(vhost: &str) -> Vec<u8> {
    method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open {
            virtual_host: ShortString::from(vhost),
        })),
    )
}

/// A raw connection.
pub struct Raw {
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// What the broker proposed in connection.tune (after `handshake`).
    pub tune: Option<connection::Tune>,
}

impl Raw {
    /// Opens the TCP connection only.
    pub async fn connect(addr: SocketAddr) -> Raw {
        let stream = TcpStream::connect(addr).await.expect("tcp connect");
        let _ = stream.set_nodelay(true);
        Raw {
            stream,
            buf: Vec::new(),
            tune: None,
        }
    }

    /// Connects and completes the handshake as guest on "/", heartbeat off,
    /// taking the broker's channel_max and frame_max.
    pub async fn open(addr: SocketAddr) -> Raw {
        Raw::open_with_heartbeat(addr, 0).await
    }

    /// Connects and completes the handshake with `heartbeat` in tune-ok.
    pub async fn open_with_heartbeat(addr: SocketAddr, heartbeat: u16) -> Raw {
        let mut r = Raw::connect(addr).await;
        r.send(HEADER_091).await;
        let tune = r.start_and_tune("guest", "guest", true).await;
        r.send(&tune_ok(tune.channel_max, tune.frame_max, heartbeat))
            .await;
        r.send(&connection_open("/")).await;
        let m = r.expect_method().await;
        assert!(
            matches!(
                m.1,
                AMQPClass::Connection(connection::AMQPMethod::OpenOk(_))
            ),
            "expected connection.open-ok, got {m:?}"
        );
        r
    }

    /// Reads connection.start, answers start-ok, reads connection.tune.
    /// (The protocol header must already have been sent.)
    pub async fn start_and_tune(&mut self, user: &str, pass: &str, caps: bool) -> connection::Tune {
        let (ch, m) = self.expect_method().await;
        assert_eq!(ch, 0);
        assert!(
            matches!(m, AMQPClass::Connection(connection::AMQPMethod::Start(_))),
            "expected connection.start, got {m:?}"
        );
        self.send(&start_ok(user, pass, caps)).await;
        let (_, m) = self.expect_method().await;
        match m {
            AMQPClass::Connection(connection::AMQPMethod::Tune(t)) => {
                self.tune = Some(t.clone());
                t
            }
            other => panic!("expected connection.tune, got {other:?}"),
        }
    }

    /// Opens channel `ch` and waits for open-ok.
    pub async fn open_channel(&mut self, ch: u16) {
        self.send(&channel_open(ch)).await;
        let (c, m) = self.expect_method().await;
        assert_eq!(c, ch, "open-ok on the wrong channel: {m:?}");
        assert!(
            matches!(m, AMQPClass::Channel(channel::AMQPMethod::OpenOk(_))),
            "expected channel.open-ok, got {m:?}"
        );
    }

    /// Writes bytes; a broker that already closed is not an error here.
    pub async fn send(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes).await;
    }

    /// Writes bytes, reporting failure.
    pub async fn try_send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Reads raw bytes (for the protocol-header reply), up to `n` or EOF.
    pub async fn read_bytes(&mut self, n: usize, within: Duration) -> Vec<u8> {
        let deadline = tokio::time::Instant::now() + within;
        while self.buf.len() < n {
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                Ok(Ok(k)) => self.buf.extend_from_slice(&chunk[..k]),
            }
        }
        let k = n.min(self.buf.len());
        self.buf.drain(..k).collect()
    }

    /// The next frame, EOF, or a timeout.
    pub async fn read_frame(&mut self, within: Duration) -> Read {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.buf.len() >= 7 {
                let size = u32::from_be_bytes([self.buf[3], self.buf[4], self.buf[5], self.buf[6]])
                    as usize;
                if self.buf.len() >= size + 8 {
                    let f: Vec<u8> = self.buf.drain(..size + 8).collect();
                    assert_eq!(f[size + 7], FRAME_END, "broker sent a bad frame end");
                    return Read::Frame(RawFrame {
                        kind: f[0],
                        channel: u16::from_be_bytes([f[1], f[2]]),
                        payload: f[7..7 + size].to_vec(),
                    });
                }
            }
            let mut chunk = [0u8; 65536];
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Read::Closed,
                Ok(Ok(k)) => self.buf.extend_from_slice(&chunk[..k]),
                Err(_) => return Read::Timeout,
            }
        }
    }

    /// The next frame that is not a heartbeat; panics on EOF or timeout.
    pub async fn expect_frame(&mut self) -> RawFrame {
        loop {
            match self.read_frame(WAIT).await {
                Read::Frame(f) if f.kind == FRAME_HEARTBEAT => continue,
                Read::Frame(f) => return f,
                other => panic!("expected a frame from the broker, got {other:?}"),
            }
        }
    }

    /// The next method (heartbeats skipped); panics on anything else.
    pub async fn expect_method(&mut self) -> (u16, AMQPClass) {
        let f = self.expect_frame().await;
        let m = f
            .method()
            .unwrap_or_else(|| panic!("expected a method frame, got {f:?}"));
        (f.channel, m)
    }

    /// Reads until connection.close arrives, skipping other frames (which
    /// the broker may have queued before it); panics on EOF or timeout.
    pub async fn expect_connection_close(&mut self) -> connection::Close {
        loop {
            match self.read_frame(WAIT).await {
                Read::Frame(f) => {
                    if f.channel == 0 {
                        if let Some(AMQPClass::Connection(connection::AMQPMethod::Close(c))) =
                            f.method()
                        {
                            return c;
                        }
                    }
                }
                other => panic!("expected connection.close, got {other:?}"),
            }
        }
    }

    /// Reads until channel.close arrives on `ch`, skipping other frames.
    pub async fn expect_channel_close(&mut self, ch: u16) -> channel::Close {
        loop {
            match self.read_frame(WAIT).await {
                Read::Frame(f) => {
                    if f.channel == ch {
                        if let Some(AMQPClass::Channel(channel::AMQPMethod::Close(c))) = f.method()
                        {
                            return c;
                        }
                    }
                    if f.channel == 0 {
                        if let Some(AMQPClass::Connection(connection::AMQPMethod::Close(c))) =
                            f.method()
                        {
                            panic!("expected channel.close on {ch}, got connection.close {c:?}");
                        }
                    }
                }
                other => panic!("expected channel.close, got {other:?}"),
            }
        }
    }

    /// Reads and discards frames until the broker closes the socket;
    /// panics if it is still open after `within`.
    pub async fn expect_eof(&mut self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.read_frame(left).await {
                Read::Closed => return,
                Read::Frame(_) => continue,
                Read::Timeout => panic!("the broker did not close the socket within {within:?}"),
            }
        }
    }

    /// Frames received within `within` (heartbeats excluded), stopping at
    /// EOF. For showing that the broker says nothing.
    pub async fn frames_within(&mut self, within: Duration) -> (Vec<RawFrame>, bool) {
        let deadline = tokio::time::Instant::now() + within;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.read_frame(left).await {
                Read::Frame(f) if f.kind == FRAME_HEARTBEAT => continue,
                Read::Frame(f) => out.push(f),
                Read::Closed => return (out, true),
                Read::Timeout => return (out, false),
            }
        }
    }
}
