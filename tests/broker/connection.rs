//! Connections: the server properties and capabilities sent in
//! connection.start, authentication failures (403) and unknown vhosts (530),
//! tune negotiation (frame_max / channel_max as lapin sees them, and the
//! tune-ok values RabbitMQ refuses with 530), orderly close from either side,
//! many channels on one connection, the channel_max limit, heartbeats
//! (lapin stays alive on a 1 s heartbeat; a silent raw client is dropped and
//! its exclusive queue deleted; heartbeat 0 disables the check), the 320
//! close at broker shutdown, connection methods out of place, and handshake
//! errors that RabbitMQ answers by just closing the socket.

use crate::common;

use std::time::Duration;

use amq_protocol::protocol::{channel as chm, connection as conm, queue as qm, AMQPClass};
use amq_protocol::types::AMQPValue;
use common::raw::{self, Raw};
use common::*;
use lapin::{options::*, types::FieldTable, Connection, ConnectionProperties};
use warren::Config;

/// A broker with a tweaked config.
async fn start_tweaked(f: impl FnOnce(&mut Config)) -> (TestBroker, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    f(&mut c);
    (start_with(c).await, tmp)
}

/// Whether a queue exists, seen from `conn` (passive declare on a fresh
/// channel: a 404 or 405 closes that channel only).
async fn queue_exists(conn: &Connection, name: &str) -> bool {
    let ch = conn.create_channel().await.expect("channel");
    match ch
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
    {
        Ok(_) => {
            let _ = ch.close(200, "OK".into()).await;
            true
        }
        // 405: another connection's exclusive queue, which exists.
        Err(e) if reply_code(&e) == Some(405) => true,
        Err(e) => {
            assert_eq!(reply_code(&e), Some(404), "passive declare: {e:?}");
            false
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_start_carries_server_properties_and_capabilities() {
    let b = start().await;
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    let (ch, m) = r.expect_method().await;
    assert_eq!(ch, 0);
    let start = match m {
        AMQPClass::Connection(conm::AMQPMethod::Start(s)) => s,
        other => panic!("expected connection.start, got {other:?}"),
    };
    assert_eq!((start.version_major, start.version_minor), (0, 9));
    let mechs = start.mechanisms.to_string();
    let mechs: Vec<&str> = mechs.split_whitespace().collect();
    assert!(mechs.contains(&"PLAIN"), "mechanisms {mechs:?}");
    assert!(mechs.contains(&"AMQPLAIN"), "mechanisms {mechs:?}");
    assert!(start
        .locales
        .to_string()
        .split_whitespace()
        .any(|l| l == "en_US"));
    let props = start.server_properties.inner();
    match props.get("product") {
        Some(AMQPValue::LongString(s)) => assert_eq!(s.to_string(), "Warren"),
        other => panic!("product: {other:?}"),
    }
    for key in ["version", "platform", "copyright", "information"] {
        assert!(
            matches!(props.get(key), Some(AMQPValue::LongString(_))),
            "server property {key}: {:?}",
            props.get(key)
        );
    }
    let caps = match props.get("capabilities") {
        Some(AMQPValue::FieldTable(t)) => t.inner().clone(),
        other => panic!("capabilities: {other:?}"),
    };
    for cap in [
        "publisher_confirms",
        "basic.nack",
        "consumer_cancel_notify",
        "exchange_exchange_bindings",
        "authentication_failure_close",
        "per_consumer_qos",
        "consumer_priorities",
        "connection.blocked",
        "direct_reply_to",
    ] {
        assert_eq!(
            caps.get(cap),
            Some(&AMQPValue::Boolean(true)),
            "capability {cap}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapin_connects_and_sees_default_tuning() {
    let b = start().await;
    let c = b.connect().await;
    assert!(c.status().connected());
    let cfg = c.configuration();
    assert_eq!(cfg.frame_max(), 131_072);
    assert_eq!(cfg.channel_max(), 2047);
    assert_eq!(cfg.heartbeat(), 60);
    assert_connection_works(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapin_sees_the_configured_tuning_and_large_bodies_are_split() {
    let (b, _t) = start_tweaked(|c| {
        c.frame_max = 8192;
        c.channel_max = 16;
        c.heartbeat = 7;
    })
    .await;
    let c = b.connect().await;
    let cfg = c.configuration();
    assert_eq!(cfg.frame_max(), 8192);
    assert_eq!(cfg.channel_max(), 16);
    assert_eq!(cfg.heartbeat(), 7);
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "big").await;
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    publish(&ch, "", "big", &body).await;
    assert_eq!(get_eventually(&ch, "big").await, Some(body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_respect_a_frame_max_lower_than_the_brokers() {
    let b = start().await;
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    let tune = r.start_and_tune("guest", "guest", true).await;
    r.send(&raw::tune_ok(tune.channel_max, 4096, 0)).await;
    r.send(&raw::connection_open("/")).await;
    let (_, m) = r.expect_method().await;
    assert!(matches!(
        m,
        AMQPClass::Connection(conm::AMQPMethod::OpenOk(_))
    ));
    r.open_channel(1).await;
    r.send(&raw::queue_declare(1, "fm", false, false, false))
        .await;
    let (_, m) = r.expect_method().await;
    assert!(
        matches!(m, AMQPClass::Queue(qm::AMQPMethod::DeclareOk(_))),
        "{m:?}"
    );
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
    // Publish in frames that respect 4096 ourselves.
    let mut out = raw::basic_publish(1, "", "fm", false, false);
    out.extend(raw::content_header(1, data.len() as u64, false));
    for chunk in data.chunks(4096 - 8) {
        out.extend(raw::body(1, chunk));
    }
    r.send(&out).await;
    // basic.get no-ack until the message is there.
    let mut got = Vec::new();
    for _ in 0..100 {
        r.send(&raw::method(
            1,
            AMQPClass::Basic(amq_protocol::protocol::basic::AMQPMethod::Get(
                amq_protocol::protocol::basic::Get {
                    queue: "fm".into(),
                    no_ack: true,
                },
            )),
        ))
        .await;
        let f = r.expect_frame().await;
        assert!(
            f.payload.len() + 8 <= 4096,
            "frame of {} bytes",
            f.payload.len() + 8
        );
        match f.method_ids() {
            Some((60, 72)) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Some((60, 71)) => {}
            other => panic!("unexpected reply to basic.get: {other:?}"),
        }
        let h = r.expect_frame().await;
        assert_eq!(h.kind, raw::FRAME_HEADER);
        assert!(h.payload.len() + 8 <= 4096);
        while got.len() < data.len() {
            let f = r.expect_frame().await;
            assert_eq!(f.kind, raw::FRAME_BODY);
            assert!(
                f.payload.len() + 8 <= 4096,
                "body frame of {} bytes",
                f.payload.len() + 8
            );
            got.extend_from_slice(&f.payload);
        }
        break;
    }
    assert_eq!(got, data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_refused_with_403() {
    let b = start().await;
    let uri = format!("amqp://guest:wrong@{}/%2f", b.addr);
    let e = Connection::connect(&uri, ConnectionProperties::default())
        .await
        .expect_err("a wrong password must be refused");
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    // The broker still serves good logins.
    let c = b.connect().await;
    assert_connection_works(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_user_is_refused_with_403_naming_no_method() {
    let b = start().await;
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    let (_, m) = r.expect_method().await;
    assert!(matches!(
        m,
        AMQPClass::Connection(conm::AMQPMethod::Start(_))
    ));
    r.send(&raw::start_ok("nobody", "guest", true)).await;
    let close = r.expect_connection_close().await;
    assert_eq!(close.reply_code, 403);
    assert_eq!(
        close.reply_text.as_str(),
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. \
         For details see the broker logfile."
    );
    // rabbit_reader:auth_fail builds the error with method 'none', so the
    // close names no method.
    assert_eq!((close.class_id, close.method_id), (0, 0), "{close:?}");
    r.send(&raw::close_ok()).await;
    r.expect_eof(raw::WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_without_the_capability_just_closes_the_socket() {
    let b = start().await;
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    let (_, m) = r.expect_method().await;
    assert!(matches!(
        m,
        AMQPClass::Connection(conm::AMQPMethod::Start(_))
    ));
    r.send(&raw::start_ok("guest", "wrong", false)).await;
    let (frames, closed) = r.frames_within(raw::WAIT).await;
    assert!(closed, "the socket must be closed");
    assert!(frames.is_empty(), "nothing may be sent: {frames:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_vhost_is_refused_with_530() {
    let b = start().await;
    let uri = format!("amqp://guest:guest@{}/nope", b.addr);
    let e = Connection::connect(&uri, ConnectionProperties::default())
        .await
        .expect_err("an unknown vhost must be refused");
    assert_eq!(reply_code(&e), Some(530), "{e:?}");

    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    let t = r.start_and_tune("guest", "guest", true).await;
    r.send(&raw::tune_ok(t.channel_max, t.frame_max, 0)).await;
    r.send(&raw::connection_open("nope")).await;
    let close = r.expect_connection_close().await;
    assert_eq!(close.reply_code, 530);
    assert_eq!(
        close.reply_text.as_str(),
        "NOT_ALLOWED - vhost nope not found"
    );
    assert_eq!((close.class_id, close.method_id), (10, 40));
}

/// Runs the handshake up to tune-ok with the given values and returns what
/// the broker answers to tune-ok + open: Ok(()) for open-ok, Err(close).
async fn tune_ok_outcome(
    b: &TestBroker,
    channel_max: u16,
    frame_max: u32,
) -> Result<(), conm::Close> {
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    r.start_and_tune("guest", "guest", true).await;
    r.send(&raw::tune_ok(channel_max, frame_max, 0)).await;
    r.send(&raw::connection_open("/")).await;
    loop {
        match r.read_frame(raw::WAIT).await {
            raw::Read::Frame(f) => match f.method() {
                Some(AMQPClass::Connection(conm::AMQPMethod::OpenOk(_))) => return Ok(()),
                Some(AMQPClass::Connection(conm::AMQPMethod::Close(c))) => return Err(c),
                _ => continue,
            },
            other => panic!("no answer to tune-ok/open: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_ok_frame_max_below_the_minimum_is_refused_with_530() {
    let b = start().await;
    let close = tune_ok_outcome(&b, 2047, 1024)
        .await
        .expect_err("frame_max 1024 must be refused");
    assert_eq!(close.reply_code, 530, "{close:?}");
    assert_eq!(
        close.reply_text.as_str(),
        "NOT_ALLOWED - negotiated frame_max = 1024 is lower than the minimum allowed value (4096)"
    );
    assert_eq!((close.class_id, close.method_id), (10, 30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_ok_frame_max_above_the_brokers_is_refused_with_530() {
    let b = start().await;
    let close = tune_ok_outcome(&b, 2047, 131_073)
        .await
        .expect_err("frame_max above the broker's must be refused");
    assert_eq!(close.reply_code, 530, "{close:?}");
    assert_eq!(
        close.reply_text.as_str(),
        "NOT_ALLOWED - negotiated frame_max = 131073 is higher than the maximum allowed value (131072)"
    );
    // rabbit_reader:fail_negotiation names 'connection.tune'.
    assert_eq!((close.class_id, close.method_id), (10, 30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_ok_channel_max_above_the_brokers_is_refused_with_530() {
    // RabbitMQ (rabbit_reader:validate_negotiated_integer_value) refuses a
    // channel_max above its own rather than clamping it.
    let b = start().await;
    let close = tune_ok_outcome(&b, 2048, 131_072)
        .await
        .expect_err("channel_max above the broker's must be refused");
    assert_eq!(close.reply_code, 530, "{close:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_ok_zero_channel_max_is_refused_when_the_broker_has_a_limit() {
    // RabbitMQ: "negotiated channel_max = 0 is higher than the maximum
    // allowed value (2047)" - 0 means "no limit", which exceeds the broker's.
    let b = start().await;
    let close = tune_ok_outcome(&b, 0, 131_072)
        .await
        .expect_err("channel_max 0 must be refused");
    assert_eq!(close.reply_code, 530, "{close:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_ok_zero_frame_max_is_refused_when_the_broker_has_a_limit() {
    let b = start().await;
    let close = tune_ok_outcome(&b, 2047, 0)
        .await
        .expect_err("frame_max 0 must be refused");
    assert_eq!(close.reply_code, 530, "{close:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_ok_lower_values_are_accepted() {
    let b = start().await;
    tune_ok_outcome(&b, 10, 4096)
        .await
        .expect("lower channel_max and frame_max are fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_close_from_lapin() {
    let b = start().await;
    let (_observer, _) = b.channel().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    ch.queue_declare(
        "mine".into(),
        QueueDeclareOptions {
            exclusive: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.close(200, "bye".into()).await.expect("channel.close");
    assert!(ch.basic_qos(1, BasicQosOptions::default()).await.is_err());
    // The connection outlives its channel.
    let _ch2 = c.create_channel().await.unwrap();
    assert!(queue_exists(&c, "mine").await);
    c.close(200, "bye".into()).await.expect("connection.close");
    assert!(c.status().closed());
    assert!(c.create_channel().await.is_err());
    // Its exclusive queue is gone.
    let other = b.connect().await;
    assert!(!queue_exists(&other, "mine").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_close_from_a_raw_client() {
    let b = start().await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&raw::method(
        1,
        AMQPClass::Channel(chm::AMQPMethod::Close(chm::Close {
            reply_code: 200,
            reply_text: "bye".into(),
            class_id: 0,
            method_id: 0,
        })),
    ))
    .await;
    let (c, m) = r.expect_method().await;
    assert_eq!(c, 1);
    assert!(
        matches!(m, AMQPClass::Channel(chm::AMQPMethod::CloseOk(_))),
        "{m:?}"
    );
    // The channel id can be used again.
    r.open_channel(1).await;
    r.send(&raw::connection_close(200, "bye")).await;
    let (c, m) = r.expect_method().await;
    assert_eq!(c, 0);
    assert!(
        matches!(m, AMQPClass::Connection(conm::AMQPMethod::CloseOk(_))),
        "{m:?}"
    );
    r.expect_eof(raw::WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_channels_on_one_connection() {
    let b = start().await;
    let c = b.connect().await;
    let first = c.create_channel().await.unwrap();
    declare(&first, "many").await;
    let mut chans = Vec::new();
    for _ in 0..300 {
        chans.push(c.create_channel().await.expect("channel"));
    }
    for (i, ch) in chans.iter().enumerate() {
        publish(ch, "", "many", format!("{i}").as_bytes()).await;
    }
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..300 {
        let body = get_eventually(&first, "many").await.expect("message");
        seen.insert(String::from_utf8(body).unwrap().parse::<usize>().unwrap());
    }
    assert_eq!(seen, (0..300).collect());
    // Close every other channel; the rest keep working.
    for ch in chans.iter().step_by(2) {
        ch.close(200, "OK".into()).await.unwrap();
    }
    for (i, ch) in chans.iter().enumerate().skip(1).step_by(2) {
        publish(ch, "", "many", format!("{i}").as_bytes()).await;
    }
    for _ in 0..150 {
        let body = get_eventually(&first, "many").await.expect("message");
        let i: usize = String::from_utf8(body).unwrap().parse().unwrap();
        assert_eq!(i % 2, 1);
    }
    assert_eq!(get_body(&first, "many").await, None);
    // New channels reuse the freed ids.
    for _ in 0..150 {
        let ch = c.create_channel().await.expect("channel");
        publish(&ch, "", "many", b"x").await;
    }
    for _ in 0..150 {
        assert!(get_eventually(&first, "many").await.is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_more_channels_than_channel_max_is_530() {
    // RabbitMQ counts open channels: once channel_max are open, one more
    // channel.open gets connection.close 530 NOT_ALLOWED "number of channels
    // opened (4) has reached the negotiated channel_max (4)".
    let (b, _t) = start_tweaked(|c| c.channel_max = 4).await;
    let mut r = Raw::open(b.addr).await;
    for ch in 1..=4 {
        r.open_channel(ch).await;
    }
    r.send(&raw::channel_open(5)).await;
    let close = r.expect_connection_close().await;
    assert_eq!(close.reply_code, 530, "{close:?}");
    assert!(
        close
            .reply_text
            .as_str()
            .contains("has reached the negotiated channel_max (4)"),
        "{}",
        close.reply_text.as_str()
    );
    r.send(&raw::close_ok()).await;
    r.expect_eof(raw::WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_ids_above_channel_max_are_allowed_while_under_the_count() {
    // RabbitMQ 3.10 only limits how many channels are open
    // (rabbit_reader:create_channel); it does not check the channel id
    // against channel_max.
    let (b, _t) = start_tweaked(|c| c.channel_max = 4).await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(100).await;
    r.send(&raw::queue_declare(100, "high", false, false, false))
        .await;
    let (c, m) = r.expect_method().await;
    assert_eq!(c, 100);
    assert!(
        matches!(m, AMQPClass::Queue(qm::AMQPMethod::DeclareOk(_))),
        "{m:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapin_stays_alive_with_a_one_second_heartbeat() {
    let (b, _t) = start_tweaked(|c| c.heartbeat = 1).await;
    let c = b.connect().await;
    assert_eq!(c.configuration().heartbeat(), 1);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(c.status().connected(), "lapin connection dropped");
    assert_connection_works(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_sends_heartbeats_to_an_idle_client() {
    let (b, _t) = start_tweaked(|c| c.heartbeat = 1).await;
    let mut r = Raw::open_with_heartbeat(b.addr, 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    let mut beats = 0;
    while tokio::time::Instant::now() < deadline {
        r.send(&raw::heartbeat(0)).await;
        match r.read_frame(Duration::from_millis(400)).await {
            raw::Read::Frame(f) => {
                assert_eq!((f.kind, f.channel), (raw::FRAME_HEARTBEAT, 0), "{f:?}");
                beats += 1;
            }
            raw::Read::Timeout => {}
            raw::Read::Closed => panic!("the broker closed a client that sends heartbeats"),
        }
    }
    assert!(beats >= 1, "no heartbeat from the broker in 4 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_client_is_disconnected_and_its_exclusive_queue_deleted() {
    let (b, _t) = start_tweaked(|c| c.heartbeat = 1).await;
    let observer = b.connect().await;
    let mut r = Raw::open_with_heartbeat(b.addr, 1).await;
    r.open_channel(1).await;
    r.send(&raw::queue_declare(1, "hb-excl", false, false, true))
        .await;
    let (_, m) = r.expect_method().await;
    assert!(
        matches!(m, AMQPClass::Queue(qm::AMQPMethod::DeclareOk(_))),
        "{m:?}"
    );
    assert!(queue_exists(&observer, "hb-excl").await);
    // Now say nothing at all; the broker must give up on us.
    r.expect_eof(Duration::from_secs(10)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while queue_exists(&observer, "hb-excl").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the exclusive queue outlived its connection"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_zero_in_tune_ok_disables_heartbeats() {
    let (b, _t) = start_tweaked(|c| c.heartbeat = 1).await;
    let mut r = Raw::open_with_heartbeat(b.addr, 0).await;
    // Silent for several would-be heartbeat timeouts: no heartbeats from
    // the broker and no disconnect.
    match r.read_frame(Duration::from_secs(4)).await {
        raw::Read::Timeout => {}
        other => panic!("expected silence, got {other:?}"),
    }
    r.open_channel(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_shutdown_closes_connections_with_320() {
    let mut b = start().await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    let client = async {
        let close = r.expect_connection_close().await;
        r.send(&raw::close_ok()).await;
        r.expect_eof(raw::WAIT).await;
        close
    };
    let (_, close) = tokio::join!(b.stop(), client);
    assert_eq!(close.reply_code, 320, "{close:?}");
    assert_eq!(
        close.reply_text.as_str(),
        "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_method_after_open_is_504() {
    // rabbit_reader:handle_method0 in state running: "unexpected method in
    // connection state running", a channel_error.
    let b = start().await;
    let mut r = Raw::open(b.addr).await;
    r.send(&raw::connection_open("/")).await;
    let close = r.expect_connection_close().await;
    assert_eq!(close.reply_code, 504, "{close:?}");
    assert_eq!(
        close.reply_text.as_str(),
        "CHANNEL_ERROR - unexpected method in connection state running"
    );
    assert_eq!((close.class_id, close.method_id), (10, 40));
    r.send(&raw::close_ok()).await;
    r.expect_eof(raw::WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_errors_before_tuning_close_the_socket_without_a_close_method() {
    // Errors while RabbitMQ is in state starting / securing (other than a
    // refused login with authentication_failure_close) end in
    // rabbit_reader:handle_exception's last clause: a pause, then the
    // socket is closed; no connection.close is sent.
    let start_ok_with = |mechanism: &str, response: &[u8]| {
        raw::method(
            0,
            AMQPClass::Connection(conm::AMQPMethod::StartOk(conm::StartOk {
                client_properties: raw::client_properties(true),
                mechanism: mechanism.into(),
                response: amq_protocol::types::LongString::from(response),
                locale: "en_US".into(),
            })),
        )
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "unknown SASL mechanism",
            start_ok_with("FOO", b"\0guest\0guest"),
        ),
        ("malformed PLAIN response", start_ok_with("PLAIN", b"guest")),
        ("connection.open before start-ok", raw::connection_open("/")),
        ("tune-ok before start-ok", raw::tune_ok(2047, 131_072, 0)),
    ];
    let b = start().await;
    let mut wrong = Vec::new();
    for (name, bytes) in cases {
        let mut r = Raw::connect(b.addr).await;
        r.send(raw::HEADER_091).await;
        let (_, m) = r.expect_method().await;
        assert!(matches!(
            m,
            AMQPClass::Connection(conm::AMQPMethod::Start(_))
        ));
        r.send(&bytes).await;
        // RabbitMQ closes after its 3 s SILENT_CLOSE_DELAY.
        let (frames, closed) = r.frames_within(Duration::from_secs(6)).await;
        if !closed || !frames.is_empty() {
            let methods: Vec<_> = frames.iter().map(|f| f.method()).collect();
            wrong.push(format!("{name}: closed={closed}, sent {methods:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let c = b.connect().await;
    assert_connection_works(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_open_before_tune_ok_closes_the_socket() {
    // State tuning: only tune-ok is expected; anything else is
    // "unexpected method in connection state tuning" and a silent close.
    let b = start().await;
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    r.start_and_tune("guest", "guest", true).await;
    r.send(&raw::connection_open("/")).await;
    // RabbitMQ closes after its 3 s SILENT_CLOSE_DELAY.
    let (frames, closed) = r.frames_within(Duration::from_secs(6)).await;
    let methods: Vec<_> = frames.iter().map(|f| f.method()).collect();
    assert!(
        closed && frames.is_empty(),
        "closed={closed}, sent {methods:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_open_without_logging_in_is_refused() {
    // Skipping start-ok (no credentials at all) must not open the
    // connection, let alone let it declare anything.
    let b = start().await;
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    let (_, m) = r.expect_method().await;
    assert!(matches!(
        m,
        AMQPClass::Connection(conm::AMQPMethod::Start(_))
    ));
    let mut bytes = raw::connection_open("/");
    bytes.extend(raw::channel_open(1));
    bytes.extend(raw::queue_declare(1, "no-login", false, true, false));
    r.send(&bytes).await;
    let (frames, closed) = r.frames_within(Duration::from_secs(6)).await;
    let observer = b.connect().await;
    let created = queue_exists(&observer, "no-login").await;
    let methods: Vec<_> = frames.iter().map(|f| f.method()).collect();
    assert!(
        !created,
        "a client that never logged in declared a durable queue; it was sent {methods:?}"
    );
    assert!(
        closed && frames.is_empty(),
        "closed={closed}, sent {methods:?}"
    );
}
