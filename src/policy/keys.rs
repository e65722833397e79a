//! The keys a policy definition may hold and what each accepts, from
//! RabbitMQ 3.10's validators (rabbit_policies, and the keys of classic
//! mirroring and shovels, which an imported file may carry: they are
//! accepted and have no effect here), and federation's keys.

use serde_json::{Map, Value};

/// Keys an operator policy may set.
pub const OPERATOR_KEYS: [&str; 7] = [
    "expires",
    "message-ttl",
    "max-length",
    "max-length-bytes",
    "max-in-memory-length",
    "max-in-memory-bytes",
    "delivery-limit",
];

/// Keys where, between a policy and a queue's x-argument, the lower value
/// wins (for the others the x-argument wins).
pub const TAKE_LOWER: [&str; 6] = [
    "expires",
    "message-ttl",
    "max-length",
    "max-length-bytes",
    "consumer-timeout",
    "delivery-limit",
];

enum Kind {
    NonNegative,
    Positive,
    Text,
    OneOf(&'static [&'static str]),
    /// A federation key: a name (of an upstream, a set) or a pattern.
    Federation(&'static str),
    /// Accepted as it is (keys of features Warren has otherwise or not).
    Any,
}

fn kind(key: &str) -> Option<Kind> {
    Some(match key {
        "message-ttl"
        | "max-length"
        | "max-length-bytes"
        | "delivery-limit"
        | "consumer-timeout"
        | "max-in-memory-length"
        | "max-in-memory-bytes" => Kind::NonNegative,
        "expires" => Kind::Positive,
        "dead-letter-exchange" | "dead-letter-routing-key" | "alternate-exchange" => Kind::Text,
        "overflow" => Kind::OneOf(&["drop-head", "reject-publish", "reject-publish-dlx"]),
        "queue-mode" => Kind::OneOf(&["default", "lazy"]),
        "dead-letter-strategy" => Kind::OneOf(&["at-most-once", "at-least-once"]),
        "queue-version"
        | "queue-master-locator"
        | "queue-leader-locator"
        | "ha-mode"
        | "ha-params"
        | "ha-sync-mode"
        | "ha-sync-batch-size"
        | "ha-promote-on-shutdown"
        | "ha-promote-on-failure"
        | "max-age"
        | "stream-max-segment-size-bytes"
        | "initial-cluster-size" => Kind::Any,
        "federation-upstream" => Kind::Federation("upstream"),
        "federation-upstream-set" => Kind::Federation("upstream set"),
        "federation-upstream-pattern" => Kind::Federation("upstream pattern"),
        _ => return None,
    })
}

/// The federation keys; a policy may hold one of them.
const FEDERATION: [&str; 3] = [
    "federation-upstream",
    "federation-upstream-set",
    "federation-upstream-pattern",
];

/// Checks every key of `definition`. Keys no policy has are named all
/// together, in RabbitMQ's words; otherwise the error names the first bad
/// one.
pub(super) fn validate(definition: &Map<String, Value>, operator: bool) -> Result<(), String> {
    let unknown: Vec<String> = definition
        .iter()
        .filter(|(key, _)| kind(key).is_none())
        .map(|(key, value)| {
            format!(
                "{{{},{}}}",
                erlang(&Value::from(key.as_str())),
                erlang(value)
            )
        })
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "[{}] are not recognised policy settings",
            unknown.join(",")
        ));
    }
    if FEDERATION
        .iter()
        .filter(|k| definition.contains_key(**k))
        .count()
        > 1
    {
        return Err(
            "cannot specify federation-upstream, federation-upstream-set or \
                    federation-upstream-pattern together"
                .into(),
        );
    }
    for (key, value) in definition {
        if operator && !OPERATOR_KEYS.contains(&key.as_str()) {
            return Err(format!(
                "'{key}' is not allowed in an operator policy (only {})",
                OPERATOR_KEYS.join(", ")
            ));
        }
        let Some(kind) = kind(key) else {
            continue;
        };
        if let Kind::Federation(what) = kind {
            let Some(text) = value.as_str() else {
                return Err(format!(
                    "{} is not a valid federation {what} name",
                    erlang(value)
                ));
            };
            if what == "upstream pattern" {
                if let Err(e) = regex::Regex::new(text) {
                    return Err(format!(
                        "could not compile pattern {text} to a regular expression. Error: {}",
                        super::regex_error(text, &e)
                    ));
                }
            }
            continue;
        }
        let ok = match kind {
            Kind::NonNegative => value.as_u64().is_some(),
            Kind::Positive => value.as_u64().is_some_and(|n| n > 0),
            Kind::Text => value.is_string(),
            Kind::OneOf(words) => value.as_str().is_some_and(|s| words.contains(&s)),
            Kind::Any | Kind::Federation(_) => true,
        };
        if !ok {
            let wanted = match kind {
                Kind::NonNegative => "a non-negative integer".to_string(),
                Kind::Positive => "a positive integer".to_string(),
                Kind::Text => "a string".to_string(),
                Kind::OneOf(words) => format!("one of {}", words.join(", ")),
                Kind::Any | Kind::Federation(_) => String::new(),
            };
            return Err(format!("'{key}' must be {wanted}, not {value}"));
        }
    }
    Ok(())
}

/// A JSON value as RabbitMQ's messages print it (Erlang terms: strings
/// as binaries).
pub fn erlang(value: &Value) -> String {
    match value {
        Value::String(s) => format!("<<{s:?}>>"),
        other => other.to_string(),
    }
}
