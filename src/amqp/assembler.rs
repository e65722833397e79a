//! Publish assembly: `basic.publish` -> content header -> body frames, the
//! state machine of RabbitMQ's `rabbit_command_assembler`. A body that comes
//! in one frame is kept as that frame's buffer (no copy); one that comes in
//! several is gathered into one buffer.

use bytes::{Bytes, BytesMut};

use super::error::ProtocolError;
use crate::message::{read_meta, Message, Meta, PropertiesError};
use crate::wire::FieldReader;

/// The fields of `basic.publish` the broker needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub exchange: Bytes,
    pub routing_key: Bytes,
    /// Exchange and routing key as the frame has them (two short strings).
    pub route: Bytes,
    pub mandatory: bool,
    pub immediate: bool,
}

/// Parses a `basic.publish` payload (class and method ids included) without
/// allocating: exchange and routing key stay slices of the frame.
pub fn parse_publish(payload: &Bytes) -> Option<Publish> {
    let mut r = FieldReader::new(payload);
    r.take(4)?; // class, method
    r.u16()?; // reserved-1 (ticket)
    let ex = r.short_str()?.len();
    let rk = r.short_str()?.len();
    let bits = r.u8()?;
    if r.remaining() != 0 {
        return None;
    }
    let ex_at = 4 + 2 + 1;
    let rk_at = ex_at + ex + 1;
    Some(Publish {
        exchange: payload.slice(ex_at..ex_at + ex),
        routing_key: payload.slice(rk_at..rk_at + rk),
        route: payload.slice(ex_at - 1..rk_at + rk),
        mandatory: bits & 1 != 0,
        immediate: bits & 2 != 0,
    })
}

/// A body is gathered in a buffer that grows as frames arrive; at most
/// this much is reserved up front (a header may announce 128 MiB and send
/// one byte).
const PREALLOCATE_MAX: usize = 1 << 20;

/// RabbitMQ's texts for frames out of order (rabbit_command_assembler).
pub const NOT_METHOD: &str = "expected method frame, got non method frame instead";
pub const NOT_HEADER: &str =
    "expected content header for class 60, got non content header frame instead";
pub const NOT_BODY: &str = "expected content body, got non content body frame instead";

/// Where a channel is in receiving a message.
#[derive(Debug, Default)]
pub enum Assembler {
    /// Expecting a method.
    #[default]
    Idle,
    /// Got basic.publish, expecting the content header.
    Header(Publish),
    /// Got the header, expecting `remaining` more body bytes.
    Body {
        publish: Publish,
        properties: Bytes,
        meta: Meta,
        size: usize,
        parts: Body,
    },
}

/// The body gathered so far.
#[derive(Debug, Default)]
pub enum Body {
    #[default]
    Empty,
    One(Bytes),
    /// Several frames, gathered after a copy of the route and properties,
    /// so the message is this one buffer; the body starts at `body_at`.
    Many {
        buf: BytesMut,
        body_at: usize,
    },
}

/// What feeding a frame produced.
// Returned by value once per message and never stored: boxing the message
// would cost an allocation per publish for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Step {
    /// More frames are needed.
    More,
    /// A whole message.
    Done(Publish, Message),
}

/// Errors of assembly that close only the channel (soft) carry their code;
/// the others are the hard 505/501 cases.
impl Assembler {
    /// Whether a publish is in progress (a method now is an error).
    pub fn is_busy(&self) -> bool {
        !matches!(self, Assembler::Idle)
    }

    /// The error for a method frame that arrived mid-publish.
    pub fn interrupted(&self) -> ProtocolError {
        let text = match self {
            Assembler::Body { .. } => NOT_BODY,
            _ => NOT_HEADER,
        };
        ProtocolError::unexpected_frame(text).on(60, 40)
    }

    /// Starts a publish.
    pub fn start(&mut self, publish: Publish) {
        *self = Assembler::Header(publish);
    }

    /// Feeds a content header frame. `span`, if given, is a buffer every
    /// frame of this publish is a slice of (see `Frame::Publish`).
    pub fn header(
        &mut self,
        payload: &Bytes,
        max_size: u64,
        span: Option<&Bytes>,
    ) -> Result<Step, ProtocolError> {
        let publish = match std::mem::take(self) {
            Assembler::Header(p) => p,
            Assembler::Idle => return Err(ProtocolError::unexpected_frame(NOT_METHOD)),
            body @ Assembler::Body { .. } => {
                *self = body;
                return Err(ProtocolError::unexpected_frame(NOT_BODY).on(60, 40));
            }
        };
        let mut r = FieldReader::new(payload);
        let (class, _weight, size) = match (r.u16(), r.u16(), r.u64()) {
            (Some(c), Some(w), Some(s)) => (c, w, s),
            _ => return Err(ProtocolError::frame_error("malformed content header").on(60, 40)),
        };
        if class != 60 {
            return Err(ProtocolError::unexpected_frame(format!(
                "content header for class {class}, expected 60"
            )));
        }
        let properties = payload.slice(12..);
        let meta = match read_meta(&properties) {
            Ok(m) => m,
            Err(PropertiesError::Malformed) => {
                return Err(
                    ProtocolError::frame_error("malformed content header properties").on(60, 40),
                )
            }
            Err(PropertiesError::TooDeep) => {
                return Err(ProtocolError::syntax_error(format!(
                    "content header headers: {}",
                    crate::wire::TableError::TooDeep
                ))
                .on(60, 40))
            }
            Err(PropertiesError::BadExpiration(v)) => {
                return Err(
                    ProtocolError::precondition_failed(format!("invalid expiration '{v}'"))
                        .on(60, 40),
                )
            }
        };
        if size > max_size {
            return Err(ProtocolError::precondition_failed(format!(
                "message size {size} is larger than configured max size {max_size}"
            ))
            .on(60, 40));
        }
        let size = size as usize;
        let body = Assembler::Body {
            publish,
            properties,
            meta,
            size,
            parts: Body::Empty,
        };
        if size == 0 {
            *self = body;
            return Ok(self.finish(span));
        }
        *self = body;
        Ok(Step::More)
    }

    /// Feeds a body frame (`span` as for `header`).
    pub fn body(&mut self, payload: Bytes, span: Option<&Bytes>) -> Result<Step, ProtocolError> {
        let len = payload.len();
        let (publish, properties, size, parts) = match self {
            Assembler::Body {
                publish,
                properties,
                size,
                parts,
                ..
            } => (publish, properties, size, parts),
            Assembler::Idle => return Err(ProtocolError::unexpected_frame(NOT_METHOD)),
            Assembler::Header(_) => {
                return Err(ProtocolError::unexpected_frame(NOT_HEADER).on(60, 40))
            }
        };
        let have = match parts {
            Body::Empty => 0,
            Body::One(b) => b.len(),
            Body::Many { buf, body_at } => buf.len() - *body_at,
        };
        if have + len > *size {
            return Err(ProtocolError::frame_error(format!(
                "content body of {} bytes exceeds the {size} declared in the header",
                have + len
            )));
        }
        let gather = |first: &[u8]| {
            let head = publish.route.len() + properties.len();
            let mut buf = BytesMut::with_capacity(head + (*size).min(PREALLOCATE_MAX));
            buf.extend_from_slice(&publish.route);
            buf.extend_from_slice(properties);
            buf.extend_from_slice(first);
            Body::Many { buf, body_at: head }
        };
        *parts = match std::mem::take(parts) {
            Body::Empty if len == *size => Body::One(payload),
            Body::Empty => gather(&payload),
            Body::One(first) => {
                let mut b = gather(&first);
                if let Body::Many { buf, .. } = &mut b {
                    buf.extend_from_slice(&payload);
                }
                b
            }
            Body::Many { mut buf, body_at } => {
                buf.extend_from_slice(&payload);
                Body::Many { buf, body_at }
            }
        };
        if have + len == *size {
            return Ok(self.finish(span));
        }
        Ok(Step::More)
    }

    /// The whole message, in one buffer: the span its frames came in
    /// (no copy), the gathered buffer of a many-frame body, or else a copy.
    fn finish(&mut self, span: Option<&Bytes>) -> Step {
        let Assembler::Body {
            publish,
            properties,
            meta,
            parts,
            ..
        } = std::mem::take(self)
        else {
            return Step::More;
        };
        let copy = |body: &[u8]| {
            Message::new(
                &publish.exchange,
                &publish.routing_key,
                &properties,
                body,
                meta,
            )
        };
        let msg = match parts {
            Body::Many { buf, body_at } => {
                let buf = buf.freeze();
                let props = publish.route.len()..body_at;
                Message::from_parts(buf.clone(), props, body_at, meta)
                    .unwrap_or_else(|| copy(buf.get(body_at..).unwrap_or_default()))
            }
            Body::Empty => span
                .and_then(|s| in_span(s, &publish.route, &properties, &[], meta))
                .unwrap_or_else(|| copy(&[])),
            Body::One(body) => span
                .and_then(|s| in_span(s, &publish.route, &properties, &body, meta))
                .unwrap_or_else(|| copy(&body)),
        };
        Step::Done(publish, msg)
    }
}

/// The message as a slice of `span`, if route, properties and body all lie
/// in it in that order (they do when the publish was cut in one piece).
fn in_span(span: &Bytes, route: &[u8], props: &[u8], body: &[u8], meta: Meta) -> Option<Message> {
    let base = span.as_ptr() as usize;
    let at = |part: &[u8]| {
        let p = part.as_ptr() as usize;
        (p >= base && p + part.len() <= base + span.len()).then(|| p - base)
    };
    let r = at(route)?;
    let p = at(props)?;
    let (b, end) = if body.is_empty() {
        (p + props.len(), p + props.len())
    } else {
        let b = at(body)?;
        (b, b + body.len())
    };
    if r > p || p + props.len() > b {
        return None;
    }
    Message::from_parts(span.slice(r..end), p - r..p - r + props.len(), b - r, meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn publish_payload(ex: &str, rk: &str, bits: u8) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u16(60);
        b.put_u16(40);
        b.put_u16(0);
        b.put_u8(ex.len() as u8);
        b.extend_from_slice(ex.as_bytes());
        b.put_u8(rk.len() as u8);
        b.extend_from_slice(rk.as_bytes());
        b.put_u8(bits);
        b.freeze()
    }

    fn header(size: u64) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u16(60);
        b.put_u16(0);
        b.put_u64(size);
        b.put_u16(0);
        b.freeze()
    }

    #[test]
    fn parses_publish() {
        let p = parse_publish(&publish_payload("amq.topic", "a.b", 1)).unwrap();
        assert_eq!(&p.exchange[..], b"amq.topic");
        assert_eq!(&p.routing_key[..], b"a.b");
        assert!(p.mandatory && !p.immediate);
        assert!(parse_publish(&Bytes::from_static(&[0, 60, 0, 40, 0])).is_none());
    }

    #[test]
    fn assembles_multi_frame_body() {
        let mut a = Assembler::default();
        a.start(parse_publish(&publish_payload("", "q", 0)).unwrap());
        assert!(matches!(
            a.header(&header(6), 1 << 20, None),
            Ok(Step::More)
        ));
        assert!(matches!(
            a.body(Bytes::from_static(b"abc"), None),
            Ok(Step::More)
        ));
        match a.body(Bytes::from_static(b"def"), None) {
            Ok(Step::Done(_, m)) => assert_eq!(m.body(), b"abcdef"),
            other => panic!("{other:?}"),
        }
        assert!(!a.is_busy());
    }

    #[test]
    fn empty_body_completes_at_header() {
        let mut a = Assembler::default();
        a.start(parse_publish(&publish_payload("", "q", 0)).unwrap());
        assert!(matches!(a.header(&header(0), 10, None), Ok(Step::Done(..))));
    }

    #[test]
    fn out_of_order_frames_are_unexpected() {
        let mut a = Assembler::default();
        assert_eq!(a.header(&header(1), 10, None).unwrap_err().code, 505);
        assert_eq!(
            a.body(Bytes::from_static(b"x"), None).unwrap_err().code,
            505
        );
    }

    #[test]
    fn body_longer_than_declared_and_oversized() {
        let mut a = Assembler::default();
        a.start(parse_publish(&publish_payload("", "q", 0)).unwrap());
        a.header(&header(2), 10, None).unwrap();
        assert_eq!(
            a.body(Bytes::from_static(b"abc"), None).unwrap_err().code,
            501
        );
        let mut a = Assembler::default();
        a.start(parse_publish(&publish_payload("", "q", 0)).unwrap());
        assert_eq!(a.header(&header(11), 10, None).unwrap_err().code, 406);
    }
}
