//! Messages over HTTP, as RabbitMQ's API takes and gives them: publish
//! takes properties as JSON and a payload as a string or base64; get gives
//! each message's properties as JSON ([] when there are none, as RabbitMQ
//! writes an empty proplist) and its payload as UTF-8 text when it is
//! (encoding "auto") or base64, cut to `truncate` bytes.

use base64::Engine;
use serde_json::{json, Map, Value};

use super::error::{ApiError, ApiResult};
use crate::message::{Message, Meta};

fn short(s: &str, what: &str) -> ApiResult<Vec<u8>> {
    if s.len() > 255 {
        return Err(ApiError::bad_request(format!(
            "{what} is longer than 255 bytes"
        )));
    }
    let mut v = vec![s.len() as u8];
    v.extend_from_slice(s.as_bytes());
    Ok(v)
}

/// The AMQP property list for `props` (RabbitMQ's API names).
pub fn encode_properties(props: &Map<String, Value>) -> ApiResult<Vec<u8>> {
    // Flag order: content_type .. app_id (cluster_id is never sent).
    const SHORT: [(&str, u16); 11] = [
        ("content_type", 15),
        ("content_encoding", 14),
        ("correlation_id", 10),
        ("reply_to", 9),
        ("expiration", 8),
        ("message_id", 7),
        ("type", 5),
        ("user_id", 4),
        ("app_id", 3),
        ("cluster_id", 2),
        ("", 0),
    ];
    let mut fields: Vec<(u16, Vec<u8>)> = Vec::new();
    for (name, bit) in SHORT.iter().take(10) {
        match props.get(*name) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => fields.push((*bit, short(s, name)?)),
            Some(Value::Number(n)) if *name == "expiration" => {
                fields.push((*bit, short(&n.to_string(), name)?))
            }
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "{name} must be a string, not {other}"
                )))
            }
        }
    }
    if let Some(h) = props.get("headers").filter(|h| !h.is_null()) {
        let table =
            crate::definitions::args_from_json(Some(h), "").map_err(ApiError::bad_request)?;
        fields.push((13, crate::wire::table::encode_table(&table)));
    }
    let byte = |name: &str, max: u64| -> ApiResult<Option<u8>> {
        match props.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n <= max)
                .map(|n| Some(n as u8))
                .ok_or_else(|| ApiError::bad_request(format!("{name} must be 0-{max}, not {v}"))),
        }
    };
    if let Some(d) = byte("delivery_mode", 2)? {
        fields.push((12, vec![d]));
    }
    if let Some(p) = byte("priority", 255)? {
        fields.push((11, vec![p]));
    }
    if let Some(t) = props.get("timestamp").filter(|t| !t.is_null()) {
        let t = t.as_u64().ok_or_else(|| {
            ApiError::bad_request(format!("timestamp must be an integer, not {t}"))
        })?;
        fields.push((6, t.to_be_bytes().to_vec()));
    }
    // Higher bits first (content_type is bit 15), which is wire order.
    fields.sort_by_key(|f| std::cmp::Reverse(f.0));
    let flags = fields.iter().fold(0u16, |f, (bit, _)| f | (1 << bit));
    let mut out = flags.to_be_bytes().to_vec();
    for (_, v) in fields {
        out.extend_from_slice(&v);
    }
    Ok(out)
}

/// A message to publish from the API's body: properties, routing_key,
/// payload, payload_encoding ("string" or "base64").
pub fn from_request(
    exchange: &str,
    body: &Map<String, Value>,
    max_size: u64,
) -> ApiResult<Message> {
    let routing_key = body
        .get("routing_key")
        .and_then(Value::as_str)
        .unwrap_or("");
    if routing_key.len() > 255 {
        return Err(ApiError::bad_request(
            "routing_key is longer than 255 bytes",
        ));
    }
    let payload = body.get("payload").and_then(Value::as_str).unwrap_or("");
    let payload = match body.get("payload_encoding").and_then(Value::as_str) {
        None | Some("string") => payload.as_bytes().to_vec(),
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(payload)
            .map_err(|_| ApiError::bad_request("payload is not base64"))?,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown payload_encoding '{other}'"
            )))
        }
    };
    // As over AMQP (amqp/assembler.rs): max_message_size holds for the
    // API's publishes too.
    if payload.len() as u64 > max_size {
        return Err(ApiError::bad_request(format!(
            "406 PRECONDITION_FAILED - message size {} is larger than configured max size \
             {max_size}",
            payload.len()
        )));
    }
    let empty = Map::new();
    let props = match body.get("properties") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(m)) => m,
        Some(Value::Array(a)) if a.is_empty() => &empty,
        Some(_) => return Err(ApiError::bad_request("properties must be an object")),
    };
    let raw = encode_properties(props)?;
    let meta: Meta = crate::message::read_meta(&raw)
        .map_err(|e| ApiError::bad_request(format!("bad properties: {e:?}")))?;
    Ok(Message::new(
        exchange.as_bytes(),
        routing_key.as_bytes(),
        &raw,
        &payload,
        meta,
    ))
}

/// A message as the API's get answers it.
pub fn to_json(
    msg: &Message,
    redelivered: bool,
    remaining: u32,
    base64: bool,
    truncate: Option<usize>,
) -> Value {
    let body = msg.body();
    let cut = &body[..truncate.unwrap_or(body.len()).min(body.len())];
    let (payload, encoding) = match (base64, std::str::from_utf8(cut)) {
        (false, Ok(s)) => (s.to_string(), "string"),
        _ => (
            base64::engine::general_purpose::STANDARD.encode(cut),
            "base64",
        ),
    };
    json!({
        "payload_bytes": body.len(),
        "redelivered": redelivered,
        "exchange": String::from_utf8_lossy(msg.exchange()),
        "routing_key": String::from_utf8_lossy(msg.routing_key()),
        "message_count": remaining,
        "properties": properties_json(msg),
        "payload": payload,
        "payload_encoding": encoding,
    })
}

fn properties_json(msg: &Message) -> Value {
    let p = msg.decoded_properties();
    let mut o = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            o.insert(k.into(), v);
        }
    };
    let s =
        |v: &Option<amq_protocol::types::ShortString>| v.as_ref().map(|s| Value::from(s.as_str()));
    put("content_type", s(p.content_type()));
    put("content_encoding", s(p.content_encoding()));
    put(
        "headers",
        p.headers().as_ref().map(crate::definitions::args_json),
    );
    put("delivery_mode", p.delivery_mode().map(Value::from));
    put("priority", p.priority().map(Value::from));
    put("correlation_id", s(p.correlation_id()));
    put("reply_to", s(p.reply_to()));
    put("expiration", s(p.expiration()));
    put("message_id", s(p.message_id()));
    put("timestamp", p.timestamp().map(Value::from));
    put("type", s(p.kind()));
    put("user_id", s(p.user_id()));
    put("app_id", s(p.app_id()));
    if o.is_empty() {
        return json!([]);
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_encode_in_wire_order_and_read_back() {
        let props = json!({"content_type": "text/plain", "delivery_mode": 2, "priority": 3,
                           "headers": {"a": 1}, "message_id": "m1", "timestamp": 1700000000});
        let raw = encode_properties(props.as_object().unwrap()).unwrap();
        let msg = Message::new(
            b"x",
            b"k",
            &raw,
            b"hello",
            crate::message::read_meta(&raw).unwrap(),
        );
        assert!(msg.persistent());
        let back = to_json(&msg, false, 0, false, None);
        assert_eq!(back["properties"]["content_type"], "text/plain");
        assert_eq!(back["properties"]["headers"]["a"], 1);
        assert_eq!(back["properties"]["message_id"], "m1");
        assert_eq!(back["properties"]["priority"], 3);
        assert_eq!(back["payload"], "hello");
        let bare = Message::new(b"", b"k", &[0, 0], &[0xff, 0xfe], Meta::default());
        let j = to_json(&bare, true, 2, false, Some(1));
        assert_eq!(j["properties"], json!([]));
        assert_eq!(j["payload_encoding"], "base64");
        assert_eq!(j["payload_bytes"], 2);
    }
}
