//! Reading an AMQP 1.0 message (a stream protocol publisher's) as AMQP
//! 0-9-1, for the readers that speak it: an AMQP consumer of the stream,
//! the HTTP API's get. The mapping is RabbitMQ's (3.13):
//!
//! - header: `durable` makes delivery mode 2 (else 1), `priority` the
//!   priority, `ttl` the expiration; without a header, the
//!   `x-basic-delivery-mode`, `x-basic-priority` and `x-basic-expiration`
//!   message annotations stand in;
//! - properties: message-id and correlation-id (a string up to 255
//!   octets as it is, a ulong in decimal, a uuid as `urn:uuid:...`, a
//!   binary or longer string in an `x-message-id` / `x-correlation-id`
//!   header instead), user-id, reply-to, content-type, content-encoding,
//!   creation-time (in seconds), group-id as app-id (else the
//!   `x-basic-app-id` annotation); `x-basic-type` is the type;
//! - application properties become headers, and so do the message
//!   annotations whose keys start `x-` (but the `x-basic-*` ones above);
//! - the body is the data sections' bytes; a body of `amqp-value` or
//!   `amqp-sequence` sections is handed over as those sections' AMQP 1.0
//!   encoding, typed `amqp-1.0`, as is a message that cannot be read as
//!   AMQP 1.0 at all (its whole bytes).
//!
//! Values nested deeper than `types::MAX_DEPTH` are left out; bytes that
//! do not read as AMQP 1.0 are handed over whole (typed `amqp-1.0`).

use amq_protocol::protocol::basic::AMQPProperties;
use amq_protocol::types::{AMQPValue, ByteArray, FieldArray, FieldTable, LongString, ShortString};

use super::types::{Bad, Cursor, Seq, MAX_DEPTH, R, V};
use crate::message::{encode_properties, read_meta, Message};

/// The type an undecodable or non-data body is handed over with.
const RAW_TYPE: &str = "amqp-1.0";

/// A described section's code (a ulong descriptor, or its symbolic name).
fn section_code(descriptor: V<'_>) -> Option<u64> {
    const NAMES: [&[u8]; 9] = [
        b"amqp:header:list",
        b"amqp:delivery-annotations:map",
        b"amqp:message-annotations:map",
        b"amqp:properties:list",
        b"amqp:application-properties:map",
        b"amqp:data:binary",
        b"amqp:amqp-sequence:list",
        b"amqp:amqp-value:*",
        b"amqp:footer:map",
    ];
    match descriptor {
        V::ULong(n) => Some(n),
        V::Sym(name) => NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| 0x70 + i as u64),
        _ => None,
    }
}

/// An AMQP 1.0 value as a 0-9-1 header value; None for what 0-9-1 has
/// no type for (decimals, values nested too deep).
fn to_field(v: V<'_>, depth: usize, budget: &mut usize) -> Option<AMQPValue> {
    if depth > MAX_DEPTH || *budget == 0 {
        return None;
    }
    *budget -= 1;
    Some(match v {
        V::Null => AMQPValue::Void,
        V::Bool(b) => AMQPValue::Boolean(b),
        V::UByte(n) => AMQPValue::ShortShortUInt(n),
        V::Byte(n) => AMQPValue::ShortShortInt(n),
        V::UShort(n) => AMQPValue::ShortUInt(n),
        V::Short(n) => AMQPValue::ShortInt(n),
        V::UInt(n) => AMQPValue::LongUInt(n),
        V::Int(n) => AMQPValue::LongInt(n),
        V::ULong(n) => AMQPValue::LongLongInt(n as i64),
        V::Long(n) => AMQPValue::LongLongInt(n),
        V::Float(f) => AMQPValue::Float(f),
        V::Double(f) => AMQPValue::Double(f),
        V::Char(c) => {
            let c = char::from_u32(c)?;
            AMQPValue::LongString(LongString::from(c.to_string().into_bytes()))
        }
        V::Timestamp(ms) => AMQPValue::Timestamp((ms.max(0) / 1000) as u64),
        V::Uuid(u) => AMQPValue::LongString(LongString::from(urn(&u).into_bytes())),
        V::Decimal => return None,
        V::Bin(b) => AMQPValue::ByteArray(ByteArray::from(b)),
        V::Str(s) | V::Sym(s) => AMQPValue::LongString(LongString::from(s.to_vec())),
        V::List(seq) | V::Array(seq) => {
            let mut out = FieldArray::default();
            for item in seq.items(depth + 1) {
                if *budget == 0 {
                    break;
                }
                if let Some(v) = item.ok().and_then(|v| to_field(v, depth + 1, budget)) {
                    out.push(v);
                }
            }
            AMQPValue::FieldArray(out)
        }
        V::Map(seq) => {
            let mut out = FieldTable::default();
            for (k, v) in seq.pairs(depth + 1).map_while(Result::ok) {
                if *budget == 0 {
                    break;
                }
                if let (Some(k), Some(v)) = (key(k), to_field(v, depth + 1, budget)) {
                    out.insert(k, v);
                }
            }
            AMQPValue::FieldTable(out)
        }
        V::Described(inner) => {
            let mut c = Cursor { b: inner };
            return to_field(c.value(depth + 1).ok()?, depth + 1, budget);
        }
    })
}

/// A map key as a 0-9-1 header name (a string or symbol of 255 octets
/// at most).
fn key(k: V<'_>) -> Option<ShortString> {
    match k {
        V::Str(s) | V::Sym(s) => short(s),
        _ => None,
    }
}

/// A short string, if `b` is UTF-8 of 255 octets at most.
fn short(b: &[u8]) -> Option<ShortString> {
    let s = std::str::from_utf8(b).ok()?;
    (s.len() <= 255).then(|| ShortString::from(s))
}

fn urn(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A message-id or correlation-id: the property, or (for what a short
/// string cannot hold) the header `header` instead.
fn id(v: V<'_>, header: &str, headers: &mut FieldTable) -> Option<ShortString> {
    match v {
        V::Str(s) => match short(s) {
            Some(s) => return Some(s),
            None => {
                headers.insert(
                    ShortString::from(header),
                    AMQPValue::LongString(LongString::from(s.to_vec())),
                );
            }
        },
        V::ULong(n) => return Some(ShortString::from(n.to_string())),
        V::Uuid(u) => return Some(ShortString::from(urn(&u))),
        V::Bin(b) => {
            headers.insert(
                ShortString::from(header),
                AMQPValue::ByteArray(ByteArray::from(b)),
            );
        }
        _ => {}
    }
    None
}

/// The sections of a message, as read.
#[derive(Default)]
struct Sections<'a> {
    header: Option<Seq<'a>>,
    annotations: Option<Seq<'a>>,
    properties: Option<Seq<'a>>,
    application: Option<Seq<'a>>,
    data: Vec<&'a [u8]>,
    /// Where the first amqp-value or amqp-sequence section starts: the
    /// body from there on is handed over encoded.
    encoded_body: Option<&'a [u8]>,
}

fn sections(bytes: &[u8]) -> R<Sections<'_>> {
    let mut s = Sections::default();
    let mut c = Cursor { b: bytes };
    while !c.b.is_empty() {
        let at = c.b;
        if c.u8()? != 0x00 {
            return Err(Bad);
        }
        let code = section_code(c.value(0)?).ok_or(Bad)?;
        let v = c.value(0)?;
        match (code, v) {
            (0x70, V::List(l)) => s.header = Some(l),
            (0x71, V::Map(_)) => {}
            (0x72, V::Map(m)) => s.annotations = Some(m),
            (0x73, V::List(l)) => s.properties = Some(l),
            (0x74, V::Map(m)) => s.application = Some(m),
            (0x75, V::Bin(b)) => s.data.push(b),
            (0x76, V::List(_)) | (0x77, _) => {
                s.encoded_body.get_or_insert(at);
            }
            (0x78, V::Map(_)) => {}
            _ => return Err(Bad),
        }
    }
    Ok(s)
}

/// The `index`th field of a list section, if present and not null.
fn field<'a>(list: Option<Seq<'a>>, index: usize) -> Option<V<'a>> {
    let v = list?.items(1).nth(index)?.ok()?;
    (!matches!(v, V::Null)).then_some(v)
}

/// Message annotation `name`, if present.
fn annotation<'a>(ann: Option<Seq<'a>>, name: &[u8]) -> Option<V<'a>> {
    ann?.pairs(1)
        .map_while(Result::ok)
        .find(|(k, _)| matches!(k, V::Sym(s) if *s == name))
        .map(|(_, v)| v)
}

fn text(v: Option<V<'_>>) -> Option<ShortString> {
    match v? {
        V::Str(s) | V::Sym(s) => short(s),
        _ => None,
    }
}

fn number(v: Option<V<'_>>) -> Option<u64> {
    match v? {
        V::UByte(n) => Some(n as u64),
        V::UShort(n) => Some(n as u64),
        V::UInt(n) => Some(n as u64),
        V::ULong(n) => Some(n),
        V::Byte(n) => u64::try_from(n).ok(),
        V::Short(n) => u64::try_from(n).ok(),
        V::Int(n) => u64::try_from(n).ok(),
        V::Long(n) => u64::try_from(n).ok(),
        _ => None,
    }
}

/// Header values converted from one message, at most (a publisher's
/// bytes cannot make a conversion build more than this).
const MAX_VALUES: usize = 16 << 10;

/// The 0-9-1 properties and body of AMQP 1.0 `bytes` (the module's doc
/// has the mapping), with `extra` headers set over whatever the message
/// carries under their names.
fn convert(bytes: &[u8], extra: &[(&str, AMQPValue)]) -> (AMQPProperties, Vec<u8>) {
    let mut headers = FieldTable::default();
    let set_extra = |headers: &mut FieldTable| {
        for (k, v) in extra {
            headers.insert(ShortString::from(*k), v.clone());
        }
    };
    let Ok(s) = sections(bytes) else {
        set_extra(&mut headers);
        let props = AMQPProperties::default()
            .with_type(ShortString::from(RAW_TYPE))
            .with_headers(headers);
        return (props, bytes.to_vec());
    };
    let mut props = AMQPProperties::default();
    // Delivery mode, priority, expiration: the header, else annotations.
    let ann = s.annotations;
    let mode = match s.header {
        Some(h) => Some(if matches!(field(Some(h), 0), Some(V::Bool(true))) {
            2
        } else {
            1
        }),
        None => number(annotation(ann, b"x-basic-delivery-mode")),
    };
    if let Some(mode) = mode.and_then(|m| u8::try_from(m).ok()) {
        props = props.with_delivery_mode(mode);
    }
    let priority = match s.header {
        Some(h) => number(field(Some(h), 1)),
        None => number(annotation(ann, b"x-basic-priority")),
    };
    if let Some(p) = priority.and_then(|p| u8::try_from(p).ok()) {
        props = props.with_priority(p);
    }
    let expiration = match number(field(s.header, 2)) {
        Some(ttl) => Some(ttl.to_string()),
        None => text(annotation(ann, b"x-basic-expiration"))
            .map(String::from)
            .filter(|e| e.bytes().all(|c| c.is_ascii_digit()) && e.parse::<u64>().is_ok()),
    };
    if let Some(e) = expiration {
        props = props.with_expiration(ShortString::from(e));
    }
    // Properties.
    let p = s.properties;
    if let Some(v) = field(p, 0).and_then(|v| id(v, "x-message-id", &mut headers)) {
        props = props.with_message_id(v);
    }
    if let Some(V::Bin(u)) = field(p, 1) {
        if let Some(u) = short(u) {
            props = props.with_user_id(u);
        }
    }
    if let Some(v) = field(p, 4).and_then(|v| match v {
        V::Str(s) => short(s),
        _ => None,
    }) {
        props = props.with_reply_to(v);
    }
    if let Some(v) = field(p, 5).and_then(|v| id(v, "x-correlation-id", &mut headers)) {
        props = props.with_correlation_id(v);
    }
    if let Some(v) = text(field(p, 6)) {
        props = props.with_content_type(v);
    }
    if let Some(v) = text(field(p, 7)) {
        props = props.with_content_encoding(v);
    }
    if let Some(V::Timestamp(ms)) = field(p, 9) {
        props = props.with_timestamp((ms.max(0) / 1000) as u64);
    }
    let app_id = match field(p, 10) {
        Some(V::Str(g)) => short(g),
        _ => text(annotation(ann, b"x-basic-app-id")),
    };
    if let Some(v) = app_id {
        props = props.with_app_id(v);
    }
    let kind = if s.encoded_body.is_some() && s.data.is_empty() {
        Some(ShortString::from(RAW_TYPE))
    } else {
        text(annotation(ann, b"x-basic-type"))
    };
    if let Some(v) = kind {
        props = props.with_type(v);
    }
    // Headers: x- annotations, then application properties.
    let mut budget = MAX_VALUES;
    if let Some(ann) = ann {
        for (k, v) in ann.pairs(1).map_while(Result::ok) {
            if budget == 0 {
                break;
            }
            let V::Sym(name) = k else { continue };
            if !name.starts_with(b"x-") || name.starts_with(b"x-basic-") {
                continue;
            }
            if let (Some(k), Some(v)) = (short(name), to_field(v, 1, &mut budget)) {
                headers.insert(k, v);
            }
        }
    }
    if let Some(app) = s.application {
        for (k, v) in app.pairs(1).map_while(Result::ok) {
            if budget == 0 {
                break;
            }
            if let (Some(k), Some(v)) = (key(k), to_field(v, 1, &mut budget)) {
                headers.insert(k, v);
            }
        }
    }
    set_extra(&mut headers);
    if !headers.inner().is_empty() {
        props = props.with_headers(headers);
    }
    let body = match (s.encoded_body, s.data.as_slice()) {
        (Some(encoded), []) => encoded.to_vec(),
        (_, [one]) => one.to_vec(),
        (_, many) => many.concat(),
    };
    (props, body)
}

/// `msg`, an AMQP 1.0 message as a stream stores it, as the AMQP 0-9-1
/// message a reader there gets; `offset` is its stream offset (the
/// `x-stream-offset` header, as 0-9-1 readers of a stream see on every
/// message).
pub fn to_091(msg: &Message, offset: u64) -> Message {
    let extra = [("x-stream-offset", AMQPValue::LongLongInt(offset as i64))];
    let (props, body) = convert(msg.body(), &extra);
    let encoded = encode_properties(&props);
    // The broker built the list; it reads back (else: the defaults).
    let meta = read_meta(&encoded).unwrap_or_default();
    Message::new(msg.exchange(), msg.routing_key(), &encoded, &body, meta)
}

/// `msg` as a reader over AMQP 0-9-1 gets it from a stream at
/// `offset`: an AMQP 1.0 message converted (`to_091`), any other as it is.
pub fn readable(msg: std::sync::Arc<Message>, offset: u64) -> std::sync::Arc<Message> {
    if super::is_amqp10(&msg) {
        std::sync::Arc::new(to_091(&msg, offset))
    } else {
        msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::amqp10::STORED_PROPS;
    use crate::message::Meta;
    use rabbitmq_stream_protocol::codec::Encoder;
    use rabbitmq_stream_protocol::message::Message as Amqp10;

    fn encoded(m: &Amqp10) -> Vec<u8> {
        let mut out = Vec::new();
        m.encode(&mut out).expect("encodes");
        out
    }

    fn stored(bytes: &[u8]) -> Message {
        Message::new(b"", b"s", STORED_PROPS, bytes, Meta::default().as_amqp10())
    }

    fn header<'a>(p: &'a AMQPProperties, k: &str) -> Option<&'a AMQPValue> {
        p.headers().as_ref()?.inner().get(k)
    }

    #[test]
    fn a_stream_protocol_message_reads_as_091_with_its_properties() {
        let m = Amqp10::builder()
            .body(b"the body".to_vec())
            .properties()
            .message_id("m-1".to_string())
            .correlation_id(42u64)
            .content_type("text/plain")
            .reply_to("replies")
            .group_id("app")
            .message_builder()
            .application_properties()
            .insert("name", "value")
            .insert("n", 7i32)
            .message_builder()
            .message_annotations()
            .insert("x-basic-type", "kind")
            .insert("x-custom", "c")
            .insert("plain", "dropped")
            .message_builder()
            .build();
        let msg = to_091(&stored(&encoded(&m)), 9);
        assert_eq!(msg.body(), b"the body");
        let p = msg.decoded_properties();
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), "m-1");
        assert_eq!(p.correlation_id().as_ref().unwrap().as_str(), "42");
        assert_eq!(p.content_type().as_ref().unwrap().as_str(), "text/plain");
        assert_eq!(p.reply_to().as_ref().unwrap().as_str(), "replies");
        assert_eq!(p.app_id().as_ref().unwrap().as_str(), "app");
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "kind");
        assert_eq!(*p.delivery_mode(), None, "no header, no annotation");
        assert_eq!(
            header(&p, "name"),
            Some(&AMQPValue::LongString("value".into()))
        );
        assert_eq!(header(&p, "n"), Some(&AMQPValue::LongInt(7)));
        assert_eq!(
            header(&p, "x-custom"),
            Some(&AMQPValue::LongString("c".into()))
        );
        assert_eq!(
            header(&p, "x-stream-offset"),
            Some(&AMQPValue::LongLongInt(9))
        );
        assert_eq!(header(&p, "plain"), None);
        assert_eq!(header(&p, "x-basic-type"), None);
    }

    #[test]
    fn the_header_gives_delivery_mode_priority_and_expiration() {
        // header [durable true, priority 5, ttl 1500], then one data section.
        let bytes = [
            0x00, 0x53, 0x70, 0xc0, 9, 3, 0x41, 0x50, 5, 0x70, 0, 0, 0x05, 0xdc, //
            0x00, 0x53, 0x75, 0xa0, 2, b'h', b'i',
        ];
        let msg = to_091(&stored(&bytes), 0);
        let p = msg.decoded_properties();
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(*p.priority(), Some(5));
        assert_eq!(p.expiration().as_ref().unwrap().as_str(), "1500");
        assert_eq!(msg.meta.delivery_mode, 2);
        assert_eq!(msg.meta.expiration_ms(), Some(1500));
        assert_eq!(msg.body(), b"hi");
    }

    #[test]
    fn ids_a_short_string_cannot_hold_go_in_headers() {
        // properties [binary id, 4 nulls, a uuid, 3 nulls, a creation time]
        let mut bytes = vec![0x00, 0x53, 0x73, 0xc0, 38, 10, 0xa0, 2, 0xff, 0];
        bytes.extend_from_slice(&[0x40; 4]);
        bytes.push(0x98);
        bytes.extend_from_slice(&[0x11; 16]);
        bytes.extend_from_slice(&[0x40; 3]);
        bytes.push(0x83);
        bytes.extend_from_slice(&1_700_000_000_123i64.to_be_bytes());
        bytes.extend_from_slice(&[0x00, 0x53, 0x75, 0xa0, 0]);
        let p = to_091(&stored(&bytes), 0).decoded_properties();
        assert_eq!(*p.message_id(), None);
        assert_eq!(
            header(&p, "x-message-id"),
            Some(&AMQPValue::ByteArray(vec![0xff, 0].into()))
        );
        assert_eq!(
            p.correlation_id().as_ref().unwrap().as_str(),
            "urn:uuid:11111111-1111-1111-1111-111111111111"
        );
        assert_eq!(*p.timestamp(), Some(1_700_000_000));
    }

    #[test]
    fn a_value_body_is_handed_over_encoded() {
        // amqp-value "hello".
        let bytes = [0x00, 0x53, 0x77, 0xa1, 5, b'h', b'e', b'l', b'l', b'o'];
        let msg = to_091(&stored(&bytes), 0);
        assert_eq!(msg.body(), &bytes[..]);
        let p = msg.decoded_properties();
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "amqp-1.0");
    }

    #[test]
    fn bytes_that_are_not_amqp_10_are_handed_over_whole() {
        let msg = to_091(&stored(b"not amqp"), 3);
        assert_eq!(msg.body(), b"not amqp");
        let p = msg.decoded_properties();
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "amqp-1.0");
        assert_eq!(
            header(&p, "x-stream-offset"),
            Some(&AMQPValue::LongLongInt(3))
        );
    }

    #[test]
    fn hostile_bytes_neither_panic_nor_run_long() {
        let m = Amqp10::builder()
            .body(b"body".to_vec())
            .properties()
            .message_id("id".to_string())
            .message_builder()
            .application_properties()
            .insert("k", "v")
            .message_builder()
            .build();
        let good = encoded(&m);
        // Every cut and every one-octet change of a good message.
        for cut in 0..good.len() {
            to_091(&stored(&good[..cut]), 0);
            for x in [0x00, 0x45, 0xd1, 0xf0, 0xff] {
                let mut b = good.clone();
                b[cut] = x;
                to_091(&stored(&b), 0);
            }
        }
        // A map claiming 4 billion items in 4 octets.
        let bomb = [0x00, 0x53, 0x74, 0xd1, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(to_091(&stored(&bomb), 0).body(), &bomb[..]);
        // Annotations nesting lists 10,000 deep.
        let mut deep = vec![0x00, 0x53, 0x72, 0xc1, 0, 2, 0xa3, 1, b'x'];
        for _ in 0..10_000 {
            deep.extend_from_slice(&[0x00, 0x53, 0x01]);
        }
        deep.push(0x40);
        to_091(&stored(&deep), 0);
        // A section descriptor that is an array whose described
        // constructor's descriptor is such an array, 100,000 deep.
        let n = 100_000usize;
        let mut chain = vec![0x00];
        for i in 0..n {
            let total = 11 * (n - i) + 1;
            chain.push(0xf0);
            chain.extend_from_slice(&((total - 5) as u32).to_be_bytes());
            chain.extend_from_slice(&0u32.to_be_bytes());
            chain.push(0x00);
        }
        chain.extend(std::iter::repeat_n(0x40, n + 1));
        assert_eq!(to_091(&stored(&chain), 0).body(), &chain[..]);
    }

    /// An application properties map whose entries are `entries`.
    fn with_properties(entries: &[(&str, &[u8])], count: u32) -> Vec<u8> {
        let mut items = Vec::new();
        for (k, v) in entries {
            items.push(0xa1);
            items.push(k.len() as u8);
            items.extend_from_slice(k.as_bytes());
            items.extend_from_slice(v);
        }
        let mut b = vec![0x00, 0x53, 0x74, 0xd1];
        b.extend_from_slice(&((items.len() + 4) as u32).to_be_bytes());
        b.extend_from_slice(&count.to_be_bytes());
        b.extend_from_slice(&items);
        b.extend_from_slice(&[0x00, 0x53, 0x75, 0xa0, 1, b'x']);
        b
    }

    #[test]
    fn what_a_publisher_sets_cannot_pass_for_the_offset_or_grow_without_end() {
        // An application property named x-stream-offset: the broker's wins.
        let forged = with_properties(&[("x-stream-offset", &[0xa1, 1, b'9'])], 2);
        let p = to_091(&stored(&forged), 4).decoded_properties();
        assert_eq!(
            header(&p, "x-stream-offset"),
            Some(&AMQPValue::LongLongInt(4))
        );
        // An array of 100,000 nulls in 100,000 octets of padding: refused,
        // the property left out.
        let mut nulls = vec![0xf0];
        nulls.extend_from_slice(&(100_005u32).to_be_bytes());
        nulls.extend_from_slice(&(100_000u32).to_be_bytes());
        nulls.push(0x40);
        nulls.extend(std::iter::repeat_n(0u8, 100_000));
        let b = with_properties(&[("nulls", &nulls), ("kept", &[0x41])], 4);
        let p = to_091(&stored(&b), 0).decoded_properties();
        assert_eq!(header(&p, "nulls"), None);
        // 50,000 properties: at most 16 Ki of them are converted.
        let names: Vec<String> = (0..50_000).map(|i| format!("k{i}")).collect();
        let entries: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &[0x40][..])).collect();
        let b = with_properties(&entries, 100_000);
        let p = to_091(&stored(&b), 0).decoded_properties();
        let kept = p.headers().as_ref().map_or(0, |h| h.inner().len());
        assert!((1..=(16 << 10) + 1).contains(&kept), "{kept}");
    }
}
