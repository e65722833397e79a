//! The wire format: cutting frames out of the read buffer (checking type,
//! size against frame_max and the frame-end octet) and writing frames into an
//! output buffer. Method payloads are parsed with amq-protocol, except for the
//! hot ones (basic.publish in, basic.deliver / ack out), which are done by
//! hand so that a message costs no allocation beyond its body.

use amq_protocol::frame::{gen_frame, AMQPFrame, WriteContext};
use amq_protocol::protocol::AMQPClass;
use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::error::ProtocolError;
use crate::wire::FieldReader;

pub const FRAME_METHOD: u8 = 1;
pub const FRAME_HEADER: u8 = 2;
pub const FRAME_BODY: u8 = 3;
pub const FRAME_HEARTBEAT: u8 = 8;
pub const FRAME_END: u8 = 0xCE;
/// Bytes of framing around a payload: type, channel, size, frame-end.
pub const FRAME_OVERHEAD: usize = 8;
pub use crate::wire::{put_short_str, FRAME_MIN_SIZE};
/// The most room reserved ahead for a frame still arriving; a larger one
/// grows the buffer as its bytes come.
const RESERVE_AHEAD_MAX: usize = 1 << 20;

/// One frame, its payload still raw (a slice of the read buffer, no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Method {
        channel: u16,
        payload: Bytes,
    },
    Header {
        channel: u16,
        payload: Bytes,
    },
    Body {
        channel: u16,
        payload: Bytes,
    },
    Heartbeat {
        channel: u16,
    },
    /// A whole publish cut at once: basic.publish, its content header and
    /// its body in at most one body frame, back to back on one channel.
    /// `raw` holds the three frames with their framing, so the message can
    /// keep one buffer; `header_at` and `body_at` are where the header and
    /// body frames start in it (no body frame for an empty body).
    Publish {
        channel: u16,
        raw: Bytes,
        header_at: usize,
        body_at: Option<usize>,
    },
}

/// The payloads of a `Frame::Publish`'s method, header and body frames,
/// sliced from its buffer.
pub fn publish_payloads(
    raw: &Bytes,
    header_at: usize,
    body_at: Option<usize>,
) -> (Bytes, Bytes, Option<Bytes>) {
    let payload = |at: usize, end: usize| raw.slice(at + 7..end - 1);
    let header_end = body_at.unwrap_or(raw.len());
    (
        payload(0, header_at),
        payload(header_at, header_end),
        body_at.map(|at| payload(at, raw.len())),
    )
}

impl Frame {
    /// The channel the frame was sent on.
    pub fn channel(&self) -> u16 {
        match self {
            Frame::Method { channel, .. }
            | Frame::Header { channel, .. }
            | Frame::Body { channel, .. }
            | Frame::Heartbeat { channel }
            | Frame::Publish { channel, .. } => *channel,
        }
    }
}

/// Cuts the next whole frame off `buf`. `Ok(None)`: more bytes are needed.
/// Errors are the connection-level 501 FRAME_ERROR cases.
pub fn decode(buf: &mut BytesMut, frame_max: u32) -> Result<Option<Frame>, ProtocolError> {
    if buf.len() < 7 {
        return Ok(None);
    }
    let kind = buf[0];
    let channel = u16::from_be_bytes([buf[1], buf[2]]);
    let size = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]);
    if !matches!(
        kind,
        FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT
    ) {
        // RabbitMQ's wording: the frame's type and payload as an Erlang binary.
        let payload = &buf[7..buf.len().min(7 + size as usize)];
        return Err(ProtocolError::frame_error(format!(
            "type {kind}, all octets = {}: unknown_frame",
            erlang_binary(payload)
        )));
    }
    // RabbitMQ allows a payload of up to frame_max octets (FRAME_SIZE_FUDGE),
    // although frame_max counts the framing too.
    if frame_max != 0 && size > frame_max {
        return Err(ProtocolError::frame_error(format!(
            "type {kind}, all octets = <<>>: {{frame_too_large,{size},{}}}",
            frame_max as usize - FRAME_OVERHEAD
        )));
    }
    let total = size as usize + FRAME_OVERHEAD;
    if buf.len() < total {
        // Room for what is announced, but not all of it up front: a header
        // may announce far more than ever arrives (with frame_max 0, 4 GiB).
        buf.reserve((total - buf.len()).min(RESERVE_AHEAD_MAX));
        return Ok(None);
    }
    if buf[total - 1] != FRAME_END {
        return Err(ProtocolError::frame_error(format!(
            "type {kind}, all octets = {}: {{invalid_frame_end_marker,{}}}",
            erlang_binary(&buf[7..total - 1]),
            buf[total - 1]
        )));
    }
    if kind == FRAME_METHOD && channel != 0 && is_basic_publish(&buf[7..total - 1]) {
        match publish_triple(buf, total, channel, frame_max) {
            Triple::Whole {
                len,
                header_at,
                body_at,
            } => {
                let raw = buf.split_to(len).freeze();
                return Ok(Some(Frame::Publish {
                    channel,
                    raw,
                    header_at,
                    body_at,
                }));
            }
            Triple::Wait(len) => {
                buf.reserve(len.saturating_sub(buf.len()).min(RESERVE_AHEAD_MAX));
                return Ok(None);
            }
            Triple::Apart => {}
        }
    }
    let mut frame = buf.split_to(total);
    frame.advance(7);
    frame.truncate(size as usize);
    let payload = frame.freeze();
    Ok(Some(match kind {
        FRAME_METHOD => Frame::Method { channel, payload },
        FRAME_HEADER => Frame::Header { channel, payload },
        FRAME_BODY => Frame::Body { channel, payload },
        _ => Frame::Heartbeat { channel },
    }))
}

/// What follows a basic.publish method frame in the buffer.
enum Triple {
    /// Its header and (at most one) body frame, whole: `len` bytes in all.
    Whole {
        len: usize,
        header_at: usize,
        body_at: Option<usize>,
    },
    /// So far consistent with that, but incomplete: wait for `len` bytes.
    Wait(usize),
    /// Anything else (another channel's frame, a body in several frames,
    /// a malformed frame): take the frames one at a time, as they come.
    Apart,
}

/// Whether a method payload is a well-formed basic.publish (a malformed one
/// is refused at once, as RabbitMQ decodes a method when it arrives).
fn is_basic_publish(payload: &[u8]) -> bool {
    let mut r = FieldReader::new(payload);
    r.take(4) == Some(&[0, 60, 0, 40][..])
        && r.u16().is_some()
        && r.short_str().is_some()
        && r.short_str().is_some()
        && r.u8().is_some()
        && r.remaining() == 0
}

/// Looks past the basic.publish method frame of `method_len` bytes at the
/// head of `buf` for its content, so that a publish is cut in one piece.
/// A publish is acted on only once its content is complete anyway (as in
/// RabbitMQ's command assembler), so waiting for it changes nothing a
/// client sees.
fn publish_triple(buf: &[u8], method_len: usize, channel: u16, frame_max: u32) -> Triple {
    if frame_max == 0 {
        return Triple::Apart;
    }
    let limit = frame_max as usize;
    // The frame at `at`: (type, channel, payload size), if its 7 octets are in.
    let head = |at: usize| -> Option<(u8, u16, usize)> {
        let h = buf.get(at..at + 7)?;
        let size = u32::from_be_bytes([h[3], h[4], h[5], h[6]]) as usize;
        Some((h[0], u16::from_be_bytes([h[1], h[2]]), size))
    };
    let header_at = method_len;
    let Some((kind, ch, size)) = head(header_at) else {
        return Triple::Wait(header_at + 7);
    };
    if kind != FRAME_HEADER || ch != channel || !(12..=limit).contains(&size) {
        return Triple::Apart;
    }
    let body_at = header_at + size + FRAME_OVERHEAD;
    let Some(header) = buf.get(header_at + 7..body_at) else {
        return Triple::Wait(body_at);
    };
    if header[size] != FRAME_END {
        return Triple::Apart;
    }
    let body_size = u64::from_be_bytes([
        header[4], header[5], header[6], header[7], header[8], header[9], header[10], header[11],
    ]);
    if body_size == 0 {
        return Triple::Whole {
            len: body_at,
            header_at,
            body_at: None,
        };
    }
    if body_size > limit as u64 {
        return Triple::Apart;
    }
    let end = body_at + body_size as usize + FRAME_OVERHEAD;
    let Some((kind, ch, size)) = head(body_at) else {
        return Triple::Wait(end);
    };
    if kind != FRAME_BODY || ch != channel || size as u64 != body_size {
        return Triple::Apart;
    }
    match buf.get(end - 1) {
        None => Triple::Wait(end),
        Some(&FRAME_END) => Triple::Whole {
            len: end,
            header_at,
            body_at: Some(body_at),
        },
        Some(_) => Triple::Apart,
    }
}

/// Class and method ids of a method payload.
pub fn method_ids(payload: &[u8]) -> Option<(u16, u16)> {
    if payload.len() < 4 {
        return None;
    }
    Some((
        u16::from_be_bytes([payload[0], payload[1]]),
        u16::from_be_bytes([payload[2], payload[3]]),
    ))
}

/// Where the field table of a method that carries one starts (the
/// arguments before it, from the AMQP 0-9-1 method definitions: `q` a
/// short integer, `s` a short string, `b` an octet). Every method with a
/// table is listed, those only a server sends too: amq-protocol parses
/// whatever arrives before the state machine can refuse it.
fn table_at(payload: &[u8]) -> Option<usize> {
    let (class, method) = method_ids(payload)?;
    let before: &[u8] = match (class, method) {
        (10, 10) => b"bb",               // connection.start (server-only, yet parsed)
        (10, 11) => b"",                 // connection.start-ok: client-properties
        (40, 10) => b"qssb",             // exchange.declare
        (40, 30) | (40, 40) => b"qsssb", // exchange.bind / unbind
        (50, 10) => b"qsb",              // queue.declare
        (50, 20) => b"qsssb",            // queue.bind
        (50, 50) => b"qsss",             // queue.unbind
        (60, 20) => b"qssb",             // basic.consume
        _ => return None,
    };
    let mut r = FieldReader::new(payload.get(4..)?);
    for kind in before {
        match kind {
            b'q' => r.u16().map(|_| ())?,
            b's' => r.short_str().map(|_| ())?,
            _ => r.u8().map(|_| ())?,
        }
    }
    Some(payload.len() - r.remaining())
}

/// Parses a method payload with amq-protocol. A field table in it is first
/// checked for depth without building anything (`wire::table`): one
/// nested deeper than `wire::MAX_DEPTH` is 502 SYNTAX_ERROR.
pub fn parse_method(payload: &[u8]) -> Result<AMQPClass, ProtocolError> {
    if let Some(at) = table_at(payload) {
        if crate::wire::table::check_table(&payload[at..]) == Err(crate::wire::TableError::TooDeep)
        {
            let (c, m) = method_ids(payload).unwrap_or((0, 0));
            return Err(ProtocolError::syntax_error(crate::wire::TableError::TooDeep).on(c, m));
        }
    }
    match amq_protocol::protocol::parse_class(payload) {
        Ok((&[], class)) => Ok(class),
        _ => {
            let (c, m) = method_ids(payload).unwrap_or((0, 0));
            if is_known_method(c, m) {
                // RabbitMQ: rabbit_misc:frame_error, "cannot decode ...".
                Err(ProtocolError::frame_error(format!(
                    "cannot decode {}",
                    erlang_binary(payload.get(4..).unwrap_or_default())
                ))
                .on(c, m))
            } else {
                Err(ProtocolError::command_invalid(format!("unknown method {c}.{m}")).on(c, m))
            }
        }
    }
}

fn is_known_method(class: u16, method: u16) -> bool {
    match class {
        10 => matches!(
            method,
            10 | 11 | 20 | 21 | 30 | 31 | 40 | 41 | 50 | 51 | 60 | 61
        ),
        20 => matches!(method, 10 | 11 | 20 | 21 | 40 | 41),
        30 => matches!(method, 10 | 11),
        40 => matches!(method, 10 | 11 | 20 | 21 | 30 | 31 | 40 | 51),
        50 => matches!(method, 10 | 11 | 20 | 21 | 30 | 31 | 40 | 41 | 50 | 51),
        60 => matches!(
            method,
            10 | 11
                | 20
                | 21
                | 30
                | 31
                | 40
                | 50
                | 60
                | 70
                | 71
                | 72
                | 80
                | 90
                | 100
                | 110
                | 111
                | 120
        ),
        85 => matches!(method, 10 | 11),
        90 => matches!(method, 10 | 11 | 20 | 21 | 30 | 31),
        _ => false,
    }
}

/// Bytes as Erlang prints a binary: `<<"text">>` when printable, else
/// `<<1,2,3>>`; long ones are cut (reply texts are short strings).
pub fn erlang_binary(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(64)];
    let more = if bytes.len() > shown.len() { "..." } else { "" };
    if shown.iter().all(|b| (32..127).contains(b)) {
        let text: String = shown
            .iter()
            .flat_map(|&b| match b {
                b'"' => vec!['\\', '"'],
                b'\\' => vec!['\\', '\\'],
                b => vec![b as char],
            })
            .collect();
        format!("<<\"{text}\"{more}>>")
    } else {
        let nums: Vec<String> = shown.iter().map(|b| b.to_string()).collect();
        format!("<<{}{more}>>", nums.join(","))
    }
}

/// Appends a method frame built by amq-protocol (control methods only).
pub fn put_method(out: &mut BytesMut, channel: u16, method: AMQPClass) {
    let frame = AMQPFrame::Method(channel, method);
    // Generation into a growable Vec cannot fail for well-formed values; a
    // failure would mean a string over 255 bytes built by us, so drop it.
    let generated = gen_frame(&frame)(WriteContext::from(Vec::with_capacity(64)));
    match generated {
        Ok(ctx) => out.extend_from_slice(&ctx.write),
        Err(_) => tracing::error!(?frame, "could not encode method frame"),
    }
}

/// Appends a heartbeat frame.
pub fn put_heartbeat(out: &mut BytesMut) {
    out.extend_from_slice(&[FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END]);
}

/// Starts a frame; returns the offset of its size field for `end_frame`.
pub fn begin_frame(out: &mut BytesMut, kind: u8, channel: u16) -> usize {
    out.put_u8(kind);
    out.put_u16(channel);
    let at = out.len();
    out.put_u32(0);
    at
}

/// Closes a frame begun with `begin_frame`: fills in its size, adds frame-end.
pub fn end_frame(out: &mut BytesMut, size_at: usize) {
    let size = (out.len() - size_at - 4) as u32;
    out[size_at..size_at + 4].copy_from_slice(&size.to_be_bytes());
    out.put_u8(FRAME_END);
}

/// Appends the content header and body frames of a message.
pub fn put_content(
    out: &mut BytesMut,
    channel: u16,
    properties: &[u8],
    body: &[u8],
    frame_max: u32,
) {
    let at = begin_frame(out, FRAME_HEADER, channel);
    out.put_u16(60);
    out.put_u16(0);
    out.put_u64(body.len() as u64);
    out.extend_from_slice(properties);
    end_frame(out, at);
    let chunk = (frame_max.max(FRAME_MIN_SIZE) as usize) - FRAME_OVERHEAD;
    for part in body.chunks(chunk) {
        out.put_u8(FRAME_BODY);
        out.put_u16(channel);
        out.put_u32(part.len() as u32);
        out.extend_from_slice(part);
        out.put_u8(FRAME_END);
    }
}

/// Appends basic.ack (publisher confirms).
pub fn put_basic_ack(out: &mut BytesMut, channel: u16, tag: u64, multiple: bool) {
    let at = begin_frame(out, FRAME_METHOD, channel);
    out.put_u16(60);
    out.put_u16(80);
    out.put_u64(tag);
    out.put_u8(multiple as u8);
    end_frame(out, at);
}

/// Appends basic.nack (publisher confirms).
pub fn put_basic_nack(out: &mut BytesMut, channel: u16, tag: u64, multiple: bool) {
    let at = begin_frame(out, FRAME_METHOD, channel);
    out.put_u16(60);
    out.put_u16(120);
    out.put_u64(tag);
    out.put_u8(multiple as u8);
    end_frame(out, at);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, channel: u16, payload: &[u8]) -> BytesMut {
        let mut b = BytesMut::new();
        b.put_u8(kind);
        b.put_u16(channel);
        b.put_u32(payload.len() as u32);
        b.extend_from_slice(payload);
        b.put_u8(FRAME_END);
        b
    }

    /// basic.publish to "" with key "q", then a header for `size` bytes.
    fn publish_frames(channel: u16, size: u64) -> BytesMut {
        let mut all = frame(FRAME_METHOD, channel, &[0, 60, 0, 40, 0, 0, 0, 1, b'q', 0]);
        let mut header = vec![0, 60, 0, 0];
        header.extend_from_slice(&size.to_be_bytes());
        header.extend_from_slice(&[0, 0]);
        all.extend_from_slice(&frame(FRAME_HEADER, channel, &header));
        all
    }

    #[test]
    fn a_whole_publish_is_cut_in_one_piece() {
        let mut all = publish_frames(1, 5);
        all.extend_from_slice(&frame(FRAME_BODY, 1, b"hello"));
        let total = all.len();
        // Any prefix: wait (nothing is cut).
        for cut in [18, 19, 25, 40, total - 1] {
            let mut buf = BytesMut::from(&all[..cut]);
            assert_eq!(decode(&mut buf, 4096), Ok(None), "prefix of {cut}");
            assert_eq!(buf.len(), cut);
        }
        let mut buf = all.clone();
        let Ok(Some(Frame::Publish {
            channel,
            raw,
            header_at,
            body_at,
        })) = decode(&mut buf, 4096)
        else {
            panic!("not cut whole");
        };
        assert!(buf.is_empty());
        assert_eq!(raw.len(), total);
        assert_eq!(channel, 1);
        let (m, h, b) = publish_payloads(&raw, header_at, body_at);
        assert_eq!(m[..4], [0, 60, 0, 40]);
        assert_eq!(h.len(), 14);
        assert_eq!(b.as_deref(), Some(&b"hello"[..]));
    }

    #[test]
    fn an_empty_body_has_no_body_frame() {
        let mut buf = publish_frames(1, 0);
        let Ok(Some(Frame::Publish { body_at, .. })) = decode(&mut buf, 4096) else {
            panic!("not cut whole");
        };
        assert_eq!(body_at, None);
    }

    #[test]
    fn other_shapes_are_cut_frame_by_frame() {
        // Another channel's frame in between.
        let mut buf = frame(FRAME_METHOD, 1, &[0, 60, 0, 40, 0, 0, 0, 1, b'q', 0]);
        buf.extend_from_slice(&frame(FRAME_HEARTBEAT, 0, b""));
        assert!(matches!(
            decode(&mut buf, 4096),
            Ok(Some(Frame::Method { .. }))
        ));
        // A body in two frames.
        let mut buf = publish_frames(1, 6);
        buf.extend_from_slice(&frame(FRAME_BODY, 1, b"abc"));
        buf.extend_from_slice(&frame(FRAME_BODY, 1, b"def"));
        assert!(matches!(
            decode(&mut buf, 4096),
            Ok(Some(Frame::Method { .. }))
        ));
        assert!(matches!(
            decode(&mut buf, 4096),
            Ok(Some(Frame::Header { .. }))
        ));
        // A header announcing more than one frame can carry.
        let mut buf = publish_frames(1, 10_000);
        assert!(matches!(
            decode(&mut buf, 4096),
            Ok(Some(Frame::Method { .. }))
        ));
        // A bad frame end on the header: its error comes from the usual path.
        let mut buf = publish_frames(1, 0);
        let last = buf.len() - 1;
        buf[last] = 0;
        assert!(matches!(
            decode(&mut buf, 4096),
            Ok(Some(Frame::Method { .. }))
        ));
        assert!(decode(&mut buf, 4096).is_err());
    }

    #[test]
    fn decodes_whole_frames_and_waits_for_partial_ones() {
        let mut all = frame(FRAME_BODY, 3, b"hello");
        all.extend_from_slice(&frame(FRAME_HEARTBEAT, 0, b""));
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&all[..6]);
        assert_eq!(decode(&mut buf, 4096), Ok(None));
        buf.extend_from_slice(&all[6..]);
        assert_eq!(
            decode(&mut buf, 4096),
            Ok(Some(Frame::Body {
                channel: 3,
                payload: Bytes::from_static(b"hello")
            }))
        );
        assert_eq!(
            decode(&mut buf, 4096),
            Ok(Some(Frame::Heartbeat { channel: 0 }))
        );
        assert_eq!(decode(&mut buf, 4096), Ok(None));
    }

    #[test]
    fn a_huge_announced_frame_reserves_little() {
        // Found by fuzz/frame_cutter: with frame_max 0 (no limit) a header
        // announcing 4 GiB made decode reserve 4 GiB at once.
        let mut b = BytesMut::from(&[8u8, 0, 0, 0xff, 0xff, 0xff, 0xff, 0][..]);
        assert_eq!(decode(&mut b, 0), Ok(None));
        assert!(b.capacity() <= RESERVE_AHEAD_MAX + 64);
    }

    #[test]
    fn rejects_bad_type_size_and_end() {
        let mut b = frame(7, 0, b"x");
        assert_eq!(decode(&mut b, 4096).unwrap_err().code, 501);
        let mut b = frame(FRAME_BODY, 1, &[0u8; 5000]);
        assert_eq!(decode(&mut b, 4096).unwrap_err().code, 501);
        let mut b = frame(FRAME_BODY, 1, b"abc");
        let n = b.len();
        b[n - 1] = 0;
        assert_eq!(decode(&mut b, 4096).unwrap_err().code, 501);
    }

    #[test]
    fn content_is_split_at_frame_max() {
        let mut out = BytesMut::new();
        let body = Bytes::from(vec![7u8; 10_000]);
        put_content(&mut out, 1, &[0, 0], &body, 4096);
        let mut n = 0;
        let mut body_len = 0;
        while let Some(f) = decode(&mut out, 4096).unwrap() {
            if let Frame::Body { payload, .. } = f {
                body_len += payload.len();
            }
            n += 1;
        }
        assert_eq!(n, 1 + 3);
        assert_eq!(body_len, 10_000);
    }

    #[test]
    fn a_deep_table_in_any_method_is_502_before_it_is_parsed() {
        // connection.start (which only servers send) with server properties
        // holding arrays in arrays 1000 deep: found in review; amq-protocol
        // would have recursed through them.
        let mut a = vec![0u8, 0, 0, 0];
        for _ in 0..1000 {
            let mut outer = ((a.len() + 1) as u32).to_be_bytes().to_vec();
            outer.push(b'A');
            outer.extend_from_slice(&a);
            a = outer;
        }
        let mut payload = vec![0, 10, 0, 10, 0, 9];
        payload.extend_from_slice(&((a.len() + 3) as u32).to_be_bytes());
        payload.extend_from_slice(&[1, b'k', b'A']);
        payload.extend_from_slice(&a);
        payload.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_method(&payload).unwrap_err().code, 502);
    }

    #[test]
    fn unknown_and_malformed_methods() {
        assert_eq!(parse_method(&[0, 99, 0, 1]).unwrap_err().code, 503);
        assert_eq!(parse_method(&[0, 50, 0, 10, 0]).unwrap_err().code, 501);
    }
}
