//! An AMQP 0-9-1 message written as AMQP 1.0, for the stream protocol's
//! readers, with RabbitMQ's mapping: delivery mode and priority in the
//! header, the properties AMQP 1.0 has in its properties, type, app-id and
//! expiration as `x-basic-*` message annotations, the headers as
//! application properties (values AMQP 1.0 has no simple type for, such as
//! nested tables, are left out), and the body as one data section.

use bytes::{BufMut, BytesMut};

use crate::message::Message;
use crate::wire::props::{self, Field};
use crate::wire::table;

// AMQP 1.0 type codes.
const DESCRIBED: u8 = 0x00;
const SMALL_ULONG: u8 = 0x53;
const NULL: u8 = 0x40;
const TRUE: u8 = 0x41;
const FALSE: u8 = 0x42;
const UBYTE: u8 = 0x50;
const BYTE: u8 = 0x51;
const USHORT: u8 = 0x60;
const SHORT: u8 = 0x61;
const UINT: u8 = 0x70;
const INT: u8 = 0x71;
const FLOAT: u8 = 0x72;
const LONG: u8 = 0x81;
const DOUBLE: u8 = 0x82;
const TIMESTAMP: u8 = 0x83;
const VBIN32: u8 = 0xb0;
const STR32: u8 = 0xb1;
const SYM32: u8 = 0xb3;
const LIST32: u8 = 0xd0;
const MAP32: u8 = 0xd1;

// Section descriptors.
const HEADER: u8 = 0x70;
const MESSAGE_ANNOTATIONS: u8 = 0x72;
const PROPERTIES: u8 = 0x73;
const APPLICATION_PROPERTIES: u8 = 0x74;
const DATA: u8 = 0x75;

fn put_sized(out: &mut BytesMut, code: u8, b: &[u8]) {
    out.put_u8(code);
    out.put_u32(b.len() as u32);
    out.put_slice(b);
}

/// A list or map: its code, size and count, the items `items` writes
/// (returning how many), the size patched in after.
fn put_compound(out: &mut BytesMut, code: u8, items: impl FnOnce(&mut BytesMut) -> u32) {
    out.put_u8(code);
    let at = out.len();
    out.put_u32(0);
    out.put_u32(0);
    let count = items(out);
    let size = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&size.to_be_bytes());
    out[at + 4..at + 8].copy_from_slice(&count.to_be_bytes());
}

fn section(out: &mut BytesMut, descriptor: u8) {
    out.put_slice(&[DESCRIBED, SMALL_ULONG, descriptor]);
}

/// 0-9-1 strings are bytes: a string when they are UTF-8, else binary
/// (as RabbitMQ writes them).
fn put_text(out: &mut BytesMut, b: &[u8]) {
    let code = if std::str::from_utf8(b).is_ok() {
        STR32
    } else {
        VBIN32
    };
    put_sized(out, code, b);
}

/// A 0-9-1 header value as an AMQP 1.0 simple value; false (nothing
/// written) for a type AMQP 1.0 has no simple value for.
fn put_value(out: &mut BytesMut, v: table::Value<'_>) -> bool {
    let b = v.bytes;
    match (v.tag, b.len()) {
        (b'S', _) => put_text(out, b.get(4..).unwrap_or_default()),
        (b'x', _) => put_sized(out, VBIN32, b.get(4..).unwrap_or_default()),
        (b't', 1) => out.put_u8(if b[0] != 0 { TRUE } else { FALSE }),
        (b'b', 1) => out.put_slice(&[BYTE, b[0]]),
        (b'B', 1) => out.put_slice(&[UBYTE, b[0]]),
        (b's', 2) => out.put_slice(&[SHORT, b[0], b[1]]),
        (b'u', 2) => out.put_slice(&[USHORT, b[0], b[1]]),
        (b'I', 4) => {
            out.put_u8(INT);
            out.put_slice(b)
        }
        (b'i', 4) => {
            out.put_u8(UINT);
            out.put_slice(b)
        }
        (b'l' | b'L', 8) => {
            out.put_u8(LONG);
            out.put_slice(b)
        }
        (b'f', 4) => {
            out.put_u8(FLOAT);
            out.put_slice(b)
        }
        (b'd', 8) => {
            out.put_u8(DOUBLE);
            out.put_slice(b)
        }
        (b'T', 8) => {
            let secs = u64::from_be_bytes(b.try_into().unwrap_or_default());
            out.put_u8(TIMESTAMP);
            out.put_i64((secs as i64).saturating_mul(1000));
        }
        (b'V', 0) => out.put_u8(NULL),
        _ => return false,
    }
    true
}

/// Writes a message published over AMQP 0-9-1 as an AMQP 1.0 message
/// into `out` (the module's doc has the mapping). Headers named in `skip`
/// are left out.
pub fn encode_091(msg: &Message, skip: &[&[u8]], out: &mut BytesMut) {
    let p = msg.properties();
    let mut spans: [Option<std::ops::Range<usize>>; 14] = Default::default();
    // Stored lists were checked when they came in.
    let _ = props::walk(p, false, |field, span| spans[field as usize] = Some(span));
    let raw = |f: Field| spans[f as usize].clone().and_then(|s| p.get(s));
    // A short string without its length octet.
    let short = |f: Field| raw(f).and_then(|b| b.get(1..));
    let mode = raw(Field::DeliveryMode).and_then(|b| b.first().copied());
    let priority = raw(Field::Priority).and_then(|b| b.first().copied());
    if mode.is_some() || priority.is_some() {
        section(out, HEADER);
        put_compound(out, LIST32, |o| {
            o.put_u8(if mode == Some(2) { TRUE } else { FALSE });
            match priority {
                Some(p) => {
                    o.put_slice(&[UBYTE, p]);
                    2
                }
                None => 1,
            }
        });
    }
    let annotations = [
        (&b"x-basic-type"[..], short(Field::Type)),
        (b"x-basic-app-id", short(Field::AppId)),
        (b"x-basic-expiration", short(Field::Expiration)),
    ];
    if annotations.iter().any(|(_, v)| v.is_some()) {
        section(out, MESSAGE_ANNOTATIONS);
        put_compound(out, MAP32, |o| {
            let mut n = 0;
            for (k, v) in annotations {
                if let Some(v) = v {
                    put_sized(o, SYM32, k);
                    put_text(o, v);
                    n += 2;
                }
            }
            n
        });
    }
    // Ids may be binary; an address must be a string and a symbol ASCII,
    // or the field is left out (a client would refuse the message).
    fn id(v: &[u8]) -> (u8, &[u8]) {
        match std::str::from_utf8(v) {
            Ok(_) => (STR32, v),
            Err(_) => (VBIN32, v),
        }
    }
    let fields = [
        short(Field::MessageId).map(id),
        short(Field::UserId).map(|v| (VBIN32, v)),
        None, // to
        None, // subject
        short(Field::ReplyTo)
            .filter(|v| std::str::from_utf8(v).is_ok())
            .map(|v| (STR32, v)),
        short(Field::CorrelationId).map(id),
        short(Field::ContentType)
            .filter(|v| v.is_ascii())
            .map(|v| (SYM32, v)),
        short(Field::ContentEncoding)
            .filter(|v| v.is_ascii())
            .map(|v| (SYM32, v)),
    ];
    let timestamp = raw(Field::Timestamp).and_then(|b| <[u8; 8]>::try_from(b).ok());
    let last = if timestamp.is_some() {
        Some(9)
    } else {
        fields.iter().rposition(Option::is_some)
    };
    if let Some(last) = last {
        section(out, PROPERTIES);
        put_compound(out, LIST32, |o| {
            for i in 0..=last {
                match fields.get(i).copied().flatten() {
                    Some((code, v)) => put_sized(o, code, v),
                    None if i == 9 => {
                        let secs = u64::from_be_bytes(timestamp.unwrap_or_default());
                        o.put_u8(TIMESTAMP);
                        o.put_i64((secs as i64).saturating_mul(1000));
                    }
                    None => o.put_u8(NULL),
                }
            }
            last as u32 + 1
        });
    }
    if let Some(headers) = raw(Field::Headers) {
        // A key must be a string.
        let kept = || {
            table::entries(headers)
                .filter(|(k, _)| !skip.contains(k) && std::str::from_utf8(k).is_ok())
        };
        if kept().next().is_some() {
            section(out, APPLICATION_PROPERTIES);
            put_compound(out, MAP32, |o| {
                let mut n = 0;
                for (k, v) in kept() {
                    let at = o.len();
                    put_sized(o, STR32, k);
                    if put_value(o, v) {
                        n += 2;
                    } else {
                        o.truncate(at);
                    }
                }
                n
            });
        }
    }
    section(out, DATA);
    put_sized(out, VBIN32, msg.body());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Meta;
    use amq_protocol::protocol::basic::AMQPProperties;
    use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
    use rabbitmq_stream_protocol::codec::Decoder;
    use rabbitmq_stream_protocol::message::Message as Amqp10;

    #[test]
    fn a_091_message_reads_back_as_amqp_10() {
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from("name"),
            AMQPValue::LongString(LongString::from("value")),
        );
        headers.insert(ShortString::from("n"), AMQPValue::LongLongInt(-7));
        headers.insert(ShortString::from("flag"), AMQPValue::Boolean(true));
        headers.insert(
            ShortString::from("nested"),
            AMQPValue::FieldTable(FieldTable::default()),
        );
        headers.insert(
            ShortString::from("x-stream-offset"),
            AMQPValue::LongLongInt(3),
        );
        let props = AMQPProperties::default()
            .with_content_type(ShortString::from("text/plain"))
            .with_message_id(ShortString::from("m-1"))
            .with_correlation_id(ShortString::from("c-1"))
            .with_delivery_mode(2)
            .with_priority(4)
            .with_timestamp(1_700_000_000)
            .with_type(ShortString::from("kind"))
            .with_headers(headers);
        let encoded = crate::message::encode_properties(&props);
        let msg = Message::new(b"", b"s", &encoded, b"the body", Meta::default());
        let mut out = BytesMut::new();
        encode_091(&msg, &[b"x-stream-offset"], &mut out);
        let (rest, m) = Amqp10::decode(&out).expect("decodes");
        assert!(rest.is_empty());
        assert_eq!(m.data(), Some(&b"the body"[..]));
        let h = m.header().expect("a header");
        assert!(h.durable);
        assert_eq!(h.priority, 4);
        let p = m.properties().expect("properties");
        assert_eq!(format!("{:?}", p.message_id), "Some(String(\"m-1\"))");
        assert_eq!(
            format!("{:?}", p.content_type),
            "Some(Symbol(\"text/plain\"))"
        );
        let created = format!("{:?}", p.creation_time);
        assert!(created.contains("2023-11-14T22:13:20"), "{created}");
        let app = format!("{:?}", m.application_properties().expect("app properties"));
        assert!(
            app.contains("\"name\"") && app.contains("\"value\""),
            "{app}"
        );
        assert!(
            app.contains("Long(-7)") && app.contains("Boolean(true)"),
            "{app}"
        );
        assert!(
            !app.contains("nested") && !app.contains("x-stream-offset"),
            "{app}"
        );
        let ann = format!("{:?}", m.message_annotations().expect("annotations"));
        assert!(
            ann.contains("x-basic-type") && ann.contains("kind"),
            "{ann}"
        );
    }

    #[test]
    fn a_bare_message_is_one_data_section() {
        let msg = Message::new(b"", b"s", &[0, 0], b"", Meta::default());
        let mut out = BytesMut::new();
        encode_091(&msg, &[], &mut out);
        assert_eq!(&out[..], &[0x00, 0x53, 0x75, 0xb0, 0, 0, 0, 0]);
    }
}
