//! The `x-delayed-message` exchange type, compatible with RabbitMQ's
//! rabbitmq_delayed_message_exchange: declared with the required argument
//! `x-delayed-type` (direct, topic, fanout or headers), it routes like that
//! type, except that a message with an `x-delay` header (milliseconds) is
//! held until the delay has passed. No header, or a delay <= 0, routes at
//! once. On release the header becomes the negative delay, as the RabbitMQ
//! plugin does.
//!
//! The broker does the holding (on disk, keyed by due time, so a million
//! pending messages cost disk, not memory, and delays have no 2^32 ms cap).

use warren_plugin_api::{
    value, AMQPValue, Disposition, ExchangeType, FieldTable, MessageView, Table,
};

/// The exchange type.
pub struct DelayedMessage;

const INNER: &[&str] = &["direct", "topic", "fanout", "headers"];

fn inner_type(args: &FieldTable) -> Result<&'static str, String> {
    let name = match args.inner().get("x-delayed-type") {
        Some(v) => value::text(v).ok_or("Invalid x-delayed-type argument")?,
        None => return Err("Missing argument x-delayed-type".into()),
    };
    INNER
        .iter()
        .find(|t| **t == name)
        .copied()
        .ok_or_else(|| format!("Invalid x-delayed-type '{name}'"))
}

/// The delay a message asks for, in ms (None: route now).
fn delay_of(msg: &MessageView<'_>) -> Option<u64> {
    let v = msg.headers?.inner().get("x-delay")?;
    let ms: i128 = if let Some(n) = value::int(v) {
        n as i128
    } else {
        match v {
            AMQPValue::Float(f) => *f as i128,
            AMQPValue::Double(f) => *f as i128,
            // A number sent as a string, as some clients do.
            v => std::str::from_utf8(value::bytes(v)?)
                .ok()?
                .trim()
                .parse()
                .ok()?,
        }
    };
    (ms > 0).then(|| ms.min(u64::MAX as i128) as u64)
}

impl ExchangeType for DelayedMessage {
    fn name(&self) -> &'static str {
        "x-delayed-message"
    }

    fn validate(&self, arguments: &FieldTable) -> Result<(), String> {
        inner_type(arguments).map(|_| ())
    }

    fn new_table(&self, arguments: &FieldTable) -> Table {
        Table::Builtin(inner_type(arguments).unwrap_or("direct"))
    }

    fn on_publish(&self, msg: &MessageView<'_>) -> Disposition {
        match delay_of(msg) {
            Some(ms) => Disposition::Delay(ms),
            None => Disposition::Route,
        }
    }

    fn released(&self, delay_ms: u64) -> Vec<(&'static str, AMQPValue)> {
        let negative = -(delay_ms.min(i64::MAX as u64) as i64);
        vec![("x-delay", AMQPValue::LongLongInt(negative))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(t: &str) -> FieldTable {
        let mut a = FieldTable::default();
        a.insert("x-delayed-type".into(), AMQPValue::LongString(t.into()));
        a
    }

    fn with_delay(v: AMQPValue) -> FieldTable {
        let mut h = FieldTable::default();
        h.insert("x-delay".into(), v);
        h
    }

    #[test]
    fn requires_a_known_inner_type() {
        assert!(DelayedMessage.validate(&FieldTable::default()).is_err());
        assert!(DelayedMessage.validate(&args("x-delayed-message")).is_err());
        assert!(DelayedMessage.validate(&args("topic")).is_ok());
        assert!(matches!(
            DelayedMessage.new_table(&args("fanout")),
            Table::Builtin("fanout")
        ));
    }

    #[test]
    fn delay_header_decides() {
        fn view(h: Option<&FieldTable>) -> MessageView<'_> {
            MessageView {
                routing_key: "k",
                headers: h,
                raw_properties: &[0, 0],
            }
        }
        assert_eq!(DelayedMessage.on_publish(&view(None)), Disposition::Route);
        let h = with_delay(AMQPValue::LongInt(1500));
        assert_eq!(
            DelayedMessage.on_publish(&view(Some(&h))),
            Disposition::Delay(1500)
        );
        let h = with_delay(AMQPValue::LongInt(0));
        assert_eq!(
            DelayedMessage.on_publish(&view(Some(&h))),
            Disposition::Route
        );
        let h = with_delay(AMQPValue::LongInt(-5));
        assert_eq!(
            DelayedMessage.on_publish(&view(Some(&h))),
            Disposition::Route
        );
        // Past 2^32 ms (49.7 days): no cap.
        let h = with_delay(AMQPValue::LongLongInt(10_000_000_000));
        assert_eq!(
            DelayedMessage.on_publish(&view(Some(&h))),
            Disposition::Delay(10_000_000_000)
        );
        let h = with_delay(AMQPValue::LongString("250".into()));
        assert_eq!(
            DelayedMessage.on_publish(&view(Some(&h))),
            Disposition::Delay(250)
        );
    }

    #[test]
    fn release_makes_the_delay_negative() {
        assert_eq!(
            DelayedMessage.released(1500),
            vec![("x-delay", AMQPValue::LongLongInt(-1500))]
        );
    }
}
