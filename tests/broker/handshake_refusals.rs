//! A refused handshake ends as RabbitMQ 3.10 ends it, so that every client
//! reads the refusal before the socket goes. Warren used to close the
//! socket the moment it had sent connection.close 403; a client whose
//! socket watcher raced its frame reader then reported "connection reset"
//! instead of "access refused". Now the socket is held until close-ok or
//! `handshake_close_delay_ms` (3 s by default, as RabbitMQ's
//! NORMAL_TIMEOUT), other frames are read and dropped up to a byte bound;
//! a client without authentication_failure_close gets no close and the
//! socket ends after the same delay; a 530 at connection.open waits for
//! close-ok up to the heartbeat interval; a frame over 4096 octets before
//! tune-ok is connection.close 501 (RabbitMQ drops such a socket silently).

use crate::common;

use std::time::Duration;

use amq_protocol::protocol::{connection as conm, AMQPClass};
use common::raw::{self, Raw};
use common::*;
use lapin::{Connection, ConnectionProperties};

/// A broker whose refused handshakes are held for `delay_ms`.
async fn broker(delay_ms: u64) -> (TestBroker, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    c.handshake_close_delay_ms = delay_ms;
    (start_with(c).await, tmp)
}

/// Sends the protocol header and reads connection.start.
async fn started(b: &TestBroker) -> Raw {
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    let (_, m) = r.expect_method().await;
    assert!(matches!(
        m,
        AMQPClass::Connection(conm::AMQPMethod::Start(_))
    ));
    r
}

/// A grace period in which the broker must not close the socket.
const STILL_OPEN: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_is_held_until_close_ok_and_other_frames_are_dropped() {
    let (b, _tmp) = broker(60_000).await;
    let mut r = started(&b).await;
    r.send(&raw::start_ok("guest", "wrong", true)).await;
    let close = r.expect_connection_close().await;
    assert_eq!(close.reply_code, 403);
    // Frames other than close-ok are read and dropped; the socket stays.
    let mut junk = raw::channel_open(1);
    junk.extend(raw::heartbeat(0));
    junk.extend(raw::connection_open("/"));
    r.send(&junk).await;
    let (frames, closed) = r.frames_within(STILL_OPEN).await;
    assert!(!closed, "the socket must be held until close-ok");
    assert!(frames.is_empty(), "nothing else may be sent: {frames:?}");
    r.send(&raw::close_ok()).await;
    r.expect_eof(raw::WAIT).await;
    let c = b.connect().await;
    assert_connection_works(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_is_closed_after_the_delay_without_close_ok() {
    let (b, _tmp) = broker(200).await;
    let mut r = started(&b).await;
    r.send(&raw::start_ok("guest", "wrong", true)).await;
    assert_eq!(r.expect_connection_close().await.reply_code, 403);
    r.expect_eof(raw::WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_capability_no_close_is_sent_and_the_socket_is_held() {
    let (b, _tmp) = broker(60_000).await;
    let mut r = started(&b).await;
    r.send(&raw::start_ok("guest", "wrong", false)).await;
    let (frames, closed) = r.frames_within(STILL_OPEN).await;
    assert!(!closed, "the socket is held for the delay");
    assert!(
        frames.is_empty(),
        "no close without the capability: {frames:?}"
    );

    let (b, _tmp) = broker(200).await;
    let mut r = started(&b).await;
    r.send(&raw::start_ok("guest", "wrong", false)).await;
    let (frames, closed) = r.frames_within(raw::WAIT).await;
    assert!(closed, "the socket is closed after the delay");
    assert!(
        frames.is_empty(),
        "no close without the capability: {frames:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_floods_a_held_socket_is_dropped() {
    let (b, _tmp) = broker(60_000).await;
    let mut r = started(&b).await;
    r.send(&raw::start_ok("guest", "wrong", true)).await;
    assert_eq!(r.expect_connection_close().await.reply_code, 403);
    // Well over the byte bound of frames that are not close-ok.
    let junk: Vec<u8> = std::iter::repeat_n(raw::heartbeat(0), 300_000)
        .flatten()
        .collect();
    let _ = r.try_send(&junk).await;
    r.expect_eof(raw::WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapin_reads_access_refused_not_a_reset() {
    let (b, _tmp) = broker(3000).await;
    for _ in 0..5 {
        let uri = format!("amqp://guest:wrong@{}/%2f", b.addr);
        let e = Connection::connect(&uri, ConnectionProperties::default())
            .await
            .expect_err("a wrong password must be refused");
        assert_eq!(reply_code(&e), Some(403), "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_vhost_waits_for_close_ok_up_to_the_heartbeat() {
    let (b, _tmp) = broker(60_000).await;
    // Heartbeat 1 s: the broker waits for close-ok about that long.
    let mut r = started(&b).await;
    r.send(&raw::start_ok("guest", "guest", true)).await;
    let (_, m) = r.expect_method().await;
    let AMQPClass::Connection(conm::AMQPMethod::Tune(t)) = m else {
        panic!("expected tune, got {m:?}");
    };
    r.send(&raw::tune_ok(t.channel_max, t.frame_max, 1)).await;
    r.send(&raw::connection_open("nope")).await;
    assert_eq!(r.expect_connection_close().await.reply_code, 530);
    r.expect_eof(raw::WAIT).await;
    // With close-ok it ends at once.
    let mut r = started(&b).await;
    r.send(&raw::start_ok("guest", "guest", true)).await;
    r.expect_method().await;
    r.send(&raw::tune_ok(t.channel_max, t.frame_max, 0)).await;
    r.send(&raw::connection_open("nope")).await;
    assert_eq!(r.expect_connection_close().await.reply_code, 530);
    r.send(&raw::close_ok()).await;
    r.expect_eof(raw::WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_4096_octets_before_tune_ok_is_501() {
    let (b, _tmp) = broker(60_000).await;
    let mut r = started(&b).await;
    // A start-ok whose client properties make the frame 5000 octets.
    let mut props = raw::client_properties(true);
    props.insert(
        "padding".into(),
        amq_protocol::types::AMQPValue::LongString("x".repeat(5000).into()),
    );
    let big = raw::method(
        0,
        AMQPClass::Connection(conm::AMQPMethod::StartOk(conm::StartOk {
            client_properties: props,
            mechanism: "PLAIN".into(),
            response: "\0guest\0guest".into(),
            locale: "en_US".into(),
        })),
    );
    assert!(big.len() > 4096 + 8);
    r.send(&big).await;
    let close = r.expect_connection_close().await;
    assert_eq!(close.reply_code, 501, "{close:?}");
    r.send(&raw::close_ok()).await;
    r.expect_eof(raw::WAIT).await;
}
