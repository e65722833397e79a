//! Stream filtering, as RabbitMQ's consumer arguments ask for it: a
//! publisher labels a message with the `x-stream-filter-value` header (a
//! string); a consumer names the values it wants in `x-stream-filter` (a
//! string or an array of them), and with `x-stream-match-unfiltered`
//! true takes the messages that carry no value too.
//!
//! RabbitMQ tests a Bloom filter per chunk, so its consumers get other
//! values too and must filter again. Warren tests each message's value:
//! a reader gets exactly the messages it asked for (and
//! `x-stream-filter-size-bytes`, the Bloom filter's size, has nothing
//! to size).

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::message::Message;
use crate::wire::table;
use crate::wire::value::text;

/// The header a publisher labels a message with.
pub const VALUE_HEADER: &str = "x-stream-filter-value";

/// What a filtered reader takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    values: Vec<Vec<u8>>,
    unfiltered: bool,
}

impl Filter {
    /// The filter a consumer's arguments ask for (None: it takes every
    /// message); an error names the argument that is wrong.
    pub fn parse(args: &FieldTable) -> Result<Option<Filter>, String> {
        let args = args.inner();
        let unfiltered = match args.get("x-stream-match-unfiltered") {
            None => false,
            Some(AMQPValue::Boolean(b)) => *b,
            Some(v) => {
                return Err(format!(
                    "invalid x-stream-match-unfiltered of type {}: a boolean is expected",
                    crate::wire::type_name(v)
                ))
            }
        };
        let values = match args.get("x-stream-filter") {
            None => return Ok(None),
            Some(AMQPValue::FieldArray(list)) => list
                .as_slice()
                .iter()
                .map(|v| text(v).map(String::into_bytes))
                .collect::<Option<Vec<_>>>()
                .ok_or("invalid x-stream-filter: every value must be a string")?,
            Some(v) => match text(v) {
                Some(one) => vec![one.into_bytes()],
                None => {
                    return Err(format!(
                        "invalid x-stream-filter of type {}: a string or an array of strings \
                         is expected",
                        crate::wire::type_name(v)
                    ))
                }
            },
        };
        if values.is_empty() {
            return Ok(None);
        }
        Ok(Some(Filter { values, unfiltered }))
    }

    /// The filter of a stream protocol subscription: the values of its
    /// `filter.N` properties, and its `match-unfiltered` (None: no values,
    /// it takes every message).
    pub fn of_values(values: Vec<Vec<u8>>, unfiltered: bool) -> Option<Filter> {
        (!values.is_empty()).then_some(Filter { values, unfiltered })
    }

    /// Whether `msg` is one this reader takes.
    pub fn matches(&self, msg: &Message) -> bool {
        let value = msg
            .raw_headers()
            .and_then(|h| table::get(h, VALUE_HEADER.as_bytes()));
        match value {
            None => self.unfiltered,
            Some(v) => match v.as_long_str() {
                Some(s) => self.values.iter().any(|want| want == s),
                // A label that is not a string matches no value.
                None => false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::FieldArray;

    fn args(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    fn labelled(value: Option<&str>) -> Message {
        let m = Message::new(b"", b"s", &[0, 0], b"body", crate::message::Meta::default());
        match value {
            Some(v) => m.with_header(VALUE_HEADER, AMQPValue::LongString(v.into())),
            None => m,
        }
    }

    #[test]
    fn a_reader_gets_exactly_the_values_it_names() {
        let list = AMQPValue::FieldArray(FieldArray::from(vec![
            AMQPValue::LongString("red".into()),
            AMQPValue::LongString("blue".into()),
        ]));
        let f = Filter::parse(&args(&[("x-stream-filter", list)]))
            .unwrap()
            .unwrap();
        assert!(f.matches(&labelled(Some("red"))));
        assert!(f.matches(&labelled(Some("blue"))));
        assert!(!f.matches(&labelled(Some("green"))));
        assert!(!f.matches(&labelled(Some("re"))));
        assert!(!f.matches(&labelled(None)));

        let one = args(&[
            ("x-stream-filter", AMQPValue::LongString("red".into())),
            ("x-stream-match-unfiltered", AMQPValue::Boolean(true)),
        ]);
        let f = Filter::parse(&one).unwrap().unwrap();
        assert!(f.matches(&labelled(Some("red"))));
        assert!(f.matches(&labelled(None)));
        assert!(!f.matches(&labelled(Some("blue"))));
    }

    #[test]
    fn no_filter_and_bad_filters() {
        assert_eq!(Filter::parse(&args(&[])), Ok(None));
        let empty = AMQPValue::FieldArray(FieldArray::default());
        assert_eq!(
            Filter::parse(&args(&[("x-stream-filter", empty)])),
            Ok(None)
        );
        assert!(Filter::parse(&args(&[("x-stream-filter", AMQPValue::LongLongInt(3))])).is_err());
        let mixed = AMQPValue::FieldArray(FieldArray::from(vec![
            AMQPValue::LongString("red".into()),
            AMQPValue::Boolean(true),
        ]));
        assert!(Filter::parse(&args(&[("x-stream-filter", mixed)])).is_err());
        let bad = args(&[
            ("x-stream-filter", AMQPValue::LongString("red".into())),
            (
                "x-stream-match-unfiltered",
                AMQPValue::LongString("yes".into()),
            ),
        ]);
        assert!(Filter::parse(&bad).is_err());
    }
}
