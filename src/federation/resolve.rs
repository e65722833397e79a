//! Which upstreams a federated object's policy names: one upstream
//! (`federation-upstream`), the elements of a set
//! (`federation-upstream-set`; `all` is every upstream of the vhost, and
//! shadows a set called so), or every upstream whose name matches a
//! pattern (`federation-upstream-pattern`, RabbitMQ's undocumented key).
//! A name with no upstream behind it is skipped, as RabbitMQ skips it.

use serde_json::{Map, Value};

use super::Survey;

/// The policy key that federates an object, and its value.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    Upstream(String),
    Set(String),
    Pattern(String),
}

/// The policy keys, in the order they are looked at.
pub const KEYS: [&str; 3] = [
    "federation-upstream",
    "federation-upstream-set",
    "federation-upstream-pattern",
];

impl Choice {
    /// The federation key of a policy definition (a checked one holds at
    /// most one), if any.
    pub fn of(definition: &Map<String, Value>) -> Option<Choice> {
        let text = |k: &str| {
            definition
                .get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        if let Some(u) = text(KEYS[0]) {
            return Some(Choice::Upstream(u));
        }
        if let Some(s) = text(KEYS[1]) {
            return Some(Choice::Set(s));
        }
        text(KEYS[2]).map(Choice::Pattern)
    }
}

/// The upstreams `choice` names in `survey`, each with the overrides its
/// set element gives.
pub fn upstreams(choice: &Choice, survey: &Survey) -> Vec<(String, Map<String, Value>)> {
    match choice {
        Choice::Upstream(name) => vec![(name.clone(), Map::new())],
        Choice::Set(all) if all == "all" => survey
            .upstreams
            .keys()
            .map(|n| (n.clone(), Map::new()))
            .collect(),
        Choice::Set(set) => {
            let Some(Value::Array(items)) = survey.sets.get(set) else {
                return Vec::new();
            };
            let mut out: Vec<(String, Map<String, Value>)> = Vec::new();
            for item in items {
                let Some(map) = item.as_object() else {
                    continue;
                };
                let Some(name) = map.get("upstream").and_then(Value::as_str) else {
                    continue;
                };
                if out.iter().any(|(n, _)| n == name) {
                    continue;
                }
                let mut overrides = map.clone();
                overrides.remove("upstream");
                out.push((name.to_string(), overrides));
            }
            out
        }
        Choice::Pattern(p) => match regex::Regex::new(p) {
            Ok(re) => survey
                .upstreams
                .keys()
                .filter(|n| re.is_match(n))
                .map(|n| (n.clone(), Map::new()))
                .collect(),
            Err(_) => Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sets_all_and_patterns_name_upstreams() {
        let mut s = Survey::default();
        for n in ["a", "b", "west-1"] {
            s.upstreams.insert(n.into(), json!({"uri": "amqp://h"}));
        }
        s.sets.insert(
            "pair".into(),
            json!([{"upstream": "a", "max-hops": 2}, {"upstream": "b"}]),
        );
        s.sets.insert("all".into(), json!([{"upstream": "a"}]));
        let names = |c: Choice| {
            upstreams(&c, &s)
                .into_iter()
                .map(|(n, _)| n)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(Choice::Set("pair".into())), ["a", "b"]);
        assert_eq!(names(Choice::Set("all".into())), ["a", "b", "west-1"]);
        assert_eq!(names(Choice::Pattern("^west".into())), ["west-1"]);
        assert_eq!(
            upstreams(&Choice::Set("pair".into()), &s)[0].1["max-hops"],
            2
        );
        assert!(names(Choice::Set("none".into())).is_empty());
    }
}
