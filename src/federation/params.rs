//! The `federation-upstream` and `federation-upstream-set` runtime
//! parameters, checked as RabbitMQ 3.10's federation plugin checks them
//! (every fault collected, in its order and words), and an upstream's
//! settings read with a set element's overrides over them.
//!
//! Where RabbitMQ takes any JSON number and fails the link later (a
//! `prefetch-count` that does not fit basic.qos, a fractional
//! `max-hops`), Warren refuses the value when it is stored.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::policy::erlang;
use crate::shovel::spec::AckMode;
use crate::shovel::uri::Uri;

/// The runtime parameter component of upstreams.
pub const UPSTREAM: &str = "federation-upstream";
/// The runtime parameter component of upstream sets.
pub const UPSTREAM_SET: &str = "federation-upstream-set";
/// RabbitMQ's leftover component: every name is refused.
pub const FEDERATION: &str = "federation";

/// The keys an upstream and a set element share (everything but `uri`).
const SHARED: &[&str] = &[
    "prefetch-count",
    "reconnect-delay",
    "ack-mode",
    "trust-user-id",
    "exchange",
    "max-hops",
    "expires",
    "message-ttl",
    "ha-policy",
    "queue",
    "consumer-tag",
    "bind-nowait",
    "resource-cleanup-mode",
    "channel-use-mode",
];

/// The order RabbitMQ reports faults in: its constraint list, reversed.
const REPORT_ORDER: &[&str] = &[
    "channel-use-mode",
    "bind-nowait",
    "ha-policy",
    "resource-cleanup-mode",
    "ack-mode",
    "trust-user-id",
    "message-ttl",
    "expires",
    "max-hops",
    "reconnect-delay",
    "prefetch-count",
    "consumer-tag",
    "queue",
    "exchange",
];

/// One upstream's settings, as a link uses them.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    /// The parameter's name.
    pub name: String,
    pub uris: Vec<Uri>,
    pub prefetch: u16,
    /// How long a failed link waits before it starts again.
    pub reconnect_delay: Duration,
    pub ack_mode: AckMode,
    pub trust_user_id: bool,
    /// The upstream exchange (default: the federated exchange's name).
    pub exchange: Option<String>,
    pub max_hops: u32,
    pub expires: Option<u32>,
    pub message_ttl: Option<u32>,
    pub ha_policy: Option<String>,
    /// The upstream queue (default: the federated queue's name).
    pub queue: Option<String>,
    pub consumer_tag: Option<String>,
    pub bind_nowait: bool,
    /// `resource-cleanup-mode: never`: a stopped link leaves its upstream
    /// queue and exchange.
    pub keep_upstream: bool,
    /// `channel-use-mode: single`.
    pub one_channel: bool,
}

/// RabbitMQ's form of a parameter refused.
fn refusal(errors: &[String]) -> String {
    let mut out = "Validation failed\n\n".to_string();
    for e in errors {
        out.push_str(e);
        out.push('\n');
    }
    out
}

/// Checks one key's value; the fault in RabbitMQ's words.
fn check_key(key: &str, v: &Value) -> Result<(), String> {
    let text = |v: &Value| match v {
        Value::String(s) if s.len() > 255 => Err(format!(
            "{key} should be less than 255 bytes, actually was {}",
            s.len()
        )),
        Value::String(_) => Ok(()),
        other => Err(format!(
            "{key} should be binary, actually was {}",
            erlang(other)
        )),
    };
    let one_of = |words: &[&str]| match v.as_str() {
        Some(s) if words.contains(&s) => Ok(()),
        Some(_) => Err(format!(
            "{key} should be one of [{}], actually was {}",
            words
                .iter()
                .map(|w| format!("<<\"{w}\">>"))
                .collect::<Vec<_>>()
                .join(","),
            erlang(v)
        )),
        None => text(v),
    };
    let int = |max: u64, min: u64| {
        if !v.is_number() {
            return Err(format!(
                "{key} should be a number, actually was {}",
                erlang(v)
            ));
        }
        match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(()),
            _ => Err(format!(
                "{key} should be an integer from {min} to {max}, actually was {v}"
            )),
        }
    };
    match key {
        "exchange" | "queue" | "consumer-tag" | "ha-policy" | "upstream" => text(v),
        "ack-mode" => one_of(&["no-ack", "on-publish", "on-confirm"]),
        "resource-cleanup-mode" => one_of(&["default", "never"]),
        "channel-use-mode" => one_of(&["multiple", "single"]),
        "trust-user-id" | "bind-nowait" => match v {
            Value::Bool(_) => Ok(()),
            other => Err(format!(
                "{key} should be boolean, actually was {}",
                erlang(other)
            )),
        },
        "prefetch-count" => int(u64::from(u16::MAX), 1),
        "max-hops" => int(u64::from(u32::MAX >> 1), 1),
        "expires" => int(u64::from(u32::MAX >> 1), 1),
        "message-ttl" => int(u64::from(u32::MAX >> 1), 0),
        "reconnect-delay" => match v.as_f64() {
            Some(f) if (0.0..=MAX_DELAY).contains(&f) => Ok(()),
            Some(_) => Err(format!(
                "{key} should be a number of seconds from 0 to {MAX_DELAY}, actually was {v}"
            )),
            None => Err(format!(
                "{key} should be a number, actually was {}",
                erlang(v)
            )),
        },
        _ => Ok(()),
    }
}

/// Checks `map`'s keys: `first` (uri or upstream) and the shared ones.
fn check_map(name: &str, map: &Map<String, Value>, first: &str, errors: &mut Vec<String>) {
    let unknown: Vec<String> = map
        .iter()
        .filter(|(k, _)| k.as_str() != first && !SHARED.contains(&k.as_str()))
        .map(|(k, v)| format!("{{{},{}}}", erlang(&Value::from(k.as_str())), erlang(v)))
        .collect();
    if !unknown.is_empty() {
        errors.push(format!(
            "Unrecognised terms [{}] in {name}",
            unknown.join(",")
        ));
    }
    for key in REPORT_ORDER {
        if let Some(v) = map.get(*key) {
            if let Err(e) = check_key(key, v) {
                errors.push(e);
            }
        }
    }
    match (first, map.get(first)) {
        (_, None) => errors.push(format!("Key \"{first}\" not found in {name}")),
        ("uri", Some(v)) => check_uris(v, errors),
        (_, Some(v)) => {
            if let Err(e) = check_key(first, v) {
                errors.push(e);
            }
        }
    }
}

fn check_uris(v: &Value, errors: &mut Vec<String>) {
    let list: Vec<&Value> = match v {
        Value::String(_) => vec![v],
        Value::Array(items) if !items.is_empty() => items.iter().collect(),
        Value::Array(_) => {
            errors.push("uri should name at least one URI, actually was []".into());
            return;
        }
        other => {
            errors.push(format!(
                "uri should be list, actually was {}",
                erlang(other)
            ));
            return;
        }
    };
    for item in list {
        match item.as_str().map(Uri::parse_any) {
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                errors.push(e);
                return;
            }
            None => {
                errors.push(format!(
                    "uri should be binary, actually was {}",
                    erlang(item)
                ));
                return;
            }
        }
    }
}

/// Checks a `federation-upstream` value; Err is the whole refusal.
pub fn check_upstream(name: &str, value: &Value) -> Result<(), String> {
    let Some(map) = value.as_object() else {
        return Err(refusal(&[format!(
            "the value of federation upstream {name} should be an object, actually was {value}"
        )]));
    };
    let mut errors = Vec::new();
    check_map(name, map, "uri", &mut errors);
    match errors.is_empty() {
        true => Ok(()),
        false => Err(refusal(&errors)),
    }
}

/// Checks a `federation-upstream-set` value (a list of objects, each
/// naming an upstream); Err is the whole refusal.
pub fn check_set(name: &str, value: &Value) -> Result<(), String> {
    let Some(items) = value.as_array() else {
        return Err(refusal(&[format!(
            "the value of federation upstream set {name} should be a list of objects, \
             actually was {value}"
        )]));
    };
    let mut errors = Vec::new();
    for item in items {
        match item.as_object() {
            Some(map) => check_map(name, map, "upstream", &mut errors),
            None => errors.push(format!(
                "each element of federation upstream set {name} should be an object, \
                 actually was {item}"
            )),
        }
    }
    match errors.is_empty() {
        true => Ok(()),
        false => Err(refusal(&errors)),
    }
}

/// The URIs of a checked upstream's `uri`.
fn uris_of(v: &Value) -> Option<Vec<Uri>> {
    match v {
        Value::String(s) => Some(vec![Uri::parse_any(s).ok()?]),
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().and_then(|s| Uri::parse_any(s).ok()))
            .collect(),
        _ => None,
    }
}

/// Whether every TLS file a checked upstream's URIs name lies under
/// `dir` (the config's `link_tls_dir`).
pub fn check_upstream_files(value: &Value, dir: Option<&std::path::Path>) -> Result<(), String> {
    let uris = value.get("uri").and_then(uris_of).unwrap_or_default();
    uris.iter().try_for_each(|u| {
        u.tls_options
            .check_files(dir)
            .map_err(|e| format!("{}: {e}", u.redacted()))
    })
}

/// Refuses every `federation` parameter, as RabbitMQ does.
pub fn check_leftover(name: &str) -> String {
    refusal(&[format!(
        "name not recognised: {}",
        erlang(&Value::from(name))
    )])
}

impl Upstream {
    /// Upstream `name`'s settings: `value` (a checked parameter) with
    /// `overrides` (a set element's keys) over it.
    pub fn read(name: &str, value: &Value, overrides: &Map<String, Value>) -> Option<Upstream> {
        let base = value.as_object()?;
        let get = |k: &str| overrides.get(k).or_else(|| base.get(k));
        let text = |k: &str| get(k).and_then(Value::as_str).map(str::to_string);
        let int = |k: &str| get(k).and_then(Value::as_u64);
        let uris = uris_of(base.get("uri")?)?;
        let reconnect = get("reconnect-delay")
            .and_then(Value::as_f64)
            .unwrap_or(RECONNECT);
        Some(Upstream {
            name: name.to_string(),
            uris,
            prefetch: int("prefetch-count").map_or(PREFETCH, |n| n as u16),
            reconnect_delay: Duration::try_from_secs_f64(reconnect.clamp(0.0, MAX_DELAY))
                .unwrap_or(Duration::from_secs(5)),
            ack_mode: match text("ack-mode").as_deref() {
                Some("no-ack") => AckMode::NoAck,
                Some("on-publish") => AckMode::OnPublish,
                _ => AckMode::OnConfirm,
            },
            trust_user_id: get("trust-user-id").and_then(Value::as_bool) == Some(true),
            exchange: text("exchange"),
            max_hops: int("max-hops").map_or(1, |n| n as u32),
            expires: int("expires").map(|n| n as u32),
            message_ttl: int("message-ttl").map(|n| n as u32),
            ha_policy: text("ha-policy"),
            queue: text("queue"),
            consumer_tag: text("consumer-tag"),
            bind_nowait: get("bind-nowait").and_then(Value::as_bool) == Some(true),
            keep_upstream: text("resource-cleanup-mode").as_deref() == Some("never"),
            one_channel: text("channel-use-mode").as_deref() == Some("single"),
        })
    }
}

/// The longest `reconnect-delay` taken, in seconds (a day).
const MAX_DELAY: f64 = 86_400.0;

/// The default `prefetch-count`.
const PREFETCH: u16 = 1000;
/// The default `reconnect-delay` in seconds (RabbitMQ's code: 5).
const RECONNECT: f64 = 5.0;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_upstream_is_refused_in_rabbitmqs_words_and_order() {
        let e = check_upstream(
            "up",
            &json!({"foo": 1, "ack-mode": "x", "max-hops": "2", "exchange": 5}),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "Validation failed\n\n\
             Unrecognised terms [{<<\"foo\">>,1}] in up\n\
             ack-mode should be one of [<<\"no-ack\">>,<<\"on-publish\">>,<<\"on-confirm\">>], \
             actually was <<\"x\">>\n\
             max-hops should be a number, actually was <<\"2\">>\n\
             exchange should be binary, actually was 5\n\
             Key \"uri\" not found in up\n"
        );
        assert!(
            check_upstream("up", &json!({"uri": "amqp://h", "queue": null}))
                .unwrap_err()
                .contains("queue should be binary, actually was null")
        );
        assert!(check_upstream("up", &json!({"uri": 5}))
            .unwrap_err()
            .contains("uri should be list, actually was 5"));
        assert!(check_upstream("up", &json!({"uri": "foo"}))
            .unwrap_err()
            .contains("not a valid URI"));
        check_upstream(
            "up",
            &json!({"uri": ["amqp://a", "amqp://b"], "max-hops": 3}),
        )
        .unwrap();
    }

    #[test]
    fn a_set_names_its_upstreams_and_overrides_them() {
        assert!(check_set("s", &json!([{"prefetch-count": 5}]))
            .unwrap_err()
            .contains("Key \"upstream\" not found in s"));
        assert!(
            check_set("s", &json!([{"upstream": "a", "uri": "amqp://"}]))
                .unwrap_err()
                .contains("Unrecognised terms")
        );
        assert!(check_set("s", &json!({"upstream": "a"})).is_err());
        check_set("s", &json!([{"upstream": "a", "max-hops": 2}])).unwrap();
        let over = json!({"max-hops": 2});
        let u = Upstream::read(
            "a",
            &json!({"uri": "amqp://h", "max-hops": 5, "prefetch-count": 10}),
            over.as_object().unwrap(),
        )
        .unwrap();
        assert_eq!((u.max_hops, u.prefetch), (2, 10));
        assert_eq!(u.reconnect_delay, Duration::from_secs(5));
        assert!(
            check_upstream("up", &json!({"uri": "amqp://h", "reconnect-delay": 1e20}))
                .unwrap_err()
                .contains("reconnect-delay should be a number of seconds from 0 to 86400")
        );
    }
}
