//! Protocol errors, over raw TCP: protocol header negotiation (a wrong
//! header gets `AMQP 0 0 9 1` back and the socket closes; the 0-9 header is
//! accepted), each hard error RabbitMQ answers with connection.close (501
//! frame errors, 504 channel errors, 505 unexpected frames, malformed
//! methods, 540 immediate) followed by the socket closing while another
//! connection keeps working, their reply texts, the frame_max tolerance, the
//! soft 406 for an over-sized message, the closing handshake (frames ignored
//! until close-ok, a crossing connection.close answered), and robustness:
//! 1000 random byte strings after a valid handshake cause no panic, and
//! deeply nested field tables (queue arguments, message headers, client
//! properties before login) are refused with 502 and do not crash the
//! broker process.

use crate::common;

use std::sync::Mutex;
use std::time::Duration;

use amq_protocol::protocol::{
    basic as bm, channel as chm, connection as conm, queue as qm, AMQPClass,
};
use common::raw::{self, Raw};
use common::*;
use lapin::{options::*, types::FieldTable, BasicProperties};
use rand::{rngs::StdRng, Rng, SeedableRng};
use warren::Config;

/// Starts a broker and a lapin observer connection, opens a raw connection
/// (and channel 1 when `channel`), sends `bytes`, and expects
/// connection.close with `code`, then (after close-ok) the socket closing,
/// and the observer still working. Returns the close.
async fn expect_hard_error(channel: bool, bytes: &[u8], code: u16) -> conm::Close {
    let b = start().await;
    let observer = b.connect().await;
    let mut r = Raw::open(b.addr).await;
    if channel {
        r.open_channel(1).await;
    }
    r.send(bytes).await;
    let close = r.expect_connection_close().await;
    assert_eq!(close.reply_code, code, "{close:?}");
    r.send(&raw::close_ok()).await;
    r.expect_eof(raw::WAIT).await;
    assert_connection_works(&observer).await;
    close
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_protocol_header_gets_the_091_header_and_the_socket_closes() {
    let b = start().await;
    for header in [
        &b"AMQP\x00\x00\x09\x02"[..],
        b"AMQP\x00\x00\x0a\x00",
        b"AMQP\x02\x00\x09\x01",
        b"XMPP\x00\x00\x09\x01",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00\x00\x00\x00\x00\x00\x00\x00",
    ] {
        let mut r = Raw::connect(b.addr).await;
        r.send(header).await;
        let reply = r.read_bytes(8, raw::WAIT).await;
        assert_eq!(&reply[..], &raw::HEADER_091[..], "reply to {header:?}");
        let (frames, closed) = r.frames_within(raw::WAIT).await;
        assert!(
            closed && frames.is_empty(),
            "after {header:?}: {frames:?} closed={closed}"
        );
    }
    let c = b.connect().await;
    assert_connection_works(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_0_9_header_is_accepted() {
    let b = start().await;
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_09).await;
    let t = r.start_and_tune("guest", "guest", true).await;
    r.send(&raw::tune_ok(t.channel_max, t.frame_max, 0)).await;
    r.send(&raw::connection_open("/")).await;
    let (_, m) = r.expect_method().await;
    assert!(
        matches!(m, AMQPClass::Connection(conm::AMQPMethod::OpenOk(_))),
        "{m:?}"
    );
    r.open_channel(1).await;
    r.send(&raw::queue_declare(1, "q09", false, false, false))
        .await;
    let (_, m) = r.expect_method().await;
    assert!(
        matches!(m, AMQPClass::Queue(qm::AMQPMethod::DeclareOk(_))),
        "{m:?}"
    );
    r.send(&raw::publish_message(1, "", "q09", b"hello")).await;
    let (_, ch) = b.channel().await;
    assert_eq!(
        get_eventually(&ch, "q09").await.as_deref(),
        Some(&b"hello"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_larger_than_frame_max_is_501() {
    // Negotiated frame_max is 131072; RabbitMQ tolerates payloads up to
    // frame_max (FRAME_SIZE_FUDGE), so go well past it.
    let mut bytes = raw::basic_publish(1, "", "q", false, false);
    bytes.extend(raw::content_header(1, 200_000, false));
    bytes.extend(raw::body(1, &vec![7u8; 140_000]));
    let close = expect_hard_error(true, &bytes, 501).await;
    assert!(
        close.reply_text.as_str().starts_with("FRAME_ERROR"),
        "{close:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_frame_as_large_as_frame_max_is_tolerated() {
    // rabbit_reader allows a payload of up to frame_max octets (the frame
    // itself then being frame_max + 8): "We allow clients to exceed the
    // frame size a little bit since quite a few get it wrong".
    let b = start().await;
    let observer = b.connect().await;
    let ch = observer.create_channel().await.unwrap();
    declare(&ch, "fudge").await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    let data = vec![5u8; 131_072];
    let mut bytes = raw::basic_publish(1, "", "fudge", false, false);
    bytes.extend(raw::content_header(1, data.len() as u64, false));
    bytes.extend(raw::body(1, &data));
    r.send(&bytes).await;
    let (frames, closed) = r.frames_within(Duration::from_millis(500)).await;
    let methods: Vec<_> = frames.iter().map(|f| f.method()).collect();
    assert!(!closed && frames.is_empty(), "closed={closed}, {methods:?}");
    let got = get_eventually(&ch, "fudge").await;
    assert!(
        got.as_deref() == Some(&data[..]),
        "got {:?} octets",
        got.map(|g| g.len())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_frame_type_is_501() {
    let close = expect_hard_error(true, &raw::frame(9, 1, b"hello"), 501).await;
    assert!(
        close.reply_text.as_str().starts_with("FRAME_ERROR"),
        "{close:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_frame_type_on_channel_0_is_501() {
    expect_hard_error(false, &raw::frame(4, 0, b""), 501).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frame_end_octet_is_501() {
    let mut bytes = raw::queue_declare(1, "q", false, false, false);
    let n = bytes.len();
    bytes[n - 1] = 0x00;
    let close = expect_hard_error(true, &bytes, 501).await;
    assert!(
        close.reply_text.as_str().starts_with("FRAME_ERROR"),
        "{close:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_on_a_channel_that_is_not_open_is_504() {
    let close =
        expect_hard_error(false, &raw::queue_declare(3, "q", false, false, false), 504).await;
    assert!(
        close.reply_text.as_str().starts_with("CHANNEL_ERROR - "),
        "{close:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_open_twice_is_504() {
    let close = expect_hard_error(true, &raw::channel_open(1), 504).await;
    assert_eq!(
        close.reply_text.as_str(),
        "CHANNEL_ERROR - second 'channel.open' seen"
    );
    assert_eq!((close.class_id, close.method_id), (20, 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_header_without_publish_is_505() {
    let close = expect_hard_error(true, &raw::content_header(1, 3, false), 505).await;
    // rabbit_command_assembler, no method to name.
    assert!(
        close.reply_text.as_str().starts_with("UNEXPECTED_FRAME - "),
        "{close:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_without_header_is_505() {
    let close = expect_hard_error(true, &raw::body(1, b"abc"), 505).await;
    // rabbit_command_assembler, no method to name.
    assert!(
        close.reply_text.as_str().starts_with("UNEXPECTED_FRAME - "),
        "{close:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_instead_of_content_header_is_505() {
    let mut bytes = raw::basic_publish(1, "", "q", false, false);
    bytes.extend(raw::queue_declare(1, "q", false, false, false));
    let close = expect_hard_error(true, &bytes, 505).await;
    assert!(
        close.reply_text.as_str().starts_with("UNEXPECTED_FRAME - "),
        "{close:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_in_the_middle_of_a_body_is_505() {
    let mut bytes = raw::basic_publish(1, "", "q", false, false);
    bytes.extend(raw::content_header(1, 10, false));
    bytes.extend(raw::body(1, b"12345"));
    bytes.extend(raw::queue_declare(1, "q", false, false, false));
    let close = expect_hard_error(true, &bytes, 505).await;
    assert!(
        close.reply_text.as_str().starts_with("UNEXPECTED_FRAME - "),
        "{close:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_longer_than_declared_is_a_connection_error() {
    // Newer RabbitMQ answers the over-long body frame itself with 501
    // ("content body frame exceeds remaining content size"); 3.10's
    // assembler kept waiting for body and failed the next method with 505.
    // Either way the connection is closed; the method after the body makes
    // both show.
    let mut bytes = raw::basic_publish(1, "", "q", false, false);
    bytes.extend(raw::content_header(1, 2, false));
    bytes.extend(raw::body(1, b"abc"));
    bytes.extend(raw::queue_declare(1, "q", false, false, false));
    let b = start().await;
    let observer = b.connect().await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&bytes).await;
    let close = r.expect_connection_close().await;
    assert!([501, 505].contains(&close.reply_code), "{close:?}");
    r.send(&raw::close_ok()).await;
    r.expect_eof(raw::WAIT).await;
    assert_connection_works(&observer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_on_channel_1_is_505() {
    let close = expect_hard_error(true, &raw::heartbeat(1), 505).await;
    assert!(
        close.reply_text.as_str().starts_with("UNEXPECTED_FRAME"),
        "{close:?}"
    );
}

/// One hard-error case for `hard_error_reply_texts_match_rabbitmq`.
struct TextCase {
    name: &'static str,
    bytes: Vec<u8>,
    code: u16,
    text: &'static str,
    method: (u16, u16),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_error_reply_texts_match_rabbitmq() {
    // The reply text and failing method RabbitMQ 3.10 puts in
    // connection.close (rabbit_reader, rabbit_command_assembler,
    // rabbit_channel), checked all at once so that the tests above stay
    // about reply codes.
    let mut publish_then_declare = raw::basic_publish(1, "", "q", false, false);
    publish_then_declare.extend(raw::queue_declare(1, "q", false, false, false));
    let mut declare_in_body = raw::basic_publish(1, "", "q", false, false);
    declare_in_body.extend(raw::content_header(1, 10, false));
    declare_in_body.extend(raw::body(1, b"12345"));
    declare_in_body.extend(raw::queue_declare(1, "q", false, false, false));
    let mut immediate = raw::basic_publish(1, "", "q", false, true);
    immediate.extend(raw::content_header(1, 2, false));
    immediate.extend(raw::body(1, b"hi"));
    let mut too_large = raw::basic_publish(1, "", "q", false, false);
    too_large.extend(raw::content_header(1, 200_000, false));
    too_large.extend(raw::body(1, &vec![7u8; 140_000]));
    let cases = vec![
        TextCase {
            name: "method on a channel that is not open",
            bytes: raw::queue_declare(3, "q", false, false, false),
            code: 504,
            text: "CHANNEL_ERROR - expected 'channel.open'",
            method: (50, 10),
        },
        TextCase {
            name: "second channel.open",
            bytes: raw::channel_open(1),
            code: 504,
            text: "CHANNEL_ERROR - second 'channel.open' seen",
            method: (20, 10),
        },
        TextCase {
            name: "content header without publish",
            bytes: raw::content_header(1, 3, false),
            code: 505,
            text: "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
            method: (0, 0),
        },
        TextCase {
            name: "body without header",
            bytes: raw::body(1, b"abc"),
            code: 505,
            text: "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
            method: (0, 0),
        },
        TextCase {
            name: "method instead of content header",
            bytes: publish_then_declare,
            code: 505,
            text: "UNEXPECTED_FRAME - expected content header for class 60, \
                   got non content header frame instead",
            method: (60, 40),
        },
        TextCase {
            name: "method instead of content body",
            bytes: declare_in_body,
            code: 505,
            text: "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
            method: (60, 40),
        },
        TextCase {
            name: "heartbeat on channel 1",
            bytes: raw::heartbeat(1),
            code: 505,
            text: "UNEXPECTED_FRAME - type 8, all octets = <<>>",
            method: (0, 0),
        },
        TextCase {
            name: "unknown frame type",
            bytes: raw::frame(9, 1, b"hello"),
            code: 501,
            text: "FRAME_ERROR - type 9, all octets = <<\"hello\">>: unknown_frame",
            method: (0, 0),
        },
        TextCase {
            name: "frame larger than frame_max",
            bytes: too_large,
            code: 501,
            text: "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,140000,131064}",
            method: (0, 0),
        },
        TextCase {
            name: "immediate publish",
            bytes: immediate,
            code: 540,
            text: "NOT_IMPLEMENTED - immediate=true",
            method: (60, 40),
        },
    ];
    let b = start().await;
    let mut wrong = Vec::new();
    for case in cases {
        let mut r = Raw::open(b.addr).await;
        r.open_channel(1).await;
        r.send(&case.bytes).await;
        let c = r.expect_connection_close().await;
        let got = (
            c.reply_code,
            c.reply_text.as_str().to_string(),
            (c.class_id, c.method_id),
        );
        let want = (case.code, case.text.to_string(), case.method);
        if got != want {
            wrong.push(format!(
                "{}:\n    got  {got:?}\n    want {want:?}",
                case.name
            ));
        }
        r.send(&raw::close_ok()).await;
    }
    assert!(
        wrong.is_empty(),
        "{} mismatches:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_method_payload_is_501() {
    // RabbitMQ's generated decoder fails with rabbit_misc:frame_error:
    // 501 FRAME_ERROR "cannot decode ...", naming the method.
    let payload = raw::method_payload(50, 10, &[0, 0, 5, b'a']);
    let close = expect_hard_error(true, &raw::frame(raw::FRAME_METHOD, 1, &payload), 501).await;
    assert_eq!((close.class_id, close.method_id), (50, 10), "{close:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_payload_with_trailing_bytes_is_501() {
    let mut f = raw::queue_declare(1, "q", false, false, false);
    // Re-frame the payload with two extra octets.
    let mut payload = f[7..f.len() - 1].to_vec();
    payload.extend_from_slice(&[1, 2]);
    f = raw::frame(raw::FRAME_METHOD, 1, &payload);
    expect_hard_error(true, &f, 501).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_basic_publish_is_501() {
    // basic.publish is decoded by hand in Warren; same rule.
    let payload = raw::method_payload(60, 40, &[0, 0, 0, 1, b'q']);
    let close = expect_hard_error(true, &raw::frame(raw::FRAME_METHOD, 1, &payload), 501).await;
    assert_eq!((close.class_id, close.method_id), (60, 40), "{close:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_immediate_is_540() {
    let mut bytes = raw::basic_publish(1, "", "q", false, true);
    bytes.extend(raw::content_header(1, 2, false));
    bytes.extend(raw::body(1, b"hi"));
    let close = expect_hard_error(true, &bytes, 540).await;
    assert_eq!(
        close.reply_text.as_str(),
        "NOT_IMPLEMENTED - immediate=true"
    );
    assert_eq!((close.class_id, close.method_id), (60, 40));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_larger_than_max_message_size_closes_the_channel_with_406() {
    let tmp = tempfile::tempdir().unwrap();
    let b = start_with(Config {
        max_message_size: 1000,
        ..config(tmp.path())
    })
    .await;
    let observer = b.connect().await;
    let och = observer.create_channel().await.unwrap();
    declare(&och, "small").await;

    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.open_channel(2).await;
    // Exactly the limit is fine.
    r.send(&raw::publish_message(1, "", "small", &[1u8; 1000]))
        .await;
    assert_eq!(get_eventually(&och, "small").await, Some(vec![1u8; 1000]));
    // One more octet is not; split over two body frames.
    let mut bytes = raw::basic_publish(1, "", "small", false, false);
    bytes.extend(raw::content_header(1, 1001, false));
    bytes.extend(raw::body(1, &[2u8; 500]));
    bytes.extend(raw::body(1, &[2u8; 501]));
    r.send(&bytes).await;
    let close = r.expect_channel_close(1).await;
    assert_eq!(close.reply_code, 406);
    assert_eq!(
        close.reply_text.as_str(),
        "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000"
    );
    assert_eq!((close.class_id, close.method_id), (60, 40));
    r.send(&raw::method(
        1,
        AMQPClass::Channel(chm::AMQPMethod::CloseOk(chm::CloseOk {})),
    ))
    .await;
    // The connection and its other channel go on.
    r.send(&raw::publish_message(2, "", "small", b"after"))
        .await;
    assert_eq!(
        get_eventually(&och, "small").await.as_deref(),
        Some(&b"after"[..])
    );
    assert_eq!(get_body(&och, "small").await, None);
    r.open_channel(1).await;

    // The same through lapin: the channel dies with 406, the connection lives.
    let (c, ch) = b.channel().await;
    ch.basic_publish(
        "".into(),
        "small".into(),
        BasicPublishOptions::default(),
        &[3u8; 5000],
        BasicProperties::default(),
    )
    .await
    .expect("publish is sent");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let e = loop {
        match ch.basic_qos(10, BasicQosOptions::default()).await {
            Err(e) => break e,
            Ok(()) => {
                assert!(tokio::time::Instant::now() < deadline, "channel not closed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(
        reply_code(&e) == Some(406) || !ch.status().connected(),
        "{e:?}"
    );
    assert!(c.status().connected());
    assert_connection_works(&c).await;
    assert_eq!(get_body(&och, "small").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_connection_close_the_broker_ignores_frames_until_close_ok() {
    let b = start().await;
    let observer = b.connect().await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&raw::channel_open(1)).await;
    let close = r.expect_connection_close().await;
    assert_eq!(close.reply_code, 504);
    // None of this may be acted on or answered.
    let mut bytes = raw::queue_declare(1, "ignored-1", false, false, false);
    bytes.extend(raw::channel_open(2));
    bytes.extend(raw::queue_declare(2, "ignored-2", false, false, false));
    bytes.extend(raw::publish_message(1, "", "ignored-1", b"x"));
    bytes.extend(raw::heartbeat(0));
    r.send(&bytes).await;
    let (frames, closed) = r.frames_within(Duration::from_millis(500)).await;
    assert!(frames.is_empty(), "answered while closing: {frames:?}");
    assert!(!closed, "the socket closed before close-ok");
    r.send(&raw::close_ok()).await;
    let (frames, closed) = r.frames_within(raw::WAIT).await;
    assert!(closed, "the socket must close after close-ok");
    assert!(frames.is_empty(), "{frames:?}");
    // Nothing sent after the close was acted on.
    for q in ["ignored-1", "ignored-2"] {
        let ch = observer.create_channel().await.unwrap();
        let e = ch
            .queue_declare(
                q.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect_err("the queue must not exist");
        assert_eq!(reply_code(&e), Some(404), "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crossing_connection_close_is_answered_with_close_ok() {
    // Both sides close at once: RabbitMQ answers a connection.close that
    // arrives while it is closing with connection.close-ok
    // (rabbit_reader:handle_method0 when ?IS_STOPPING).
    let b = start().await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&raw::channel_open(1)).await;
    let close = r.expect_connection_close().await;
    assert_eq!(close.reply_code, 504);
    r.send(&raw::connection_close(200, "bye")).await;
    let f = r.expect_frame().await;
    assert_eq!(f.channel, 0);
    assert!(
        matches!(
            f.method(),
            Some(AMQPClass::Connection(conm::AMQPMethod::CloseOk(_)))
        ),
        "{f:?}"
    );
    r.send(&raw::close_ok()).await;
    r.expect_eof(raw::WAIT).await;
}

/// Panics raised outside the test files (in the broker or its
/// dependencies), recorded by a process-wide hook.
static FOREIGN_PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record_foreign_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let file = info.location().map(|l| l.file()).unwrap_or("");
            if !file.starts_with("tests/") && !file.contains("/tests/") {
                FOREIGN_PANICS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(info.to_string());
            }
            previous(info);
        }));
    });
}

/// Known (class, method) pairs, client and server side.
const METHODS: &[(u16, u16)] = &[
    (10, 10),
    (10, 11),
    (10, 20),
    (10, 21),
    (10, 30),
    (10, 31),
    (10, 40),
    (10, 41),
    (10, 50),
    (10, 51),
    (10, 60),
    (10, 61),
    (20, 10),
    (20, 11),
    (20, 20),
    (20, 21),
    (20, 40),
    (20, 41),
    (40, 10),
    (40, 11),
    (40, 20),
    (40, 21),
    (40, 30),
    (40, 31),
    (40, 40),
    (40, 51),
    (50, 10),
    (50, 11),
    (50, 20),
    (50, 21),
    (50, 30),
    (50, 31),
    (50, 40),
    (50, 41),
    (50, 50),
    (50, 51),
    (60, 10),
    (60, 11),
    (60, 20),
    (60, 21),
    (60, 30),
    (60, 31),
    (60, 40),
    (60, 50),
    (60, 60),
    (60, 70),
    (60, 71),
    (60, 72),
    (60, 80),
    (60, 90),
    (60, 100),
    (60, 110),
    (60, 111),
    (60, 120),
    (85, 10),
    (85, 11),
    (90, 10),
    (90, 11),
    (90, 20),
    (90, 21),
    (90, 30),
    (90, 31),
];

fn random_bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let n = rng.gen_range(0..=max);
    (0..n).map(|_| rng.gen()).collect()
}

/// Valid frames to mutate.
fn valid_frames(ch: u16) -> Vec<Vec<u8>> {
    let mut args = FieldTable::default();
    args.insert(
        "x-max-length".into(),
        amq_protocol::types::AMQPValue::LongInt(10),
    );
    args.insert(
        "x-dead-letter-exchange".into(),
        amq_protocol::types::AMQPValue::LongString("dlx".into()),
    );
    vec![
        raw::queue_declare(ch, "fuzz", false, false, false),
        raw::method(
            ch,
            AMQPClass::Queue(qm::AMQPMethod::Declare(qm::Declare {
                queue: "fuzz-args".into(),
                passive: false,
                durable: true,
                exclusive: false,
                auto_delete: false,
                nowait: false,
                arguments: args,
            })),
        ),
        raw::basic_publish(ch, "amq.topic", "a.b", true, false),
        raw::content_header(ch, 5, true),
        raw::method(
            ch,
            AMQPClass::Basic(bm::AMQPMethod::Consume(bm::Consume {
                queue: "fuzz".into(),
                consumer_tag: "t".into(),
                no_local: false,
                no_ack: false,
                exclusive: false,
                nowait: false,
                arguments: FieldTable::default(),
            })),
        ),
        raw::method(
            ch,
            AMQPClass::Basic(bm::AMQPMethod::Ack(bm::Ack {
                delivery_tag: 1,
                multiple: true,
            })),
        ),
        raw::method(
            ch,
            AMQPClass::Basic(bm::AMQPMethod::Qos(bm::Qos {
                prefetch_count: 5,
                global: false,
            })),
        ),
        raw::connection_close(200, "x"),
    ]
}

/// One random input: an optional valid prefix, then 1-3 random pieces.
fn random_case(rng: &mut StdRng) -> Vec<u8> {
    let mut out = Vec::new();
    match rng.gen_range(0..4) {
        0 => {}
        1 => out.extend(raw::channel_open(1)),
        2 => {
            out.extend(raw::channel_open(1));
            out.extend(raw::basic_publish(1, "", "fuzz", false, false));
        }
        _ => {
            out.extend(raw::channel_open(1));
            out.extend(raw::basic_publish(1, "", "fuzz", false, false));
            out.extend(raw::content_header(1, rng.gen_range(0..20), false));
        }
    }
    let ch: u16 = match rng.gen_range(0..4) {
        0 => 0,
        1 | 2 => 1,
        _ => rng.gen(),
    };
    for _ in 0..rng.gen_range(1..=3) {
        match rng.gen_range(0..7) {
            0 => out.extend(random_bytes(rng, 64)),
            1 => {
                let kind = if rng.gen_bool(0.7) {
                    [1u8, 2, 3, 8][rng.gen_range(0..4)]
                } else {
                    rng.gen()
                };
                out.extend(raw::frame(kind, ch, &random_bytes(rng, 64)));
            }
            2 => {
                let (c, m) = METHODS[rng.gen_range(0..METHODS.len())];
                let p = raw::method_payload(c, m, &random_bytes(rng, 48));
                out.extend(raw::frame(raw::FRAME_METHOD, ch, &p));
            }
            3 => {
                let mut p = Vec::new();
                p.extend_from_slice(
                    &(if rng.gen_bool(0.8) { 60u16 } else { rng.gen() }).to_be_bytes(),
                );
                p.extend_from_slice(&0u16.to_be_bytes());
                p.extend_from_slice(&rng.gen_range(0u64..100).to_be_bytes());
                p.extend(random_bytes(rng, 40));
                out.extend(raw::frame(raw::FRAME_HEADER, ch, &p));
            }
            4 | 5 => {
                let frames = valid_frames(ch);
                let mut f = frames[rng.gen_range(0..frames.len())].clone();
                // Mutate the payload (keep the framing mostly right).
                let flips = rng.gen_range(1..=4);
                for _ in 0..flips {
                    if f.len() > 8 {
                        let i = rng.gen_range(7..f.len() - 1);
                        f[i] = rng.gen();
                    }
                }
                if rng.gen_bool(0.3) && f.len() > 9 {
                    // Truncate the payload and fix the size.
                    let keep = rng.gen_range(0..f.len() - 8);
                    let p = f[7..7 + keep].to_vec();
                    f = raw::frame(f[0], ch, &p);
                }
                out.extend(f);
            }
            _ => {
                // A size field that lies.
                let mut f = raw::frame(raw::FRAME_METHOD, ch, &random_bytes(rng, 32));
                let lie: u32 = if rng.gen_bool(0.5) {
                    rng.gen_range(0..64)
                } else {
                    rng.gen()
                };
                f[3..7].copy_from_slice(&lie.to_be_bytes());
                out.extend(f);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_input_after_handshake_does_not_panic_the_broker() {
    record_foreign_panics();
    let b = start().await;
    let observer = b.connect().await;
    let mut rng = StdRng::seed_from_u64(0x5EED_0091);
    let cases: Vec<Vec<u8>> = (0..1000).map(|_| random_case(&mut rng)).collect();
    let mut outcomes = std::collections::BTreeMap::new();
    for batch in cases.chunks(25) {
        let runs = batch.iter().map(|bytes| {
            let addr = b.addr;
            let bytes = bytes.clone();
            async move {
                let mut r = Raw::open(addr).await;
                r.send(&bytes).await;
                // Let the broker act on it; answer a close like a client would.
                let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
                let mut code = None;
                loop {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    match r.read_frame(left).await {
                        raw::Read::Frame(f) => {
                            if f.channel == 0 && f.method_ids() == Some((10, 50)) {
                                if let Some(AMQPClass::Connection(conm::AMQPMethod::Close(c))) =
                                    f.method()
                                {
                                    code = Some(c.reply_code);
                                }
                                r.send(&raw::close_ok()).await;
                            }
                        }
                        _ => break,
                    }
                }
                code
            }
        });
        for code in futures::future::join_all(runs).await {
            *outcomes.entry(code).or_insert(0usize) += 1;
        }
    }
    eprintln!("connection.close codes for 1000 random inputs: {outcomes:?}");
    let panics = FOREIGN_PANICS.lock().unwrap().clone();
    assert!(panics.is_empty(), "the broker panicked: {panics:#?}");
    assert_connection_works(&observer).await;
    let c = b.connect().await;
    assert_connection_works(&c).await;
}

/// A field table nested `depth` deep: {"a": {"a": {...}}}.
fn nested_table(depth: usize) -> Vec<u8> {
    // Built inside out: each level is len(4) + key "a" (1+1) + 'F' + inner.
    let mut inner: Vec<u8> = 0u32.to_be_bytes().to_vec();
    for _ in 0..depth {
        let mut t = Vec::with_capacity(inner.len() + 7);
        let len = (inner.len() + 3) as u32;
        t.extend_from_slice(&len.to_be_bytes());
        t.push(1);
        t.push(b'a');
        t.push(b'F');
        t.extend_from_slice(&inner);
        inner = t;
    }
    inner
}

/// Asserts that `f` is connection.close with `code`, naming `method`.
fn assert_close(f: &raw::RawFrame, code: u16, method: (u16, u16)) {
    match f.method() {
        Some(AMQPClass::Connection(conm::AMQPMethod::Close(c))) => {
            assert_eq!(c.reply_code, code, "{c:?}");
            assert_eq!((c.class_id, c.method_id), method, "{c:?}");
        }
        other => panic!("expected connection.close, got {other:?}"),
    }
}

/// Sends `bytes` to the real `warren` binary (a stack overflow would abort
/// the test process itself) on a raw connection: right after
/// connection.start when `at_start_ok`, else after the handshake and
/// channel.open on 1. Checks the broker still runs and serves a lapin
/// connection opened before; returns what the raw client read first.
async fn send_to_child(at_start_ok: bool, bytes: &[u8]) -> raw::Read {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let broker = child::ChildBroker::spawn(&data, &tmp.path().join("warren.log"), &[]);
    let observer = broker.connect().await;
    let mut r = if at_start_ok {
        let mut r = Raw::connect(broker.addr()).await;
        r.send(raw::HEADER_091).await;
        let (_, m) = r.expect_method().await;
        assert!(matches!(
            m,
            AMQPClass::Connection(conm::AMQPMethod::Start(_))
        ));
        r
    } else {
        let mut r = Raw::open(broker.addr()).await;
        r.open_channel(1).await;
        r
    };
    assert!(bytes.len() <= 131_072 + 8);
    r.send(bytes).await;
    let got = r.read_frame(raw::WAIT).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        broker.is_running(),
        "warren died (raw client saw {got:?}): {}",
        broker.log_tail()
    );
    assert_connection_works(&observer).await;
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_queue_arguments_are_502_and_do_not_crash_the_broker() {
    // queue.declare "deep" with an arguments table nested 18000 deep
    // (within frame_max). RabbitMQ decodes it and declares the queue (the
    // argument is not an x- argument it checks); Warren refuses tables
    // nested over 64 deep before decoding them.
    let mut args = Vec::new();
    args.extend_from_slice(&0u16.to_be_bytes()); // ticket
    args.push(4);
    args.extend_from_slice(b"deep");
    args.push(0); // bits
    args.extend(nested_table(18_000));
    let payload = raw::method_payload(50, 10, &args);
    match send_to_child(false, &raw::frame(raw::FRAME_METHOD, 1, &payload)).await {
        raw::Read::Frame(f) => assert_close(&f, 502, (50, 10)),
        other => panic!("expected connection.close, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_message_headers_are_502_and_do_not_crash_the_broker() {
    // A publish whose headers property is nested 18000 deep; RabbitMQ
    // decodes and routes it, Warren refuses it (over 64 levels).
    let mut props = Vec::new();
    props.extend_from_slice(&60u16.to_be_bytes());
    props.extend_from_slice(&0u16.to_be_bytes());
    props.extend_from_slice(&2u64.to_be_bytes());
    props.extend_from_slice(&0x2000u16.to_be_bytes()); // headers only
    props.extend(nested_table(18_000));
    let mut bytes = raw::basic_publish(1, "", "nowhere", false, false);
    bytes.extend(raw::frame(raw::FRAME_HEADER, 1, &props));
    bytes.extend(raw::body(1, b"hi"));
    match send_to_child(false, &bytes).await {
        raw::Read::Frame(f) => assert_close(&f, 502, (60, 40)),
        other => panic!("expected connection.close, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_client_properties_are_502_and_do_not_crash_the_broker() {
    // Before authentication: connection.start-ok whose client-properties
    // table is nested 500 deep (within the 4096 octets allowed before
    // tuning). RabbitMQ decodes it, logs in and tunes; Warren refuses it.
    let mut args = nested_table(500);
    args.push(5);
    args.extend_from_slice(b"PLAIN");
    let resp = b"\0guest\0guest";
    args.extend_from_slice(&(resp.len() as u32).to_be_bytes());
    args.extend_from_slice(resp);
    args.push(5);
    args.extend_from_slice(b"en_US");
    let payload = raw::method_payload(10, 11, &args);
    match send_to_child(true, &raw::frame(raw::FRAME_METHOD, 0, &payload)).await {
        raw::Read::Frame(f) => assert_close(&f, 502, (10, 11)),
        other => panic!("expected connection.close, got {other:?}"),
    }
}
