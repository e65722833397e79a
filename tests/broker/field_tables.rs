//! Field tables and properties as a hostile or unusual client sends them.
//!
//! - Tables nested deeper than 64 levels (in method arguments or in message
//!   headers) are refused with 502 SYNTAX_ERROR before any value is built.
//!   Warren used to decode them recursively on a 256 MiB worker stack; now
//!   workers run on tokio's default stack and a 10,000-deep table in one
//!   frame is just refused.
//! - Properties keep the bytes the publisher sent. A short string that is
//!   not UTF-8 (RabbitMQ takes any bytes) used to make amq-protocol fail to
//!   decode the properties, which then fell back to the defaults: a
//!   dead-lettered persistent message became transient (lost at restart)
//!   and a BCC header was not stripped.
//! - frame_max takes values above the old 256 KiB cap.

use crate::common;
use crate::helpers;

use amq_protocol::protocol::{basic as bm, connection as conm, queue as qm, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, ShortString};
use common::raw::{self, Raw, RawFrame};
use common::*;
use helpers::*;
use lapin::options::*;

/// A table holding `depth - 1` tables nested one in another, as
/// amq-protocol values.
fn nested(depth: usize) -> FieldTable {
    let mut t = FieldTable::default();
    for _ in 1..depth {
        let mut outer = FieldTable::default();
        outer.insert("k".into(), AMQPValue::FieldTable(t));
        t = outer;
    }
    t
}

/// The same, encoded by hand (amq-protocol's encoder recurses too), with
/// its length first.
fn nested_bytes(depth: usize) -> Vec<u8> {
    let mut t = 0u32.to_be_bytes().to_vec();
    for _ in 1..depth {
        let mut outer = ((3 + t.len()) as u32).to_be_bytes().to_vec();
        outer.extend_from_slice(&[1, b'k', b'F']);
        outer.extend_from_slice(&t);
        t = outer;
    }
    t
}

/// queue.declare of `name` with `args` (encoded table bytes, length first).
fn declare_with_raw_args(channel: u16, name: &str, durable: bool, args: &[u8]) -> Vec<u8> {
    let mut a = vec![0, 0, name.len() as u8];
    a.extend_from_slice(name.as_bytes());
    a.push(if durable { 0b10 } else { 0 });
    a.extend_from_slice(args);
    raw::frame(raw::FRAME_METHOD, channel, &raw::method_payload(50, 10, &a))
}

/// basic.publish to the default exchange with `props` as the property list.
fn publish_with_props(channel: u16, key: &str, props: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = raw::basic_publish(channel, "", key, false, false);
    let mut h = vec![0, 60, 0, 0];
    h.extend_from_slice(&(body.len() as u64).to_be_bytes());
    h.extend_from_slice(props);
    out.extend(raw::frame(raw::FRAME_HEADER, channel, &h));
    out.extend(raw::body(channel, body));
    out
}

/// basic.get with no-ack; returns the content header's property bytes.
async fn get_props(r: &mut Raw, channel: u16, queue: &str) -> Option<Vec<u8>> {
    r.send(&raw::method(
        channel,
        AMQPClass::Basic(bm::AMQPMethod::Get(bm::Get {
            queue: queue.into(),
            no_ack: true,
        })),
    ))
    .await;
    let f = r.expect_frame().await;
    match f.method() {
        Some(AMQPClass::Basic(bm::AMQPMethod::GetOk(_))) => {}
        Some(AMQPClass::Basic(bm::AMQPMethod::GetEmpty(_))) => return None,
        other => panic!("expected get-ok, got {other:?}"),
    }
    let header: RawFrame = r.expect_frame().await;
    assert_eq!(header.kind, raw::FRAME_HEADER);
    let body_size = u64::from_be_bytes(header.payload[4..12].try_into().unwrap());
    if body_size > 0 {
        r.expect_frame().await;
    }
    Some(header.payload[12..].to_vec())
}

/// Properties: content-type "bad\xff" (not UTF-8), headers `headers`
/// (encoded, length first), delivery-mode 2, message-id "\xfe".
fn odd_props(headers: &[u8]) -> Vec<u8> {
    let flags: u16 = 1 << 15 | 1 << 13 | 1 << 12 | 1 << 7;
    let mut p = flags.to_be_bytes().to_vec();
    p.extend_from_slice(&[4, b'b', b'a', b'd', 0xff]);
    p.extend_from_slice(headers);
    p.push(2);
    p.extend_from_slice(&[1, 0xfe]);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_tables_deeper_than_64_levels_are_502() {
    let b = start().await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&declare_with_raw_args(
        1,
        "deep64",
        false,
        &nested_bytes(64),
    ))
    .await;
    let (_, m) = r.expect_method().await;
    assert!(
        matches!(m, AMQPClass::Queue(qm::AMQPMethod::DeclareOk(_))),
        "64 levels are fine: {m:?}"
    );
    r.send(&declare_with_raw_args(
        1,
        "deep65",
        false,
        &nested_bytes(65),
    ))
    .await;
    let close = r.expect_connection_close().await;
    assert_eq!(close.reply_code, 502, "{close:?}");
    assert_eq!((close.class_id, close.method_id), (50, 10));
    // Nested as deep as one 128 KiB frame allows: refused, nothing breaks.
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&declare_with_raw_args(
        1,
        "deeper",
        false,
        &nested_bytes(18_000),
    ))
    .await;
    assert_eq!(r.expect_connection_close().await.reply_code, 502);
    let c = b.connect().await;
    assert_connection_works(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_tables_deeper_than_64_levels_are_502_and_64_pass_intact() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "h").await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    let mut headers = nested_bytes(64);
    // Deep, and with a key that is not UTF-8 at the top.
    let extra = [1u8, 0xff, b't', 1];
    let n = u32::from_be_bytes(headers[..4].try_into().unwrap()) + extra.len() as u32;
    headers[..4].copy_from_slice(&n.to_be_bytes());
    headers.extend_from_slice(&extra);
    let props = odd_props(&headers);
    r.send(&publish_with_props(1, "h", &props, b"deep")).await;
    let got = get_props(&mut r, 1, "h").await.expect("delivered");
    assert_eq!(got, props, "the properties arrive as sent");
    r.send(&publish_with_props(
        1,
        "h",
        &odd_props(&nested_bytes(65)),
        b"x",
    ))
    .await;
    assert_eq!(r.expect_connection_close().await.reply_code, 502);
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&publish_with_props(
        1,
        "h",
        &odd_props(&nested_bytes(18_000)),
        b"x",
    ))
    .await;
    assert_eq!(r.expect_connection_close().await.reply_code, 502);
    assert_eq!(message_count(&ch, "h").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_message_keeps_its_odd_properties_and_stays_persistent() {
    let mut b = start().await;
    {
        let (_c, ch) = b.channel().await;
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        ch.queue_declare("dead".into(), durable, FieldTable::default())
            .await
            .unwrap();
        ch.queue_declare(
            "work".into(),
            durable,
            table(&[
                ("x-dead-letter-exchange", s("")),
                ("x-dead-letter-routing-key", s("dead")),
            ]),
        )
        .await
        .unwrap();
    }
    let mut headers = 0u32.to_be_bytes().to_vec();
    let entry = [3u8, b'a', 0xfe, b'z', b'S', 0, 0, 0, 1, 0xfd];
    headers[..4].copy_from_slice(&(entry.len() as u32).to_be_bytes());
    headers.extend_from_slice(&entry);
    let props = odd_props(&headers);
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&publish_with_props(1, "work", &props, b"odd")).await;
    // Reject it: it moves to "dead".
    r.send(&raw::method(
        1,
        AMQPClass::Basic(bm::AMQPMethod::Get(bm::Get {
            queue: "work".into(),
            no_ack: false,
        })),
    ))
    .await;
    let f = r.expect_frame().await;
    let Some(AMQPClass::Basic(bm::AMQPMethod::GetOk(ok))) = f.method() else {
        panic!("expected get-ok, got {f:?}");
    };
    r.expect_frame().await;
    r.expect_frame().await;
    r.send(&raw::method(
        1,
        AMQPClass::Basic(bm::AMQPMethod::Reject(bm::Reject {
            delivery_tag: ok.delivery_tag,
            requeue: false,
        })),
    ))
    .await;
    r.send(&raw::connection_close(200, "bye")).await;
    let _ = r.expect_method().await;
    drop(r);
    // Persistent still: it survives a restart.
    b.restart_when_unlocked().await;
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    let got = get_props(&mut r, 1, "dead")
        .await
        .expect("the dead-lettered copy survived the restart");
    let flags = u16::from_be_bytes([got[0], got[1]]);
    assert_eq!(flags, u16::from_be_bytes([props[0], props[1]]));
    // content-type, then headers: the original entry kept byte for byte.
    assert_eq!(&got[2..7], &props[2..7]);
    let h_len = u32::from_be_bytes(got[7..11].try_into().unwrap()) as usize;
    let h = &got[11..11 + h_len];
    assert!(
        h.windows(entry.len()).any(|w| w == entry),
        "original header kept"
    );
    assert!(h.windows(7).any(|w| w == b"x-death"), "x-death added");
    // delivery-mode and message-id follow the headers unchanged.
    assert_eq!(&got[11 + h_len..], &[2, 1, 0xfe]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bcc_is_stripped_from_odd_properties() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "to").await;
    declare(&ch, "hidden").await;
    let mut bcc = Vec::new();
    warren::wire::table::encode_value(
        &mut bcc,
        &AMQPValue::FieldArray(vec![AMQPValue::LongString("hidden".into())].into()),
    );
    let mut body = vec![3, b'B', b'C', b'C'];
    body.extend_from_slice(&bcc);
    let mut headers = (body.len() as u32).to_be_bytes().to_vec();
    headers.extend_from_slice(&body);
    let props = odd_props(&headers);
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    r.send(&publish_with_props(1, "to", &props, b"x")).await;
    for q in ["to", "hidden"] {
        let got = get_props(&mut r, 1, q)
            .await
            .expect("routed by key and BCC");
        assert_eq!(&got[2..7], &props[2..7], "content type kept");
        assert!(
            !got.windows(3).any(|w| w == b"BCC"),
            "BCC is not shown to anyone"
        );
        assert_eq!(&got[got.len() - 3..], &[2, 1, 0xfe]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_max_above_the_old_cap_and_a_deep_durable_argument() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    c.frame_max = 1 << 20;
    let b = start_with(c).await;
    let mut r = Raw::connect(b.addr).await;
    r.send(raw::HEADER_091).await;
    let t = r.start_and_tune("guest", "guest", true).await;
    assert_eq!(t.frame_max, 1 << 20);
    r.send(&raw::tune_ok(t.channel_max, t.frame_max, 0)).await;
    r.send(&raw::connection_open("/")).await;
    let (_, m) = r.expect_method().await;
    assert!(matches!(
        m,
        AMQPClass::Connection(conm::AMQPMethod::OpenOk(_))
    ));
    r.open_channel(1).await;
    // One 900 KiB body frame.
    let body = vec![7u8; 900 << 10];
    r.send(&raw::queue_declare(1, "big", false, false, false))
        .await;
    r.expect_method().await;
    r.send(&raw::publish_message(1, "", "big", &body)).await;
    let (_c, ch) = b.channel().await;
    assert_eq!(
        ch.basic_get("big".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .map(|m| m.delivery.data.len()),
        Some(900 << 10)
    );
    // A lapin-encoded argument 64 levels deep is accepted.
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-deep"),
        AMQPValue::FieldTable(nested(63)),
    );
    ch.queue_declare("deep".into(), QueueDeclareOptions::default(), args)
        .await
        .expect("64 levels");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_header_key_that_is_not_utf8_routes_through_a_headers_exchange() {
    // Found by fuzz/field_table: a 255-byte key of invalid UTF-8 read
    // lossily became 765 bytes, and amq-protocol's ShortString panicked.
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "hq").await;
    bind(
        &ch,
        "hq",
        "amq.headers",
        "",
        table(&[("x-match", s("any")), ("k", s("v"))]),
    )
    .await;
    let mut body = vec![255u8];
    body.extend(std::iter::repeat_n(0xffu8, 255));
    body.extend_from_slice(&[b'S', 0, 0, 0, 1, b'x']);
    body.extend_from_slice(&[1, b'k', b'S', 0, 0, 0, 1, b'v']);
    let mut headers = (body.len() as u32).to_be_bytes().to_vec();
    headers.extend_from_slice(&body);
    let props = odd_props(&headers);
    let mut r = Raw::open(b.addr).await;
    r.open_channel(1).await;
    let mut frames = raw::basic_publish(1, "amq.headers", "", false, false);
    let mut h = vec![0, 60, 0, 0];
    h.extend_from_slice(&1u64.to_be_bytes());
    h.extend_from_slice(&props);
    frames.extend(raw::frame(raw::FRAME_HEADER, 1, &h));
    frames.extend(raw::body(1, b"z"));
    r.send(&frames).await;
    assert_eq!(
        get_props(&mut r, 1, "hq").await,
        Some(props),
        "routed by k=v"
    );
}
