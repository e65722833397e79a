//! The stream protocol's fuzz targets: a whole connection's bytes into
//! the stream listener of a broker in this process, and a publisher's
//! AMQP 1.0 message bytes through what the broker reads of them.

use std::sync::{Arc, OnceLock};

use bytes::{BufMut, BytesMut};

use super::{harness_with, talk, Harness};
use crate::message::{amqp10, Message, Meta};
use crate::queue::stream::filter::Filter;

static STREAM_HARNESS: OnceLock<Harness> = OnceLock::new();

/// A frame of `key` (version 1) with `fields`, as a client sends it.
fn frame(key: u16, fields: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + fields.len());
    f.put_u32(4 + fields.len() as u32);
    f.put_u16(key);
    f.put_u16(1);
    f.extend_from_slice(fields);
    f
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.put_u16(s.len() as u16);
    out.extend_from_slice(s.as_bytes());
}

/// A good opening as guest on "/": peer properties, SASL PLAIN, the
/// client's tune (no heartbeat) and open.
fn opening() -> Vec<u8> {
    use crate::stream_protocol::codes::{
        OPEN, PEER_PROPERTIES, SASL_AUTHENTICATE, SASL_HANDSHAKE, TUNE,
    };
    let mut out = Vec::new();
    let mut f = Vec::new();
    f.put_u32(1);
    f.put_u32(1);
    string(&mut f, "product");
    string(&mut f, "fuzz");
    out.extend(frame(PEER_PROPERTIES, &f));
    out.extend(frame(SASL_HANDSHAKE, &2u32.to_be_bytes()));
    let mut f = Vec::new();
    f.put_u32(3);
    string(&mut f, "PLAIN");
    let plain = b"\0guest\0guest";
    f.put_u32(plain.len() as u32);
    f.extend_from_slice(plain);
    out.extend(frame(SASL_AUTHENTICATE, &f));
    let mut f = Vec::new();
    f.put_u32(1 << 20);
    f.put_u32(0);
    out.extend(frame(TUNE, &f));
    let mut f = Vec::new();
    f.put_u32(4);
    string(&mut f, "/");
    out.extend(frame(OPEN, &f));
    out
}

/// Sends `data` on a stream protocol connection to a broker in this
/// process: after a good opening when the first octet is even, from the
/// first byte on when odd. The broker must not panic (a fuzz target
/// aborts on any panic, a connection task's included) and the listener
/// must still take connections.
pub fn stream_connection(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let h = harness_with(&STREAM_HARNESS, "stream", true);
    let Some(addr) = h.stream_addr else {
        return;
    };
    let mut bytes = if pick % 2 == 0 { opening() } else { Vec::new() };
    bytes.extend_from_slice(rest);
    talk(h, addr, &bytes);
}

/// Reads `data` as a stream protocol publisher's message (an AMQP 1.0
/// message, stored as it came): as an AMQP 0-9-1 reader of the stream
/// gets it, as a filtered reader tests it, and written back as AMQP 1.0
/// for a reader over the stream protocol. The first octet, if below 64,
/// is the length of a filter label taken from the start of the rest. No
/// bytes may panic; what the reads make must read back.
pub fn amqp10_message(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let (label, body) = match usize::from(pick) {
        n if n < 64 && n <= rest.len() => (Some(&rest[..n]), &rest[n..]),
        _ => (None, rest),
    };
    let mut props = Vec::new();
    let props = match label {
        Some(l) => {
            amqp10::stored_props_with(l, &mut props);
            &props[..]
        }
        None => amqp10::STORED_PROPS,
    };
    let mut meta = Meta::default().with_delivery_mode(2).as_amqp10();
    meta.has_headers = true;
    let msg = Arc::new(Message::new(b"", b"fuzz", props, body, meta));
    assert!(amqp10::is_amqp10(&msg), "a stored list is recognised");
    if let Some(f) = Filter::of_values(vec![b"a".to_vec()], true) {
        let _ = f.matches(&msg);
    }
    let read = amqp10::readable(Arc::clone(&msg), 7);
    assert!(
        !amqp10::is_amqp10(&read),
        "the 0-9-1 form is not taken for 1.0"
    );
    assert!(
        crate::wire::props::layout(read.properties()).is_ok(),
        "the 0-9-1 form's properties read back"
    );
    let mut out = BytesMut::new();
    amqp10::encode_091(&read, &[b"x-stream-offset"], &mut out);
    let again = Message::new(b"", b"fuzz", amqp10::STORED_PROPS, &out, meta);
    let _ = amqp10::to_091(&again, 8);
}
