//! `Message`: what a publish carries, shared (`Arc`) by every queue it lands
//! in. Properties stay in their wire encoding and are re-sent verbatim on
//! delivery; `Meta` holds the few fields the broker itself reads.

use amq_protocol::protocol::basic::AMQPProperties;
use amq_protocol::types::FieldTable;
use bytes::Bytes;

use crate::amqp::codec::FieldReader;

/// A published message.
#[derive(Debug, Clone)]
pub struct Message {
    /// Exchange it was published to (as sent: a short string).
    pub exchange: Bytes,
    /// Routing key it was published with.
    pub routing_key: Bytes,
    /// The content-header property flags and list, as on the wire.
    pub properties: Bytes,
    /// The body, one buffer however many frames carried it.
    pub body: Bytes,
    /// Fields of `properties` the broker acts on.
    pub meta: Meta,
}

/// Property fields the broker reads, decoded once at publish.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Meta {
    /// 2 = persistent.
    pub delivery_mode: u8,
    /// 0-255; only priority queues look at it.
    pub priority: u8,
    /// Per-message TTL from the `expiration` property, in milliseconds.
    pub expiration_ms: Option<u64>,
    /// Whether a headers table is present.
    pub has_headers: bool,
}

impl Message {
    /// Whether the publisher asked for the message to survive a restart.
    pub fn persistent(&self) -> bool {
        self.meta.delivery_mode == 2
    }

    /// The exchange name as text (lossy for non-UTF-8 names).
    pub fn exchange_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.exchange)
    }

    /// The routing key as text (lossy for non-UTF-8 keys).
    pub fn routing_key_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.routing_key)
    }

    /// The full decoded properties (allocates: not for the hot path).
    pub fn decoded_properties(&self) -> AMQPProperties {
        amq_protocol::protocol::basic::parse_properties(&self.properties[..])
            .map(|(_, p)| p)
            .unwrap_or_default()
    }

    /// The headers table, decoded (allocates; only when headers are present).
    pub fn headers(&self) -> Option<FieldTable> {
        if !self.meta.has_headers {
            return None;
        }
        self.decoded_properties().headers().clone()
    }

    /// A copy with header `key` set to `value` (re-encodes the properties:
    /// not for the hot path).
    pub fn with_header(&self, key: &str, value: amq_protocol::types::AMQPValue) -> Message {
        let props = self.decoded_properties();
        let mut headers = props.headers().clone().unwrap_or_default();
        headers.insert(key.into(), value);
        let properties = encode_properties(&props.with_headers(headers));
        let meta = read_meta(&properties).unwrap_or(self.meta);
        Message {
            properties,
            meta,
            ..self.clone()
        }
    }

    /// Approximate memory this message holds.
    pub fn size(&self) -> usize {
        self.body.len() + self.properties.len() + self.exchange.len() + self.routing_key.len()
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

// Property flag bits, most significant first (AMQP 0-9-1 basic class).
const CONTENT_TYPE: u16 = 1 << 15;
const CONTENT_ENCODING: u16 = 1 << 14;
const HEADERS: u16 = 1 << 13;
const DELIVERY_MODE: u16 = 1 << 12;
const PRIORITY: u16 = 1 << 11;
const CORRELATION_ID: u16 = 1 << 10;
const REPLY_TO: u16 = 1 << 9;
const EXPIRATION: u16 = 1 << 8;
const MESSAGE_ID: u16 = 1 << 7;
const TIMESTAMP: u16 = 1 << 6;
const TYPE: u16 = 1 << 5;
const USER_ID: u16 = 1 << 4;
const APP_ID: u16 = 1 << 3;
const CLUSTER_ID: u16 = 1 << 2;

/// Why a property list was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PropertiesError {
    /// The bytes do not form a property list.
    Malformed,
    /// `expiration` is not a non-negative integer string (RabbitMQ: 406).
    BadExpiration(String),
}

/// Reads `Meta` out of encoded properties, checking that the list is well
/// formed (every field within bounds, the headers table decodable), so that
/// what is re-sent to consumers is valid.
pub fn read_meta(props: &[u8]) -> Result<Meta, PropertiesError> {
    let mut r = FieldReader::new(props);
    let flags = r.u16().ok_or(PropertiesError::Malformed)?;
    if flags & 1 != 0 || flags & 0b10 != 0 {
        // Continuation flags or unused bits: basic has only 14 properties.
        return Err(PropertiesError::Malformed);
    }
    let mut meta = Meta::default();
    fn short<'a>(r: &mut FieldReader<'a>) -> Result<&'a [u8], PropertiesError> {
        r.short_str().ok_or(PropertiesError::Malformed)
    }
    if flags & CONTENT_TYPE != 0 {
        short(&mut r)?;
    }
    if flags & CONTENT_ENCODING != 0 {
        short(&mut r)?;
    }
    if flags & HEADERS != 0 {
        let n = r.u32().ok_or(PropertiesError::Malformed)? as usize;
        let table = r.take(n).ok_or(PropertiesError::Malformed)?;
        let mut framed = Vec::with_capacity(n + 4);
        framed.extend_from_slice(&(n as u32).to_be_bytes());
        framed.extend_from_slice(table);
        match amq_protocol::types::parsing::parse_field_table(&framed[..]) {
            Ok((&[], _)) => {}
            _ => return Err(PropertiesError::Malformed),
        }
        meta.has_headers = true;
    }
    if flags & DELIVERY_MODE != 0 {
        meta.delivery_mode = r.u8().ok_or(PropertiesError::Malformed)?;
    }
    if flags & PRIORITY != 0 {
        meta.priority = r.u8().ok_or(PropertiesError::Malformed)?;
    }
    if flags & CORRELATION_ID != 0 {
        short(&mut r)?;
    }
    if flags & REPLY_TO != 0 {
        short(&mut r)?;
    }
    if flags & EXPIRATION != 0 {
        let s = short(&mut r)?;
        let text = std::str::from_utf8(s).map_err(|_| PropertiesError::Malformed)?;
        let ms = text
            .parse::<u64>()
            .map_err(|_| PropertiesError::BadExpiration(text.to_string()))?;
        meta.expiration_ms = Some(ms);
    }
    if flags & MESSAGE_ID != 0 {
        short(&mut r)?;
    }
    if flags & TIMESTAMP != 0 {
        r.u64().ok_or(PropertiesError::Malformed)?;
    }
    for bit in [TYPE, USER_ID, APP_ID, CLUSTER_ID] {
        if flags & bit != 0 {
            short(&mut r)?;
        }
    }
    if r.remaining() != 0 {
        return Err(PropertiesError::Malformed);
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
        assert_eq!(
            meta,
            Meta {
                delivery_mode: 2,
                priority: 5,
                expiration_ms: Some(1500),
                has_headers: true
            }
        );
    }

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
