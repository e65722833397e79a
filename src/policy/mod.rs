//! Policies and operator policies, as RabbitMQ has them: a name, a regular
//! expression over entity names, what it applies to, a priority and a
//! definition (keys such as message-ttl or dead-letter-exchange). At most
//! one policy and one operator policy apply to an entity: the matching one
//! of highest priority of each (ties go to the name that sorts first, so
//! the choice is the same on every node). Operator policies accept only
//! the keys an operator caps; where both set one, the lower value wins.
//!
//! This module is pure: it validates, selects and merges. The vhost keeps
//! its set and applies the result to its queues and exchanges.

mod keys;
pub use keys::erlang;

use std::sync::Arc;

use regex::Regex;
use serde_json::{Map, Value};

pub use keys::{OPERATOR_KEYS, TAKE_LOWER};

/// What a policy applies to (RabbitMQ's apply-to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyTo {
    Queues,
    ClassicQueues,
    QuorumQueues,
    Streams,
    Exchanges,
    All,
}

impl ApplyTo {
    /// From RabbitMQ's word for it.
    pub fn parse(s: &str) -> Option<ApplyTo> {
        Some(match s {
            "queues" => ApplyTo::Queues,
            "classic_queues" => ApplyTo::ClassicQueues,
            "quorum_queues" => ApplyTo::QuorumQueues,
            "streams" => ApplyTo::Streams,
            "exchanges" => ApplyTo::Exchanges,
            "all" => ApplyTo::All,
            _ => return None,
        })
    }

    /// RabbitMQ's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyTo::Queues => "queues",
            ApplyTo::ClassicQueues => "classic_queues",
            ApplyTo::QuorumQueues => "quorum_queues",
            ApplyTo::Streams => "streams",
            ApplyTo::Exchanges => "exchanges",
            ApplyTo::All => "all",
        }
    }

    fn covers(self, target: Target<'_>) -> bool {
        match (self, target) {
            (ApplyTo::All, _) => true,
            (ApplyTo::Exchanges, Target::Exchange) => true,
            (ApplyTo::Queues, Target::Queue(t)) => t != "stream",
            (ApplyTo::ClassicQueues, Target::Queue(t)) => t == "classic",
            (ApplyTo::QuorumQueues, Target::Queue(t)) => t == "quorum",
            (ApplyTo::Streams, Target::Queue(t)) => t == "stream",
            _ => false,
        }
    }
}

/// What a policy is matched against: an exchange, or a queue of a type
/// ("classic", "quorum", "stream").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    Exchange,
    Queue(&'a str),
}

/// One policy (or operator policy).
#[derive(Debug)]
pub struct Policy {
    pub vhost: String,
    pub name: String,
    pub pattern: String,
    pub apply_to: ApplyTo,
    pub priority: i64,
    pub definition: Map<String, Value>,
    /// Whether it is an operator policy.
    pub operator: bool,
    regex: Regex,
}

impl Policy {
    /// A policy, validated as RabbitMQ validates one; the error says what
    /// is wrong, naming the key.
    pub fn new(
        vhost: &str,
        name: &str,
        pattern: &str,
        apply_to: &str,
        priority: i64,
        definition: Map<String, Value>,
        operator: bool,
    ) -> Result<Policy, String> {
        if name.is_empty() {
            return Err("a policy needs a name".into());
        }
        let regex = Regex::new(pattern).map_err(|e| {
            format!(
                "pattern should be regular expression but is invalid: {}",
                regex_error(pattern, &e)
            )
        })?;
        let apply_to = ApplyTo::parse(apply_to).ok_or_else(|| {
            format!(
                "'{apply_to}' is not a valid apply-to value \
                 (queues, classic_queues, quorum_queues, streams, exchanges, all)"
            )
        })?;
        if definition.is_empty() {
            return Err("a policy definition must not be empty".into());
        }
        // RabbitMQ takes any integer; its tools read priorities as i16.
        if i16::try_from(priority).is_err() {
            return Err(format!(
                "priority {priority} is out of range (-32768 to 32767)"
            ));
        }
        keys::validate(&definition, operator)?;
        Ok(Policy {
            vhost: vhost.to_string(),
            name: name.to_string(),
            pattern: pattern.to_string(),
            apply_to,
            priority,
            definition,
            operator,
            regex,
        })
    }

    fn matches(&self, name: &str, target: Target<'_>) -> bool {
        self.apply_to.covers(target) && self.regex.is_match(name)
    }
}

/// The policies of one vhost.
#[derive(Debug, Default, Clone)]
pub struct Policies {
    policies: Vec<Arc<Policy>>,
}

/// What applies to one entity: its policy, its operator policy, and the
/// definition they make together.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    pub policy: Option<String>,
    pub operator_policy: Option<String>,
    pub definition: Map<String, Value>,
}

impl Policies {
    /// Every policy, by name (operator policies too).
    pub fn list(&self) -> &[Arc<Policy>] {
        &self.policies
    }

    /// The same set with `p` added (replacing one of its name and kind).
    pub fn with(&self, p: Policy) -> Policies {
        let mut policies: Vec<_> = self
            .policies
            .iter()
            .filter(|q| !(q.name == p.name && q.operator == p.operator))
            .cloned()
            .collect();
        policies.push(Arc::new(p));
        policies.sort_by(|a, b| (a.operator, &a.name).cmp(&(b.operator, &b.name)));
        Policies { policies }
    }

    /// The same set without the policy `name` (of the kind `operator`).
    pub fn without(&self, name: &str, operator: bool) -> Option<Policies> {
        let before = self.policies.len();
        let policies: Vec<_> = self
            .policies
            .iter()
            .filter(|q| !(q.name == name && q.operator == operator))
            .cloned()
            .collect();
        (policies.len() != before).then_some(Policies { policies })
    }

    /// The policy `name` of the kind `operator`.
    pub fn get(&self, name: &str, operator: bool) -> Option<&Arc<Policy>> {
        self.policies
            .iter()
            .find(|p| p.name == name && p.operator == operator)
    }

    fn best(&self, name: &str, target: Target<'_>, operator: bool) -> Option<&Arc<Policy>> {
        // Sorted by name: on equal priority the first name wins.
        let mut best: Option<&Arc<Policy>> = None;
        for p in &self.policies {
            if p.operator == operator
                && p.matches(name, target)
                && best.is_none_or(|b| p.priority > b.priority)
            {
                best = Some(p);
            }
        }
        best
    }

    /// What applies to the entity `name`.
    pub fn apply(&self, name: &str, target: Target<'_>) -> Applied {
        let policy = self.best(name, target, false);
        let operator = match target {
            Target::Queue(_) => self.best(name, target, true),
            Target::Exchange => None,
        };
        let mut definition = policy.map(|p| p.definition.clone()).unwrap_or_default();
        if let Some(op) = operator {
            for (k, v) in &op.definition {
                let merged = match (definition.get(k), v) {
                    (Some(Value::Number(a)), Value::Number(b)) => match (a.as_i64(), b.as_i64()) {
                        (Some(a), Some(b)) => Value::from(a.min(b)),
                        _ => v.clone(),
                    },
                    _ => v.clone(),
                };
                definition.insert(k.clone(), merged);
            }
        }
        Applied {
            policy: policy.map(|p| p.name.clone()),
            operator_policy: operator.map(|p| p.name.clone()),
            definition,
        }
    }
}

/// What is wrong with `pattern`, as RabbitMQ prints PCRE's error: the
/// problem and where, {"unclosed group",0}.
pub(super) fn regex_error(pattern: &str, e: &regex::Error) -> String {
    let (what, at) = match regex_syntax::ast::parse::Parser::new().parse(pattern) {
        Err(e) => (e.kind().to_string(), e.span().start.offset),
        // Parsed, but not compiled (too large, say): the first line says.
        Ok(_) => (
            e.to_string()
                .lines()
                .last()
                .unwrap_or("")
                .trim()
                .to_string(),
            0,
        ),
    };
    format!("{{{:?},{at}}}", what.trim_start_matches("error: "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn def(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn policy(name: &str, pattern: &str, apply: &str, prio: i64, d: Value, op: bool) -> Policy {
        Policy::new("/", name, pattern, apply, prio, def(d), op).unwrap()
    }

    #[test]
    fn the_highest_priority_of_each_kind_applies_and_operator_caps_take_the_lower() {
        let set = Policies::default()
            .with(policy(
                "low",
                ".*",
                "queues",
                0,
                json!({"max-length": 10, "dead-letter-exchange": "dlx"}),
                false,
            ))
            .with(policy(
                "high",
                "^ttl\\.",
                "queues",
                5,
                json!({"message-ttl": 60000, "max-length": 100}),
                false,
            ))
            .with(policy(
                "cap",
                ".*",
                "queues",
                0,
                json!({"max-length": 50, "message-ttl": 90000}),
                true,
            ))
            .with(policy(
                "ex",
                ".*",
                "exchanges",
                9,
                json!({"alternate-exchange": "ae"}),
                false,
            ));
        let a = set.apply("ttl.q", Target::Queue("classic"));
        assert_eq!(a.policy.as_deref(), Some("high"));
        assert_eq!(a.operator_policy.as_deref(), Some("cap"));
        assert_eq!(
            a.definition,
            def(json!({"message-ttl": 60000, "max-length": 50}))
        );
        let b = set.apply("other", Target::Queue("classic"));
        assert_eq!(b.policy.as_deref(), Some("low"));
        assert_eq!(b.definition["max-length"], json!(10));
        let x = set.apply("in", Target::Exchange);
        assert_eq!(x.policy.as_deref(), Some("ex"));
        assert_eq!(x.operator_policy, None);
        assert_eq!(set.apply("in", Target::Queue("stream")).policy, None);
        let gone = set.without("high", false).unwrap();
        assert_eq!(
            gone.apply("ttl.q", Target::Queue("classic"))
                .policy
                .as_deref(),
            Some("low")
        );
        assert!(set.without("nope", false).is_none());
    }

    #[test]
    fn bad_policies_are_refused_naming_what_is_wrong() {
        let bad = |pattern: &str, apply: &str, d: Value, op: bool| {
            Policy::new("/", "p", pattern, apply, 0, def(d), op).unwrap_err()
        };
        assert!(bad("(", "queues", json!({"max-length": 1}), false).contains("pattern"));
        assert!(bad(".*", "tables", json!({"max-length": 1}), false).contains("apply-to"));
        assert!(bad(".*", "queues", json!({"max-length": -1}), false).contains("max-length"));
        assert!(bad(".*", "queues", json!({"no-such-key": 1}), false).contains("no-such-key"));
        assert!(
            bad(".*", "queues", json!({"dead-letter-exchange": "x"}), true)
                .contains("dead-letter-exchange")
        );
        assert!(bad(".*", "queues", json!({"overflow": "drop-tail"}), false).contains("overflow"));
        assert!(bad(".*", "queues", json!({}), false).contains("empty"));
    }
}
