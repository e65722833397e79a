//! Queue types (`x-queue-type`): classic; quorum, a durable queue that
//! keeps every message in the store whatever its delivery mode (on a
//! cluster, every message is replicated with the node state); and stream,
//! an append-only log read by offset (stream/). Quorum queues and streams
//! refuse what RabbitMQ 3.10's refuse, with its wording.

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::wire::value::text;

/// The types a queue may be declared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    #[default]
    Classic,
    Quorum,
    Stream,
}

/// RabbitMQ's module names for the queue types, which its errors print.
const QUORUM_MODULE: &str = "rabbit_quorum_queue";
const CLASSIC_MODULE: &str = "rabbit_classic_queue";
const STREAM_MODULE: &str = "rabbit_stream_queue";

/// Arguments of quorum queues and streams that classic queues refuse, as
/// RabbitMQ 3.10's do. (x-delivery-limit is not among them: Warren's
/// classic queues honour it.)
const NOT_FOR_CLASSIC: &[&str] = &[
    "x-dead-letter-strategy",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-quorum-initial-group-size",
    "x-queue-leader-locator",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
];

/// Arguments RabbitMQ knows for some queue type but quorum queues refuse.
const NOT_FOR_QUORUM: &[&str] = &[
    "x-max-priority",
    "x-queue-mode",
    "x-queue-version",
    "x-queue-master-locator",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
];

/// Arguments streams refuse (RabbitMQ 3.10's stream queue capabilities,
/// and x-consumer-timeout, which a stream's reads never act on).
const NOT_FOR_STREAM: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-max-length",
    "x-max-priority",
    "x-queue-mode",
    "x-overflow",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-quorum-initial-group-size",
    "x-cancel-on-ha-failover",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-delivery-limit",
    "x-dead-letter-strategy",
    "x-single-active-consumer",
    "x-queue-version",
    "x-consumer-timeout",
];

impl Kind {
    /// The type `args` declare (classic when none; an unknown one reads as
    /// classic, `check_type` refuses it at declare).
    pub fn of(args: &FieldTable) -> Kind {
        match args.inner().get("x-queue-type").and_then(text).as_deref() {
            Some("quorum") => Kind::Quorum,
            Some("stream") => Kind::Stream,
            _ => Kind::Classic,
        }
    }
}

/// The x-queue-type value check, as RabbitMQ words it.
pub(super) fn check_type(value: &AMQPValue) -> Result<(), String> {
    match text(value).as_deref() {
        Some("classic" | "quorum" | "stream") => Ok(()),
        Some(other) => Err(format!("\"unsupported queue type '{other}'\"")),
        None => Err(format!(
            "{{unacceptable_type,{}}}",
            crate::wire::type_name(value)
        )),
    }
}

/// What a declare of a queue of type `kind` may not ask for, after its
/// arguments passed `args::validate`. `describe` is "queue 'q' in vhost
/// '/'". The order is RabbitMQ's: a server-named queue, the refused
/// arguments, then auto-delete, exclusive and non-durable.
pub fn check_declare(kind: Kind, spec: Declared<'_>, describe: &str) -> Result<(), String> {
    if kind == Kind::Classic {
        return match NOT_FOR_CLASSIC
            .iter()
            .find(|a| spec.arguments.contains_key(a))
        {
            Some(arg) => Err(format!(
                "invalid arg '{arg}' for {describe} of queue type {CLASSIC_MODULE}"
            )),
            None => Ok(()),
        };
    }
    let (module, refused) = match kind {
        Kind::Stream => (STREAM_MODULE, NOT_FOR_STREAM),
        _ => (QUORUM_MODULE, NOT_FOR_QUORUM),
    };
    if spec.server_named {
        return Err(format!(
            "Cannot declare a server-named queue for type {module}"
        ));
    }
    if let Some(arg) = refused.iter().find(|a| spec.arguments.contains_key(a)) {
        return Err(format!(
            "invalid arg '{arg}' for {describe} of queue type {module}"
        ));
    }
    let property = if spec.auto_delete {
        "auto-delete"
    } else if spec.exclusive {
        "exclusive-owner"
    } else if !spec.durable {
        "non-durable"
    } else {
        return Ok(());
    };
    Err(format!("invalid property '{property}' for {describe}"))
}

/// The parts of a declare the type checks look at.
#[derive(Debug, Clone, Copy)]
pub struct Declared<'a> {
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    pub server_named: bool,
    pub arguments: &'a FieldTable,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quorum(extra: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        t.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        for (k, v) in extra {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    fn declared(args: &FieldTable) -> Declared<'_> {
        Declared {
            durable: true,
            exclusive: false,
            auto_delete: false,
            server_named: false,
            arguments: args,
        }
    }

    const Q: &str = "queue 'q' in vhost '/'";

    #[test]
    fn quorum_refuses_what_rabbitmq_refuses_in_its_order() {
        let args = quorum(&[]);
        assert_eq!(Kind::of(&args), Kind::Quorum);
        assert!(check_declare(Kind::Quorum, declared(&args), Q).is_ok());
        let with = |f: fn(&mut Declared)| {
            let mut d = declared(&args);
            f(&mut d);
            check_declare(Kind::Quorum, d, Q).unwrap_err()
        };
        assert_eq!(
            with(|d| d.durable = false),
            "invalid property 'non-durable' for queue 'q' in vhost '/'"
        );
        assert_eq!(
            with(|d| {
                d.durable = false;
                d.exclusive = true
            }),
            "invalid property 'exclusive-owner' for queue 'q' in vhost '/'"
        );
        assert_eq!(
            with(|d| {
                d.exclusive = true;
                d.auto_delete = true
            }),
            "invalid property 'auto-delete' for queue 'q' in vhost '/'"
        );
        assert_eq!(
            with(|d| d.server_named = true),
            "Cannot declare a server-named queue for type rabbit_quorum_queue"
        );
        let prio = quorum(&[("x-max-priority", AMQPValue::LongInt(5))]);
        let mut d = declared(&prio);
        d.durable = false;
        assert_eq!(
            check_declare(Kind::Quorum, d, Q).unwrap_err(),
            "invalid arg 'x-max-priority' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue"
        );
        let allowed = quorum(&[
            ("x-delivery-limit", AMQPValue::LongInt(3)),
            ("x-quorum-initial-group-size", AMQPValue::LongInt(3)),
            ("x-message-ttl", AMQPValue::LongInt(1000)),
            ("x-overflow", AMQPValue::LongString("reject-publish".into())),
        ]);
        assert!(check_declare(Kind::Quorum, declared(&allowed), Q).is_ok());
    }

    #[test]
    fn classic_refuses_quorum_and_stream_arguments_and_other_types_are_unsupported() {
        let none = FieldTable::default();
        let mut d = declared(&none);
        d.durable = false;
        d.server_named = true;
        assert!(check_declare(Kind::Classic, d, Q).is_ok());
        let mut quorum_only = FieldTable::default();
        quorum_only.insert("x-max-in-memory-length".into(), AMQPValue::LongInt(5));
        assert_eq!(
            check_declare(Kind::Classic, declared(&quorum_only), Q).unwrap_err(),
            "invalid arg 'x-max-in-memory-length' for queue 'q' in vhost '/' of queue type rabbit_classic_queue"
        );
        let mut limited = FieldTable::default();
        limited.insert("x-delivery-limit".into(), AMQPValue::LongInt(5));
        assert!(check_declare(Kind::Classic, declared(&limited), Q).is_ok());
        assert!(check_type(&AMQPValue::LongString("classic".into())).is_ok());
        assert!(check_type(&AMQPValue::LongString("stream".into())).is_ok());
        assert_eq!(
            check_type(&AMQPValue::LongString("lazy".into())).unwrap_err(),
            "\"unsupported queue type 'lazy'\""
        );
        assert_eq!(
            check_type(&AMQPValue::LongInt(1)).unwrap_err(),
            "{unacceptable_type,signedint}"
        );
    }

    #[test]
    fn streams_refuse_what_rabbitmq_refuses_in_its_order() {
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("stream".into()),
        );
        assert_eq!(Kind::of(&args), Kind::Stream);
        assert!(check_declare(Kind::Stream, declared(&args), Q).is_ok());
        let mut d = declared(&args);
        d.server_named = true;
        assert_eq!(
            check_declare(Kind::Stream, d, Q).unwrap_err(),
            "Cannot declare a server-named queue for type rabbit_stream_queue"
        );
        let mut d = declared(&args);
        d.auto_delete = true;
        assert_eq!(
            check_declare(Kind::Stream, d, Q).unwrap_err(),
            "invalid property 'auto-delete' for queue 'q' in vhost '/'"
        );
        for refused in ["x-message-ttl", "x-max-length", "x-dead-letter-exchange"] {
            let mut with = args.clone();
            with.insert(refused.into(), AMQPValue::LongInt(1));
            assert_eq!(
                check_declare(Kind::Stream, declared(&with), Q).unwrap_err(),
                format!("invalid arg '{refused}' for queue 'q' in vhost '/' of queue type rabbit_stream_queue")
            );
        }
        let mut retained = args.clone();
        retained.insert("x-max-age".into(), AMQPValue::LongString("7D".into()));
        retained.insert("x-max-length-bytes".into(), AMQPValue::LongInt(1 << 20));
        assert!(check_declare(Kind::Stream, declared(&retained), Q).is_ok());
        // Filtering is exact (stream/filter.rs): the Bloom filter's size
        // has nothing to size, and is taken.
        retained.insert("x-stream-filter-size-bytes".into(), AMQPValue::LongInt(32));
        assert!(check_declare(Kind::Stream, declared(&retained), Q).is_ok());
        // As a quorum queue's group size: Warren replicates the node's
        // state as one group, so every stream is on every member.
        retained.insert("x-initial-cluster-size".into(), AMQPValue::LongInt(3));
        retained.insert(
            "x-queue-leader-locator".into(),
            AMQPValue::LongString("balanced".into()),
        );
        assert!(check_declare(Kind::Stream, declared(&retained), Q).is_ok());
    }
}
