//! A dynamic shovel's definition: the value of a `shovel` runtime
//! parameter, read and checked as RabbitMQ's shovel plugin does (every
//! error collected, then refused together: "Validation failed" and one
//! line each). Keys of what Warren does not do (AMQP 1.0 ends) are
//! refused, never stored as if they ran.

use std::time::Duration;

use serde_json::{Map, Value};

use super::uri::Uri;

/// When the source message is acked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// Once the destination confirmed it: nothing is lost.
    OnConfirm,
    /// Once it was published to the destination.
    OnPublish,
    /// Consumed without acks.
    NoAck,
}

impl AckMode {
    pub fn name(self) -> &'static str {
        match self {
            AckMode::OnConfirm => "on-confirm",
            AckMode::OnPublish => "on-publish",
            AckMode::NoAck => "no-ack",
        }
    }
}

/// When the shovel is done and its parameter cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteAfter {
    Never,
    /// The source queue's length when the shovel starts.
    QueueLength,
    Count(u64),
}

/// Where messages come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A queue (declared durable with `args` if it is missing).
    Queue {
        name: String,
        args: Map<String, Value>,
    },
    /// A server-named queue bound to an exchange with a key.
    Exchange { name: String, key: String },
}

/// Where messages go.
#[derive(Debug, Clone, PartialEq)]
pub enum Dest {
    /// A queue, through the default exchange (declared if missing).
    Queue {
        name: String,
        args: Map<String, Value>,
    },
    /// An exchange, with a key or each message's own.
    Exchange { name: String, key: Option<String> },
    /// Each message's own exchange, with a key or its own.
    Original { key: Option<String> },
}

/// A checked shovel definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub src_uris: Vec<Uri>,
    pub dest_uris: Vec<Uri>,
    pub source: Source,
    pub dest: Dest,
    pub ack_mode: AckMode,
    pub prefetch: u16,
    pub delete_after: DeleteAfter,
    /// None: never reconnected (RabbitMQ's `reconnect-delay` of 0 or a
    /// fraction).
    pub reconnect_delay: Option<Duration>,
    pub forward_headers: bool,
    pub timestamp_header: bool,
    /// Basic properties set on every message.
    pub publish_properties: Map<String, Value>,
    pub consumer_args: Map<String, Value>,
    /// `src-predeclared` / `dest-predeclared` (RabbitMQ 4.0's): the
    /// queue is someone else's to declare; a run waits for it (fails and
    /// tries again) rather than declaring it.
    pub src_predeclared: bool,
    pub dest_predeclared: bool,
}

/// Keys RabbitMQ 3.x takes for AMQP 0-9-1 ends.
const KEYS: &[&str] = &[
    "src-protocol",
    "dest-protocol",
    "src-uri",
    "dest-uri",
    "src-queue",
    "src-exchange",
    "src-exchange-key",
    "src-queue-args",
    "dest-queue-args",
    "src-consumer-args",
    "src-prefetch-count",
    "prefetch-count",
    "src-delete-after",
    "delete-after",
    "ack-mode",
    "reconnect-delay",
    "dest-queue",
    "dest-exchange",
    "dest-exchange-key",
    "dest-add-forward-headers",
    "add-forward-headers",
    "dest-add-timestamp-header",
    "add-timestamp-header",
    "dest-publish-properties",
    "publish-properties",
    "src-predeclared",
    "dest-predeclared",
];

const STRING_PROPS: &[&str] = &[
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
];
const NUMBER_PROPS: &[&str] = &["delivery_mode", "priority", "timestamp"];

/// The default `src-prefetch-count`, as RabbitMQ's.
const PREFETCH: u16 = 1000;
/// The default `reconnect-delay` (RabbitMQ's code says 5 s).
const RECONNECT: u64 = 5;

struct Reader<'a> {
    name: &'a str,
    value: &'a Map<String, Value>,
    errors: Vec<String>,
}

impl<'a> Reader<'a> {
    /// `key`, else its older alias.
    fn get(&self, key: &str, alias: Option<&str>) -> Option<(&'a str, &'a Value)> {
        let v = self.value;
        v.get_key_value(key)
            .or_else(|| alias.and_then(|a| v.get_key_value(a)))
            .map(|(k, v)| (k.as_str(), v))
    }

    /// A name or key of the protocol: at most 255 bytes (a short string).
    /// RabbitMQ's word for a string is "binary" (an Erlang binary).
    fn string(&mut self, key: &str) -> Option<String> {
        match self.value.get(key)? {
            Value::String(s) if s.len() > 255 => {
                self.errors.push(format!(
                    "{key} should be less than 255 bytes, actually was {}",
                    s.len()
                ));
                None
            }
            Value::String(s) => Some(s.clone()),
            other => {
                self.errors
                    .push(format!("{key} should be binary, actually was {other}"));
                None
            }
        }
    }

    fn boolean(&mut self, key: &str, alias: &str) -> bool {
        match self.get(key, Some(alias)) {
            None => false,
            Some((_, Value::Bool(b))) => *b,
            Some((k, other)) => {
                self.errors
                    .push(format!("{k} should be boolean, actually was {other}"));
                false
            }
        }
    }

    fn object(&mut self, key: &str, alias: Option<&str>) -> Map<String, Value> {
        match self.get(key, alias) {
            None => Map::new(),
            Some((_, Value::Object(m))) => m.clone(),
            Some((k, other)) => {
                self.errors
                    .push(format!("{k} should be an object, actually was {other}"));
                Map::new()
            }
        }
    }

    fn uris(&mut self, key: &str) -> Vec<Uri> {
        let texts: Vec<&Value> = match self.value.get(key) {
            None => {
                self.errors
                    .push(format!("Key \"{key}\" not found in {}", self.name));
                return Vec::new();
            }
            Some(Value::Array(list)) if !list.is_empty() => list.iter().collect(),
            Some(v @ Value::String(_)) => vec![v],
            Some(other) => {
                self.errors.push(format!(
                    "{key} should be a URI or a non-empty list of URIs, actually was {other}"
                ));
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for t in texts {
            match t.as_str().map(Uri::parse) {
                Some(Ok(u)) => out.push(u),
                Some(Err(e)) => self.errors.push(e),
                None => self
                    .errors
                    .push(format!("{key} should hold strings, actually held {t}")),
            }
        }
        out
    }
}

/// An AMQP table's value from JSON: what a queue's or consumer's
/// arguments may hold.
fn checked_args(r: &mut Reader<'_>, key: &str, map: &Map<String, Value>, allowed: Option<&[&str]>) {
    for (k, v) in map {
        if k.len() > 255 {
            r.errors.push(format!("{key}: a key longer than 255 bytes"));
        }
        if allowed.is_some_and(|a| !a.contains(&k.as_str())) {
            r.errors
                .push(format!("Unrecognised terms [\"{k}\"] in {key}"));
        }
        if !matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_)) {
            r.errors.push(format!(
                "{key}: the value of {k} should be a string, number or boolean, actually was {v}"
            ));
        }
    }
}

impl Spec {
    /// Reads shovel `name`'s parameter value; Err is the whole refusal.
    pub fn parse(name: &str, value: &Value) -> Result<Spec, String> {
        let Some(map) = value.as_object() else {
            return Err(refusal(&[format!(
                "the value of shovel {name} should be an object, actually was {value}"
            )]));
        };
        let mut r = Reader {
            name,
            value: map,
            errors: Vec::new(),
        };
        let unknown: Vec<String> = map
            .keys()
            .filter(|k| !KEYS.contains(&k.as_str()))
            .map(|k| format!("\"{k}\""))
            .collect();
        if !unknown.is_empty() {
            r.errors.push(format!(
                "Unrecognised terms [{}] in {name}",
                unknown.join(",")
            ));
        }
        for key in ["src-protocol", "dest-protocol"] {
            match r.string(key).as_deref() {
                None | Some("amqp091") => {}
                Some("amqp10") => r.errors.push(format!(
                    "{key} amqp10: Warren does not speak AMQP 1.0, so it cannot shovel \
                     to or from it"
                )),
                Some(other) => r.errors.push(format!(
                    "{key} should be one of [\"amqp091\",\"amqp10\"], actually was \"{other}\""
                )),
            }
        }
        let src_uris = r.uris("src-uri");
        let dest_uris = r.uris("dest-uri");
        let src_queue = r.string("src-queue");
        if src_queue.as_ref().is_some_and(String::is_empty) {
            // The server would name a new queue on every run.
            r.errors.push("src-queue should not be empty".into());
        }
        let src_exchange = r.string("src-exchange");
        let src_key = r.string("src-exchange-key").unwrap_or_default();
        let src_args = r.object("src-queue-args", None);
        checked_args(&mut r, "src-queue-args", &src_args, None);
        let dest_args = r.object("dest-queue-args", None);
        checked_args(&mut r, "dest-queue-args", &dest_args, None);
        let consumer_args = r.object("src-consumer-args", None);
        checked_args(
            &mut r,
            "src-consumer-args",
            &consumer_args,
            Some(&["x-priority", "x-stream-offset", "x-cancel-on-ha-failover"]),
        );
        let source = match (src_queue, src_exchange) {
            (Some(q), None) => Some(Source::Queue {
                name: q,
                args: src_args,
            }),
            (None, Some(x)) => Some(Source::Exchange {
                name: x,
                key: src_key,
            }),
            (None, None) => {
                r.errors
                    .push("Must specify 'src-exchange' or 'src-queue'".into());
                None
            }
            (Some(_), Some(_)) => {
                r.errors
                    .push("Cannot specify 'src-exchange' and 'src-queue'".into());
                None
            }
        };
        let dest_queue = r.string("dest-queue");
        let dest_exchange = r.string("dest-exchange");
        let dest_key = r.string("dest-exchange-key");
        if dest_queue.as_ref().is_some_and(String::is_empty) {
            // Published to the default exchange with an empty key: dropped.
            r.errors.push("dest-queue should not be empty".into());
        }
        let dest = match (dest_queue, dest_exchange) {
            (Some(q), None) => Some(Dest::Queue {
                name: q,
                args: dest_args,
            }),
            (None, Some(x)) => Some(Dest::Exchange {
                name: x,
                key: dest_key,
            }),
            (None, None) => Some(Dest::Original { key: dest_key }),
            (Some(_), Some(_)) => {
                r.errors
                    .push("Cannot specify 'dest-exchange' and 'dest-queue'".into());
                None
            }
        };
        let ack_mode = match r.string("ack-mode").as_deref() {
            None | Some("on-confirm") => AckMode::OnConfirm,
            Some("on-publish") => AckMode::OnPublish,
            Some("no-ack") => AckMode::NoAck,
            Some(other) => {
                r.errors.push(format!(
                    "ack-mode should be one of [\"no-ack\",\"on-publish\",\"on-confirm\"], \
                     actually was \"{other}\""
                ));
                AckMode::OnConfirm
            }
        };
        let prefetch = match r.get("src-prefetch-count", Some("prefetch-count")) {
            None => PREFETCH,
            Some((k, v)) => match v.as_u64() {
                Some(n) if (1..=u64::from(u16::MAX)).contains(&n) => n as u16,
                _ => {
                    // 0 would be no limit: the source could fill this
                    // broker's memory faster than the destination takes.
                    r.errors.push(format!(
                        "{k} should be a number from 1 to 65535, actually was {v}"
                    ));
                    PREFETCH
                }
            },
        };
        let delete_after = match r.get("src-delete-after", Some("delete-after")) {
            None => DeleteAfter::Never,
            Some((_, Value::String(s))) if s == "never" => DeleteAfter::Never,
            Some((_, Value::String(s))) if s == "queue-length" => DeleteAfter::QueueLength,
            Some((_, v)) if v.as_u64().is_some() => DeleteAfter::Count(v.as_u64().unwrap_or(0)),
            Some((k, v)) => {
                r.errors.push(format!(
                    "{k} should be a number greater than or equal to 0, \"never\" or \
                     \"queue-length\", actually was {v}"
                ));
                DeleteAfter::Never
            }
        };
        if ack_mode == AckMode::NoAck && matches!(delete_after, DeleteAfter::Count(_)) {
            r.errors
                .push("Cannot specify 'no-ack' and numerical 'delete-after'".into());
        }
        let reconnect_delay = match map.get("reconnect-delay") {
            None => Some(Duration::from_secs(RECONNECT)),
            Some(v) => match (v.as_u64(), v.as_f64()) {
                (Some(0), _) => None,
                (Some(n), _) => Some(Duration::from_secs(n)),
                // A fraction or a negative: RabbitMQ never restarts such
                // a shovel.
                (None, Some(_)) => None,
                _ => {
                    r.errors.push(format!(
                        "reconnect-delay should be a number, actually was {v}"
                    ));
                    None
                }
            },
        };
        let forward_headers = r.boolean("dest-add-forward-headers", "add-forward-headers");
        let src_predeclared = r.boolean("src-predeclared", "src-predeclared");
        let dest_predeclared = r.boolean("dest-predeclared", "dest-predeclared");
        let timestamp_header = r.boolean("dest-add-timestamp-header", "add-timestamp-header");
        let publish_properties = r.object("dest-publish-properties", Some("publish-properties"));
        for (k, v) in &publish_properties {
            let fits = match (
                STRING_PROPS.contains(&k.as_str()),
                NUMBER_PROPS.contains(&k.as_str()),
            ) {
                (true, _) => v.as_str().is_some_and(|s| s.len() <= 255),
                (_, true) => v.as_u64().is_some(),
                _ => {
                    r.errors.push(format!(
                        "Unrecognised terms [\"{k}\"] in dest-publish-properties"
                    ));
                    continue;
                }
            };
            if !fits {
                r.errors.push(format!(
                    "dest-publish-properties: {k} has the wrong type ({v})"
                ));
            }
        }
        if !r.errors.is_empty() {
            return Err(refusal(&r.errors));
        }
        let (Some(source), Some(dest)) = (source, dest) else {
            return Err(refusal(&["an incomplete shovel".to_string()]));
        };
        Ok(Spec {
            src_uris,
            dest_uris,
            source,
            dest,
            ack_mode,
            prefetch,
            delete_after,
            reconnect_delay,
            forward_headers,
            timestamp_header,
            publish_properties,
            consumer_args,
            src_predeclared,
            dest_predeclared,
        })
    }
}

impl Spec {
    /// Whether every TLS file its URIs name lies under `dir` (the
    /// config's `link_tls_dir`).
    pub fn check_tls_files(&self, dir: Option<&std::path::Path>) -> Result<(), String> {
        self.src_uris
            .iter()
            .chain(&self.dest_uris)
            .try_for_each(|u| {
                u.tls_options
                    .check_files(dir)
                    .map_err(|e| format!("{}: {e}", u.redacted()))
            })
    }
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

/// The parameter value with every URI's credentials taken out (what the
/// API shows of a shovel).
pub fn redacted(value: &Value) -> Value {
    let mut v = value.clone();
    if let Some(map) = v.as_object_mut() {
        for key in ["src-uri", "dest-uri"] {
            let hide = |u: &Value| match u.as_str() {
                Some(text) => Value::String(match Uri::parse(text) {
                    Ok(uri) => uri.redacted(),
                    Err(_) => super::uri::shown_unread(text),
                }),
                None => u.clone(),
            };
            if let Some(u) = map.get_mut(key) {
                let shown = match &*u {
                    Value::Array(list) => Value::Array(list.iter().map(hide).collect()),
                    other => hide(other),
                };
                *u = shown;
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_full_definition_reads_and_a_bad_one_lists_every_fault() {
        let s = Spec::parse(
            "s",
            &json!({"src-uri": "amqp://u:p@h", "src-queue": "a", "dest-uri": ["amqp://u:p@h2"],
                    "dest-exchange": "x", "prefetch-count": 10, "delete-after": "queue-length",
                    "add-forward-headers": true, "reconnect-delay": 0}),
        )
        .unwrap();
        assert_eq!(s.prefetch, 10);
        assert_eq!(s.delete_after, DeleteAfter::QueueLength);
        assert_eq!(s.reconnect_delay, None);
        assert!(s.forward_headers);
        assert_eq!(s.ack_mode, AckMode::OnConfirm);
        assert_eq!(
            s.dest,
            Dest::Exchange {
                name: "x".into(),
                key: None
            }
        );
        let e = Spec::parse(
            "s",
            &json!({"src-uri": "amqp://u:p@h", "src-queue": "a", "src-exchange": "b",
                    "ack-mode": "no-ack", "delete-after": 5, "bogus": 1,
                    "dest-protocol": "amqp10"}),
        )
        .unwrap_err();
        assert!(e.starts_with("Validation failed\n\n"), "{e}");
        for part in [
            "Key \"dest-uri\" not found in s",
            "Cannot specify 'src-exchange' and 'src-queue'",
            "Cannot specify 'no-ack' and numerical 'delete-after'",
            "Unrecognised terms [\"bogus\"] in s",
            "AMQP 1.0",
        ] {
            assert!(e.contains(part), "{part} in {e}");
        }
    }

    #[test]
    fn credentials_leave_what_the_api_shows() {
        let v = redacted(&json!({"src-uri": "amqp://u:p@h/v", "dest-uri": ["amqps://u:p@h2:1"]}));
        assert_eq!(v["src-uri"], "amqp://h/v");
        assert_eq!(v["dest-uri"], json!(["amqps://h2:1/%2F"]));
    }
}
