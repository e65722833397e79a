//! RabbitMQ's equivalence rules: redeclaring an exchange or a queue must
//! ask for what it already is (type and flags, and the arguments RabbitMQ
//! compares), or the declare fails with 406 and RabbitMQ's text; a queue
//! redeclared with another exclusive flag is 405 instead. Pure functions:
//! the subject ("queue 'q' in vhost '/'") is given, the text comes back.

use amq_protocol::types::{AMQPValue, FieldTable};

use super::{ExchangeSpec, QueueSpec};
use crate::queue::QueueConfig;
use crate::vhost::Exchange;
use crate::wire::{type_name, value};

/// Queue arguments RabbitMQ compares on redeclare.
const QUEUE_ARGS_COMPARED: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
];

/// Exchange arguments RabbitMQ compares on redeclare.
const EXCHANGE_ARGS_COMPARED: &[&str] = &["alternate-exchange"];

/// How a queue redeclare differs from the queue.
#[derive(Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// The exclusive flag (405, RabbitMQ's "locked" text).
    Exclusive,
    /// Anything else (406), with RabbitMQ's text.
    Field(String),
}

/// Whether `spec` redeclares the queue `have`.
pub fn queue(spec: &QueueSpec, have: &QueueConfig, subject: &str) -> Result<(), Mismatch> {
    // In RabbitMQ's order: durable, exclusive, auto_delete, arguments.
    // It makes exclusive queues transient whatever was asked.
    let durable = spec.durable && !spec.exclusive;
    flags(&[("durable", durable, have.durable)], subject).map_err(Mismatch::Field)?;
    if spec.exclusive != have.exclusive_owner.is_some() {
        return Err(Mismatch::Exclusive);
    }
    flags(
        &[("auto_delete", spec.auto_delete, have.auto_delete)],
        subject,
    )
    .and_then(|()| {
        arguments(
            QUEUE_ARGS_COMPARED,
            &spec.arguments,
            &have.arguments,
            subject,
        )
    })
    .map_err(Mismatch::Field)
}

/// Whether `spec` redeclares the exchange `have`; the 406 text if not.
pub fn exchange(spec: &ExchangeSpec, have: &Exchange, subject: &str) -> Result<(), String> {
    if have.type_name != spec.kind {
        return Err(inequivalent("type", subject, &spec.kind, &have.type_name));
    }
    flags(
        &[
            ("durable", spec.durable, have.durable),
            ("auto_delete", spec.auto_delete, have.auto_delete),
            ("internal", spec.internal, have.internal),
        ],
        subject,
    )?;
    arguments(
        EXCHANGE_ARGS_COMPARED,
        &spec.arguments,
        &have.arguments,
        subject,
    )
}

fn inequivalent(field: &str, subject: &str, got: &str, have: &str) -> String {
    format!("inequivalent arg '{field}' for {subject}: received '{got}' but current is '{have}'")
}

fn flags(pairs: &[(&str, bool, bool)], subject: &str) -> Result<(), String> {
    for &(field, got, have) in pairs {
        if got != have {
            return Err(inequivalent(field, subject, bool_str(got), bool_str(have)));
        }
    }
    Ok(())
}

fn arguments(
    keys: &[&str],
    got: &FieldTable,
    have: &FieldTable,
    subject: &str,
) -> Result<(), String> {
    for key in keys {
        let (g, h) = (got.inner().get(*key), have.inner().get(*key));
        let same = match (g, h) {
            (None, None) => true,
            (Some(a), Some(b)) => same_value(a, b),
            _ => false,
        };
        if !same {
            // Two queue types are compared as types (RabbitMQ 3.10).
            if let (true, Some(a), Some(b)) = (*key == "x-queue-type", g, h) {
                return Err(inequivalent(key, subject, &value_text(a), &value_text(b)));
            }
            let describe = |v: Option<&AMQPValue>| match v {
                Some(v) => format!("the value '{}' of type '{}'", value_text(v), type_name(v)),
                None => "none".to_string(),
            };
            return Err(format!(
                "inequivalent arg '{key}' for {subject}: received {} but current is {}",
                describe(g),
                describe(h)
            ));
        }
    }
    Ok(())
}

fn bool_str(b: bool) -> &'static str {
    if b {
        "true"
    } else {
        "false"
    }
}

/// A value as RabbitMQ prints it in an equivalence error.
fn value_text(v: &AMQPValue) -> String {
    match v {
        AMQPValue::Boolean(b) => bool_str(*b).to_string(),
        v => match (value::int(v), value::text(v)) {
            (Some(n), _) => n.to_string(),
            (None, Some(s)) => s,
            (None, None) => format!("{v:?}"),
        },
    }
}

/// Numeric values compare by value across integer widths (clients differ
/// in which width they send), strings by their bytes whether short or
/// long, everything else exactly.
fn same_value(a: &AMQPValue, b: &AMQPValue) -> bool {
    match (value::int(a), value::int(b)) {
        (Some(x), Some(y)) => x == y,
        _ => match (value::bytes(a), value::bytes(b)) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUBJECT: &str = "queue 'q' in vhost '/'";

    fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    fn config(durable: bool, exclusive: bool, arguments: FieldTable) -> QueueConfig {
        QueueConfig {
            name: "q".into(),
            vhost: "/".into(),
            durable,
            exclusive_owner: exclusive.then_some(1),
            auto_delete: false,
            arguments,
            store_id: 0,
        }
    }

    fn spec(durable: bool, exclusive: bool, arguments: FieldTable) -> QueueSpec {
        QueueSpec {
            name: "q".into(),
            durable,
            exclusive,
            auto_delete: false,
            arguments,
            server_named: false,
        }
    }

    #[test]
    fn the_same_queue_redeclares_across_integer_widths_and_string_kinds() {
        let have = config(
            true,
            false,
            table(&[
                ("x-max-length", AMQPValue::LongLongInt(10)),
                ("x-overflow", AMQPValue::LongString("reject-publish".into())),
                ("x-unrelated", AMQPValue::Boolean(true)),
            ]),
        );
        let again = spec(
            true,
            false,
            table(&[
                ("x-max-length", AMQPValue::ShortInt(10)),
                (
                    "x-overflow",
                    AMQPValue::ShortString("reject-publish".into()),
                ),
            ]),
        );
        assert_eq!(
            queue(&again, &have, SUBJECT),
            Ok(()),
            "x-unrelated is not compared"
        );
    }

    #[test]
    fn a_different_argument_or_flag_is_406_with_rabbitmqs_text() {
        let have = config(
            true,
            false,
            table(&[("x-message-ttl", AMQPValue::LongInt(5))]),
        );
        let other = spec(
            true,
            false,
            table(&[("x-message-ttl", AMQPValue::LongInt(6))]),
        );
        assert_eq!(
            queue(&other, &have, SUBJECT),
            Err(Mismatch::Field(
                "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value \
                 '6' of type 'signedint' but current is the value '5' of type 'signedint'"
                    .into()
            ))
        );
        let missing = spec(true, false, FieldTable::default());
        let Err(Mismatch::Field(text)) = queue(&missing, &have, SUBJECT) else {
            panic!("a missing argument differs");
        };
        assert!(text.ends_with("received none but current is the value '5' of type 'signedint'"));
        let transient = spec(
            false,
            false,
            table(&[("x-message-ttl", AMQPValue::LongInt(5))]),
        );
        assert_eq!(
            queue(&transient, &have, SUBJECT),
            Err(Mismatch::Field(
                "inequivalent arg 'durable' for queue 'q' in vhost '/': received 'false' but \
                 current is 'true'"
                    .into()
            ))
        );
    }

    #[test]
    fn exclusivity_differs_as_a_lock_and_exclusive_queues_are_transient() {
        let exclusive = config(false, true, FieldTable::default());
        // durable=true on an exclusive queue is taken as transient.
        assert_eq!(
            queue(
                &spec(true, true, FieldTable::default()),
                &exclusive,
                SUBJECT
            ),
            Ok(())
        );
        assert_eq!(
            queue(
                &spec(false, false, FieldTable::default()),
                &exclusive,
                SUBJECT
            ),
            Err(Mismatch::Exclusive)
        );
    }
}
