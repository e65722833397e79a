//! `Message`: what a publish carries, shared (`Arc`) by every queue it lands
//! in. Properties stay in their wire encoding and are re-sent verbatim on
//! delivery; `Meta` holds the few fields the broker itself reads.

use amq_protocol::protocol::basic::AMQPProperties;
use amq_protocol::types::{AMQPValue, FieldTable};
use bytes::Bytes;

use crate::wire::props::{self, Field};
use crate::wire::{table, TableError};

pub mod amqp10;
pub mod batch;

/// A published message, in one buffer: the route (exchange and routing key
/// as two short strings, as `basic.publish` carries them) at its start, the
/// property list and the body at recorded offsets, and whatever lies
/// between them (the framing of the frames they came in) ignored. A publish
/// cut from the read buffer in one piece keeps that piece (no copy); the
/// store's records have the same shape. Kept small (64 bytes, 80 with its
/// `Arc`): a backlog of a million small messages is mostly these.
#[derive(Debug, Clone)]
pub struct Message {
    raw: Bytes,
    props_at: u32,
    props_len: u32,
    /// The body runs from here to the end of `raw`.
    body_at: u32,
    /// Fields of the properties the broker acts on.
    pub meta: Meta,
}

/// Property fields the broker reads, decoded once at publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// 2 = persistent.
    pub delivery_mode: u8,
    /// 0-255; only priority queues look at it.
    pub priority: u8,
    /// Whether a headers table is present.
    pub has_headers: bool,
    /// Published over the stream protocol: its body is an AMQP 1.0
    /// message (amqp10.rs). Only that publish path sets it, so no AMQP
    /// 0-9-1 property list can pass for one.
    pub amqp10: bool,
    /// Per-message TTL in milliseconds; `NO_EXPIRATION` if none (a plain
    /// u64 rather than an Option keeps `Meta` at 16 bytes).
    expiration: u64,
}

const NO_EXPIRATION: u64 = u64::MAX;

impl Default for Meta {
    fn default() -> Self {
        Meta {
            delivery_mode: 0,
            priority: 0,
            has_headers: false,
            amqp10: false,
            expiration: NO_EXPIRATION,
        }
    }
}

impl Meta {
    /// The same with `delivery_mode` set.
    pub fn with_delivery_mode(self, delivery_mode: u8) -> Meta {
        Meta {
            delivery_mode,
            ..self
        }
    }

    /// The same, marked as an AMQP 1.0 message (the stream protocol's).
    pub fn as_amqp10(self) -> Meta {
        Meta {
            amqp10: true,
            ..self
        }
    }

    /// The same with `priority` set.
    pub fn with_priority(self, priority: u8) -> Meta {
        Meta { priority, ..self }
    }

    /// Per-message TTL from the `expiration` property, in milliseconds.
    pub fn expiration_ms(&self) -> Option<u64> {
        (self.expiration != NO_EXPIRATION).then_some(self.expiration)
    }

    /// Sets the per-message TTL (values past 584 million years are capped).
    pub fn set_expiration_ms(&mut self, ms: Option<u64>) {
        self.expiration = ms.map_or(NO_EXPIRATION, |ms| ms.min(NO_EXPIRATION - 1));
    }
}

/// The length of the route (two short strings) at the start of `raw`.
fn route_len(raw: &[u8]) -> Option<usize> {
    let ex = *raw.first()? as usize;
    let rk = *raw.get(1 + ex)? as usize;
    let len = 2 + ex + rk;
    (len <= raw.len()).then_some(len)
}

impl Message {
    /// About what a message held in memory costs beyond its body: the
    /// record, the Arc's counts, the buffer's shared header, and the
    /// exchange, routing key and properties kept with the body.
    pub const OVERHEAD: usize = std::mem::size_of::<Message>() + 16 + 32 + 64;

    /// A message published to `exchange` with `routing_key`, copied into
    /// one new buffer (names longer than 255 octets, which cannot come off
    /// the wire, are cut).
    pub fn new(
        exchange: &[u8],
        routing_key: &[u8],
        properties: &[u8],
        body: &[u8],
        meta: Meta,
    ) -> Message {
        let ex = &exchange[..exchange.len().min(255)];
        let rk = &routing_key[..routing_key.len().min(255)];
        let mut raw = Vec::with_capacity(2 + ex.len() + rk.len() + properties.len() + body.len());
        raw.push(ex.len() as u8);
        raw.extend_from_slice(ex);
        raw.push(rk.len() as u8);
        raw.extend_from_slice(rk);
        let props_at = raw.len();
        raw.extend_from_slice(properties);
        let body_at = raw.len();
        raw.extend_from_slice(body);
        Message {
            raw: Bytes::from(raw),
            props_at: props_at as u32,
            props_len: properties.len() as u32,
            body_at: body_at as u32,
            meta,
        }
    }

    /// A message kept in `raw` as it is: the route at its start, the
    /// properties at `props`, the body from `body_at` to the end. None if
    /// the parts do not fit that way.
    pub fn from_parts(
        raw: Bytes,
        props: std::ops::Range<usize>,
        body_at: usize,
        meta: Meta,
    ) -> Option<Message> {
        let route = route_len(&raw)?;
        let fits = route <= props.start
            && props.start <= props.end
            && props.end <= body_at
            && body_at <= raw.len()
            && u32::try_from(body_at).is_ok();
        fits.then(|| Message {
            raw,
            props_at: props.start as u32,
            props_len: props.len() as u32,
            body_at: body_at as u32,
            meta,
        })
    }

    /// The route: exchange and routing key as two short strings.
    fn route(&self) -> (&[u8], &[u8]) {
        let ex = self.raw.first().map_or(0, |&n| n as usize);
        let rk = self.raw.get(1 + ex).map_or(0, |&n| n as usize);
        (
            self.raw.get(1..1 + ex).unwrap_or_default(),
            self.raw.get(2 + ex..2 + ex + rk).unwrap_or_default(),
        )
    }

    /// The buffer the message lives in: messages that share it (one
    /// published message routed to several queues) are the same message.
    pub fn backing(&self) -> &Bytes {
        &self.raw
    }

    /// The exchange it was published to (as sent: a short string).
    pub fn exchange(&self) -> &[u8] {
        self.route().0
    }

    /// The routing key it was published with.
    pub fn routing_key(&self) -> &[u8] {
        self.route().1
    }

    /// The content-header property flags and list, as on the wire.
    pub fn properties(&self) -> &[u8] {
        let at = self.props_at as usize;
        self.raw
            .get(at..at + self.props_len as usize)
            .unwrap_or(&[0, 0])
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        self.raw.get(self.body_at as usize..).unwrap_or_default()
    }

    /// Whether the publisher asked for the message to survive a restart.
    pub fn persistent(&self) -> bool {
        self.meta.delivery_mode == 2
    }

    /// The exchange name as text (lossy for non-UTF-8 names).
    pub fn exchange_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.exchange())
    }

    /// The routing key as text (lossy for non-UTF-8 keys).
    pub fn routing_key_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.routing_key())
    }

    /// The full decoded properties (allocates: not for the hot path).
    /// A property amq-protocol cannot read (a short string that is not
    /// UTF-8) makes this the defaults: only for tests and diagnostics, never
    /// for building a message.
    pub fn decoded_properties(&self) -> AMQPProperties {
        amq_protocol::protocol::basic::parse_properties(self.properties())
            .map(|(_, p)| p)
            .unwrap_or_default()
    }

    /// The headers table as sent (its length first), if there is one.
    pub fn raw_headers(&self) -> Option<&[u8]> {
        if !self.meta.has_headers {
            return None;
        }
        props::headers(self.properties())
    }

    /// The headers table, decoded (allocates; only when headers are
    /// present; keys that are not UTF-8 are read lossily).
    pub fn headers(&self) -> Option<FieldTable> {
        table::decode_table(self.raw_headers()?)
    }

    /// A copy with header `key` set to `value`. Only the headers table is
    /// rewritten, and in it only that entry; every other property and
    /// header keeps the bytes the publisher sent (copies the body: not for
    /// the hot path).
    pub fn with_header(&self, key: &str, value: AMQPValue) -> Message {
        let mut v = Vec::new();
        table::encode_value(&mut v, &value);
        self.edit_headers(&[(key.as_bytes(), &v)], &[])
    }

    /// A copy without the header `key`, or None if it has none.
    pub fn without_header(&self, key: &str) -> Option<Message> {
        table::get(self.raw_headers()?, key.as_bytes())?;
        Some(self.edit_headers(&[], &[key.as_bytes()]))
    }

    /// A copy whose headers have `set` set and `remove` removed (see
    /// `wire::table::edit`).
    pub fn edit_headers(&self, set: &[(&[u8], &[u8])], remove: &[&[u8]]) -> Message {
        match props::edit_headers(self.properties(), set, remove) {
            Some(p) => self.with_properties(&p),
            // Cannot happen: the properties were checked at publish.
            None => self.clone(),
        }
    }

    /// A short-string property, if present (a flag test first: cheap when
    /// absent).
    pub fn short_property(&self, field: Field) -> Option<&[u8]> {
        let p = self.properties();
        let flags = u16::from_be_bytes([*p.first()?, *p.get(1)?]);
        if flags & field.flag() == 0 {
            return None;
        }
        props::short_str(p, field)
    }

    /// A copy with short-string property `field` set to `value`; every
    /// other property keeps its bytes (copies the body).
    pub fn with_short_property(&self, field: Field, value: &[u8]) -> Message {
        let value = &value[..value.len().min(255)];
        let mut encoded = Vec::with_capacity(value.len() + 1);
        encoded.push(value.len() as u8);
        encoded.extend_from_slice(value);
        match props::with_field(self.properties(), field, Some(&encoded)) {
            Some(p) => self.with_properties(&p),
            None => self.clone(),
        }
    }

    /// A copy with another (broker-encoded) property list (copies the body:
    /// not for the hot path).
    pub fn with_properties(&self, properties: &[u8]) -> Message {
        let meta = read_meta(properties).unwrap_or(self.meta);
        let (ex, rk) = self.route();
        Message::new(ex, rk, properties, self.body(), meta)
    }

    /// Approximate memory this message holds.
    pub fn size(&self) -> usize {
        self.raw.len()
    }
}

/// Encodes properties built by the broker (dead-lettering, plugins).
pub fn encode_properties(props: &AMQPProperties) -> Bytes {
    use amq_protocol::frame::WriteContext;
    match amq_protocol::protocol::basic::gen_properties(props)(WriteContext::from(
        Vec::with_capacity(64),
    )) {
        Ok(ctx) => Bytes::from(ctx.write),
        Err(_) => Bytes::from_static(&[0, 0]),
    }
}

/// Why a property list was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PropertiesError {
    /// The bytes do not form a property list.
    Malformed,
    /// The headers table nests deeper than `wire::MAX_DEPTH` (502).
    TooDeep,
    /// `expiration` is not a non-negative integer string (RabbitMQ: 406).
    BadExpiration(String),
}

/// Reads `Meta` out of encoded properties, checking that the list is well
/// formed (every field within bounds, the headers table checked by
/// `wire::table::check_table`), so that what is re-sent to consumers is
/// valid. Nothing is decoded but the fields the broker acts on.
pub fn read_meta(props: &[u8]) -> Result<Meta, PropertiesError> {
    meta_of(props, true)
}

/// `read_meta` for a stored record: a headers table nested deeper than
/// the wire now allows (an older version stored it) does not make the
/// record unreadable; such headers are kept as they are and read as
/// absent (`Message::headers` refuses to decode them).
pub fn read_meta_stored(props: &[u8]) -> Result<Meta, PropertiesError> {
    match read_meta(props) {
        Err(PropertiesError::TooDeep) => meta_of(props, false),
        other => other,
    }
}

fn meta_of(props: &[u8], check_headers: bool) -> Result<Meta, PropertiesError> {
    let mut meta = Meta::default();
    let mut expiration = None;
    props::walk(props, check_headers, |field, span| match field {
        Field::DeliveryMode => meta.delivery_mode = props.get(span.start).copied().unwrap_or(0),
        Field::Priority => meta.priority = props.get(span.start).copied().unwrap_or(0),
        Field::Headers => meta.has_headers = true,
        Field::Expiration => expiration = Some(span),
        _ => {}
    })
    .map_err(|e| match e {
        TableError::TooDeep => PropertiesError::TooDeep,
        TableError::Malformed => PropertiesError::Malformed,
    })?;
    if let Some(span) = expiration {
        let s = props.get(span.start + 1..span.end).unwrap_or_default();
        let text = std::str::from_utf8(s).map_err(|_| PropertiesError::Malformed)?;
        let ms = text
            .parse::<u64>()
            .map_err(|_| PropertiesError::BadExpiration(text.to_string()))?;
        meta.set_expiration_ms(Some(ms));
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::{AMQPValue, ShortString};

    #[test]
    fn reads_meta_from_encoded_properties() {
        let mut headers = FieldTable::default();
        headers.insert(ShortString::from("a"), AMQPValue::LongInt(1));
        let props = AMQPProperties::default()
            .with_content_type("text/plain".into())
            .with_headers(headers)
            .with_delivery_mode(2)
            .with_priority(5)
            .with_expiration("1500".into())
            .with_timestamp(7)
            .with_app_id("x".into());
        let bytes = encode_properties(&props);
        let meta = read_meta(&bytes).unwrap();
        assert_eq!(meta.delivery_mode, 2);
        assert_eq!(meta.priority, 5);
        assert_eq!(meta.expiration_ms(), Some(1500));
        assert!(meta.has_headers);
    }

    #[test]
    fn message_is_small() {
        assert_eq!(std::mem::size_of::<Meta>(), 16);
        assert_eq!(std::mem::size_of::<Message>(), 64);
    }

    #[test]
    fn parts_round_trip_and_bad_layouts_are_refused() {
        let m = Message::new(b"ex", b"a.b", &[0, 0], b"body", Meta::default());
        assert_eq!(m.exchange(), b"ex");
        assert_eq!(m.routing_key(), b"a.b");
        assert_eq!(m.properties(), &[0, 0]);
        assert_eq!(m.body(), b"body");
        // Route, a gap, properties, a gap, body.
        let raw = Bytes::from_static(&[1, b'x', 1, b'k', 9, 0, 0, 9, 9, b'b']);
        let m = Message::from_parts(raw.clone(), 5..7, 9, Meta::default()).unwrap();
        assert_eq!((m.exchange(), m.routing_key()), (&b"x"[..], &b"k"[..]));
        assert_eq!((m.properties(), m.body()), (&[0u8, 0][..], &b"b"[..]));
        assert!(Message::from_parts(raw.clone(), 3..7, 9, Meta::default()).is_none());
        assert!(Message::from_parts(raw.clone(), 5..7, 11, Meta::default()).is_none());
        assert!(Message::from_parts(raw, 5..8, 7, Meta::default()).is_none());
        for bad in [&b""[..], &[0], &[3, b'a'], &[0, 1]] {
            let raw = Bytes::copy_from_slice(bad);
            assert!(Message::from_parts(raw, 0..0, 0, Meta::default()).is_none());
        }
    }

    #[test]
    fn a_stored_record_with_headers_deeper_than_allowed_still_reads() {
        // An older version stored headers of any depth; they must not stop
        // recovery now: read as absent, kept as they are.
        let mut t = vec![0u8, 0, 0, 0];
        for _ in 0..100 {
            let mut outer = ((3 + t.len()) as u32).to_be_bytes().to_vec();
            outer.extend_from_slice(&[1, b'k', b'F']);
            outer.extend_from_slice(&t);
            t = outer;
        }
        let mut props = (HEADERS_FLAG | DELIVERY_FLAG).to_be_bytes().to_vec();
        props.extend_from_slice(&t);
        props.push(2);
        assert_eq!(read_meta(&props), Err(PropertiesError::TooDeep));
        let meta = read_meta_stored(&props).unwrap();
        assert_eq!(meta.delivery_mode, 2);
        let m = Message::new(b"", b"q", &props, b"x", meta);
        assert!(m.headers().is_none());
        assert_eq!(m.properties(), &props[..]);
    }

    const HEADERS_FLAG: u16 = 1 << 13;
    const DELIVERY_FLAG: u16 = 1 << 12;

    #[test]
    fn empty_properties() {
        assert_eq!(read_meta(&[0, 0]), Ok(Meta::default()));
    }

    #[test]
    fn refuses_truncated_and_trailing_bytes() {
        let bytes = encode_properties(&AMQPProperties::default().with_content_type("abc".into()));
        assert_eq!(
            read_meta(&bytes[..bytes.len() - 1]),
            Err(PropertiesError::Malformed)
        );
        let mut long = bytes.to_vec();
        long.push(0);
        assert_eq!(read_meta(&long), Err(PropertiesError::Malformed));
    }

    #[test]
    fn refuses_bad_expiration() {
        let bytes = encode_properties(&AMQPProperties::default().with_expiration("soon".into()));
        assert_eq!(
            read_meta(&bytes),
            Err(PropertiesError::BadExpiration("soon".into()))
        );
    }
}
