//! Queue arguments (`x-...` on queue.declare): validation with RabbitMQ's
//! wording, and the typed view the queue works from.

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::wire::type_name;
use crate::wire::value::{int as int_arg, text as str_arg};

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
    /// Whether x-overflow was given (it then wins over a policy's).
    pub overflow_set: bool,
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
    /// `x-consumer-timeout`, ms (0 = none): how long a delivery may stay
    /// unacked (RabbitMQ 3.12+).
    pub consumer_timeout: Option<u64>,
    /// `x-queue-type`.
    pub kind: super::kind::Kind,
    /// A stream's `x-max-age`, ms.
    pub max_age_ms: Option<u64>,
    /// A stream's `x-stream-max-segment-size-bytes`.
    pub stream_segment_bytes: Option<u64>,
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
            overflow: overflow(get("x-overflow").and_then(str_arg).as_deref()),
            overflow_set: get("x-overflow").is_some(),
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
            consumer_timeout: uint("x-consumer-timeout"),
            kind: super::kind::Kind::of(args),
            max_age_ms: get("x-max-age")
                .and_then(str_arg)
                .and_then(|a| max_age_ms(&a)),
            stream_segment_bytes: uint("x-stream-max-segment-size-bytes"),
        }
    }
}

fn overflow(word: Option<&str>) -> Overflow {
    match word {
        Some("reject-publish") => Overflow::RejectPublish,
        Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
        _ => Overflow::DropHead,
    }
}

impl QueueArgs {
    /// The arguments in force when `policy` (the definition the queue's
    /// policy and operator policy make together) applies, as RabbitMQ
    /// merges them: expires, message-ttl, max-length, max-length-bytes,
    /// consumer-timeout, delivery-limit, and a stream's max-age and
    /// stream-max-segment-size-bytes take the lower of the two;
    /// dead-letter-exchange, dead-letter-routing-key and overflow take the
    /// x-argument when there is one. A stream takes only max-length-bytes,
    /// max-age and stream-max-segment-size-bytes.
    pub fn with_policy(&self, policy: &serde_json::Map<String, serde_json::Value>) -> QueueArgs {
        let num = |k: &str| policy.get(k).and_then(serde_json::Value::as_u64);
        let text = |k: &str| policy.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let lower = |mine: Option<u64>, k: &str| match (mine, num(k)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut a = self.clone();
        a.stream_segment_bytes = lower(self.stream_segment_bytes, "stream-max-segment-size-bytes");
        let policy_age = policy
            .get("max-age")
            .and_then(|v| v.as_str())
            .and_then(max_age_ms);
        a.max_age_ms = match (self.max_age_ms, policy_age) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        a.max_length_bytes = lower(self.max_length_bytes, "max-length-bytes");
        if self.kind == super::kind::Kind::Stream {
            // A stream takes its retention from a policy and nothing else
            // (as RabbitMQ's): expires would delete it, message-ttl,
            // max-length, dead-lettering and consumer-timeout are queues'.
            return a;
        }
        a.message_ttl = lower(self.message_ttl, "message-ttl");
        a.expires = lower(self.expires, "expires").filter(|&ms| ms > 0);
        a.max_length = lower(self.max_length, "max-length");
        a.consumer_timeout = lower(self.consumer_timeout, "consumer-timeout");
        a.delivery_limit = lower(self.delivery_limit, "delivery-limit");
        if self.dead_letter_exchange.is_none() {
            a.dead_letter_exchange = text("dead-letter-exchange");
        }
        if self.dead_letter_routing_key.is_none() {
            a.dead_letter_routing_key = text("dead-letter-routing-key");
        }
        if !self.overflow_set {
            a.overflow = overflow(policy.get("overflow").and_then(|v| v.as_str()));
        }
        a
    }
}

/// Checks the x-arguments a queue.declare for `subject` ("queue 'q' in
/// vhost '/'") carries; on error, the reply's text as RabbitMQ 3.10 words
/// it ("invalid arg 'x-message-ttl' for queue 'q' in vhost '/':
/// {value_negative,-1}", the reason as the Erlang term it prints).
pub fn validate(args: &FieldTable, subject: &str) -> Result<(), String> {
    // rabbit_channel checks the dead-letter exchange's type first, in words
    // of its own.
    if let Some(v) = args.inner().get("x-dead-letter-exchange") {
        if str_arg(v).is_none() {
            return Err(format!(
                "invalid type '{}' for arg 'x-dead-letter-exchange' in {subject}",
                type_name(v)
            ));
        }
    }
    for (key, value) in args.inner() {
        let key = key.as_str();
        if let Err(why) = check(key, value, args) {
            return Err(format!("invalid arg '{key}' for {subject}: {why}"));
        }
    }
    Ok(())
}

/// One argument (RabbitMQ's rabbit_amqqueue check_*_arg functions).
fn check(key: &str, value: &AMQPValue, args: &FieldTable) -> Result<(), String> {
    let wrong_type = || Err(format!("{{unacceptable_type,{}}}", type_name(value)));
    let string = || match str_arg(value) {
        // Names go out as short strings (dead-lettering routes by them).
        Some(s) if s.len() > 255 => Err("name longer than 255 bytes".into()),
        Some(_) => Ok(()),
        None => wrong_type(),
    };
    // RabbitMQ prints the reason with ~p: a string comes out quoted.
    let int = || match int_arg(value) {
        None => Err(format!("\"expected integer, got {}\"", type_name(value))),
        Some(n) if n < 0 => Err(format!("{{value_negative,{n}}}")),
        Some(n) => Ok(n),
    };
    // rabbit_misc:check_expiry: at most ten years.
    let expiry = || match int()? {
        n if n > 315_360_000_000 => Err(format!("{{value_too_large,{n}}}")),
        n => Ok(n),
    };
    let one_of = |words: &[&str], why: &str| match str_arg(value) {
        Some(w) if words.contains(&w.as_str()) => Ok(()),
        Some(_) => Err(why.to_string()),
        None => wrong_type(),
    };
    match key {
        "x-max-length" | "x-max-length-bytes" | "x-delivery-limit" | "x-consumer-timeout" => {
            int().map(drop)
        }
        "x-message-ttl" => expiry().map(drop),
        "x-expires" => match expiry()? {
            0 => Err("{value_zero,0}".into()),
            _ => Ok(()),
        },
        "x-max-priority" => match int()? {
            n if n > 255 => Err(format!("{{max_value_exceeded,{n}}}")),
            _ => Ok(()),
        },
        "x-dead-letter-exchange" => string(),
        "x-dead-letter-routing-key" => {
            string()?;
            if args.contains_key("x-dead-letter-exchange") {
                Ok(())
            } else {
                Err("routing_key_but_no_dlx_defined".into())
            }
        }
        "x-overflow" => {
            string()?;
            match str_arg(value).as_deref() {
                Some("drop-head" | "reject-publish" | "reject-publish-dlx") => Ok(()),
                _ => Err("invalid_overflow".into()),
            }
        }
        "x-queue-mode" => {
            string()?;
            match str_arg(value) {
                Some(m) if m == "default" || m == "lazy" => Ok(()),
                Some(m) => Err(format!("\"unsupported queue mode '{m}'\"")),
                None => Err("invalid_queue_mode".into()),
            }
        }
        "x-queue-version" => match int()? {
            1 | 2 => Ok(()),
            n => Err(format!("\"unsupported queue version '{n}'\"")),
        },
        "x-queue-type" => super::kind::check_type(value),
        "x-quorum-initial-group-size" => match int()? {
            0 => Err("{value_zero,0}".into()),
            _ => Ok(()),
        },
        "x-max-in-memory-length" | "x-max-in-memory-bytes" => int().map(drop),
        "x-dead-letter-strategy" => {
            one_of(&["at-most-once", "at-least-once"], "invalid_dlx_strategy")
        }
        "x-queue-leader-locator" => {
            one_of(&["client-local", "balanced"], "invalid_queue_locator_arg")
        }
        "x-max-age" => match str_arg(value) {
            Some(age) => max_age_ms(&age)
                .map(drop)
                .ok_or_else(|| "invalid_max_age".into()),
            None => wrong_type(),
        },
        "x-stream-max-segment-size-bytes" => int().map(drop),
        "x-initial-cluster-size" => match int()? {
            0 => Err("{value_zero,0}".into()),
            _ => Ok(()),
        },
        "x-stream-filter-size-bytes" => match int()? {
            16..=255 => Ok(()),
            n => Err(format!("{{value_out_of_range,{n}}}")),
        },
        "x-single-active-consumer" => match value {
            AMQPValue::Boolean(_) => Ok(()),
            _ => wrong_type(),
        },
        _ => Ok(()),
    }
}

/// A stream's x-max-age ("7D", "12h", "30m", "10s", "1Y", "1M": a
/// positive number and one unit, as RabbitMQ reads it: a year is 365
/// days, a month 30) in ms; None if it is not one.
pub fn max_age_ms(age: &str) -> Option<u64> {
    let split = age.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = age.split_at(split);
    let n: u64 = n.parse().ok().filter(|&n| n > 0)?;
    let secs: u64 = match unit {
        "Y" => 365 * 86_400,
        "M" => 30 * 86_400,
        "D" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => return None,
    };
    n.checked_mul(secs)?.checked_mul(1000)
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
    fn a_policy_merges_as_rabbitmq_merges_it() {
        let mut t = table("x-message-ttl", AMQPValue::LongInt(500));
        t.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("mine".into()),
        );
        let declared = QueueArgs::from_table(&t);
        let policy = serde_json::json!({
            "message-ttl": 1000, "max-length": 3, "dead-letter-exchange": "theirs",
            "dead-letter-routing-key": "k", "overflow": "reject-publish"
        });
        let a = declared.with_policy(policy.as_object().unwrap());
        assert_eq!(a.message_ttl, Some(500), "the lower TTL");
        assert_eq!(a.max_length, Some(3));
        assert_eq!(
            a.dead_letter_exchange.as_deref(),
            Some("mine"),
            "the x-argument"
        );
        assert_eq!(a.dead_letter_routing_key.as_deref(), Some("k"));
        assert_eq!(a.overflow, Overflow::RejectPublish);
        let lower = serde_json::json!({"message-ttl": 100});
        assert_eq!(
            declared.with_policy(lower.as_object().unwrap()).message_ttl,
            Some(100)
        );
        assert_eq!(declared.with_policy(&Default::default()), declared);
    }

    fn check_one(t: &FieldTable) -> Result<(), String> {
        validate(t, "queue 'q' in vhost '/'")
    }

    #[test]
    fn a_dead_letter_exchange_of_another_type_is_worded_as_rabbitmqs() {
        assert_eq!(
            check_one(&table("x-dead-letter-exchange", AMQPValue::LongLongInt(5))).unwrap_err(),
            "invalid type 'long' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'"
        );
    }

    #[test]
    fn accepts_good_and_refuses_bad_args() {
        assert!(check_one(&table("x-message-ttl", AMQPValue::LongInt(1000))).is_ok());
        assert!(check_one(&table("x-message-ttl", AMQPValue::LongInt(-1))).is_err());
        assert!(check_one(&table("x-message-ttl", AMQPValue::LongString("a".into()))).is_err());
        assert!(check_one(&table("x-expires", AMQPValue::LongInt(0))).is_err());
        assert!(check_one(&table("x-max-priority", AMQPValue::LongInt(256))).is_err());
        assert!(check_one(&table(
            "x-overflow",
            AMQPValue::LongString("drop-tail".into())
        ))
        .is_err());
        assert!(check_one(&table("x-custom", AMQPValue::Boolean(true))).is_ok());
    }

    #[test]
    fn errors_read_as_rabbitmq_prints_them() {
        let why = |k: &str, v: AMQPValue| {
            let text = check_one(&table(k, v)).unwrap_err();
            let prefix = format!("invalid arg '{k}' for queue 'q' in vhost '/': ");
            text.strip_prefix(&prefix).unwrap_or(&text).to_string()
        };
        assert_eq!(
            why("x-message-ttl", AMQPValue::LongInt(-1)),
            "{value_negative,-1}"
        );
        assert_eq!(
            why("x-max-length", AMQPValue::LongString("a".into())),
            "\"expected integer, got longstr\""
        );
        assert_eq!(
            why("x-message-ttl", AMQPValue::LongLongInt(315_360_000_001)),
            "{value_too_large,315360000001}"
        );
        assert_eq!(
            why("x-queue-mode", AMQPValue::LongString("eager".into())),
            "\"unsupported queue mode 'eager'\""
        );
        assert_eq!(
            why("x-queue-version", AMQPValue::LongInt(3)),
            "\"unsupported queue version '3'\""
        );
        assert!(check_one(&table("x-queue-version", AMQPValue::LongInt(2))).is_ok());
        assert_eq!(why("x-expires", AMQPValue::LongInt(0)), "{value_zero,0}");
        assert_eq!(
            why("x-max-priority", AMQPValue::LongInt(300)),
            "{max_value_exceeded,300}"
        );
        assert_eq!(
            why("x-overflow", AMQPValue::LongString("x".into())),
            "invalid_overflow"
        );
        assert_eq!(
            why(
                "x-dead-letter-routing-key",
                AMQPValue::LongString("k".into())
            ),
            "routing_key_but_no_dlx_defined"
        );
        assert_eq!(
            why("x-single-active-consumer", AMQPValue::LongInt(1)),
            "{unacceptable_type,signedint}"
        );
    }

    #[test]
    fn max_age_reads_as_rabbitmq_reads_it() {
        assert_eq!(max_age_ms("10s"), Some(10_000));
        assert_eq!(max_age_ms("30m"), Some(1_800_000));
        assert_eq!(max_age_ms("12h"), Some(43_200_000));
        assert_eq!(max_age_ms("7D"), Some(604_800_000));
        assert_eq!(max_age_ms("1M"), Some(2_592_000_000));
        assert_eq!(max_age_ms("1Y"), Some(31_536_000_000));
        for bad in [
            "",
            "0D",
            "D",
            "7",
            "7d",
            "7 D",
            "-1h",
            "1.5h",
            "99999999999999999999Y",
        ] {
            assert_eq!(max_age_ms(bad), None, "{bad}");
        }
        let t = table("x-max-age", AMQPValue::LongString("7x".into()));
        assert_eq!(
            validate(&t, "queue 's' in vhost '/'").unwrap_err(),
            "invalid arg 'x-max-age' for queue 's' in vhost '/': invalid_max_age"
        );
    }

    #[test]
    fn a_stream_takes_only_retention_from_a_policy() {
        let mut t = table("x-queue-type", AMQPValue::LongString("stream".into()));
        t.insert("x-max-age".into(), AMQPValue::LongString("1D".into()));
        let stream = QueueArgs::from_table(&t);
        let policy = serde_json::json!({
            "expires": 1000, "message-ttl": 10, "max-length": 5, "consumer-timeout": 100,
            "dead-letter-exchange": "dlx", "overflow": "reject-publish", "delivery-limit": 1,
            "max-length-bytes": 4096, "max-age": "1h", "stream-max-segment-size-bytes": 1024,
        });
        let live = stream.with_policy(policy.as_object().unwrap());
        assert_eq!(live.max_length_bytes, Some(4096));
        assert_eq!(live.max_age_ms, Some(3_600_000));
        assert_eq!(live.stream_segment_bytes, Some(1024));
        assert_eq!(
            (
                live.expires,
                live.message_ttl,
                live.max_length,
                live.consumer_timeout
            ),
            (None, None, None, None)
        );
        assert_eq!(live.dead_letter_exchange, None);
        assert_eq!(live.overflow, Overflow::DropHead);
        assert_eq!(live.delivery_limit, None);
        // A classic queue takes them all.
        let classic = QueueArgs::default().with_policy(policy.as_object().unwrap());
        assert_eq!(classic.expires, Some(1000));
        assert_eq!(classic.max_length, Some(5));
    }
}
