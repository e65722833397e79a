//! Stream protocol test support: a broker with the stream port on, an
//! environment of RabbitMQ's Rust stream client, and a raw client that
//! writes frames itself.

use std::time::Duration;

use futures::StreamExt;
use rabbitmq_stream_client::error::ConsumerDeliveryError;
use rabbitmq_stream_client::types::{Delivery, Message};
use rabbitmq_stream_client::{Consumer, Environment};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren::config::Port;

use super::*;

/// `method` on `b`'s management API at `path` with `body`, as guest, over
/// HTTP/1.0: (status, body).
pub async fn api_call(b: &TestBroker, method: &str, path: &str, body: &str) -> (u16, String) {
    let addr = b.api.expect("the management API is on");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // "guest:guest" in base64.
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8(raw).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok());
    (status.unwrap_or(0), body.to_string())
}

/// A broker with the stream port and the management API on.
pub async fn start_streams_with_api() -> TestBroker {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = config(tmp.path());
    c.stream_port = Port::On(0);
    c.management_port = Port::On(0);
    start_in(tmp, c).await
}

pub async fn start_streams() -> TestBroker {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = config(tmp.path());
    c.stream_port = Port::On(0);
    start_in(tmp, c).await
}

pub async fn env(b: &TestBroker) -> Environment {
    let at = b.streams.expect("the stream port is on");
    Environment::builder()
        .host("127.0.0.1")
        .port(at.port())
        .build()
        .await
        .expect("connects")
}

/// The next delivery of a consumer (or a super stream consumer), within
/// 10 s.
pub async fn next_delivery<C>(consumer: &mut C) -> Delivery
where
    C: futures::Stream<Item = Result<Delivery, ConsumerDeliveryError>> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("a delivery in time")
        .expect("the consumer is open")
        .expect("a delivery")
}

/// The next `n` deliveries: (offset, body).
pub async fn take(consumer: &mut Consumer, n: usize) -> Vec<(u64, Vec<u8>)> {
    let mut got = Vec::new();
    while got.len() < n {
        let d = next_delivery(consumer).await;
        let body = d.message().data().map(<[u8]>::to_vec).unwrap_or_default();
        got.push((d.offset(), body));
    }
    got
}

pub async fn assert_nothing_more(consumer: &mut Consumer) {
    let more = tokio::time::timeout(Duration::from_millis(500), consumer.next()).await;
    assert!(more.is_err(), "no more deliveries");
}

pub fn body(i: u64) -> Vec<u8> {
    format!("message {i}").into_bytes()
}

pub async fn publish_to(env: &Environment, stream: &str, range: std::ops::Range<u64>) {
    let producer = env.producer().build(stream).await.expect("a producer");
    for i in range {
        let m = Message::builder()
            .body(body(i))
            .application_properties()
            .insert("n", i.to_string())
            .message_builder()
            .build();
        let status = producer.send_with_confirm(m).await.expect("sent");
        assert!(status.confirmed(), "message {i} confirmed");
    }
    producer.close().await.expect("closed");
}

pub async fn send_frame(s: &mut tokio::net::TcpStream, key: u16, body: &[u8]) {
    let mut f = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    f.extend_from_slice(&key.to_be_bytes());
    f.extend_from_slice(&1u16.to_be_bytes());
    f.extend_from_slice(body);
    s.write_all(&f).await.unwrap();
}

/// Reads frames until one of `key`: its fields after key and version.
pub async fn read_until(s: &mut tokio::net::TcpStream, key: u16) -> Vec<u8> {
    read_versioned(s, key).await.1
}

/// Reads frames until one of `key`: its version, and its fields.
pub async fn read_versioned(s: &mut tokio::net::TcpStream, key: u16) -> (u16, Vec<u8>) {
    loop {
        let mut size = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut size))
            .await
            .expect("a frame in time")
            .expect("a frame");
        let mut f = vec![0u8; u32::from_be_bytes(size) as usize];
        s.read_exact(&mut f).await.unwrap();
        if u16::from_be_bytes([f[0], f[1]]) == key {
            return (u16::from_be_bytes([f[2], f[3]]), f[4..].to_vec());
        }
    }
}

pub fn string(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

/// The handshake of a client that writes frames itself.
pub async fn raw_open(b: &TestBroker) -> tokio::net::TcpStream {
    raw_open_at(b.streams.unwrap()).await
}

/// Tells the server this raw client takes Deliver version 2
/// (ExchangeCommandVersions); returns the server's deliver (min, max).
pub async fn ask_deliver_v2(s: &mut tokio::net::TcpStream) -> (u16, u16) {
    let mut ask = vec![0, 0, 0, 40, 0, 0, 0, 1];
    ask.extend([0, 8, 0, 1, 0, 2]);
    send_frame(s, 27, &ask).await;
    let answer = read_until(s, 0x801b).await;
    assert_eq!(&answer[4..6], &[0, 1], "versions exchanged");
    let n = u32::from_be_bytes(answer[6..10].try_into().unwrap()) as usize;
    (0..n)
        .map(|i| &answer[10 + 6 * i..16 + 6 * i])
        .find(|v| v[..2] == [0, 8])
        .map(|v| {
            let at = |i: usize| u16::from_be_bytes([v[i], v[i + 1]]);
            (at(2), at(4))
        })
        .expect("deliver's versions")
}

/// The handshake of a client that writes frames itself, with the stream
/// port at `at`.
pub async fn raw_open_at(at: std::net::SocketAddr) -> tokio::net::TcpStream {
    raw_open_beating(at, 60).await
}

/// `raw_open_at`, tuning a heartbeat of `heartbeat` seconds.
pub async fn raw_open_beating(at: std::net::SocketAddr, heartbeat: u8) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(at).await.unwrap();
    send_frame(&mut s, 17, &[0, 0, 0, 1, 0, 0, 0, 0]).await;
    read_until(&mut s, 0x8011).await;
    let mut auth = vec![0, 0, 0, 2];
    auth.extend(string("PLAIN"));
    auth.extend(12u32.to_be_bytes());
    auth.extend(b"\0guest\0guest");
    send_frame(&mut s, 19, &auth).await;
    let ok = read_until(&mut s, 0x8013).await;
    assert_eq!(&ok[4..6], &[0, 1], "authenticated");
    read_until(&mut s, 20).await;
    send_frame(&mut s, 0x8014, &[0, 16, 0, 0, 0, 0, 0, heartbeat]).await;
    let mut open = vec![0, 0, 0, 3];
    open.extend(string("/"));
    send_frame(&mut s, 21, &open).await;
    let ok = read_until(&mut s, 0x8015).await;
    assert_eq!(&ok[4..6], &[0, 1], "opened");
    s
}

/// The super stream routing key of a test message: its body's second
/// character ("k1..." goes by key "1").
pub fn key_of(m: &Message) -> String {
    let body = m.data().unwrap_or_default();
    String::from_utf8_lossy(body.get(1..2).unwrap_or_default()).into_owned()
}

/// Subscribes (subscription 1, correlation 9) to `stream` from `offset`
/// with 100 credits, on a raw connection.
pub async fn subscribe_at(s: &mut tokio::net::TcpStream, stream: &str, offset: u64) {
    let mut sub = vec![0, 0, 0, 9, 1];
    sub.extend(string(stream));
    sub.extend([0, 4]); // an offset
    sub.extend(offset.to_be_bytes());
    sub.extend([0, 100]); // credit
    sub.extend([0, 0, 0, 0]);
    send_frame(s, 7, &sub).await;
    let ok = read_until(s, 0x8007).await;
    assert_eq!(&ok[..6], &[0, 0, 0, 9, 0, 1], "subscribed");
}

/// Reads Deliver frames (version 1) until offset `end`, from `next` on,
/// checking each as a client that verifies chunks does: the chunk
/// starts at the next offset, its data length and CRC-32 are its
/// entries', and each entry is the body `body` gives its offset.
pub async fn read_checked_chunks(
    s: &mut tokio::net::TcpStream,
    mut next: u64,
    end: u64,
    body: impl Fn(u64) -> Vec<u8>,
) {
    use rabbitmq_stream_protocol::codec::Decoder;
    use rabbitmq_stream_protocol::commands::deliver::DeliverCommand;
    while next < end {
        let d = read_until(s, 8).await;
        let chunk = &d[1..];
        let entries = u16::from_be_bytes(chunk[2..4].try_into().unwrap());
        let first = u64::from_be_bytes(chunk[24..32].try_into().unwrap());
        let crc = u32::from_be_bytes(chunk[32..36].try_into().unwrap());
        let len = u32::from_be_bytes(chunk[36..40].try_into().unwrap());
        let data = &chunk[48..];
        let at = format!("the chunk at {first}");
        assert_eq!(first, next, "{at}");
        assert_eq!(data.len(), len as usize, "{at}: its data length");
        assert_eq!(crc32fast::hash(data), crc, "{at}: its CRC");
        let (rest, deliver) = DeliverCommand::decode(&d).expect("decodes");
        assert!(rest.is_empty(), "{at}: nothing after its entries");
        assert_eq!(deliver.messages.len(), usize::from(entries), "{at}");
        for (i, m) in deliver.messages.iter().enumerate() {
            let o = first + i as u64;
            assert_eq!(m.data(), Some(&body(o)[..]), "{at}: offset {o}");
        }
        next = first + u64::from(entries);
    }
}
