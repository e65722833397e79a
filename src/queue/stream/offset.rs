//! Where a stream reader starts (the `x-stream-offset` consumer
//! argument, as RabbitMQ reads it): `first`, `last`, `next` (the
//! default), a number, an AMQP timestamp (seconds), or an interval
//! ("1h": from that long ago).

use amq_protocol::types::AMQPValue;

use crate::queue::args::max_age_ms;
use crate::wire::value::{int, text};

/// Where a reader starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Start {
    /// The first message the stream keeps.
    First,
    /// The last message (the last chunk's start in RabbitMQ; a Warren
    /// stream's chunk is one message).
    Last,
    /// The next message published.
    #[default]
    Next,
    /// This offset, clamped to what the stream keeps.
    Offset(u64),
    /// The first message stored at or after this time (ms since the
    /// epoch; second precision: from the first message of its second).
    Time(u64),
}

impl Start {
    /// Reads the x-stream-offset argument (None: `Next`); `now_ms` is the
    /// wall clock an interval counts back from. An error names what was
    /// wrong.
    pub fn parse(value: Option<&AMQPValue>, now_ms: u64) -> Result<Start, String> {
        let Some(value) = value else {
            return Ok(Start::Next);
        };
        if let AMQPValue::Timestamp(secs) = value {
            return Ok(Start::Time(secs.saturating_mul(1000)));
        }
        if let Some(word) = text(value) {
            return match word.as_str() {
                "first" => Ok(Start::First),
                "last" => Ok(Start::Last),
                "next" => Ok(Start::Next),
                interval => match max_age_ms(interval) {
                    Some(ms) => Ok(Start::Time(now_ms.saturating_sub(ms))),
                    None => Err(format!("invalid x-stream-offset '{interval}'")),
                },
            };
        }
        match int(value) {
            Some(n) => u64::try_from(n)
                .map(Start::Offset)
                .map_err(|_| format!("invalid x-stream-offset {n}")),
            None => Err(format!(
                "invalid x-stream-offset of type {}",
                crate::wire::type_name(value)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_rabbitmq_takes() {
        let now = 10_000_000;
        let parse = |v: AMQPValue| Start::parse(Some(&v), now);
        assert_eq!(Start::parse(None, now), Ok(Start::Next));
        assert_eq!(
            parse(AMQPValue::LongString("first".into())),
            Ok(Start::First)
        );
        assert_eq!(
            parse(AMQPValue::ShortString("last".into())),
            Ok(Start::Last)
        );
        assert_eq!(parse(AMQPValue::LongString("next".into())), Ok(Start::Next));
        assert_eq!(parse(AMQPValue::LongLongInt(42)), Ok(Start::Offset(42)));
        assert_eq!(parse(AMQPValue::ShortShortUInt(7)), Ok(Start::Offset(7)));
        assert_eq!(
            parse(AMQPValue::Timestamp(1234)),
            Ok(Start::Time(1_234_000))
        );
        assert_eq!(
            parse(AMQPValue::LongString("10s".into())),
            Ok(Start::Time(now - 10_000))
        );
        assert!(parse(AMQPValue::LongLongInt(-1)).is_err());
        assert!(parse(AMQPValue::LongString("sometime".into())).is_err());
        assert!(parse(AMQPValue::Boolean(true)).is_err());
    }
}
