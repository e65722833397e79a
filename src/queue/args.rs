//! Queue arguments (`x-...` on queue.declare): validation with RabbitMQ's
//! wording, and the typed view the queue works from.

use amq_protocol::types::{AMQPValue, FieldTable};

/// An integer argument, accepting every integer width clients send.
pub fn int_arg(v: &AMQPValue) -> Option<i64> {
    Some(match v {
        AMQPValue::ShortShortInt(n) => *n as i64,
        AMQPValue::ShortShortUInt(n) => *n as i64,
        AMQPValue::ShortInt(n) => *n as i64,
        AMQPValue::ShortUInt(n) => *n as i64,
        AMQPValue::LongInt(n) => *n as i64,
        AMQPValue::LongUInt(n) => *n as i64,
        AMQPValue::LongLongInt(n) => *n,
        _ => return None,
    })
}

/// A string argument.
pub fn str_arg(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

fn type_name(v: &AMQPValue) -> &'static str {
    match v {
        AMQPValue::Boolean(_) => "bool",
        AMQPValue::LongString(_) | AMQPValue::ShortString(_) => "longstr",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Float(_) | AMQPValue::Double(_) => "double",
        _ => "signedint",
    }
}

/// What a queue does when it is full (`x-overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Drop (dead-letter) the oldest message to make room.
    #[default]
    DropHead,
    /// Refuse the new message (basic.nack to a confirming publisher).
    RejectPublish,
    /// Refuse it and dead-letter it.
    RejectPublishDlx,
}

/// The queue arguments the broker acts on, read once at declare.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueArgs {
    /// `x-message-ttl`, ms.
    pub message_ttl: Option<u64>,
    /// `x-expires`, ms.
    pub expires: Option<u64>,
    /// `x-max-length`, ready messages.
    pub max_length: Option<u64>,
    /// `x-max-length-bytes`, body bytes of ready messages.
    pub max_length_bytes: Option<u64>,
    /// `x-overflow`.
    pub overflow: Overflow,
    /// `x-dead-letter-exchange` ("" is the default exchange).
    pub dead_letter_exchange: Option<String>,
    /// `x-dead-letter-routing-key`.
    pub dead_letter_routing_key: Option<String>,
    /// `x-max-priority` (1-255).
    pub max_priority: Option<u8>,
    /// `x-single-active-consumer`.
    pub single_active_consumer: bool,
    /// `x-delivery-limit`: redeliveries allowed before dead-lettering.
    pub delivery_limit: Option<u64>,
}

impl QueueArgs {
    /// Reads validated arguments (see `validate`); unknown keys are ignored.
    pub fn from_table(args: &FieldTable) -> QueueArgs {
        let get = |k: &str| args.inner().get(k);
        let uint = |k: &str| get(k).and_then(int_arg).and_then(|n| u64::try_from(n).ok());
        QueueArgs {
            message_ttl: uint("x-message-ttl"),
            expires: uint("x-expires"),
            max_length: uint("x-max-length"),
            max_length_bytes: uint("x-max-length-bytes"),
            overflow: match get("x-overflow").and_then(str_arg).as_deref() {
                Some("reject-publish") => Overflow::RejectPublish,
                Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
                _ => Overflow::DropHead,
            },
            dead_letter_exchange: get("x-dead-letter-exchange").and_then(str_arg),
            dead_letter_routing_key: get("x-dead-letter-routing-key").and_then(str_arg),
            max_priority: uint("x-max-priority")
                .and_then(|n| u8::try_from(n).ok())
                .filter(|&n| n > 0),
            single_active_consumer: matches!(
                get("x-single-active-consumer"),
                Some(AMQPValue::Boolean(true))
            ),
            delivery_limit: uint("x-delivery-limit"),
        }
    }
}

/// Checks the x-arguments a queue.declare carries. On error returns the
/// argument's name and what is wrong with it; the caller words the reply as
/// RabbitMQ does ("invalid arg 'x-message-ttl' for queue 'q' in vhost '/': ...").
pub fn validate(args: &FieldTable) -> Result<(), (String, String)> {
    for (key, value) in args.inner() {
        let key = key.as_str();
        let bad = |why: String| Err((key.to_string(), why));
        match key {
            "x-message-ttl" | "x-expires" | "x-max-length" | "x-max-length-bytes"
            | "x-delivery-limit" => match int_arg(value) {
                None => return bad(format!("unacceptable type '{}'", type_name(value))),
                Some(n) if n < 0 || (key == "x-expires" && n == 0) => {
                    return bad(format!("value {n} is not acceptable"))
                }
                Some(_) => {}
            },
            "x-max-priority" => match int_arg(value) {
                None => return bad(format!("unacceptable type '{}'", type_name(value))),
                Some(n) if !(0..=255).contains(&n) => {
                    return bad(format!("value {n} is not acceptable"))
                }
                Some(_) => {}
            },
            "x-queue-mode" => match str_arg(value).as_deref() {
                Some("default" | "lazy") => {}
                Some(other) => return bad(format!("value '{other}' is not acceptable")),
                None => return bad(format!("unacceptable type '{}'", type_name(value))),
            },
            "x-dead-letter-exchange" | "x-dead-letter-routing-key"
                if str_arg(value).is_some_and(|v| v.len() > 255) =>
            {
                return bad("value is longer than 255 bytes".into());
            }
            "x-dead-letter-routing-key" if !args.contains_key("x-dead-letter-exchange") => {
                return bad(
                    "Key x-dead-letter-routing-key should be accompanied by x-dead-letter-exchange"
                        .into(),
                );
            }
            "x-dead-letter-exchange" | "x-dead-letter-routing-key" | "x-queue-type"
                if str_arg(value).is_none() =>
            {
                return bad(format!("unacceptable type '{}'", type_name(value)));
            }
            "x-overflow" => match str_arg(value).as_deref() {
                Some("drop-head" | "reject-publish" | "reject-publish-dlx") => {}
                Some(other) => return bad(format!("value '{other}' is not acceptable")),
                None => return bad(format!("unacceptable type '{}'", type_name(value))),
            },
            "x-single-active-consumer" if !matches!(value, AMQPValue::Boolean(_)) => {
                return bad(format!("unacceptable type '{}'", type_name(value)));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::ShortString;

    fn table(k: &str, v: AMQPValue) -> FieldTable {
        let mut t = FieldTable::default();
        t.insert(ShortString::from(k), v);
        t
    }

    #[test]
    fn typed_view() {
        let mut t = table("x-message-ttl", AMQPValue::ShortInt(500));
        t.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        t.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("dlx".into()),
        );
        let a = QueueArgs::from_table(&t);
        assert_eq!(a.message_ttl, Some(500));
        assert_eq!(a.overflow, Overflow::RejectPublish);
        assert_eq!(a.dead_letter_exchange.as_deref(), Some("dlx"));
        assert_eq!(a.max_length, None);
    }

    #[test]
    fn accepts_good_and_refuses_bad_args() {
        assert!(validate(&table("x-message-ttl", AMQPValue::LongInt(1000))).is_ok());
        assert!(validate(&table("x-message-ttl", AMQPValue::LongInt(-1))).is_err());
        assert!(validate(&table("x-message-ttl", AMQPValue::LongString("a".into()))).is_err());
        assert!(validate(&table("x-expires", AMQPValue::LongInt(0))).is_err());
        assert!(validate(&table("x-max-priority", AMQPValue::LongInt(256))).is_err());
        assert!(validate(&table(
            "x-overflow",
            AMQPValue::LongString("drop-tail".into())
        ))
        .is_err());
        assert!(validate(&table("x-custom", AMQPValue::Boolean(true))).is_ok());
    }
}
