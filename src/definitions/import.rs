//! Import: a definitions file in RabbitMQ's JSON (as rabbitmqctl or the
//! HTTP API export it, or as people write them) is read whole and checked
//! whole first: every user, vhost, permission, policy, parameter, exchange,
//! queue and binding, against the node and against the rest of the file.
//! Only a file with nothing wrong is applied; one with anything wrong is
//! refused with a message that names the entry and what is wrong with it,
//! and nothing of it is applied. Import adds and updates; it deletes
//! nothing.

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::args::from_json;
use crate::access::{password, Algorithm, Permission, TopicPermission, User};
use crate::broker::policies::{PolicySpec, OPERATOR_POLICY, POLICY};
use crate::broker::vhosts::{parse_limits, LIMITS_COMPONENT};
use crate::broker::Broker;
use crate::store::GlobalParameterDef;
use crate::vhost::{checks, ExchangeSpec, Meta, QueueSpec};

/// What an import did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Imported {
    pub users: usize,
    pub vhosts: usize,
    pub permissions: usize,
    pub policies: usize,
    pub parameters: usize,
    pub exchanges: usize,
    pub queues: usize,
    pub bindings: usize,
}

struct Binding {
    vhost: String,
    source: String,
    destination: String,
    to_exchange: bool,
    routing_key: String,
    arguments: amq_protocol::types::FieldTable,
}

#[derive(Default)]
struct Plan {
    users: Vec<User>,
    vhosts: Vec<(Meta, Option<Map<String, Value>>)>,
    permissions: Vec<[String; 5]>,
    topic_permissions: Vec<[String; 5]>,
    limits: Vec<(String, Map<String, Value>)>,
    policies: Vec<(String, String, PolicySpec, bool)>,
    globals: Vec<GlobalParameterDef>,
    exchanges: Vec<(String, ExchangeSpec)>,
    queues: Vec<(String, QueueSpec)>,
    bindings: Vec<Binding>,
    /// (vhost, name, value) of each shovel, started once made.
    shovels: Vec<(String, String, Value)>,
    /// (component, vhost, name, value) of each federation upstream and
    /// upstream set.
    federation: Vec<(String, String, String, Value)>,
}

/// Reads a field that must be a string.
fn text(o: &Map<String, Value>, key: &str, at: &str) -> Result<String, String> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("{at}: '{key}' must be a string, not {other}")),
        None => Err(format!("{at}: '{key}' is missing")),
    }
}

fn text_or(o: &Map<String, Value>, key: &str, default: &str, at: &str) -> Result<String, String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default.to_string()),
        Some(_) => text(o, key, at),
    }
}

fn flag(o: &Map<String, Value>, key: &str, default: bool, at: &str) -> Result<bool, String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        // Some tools write "true"/"false".
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        Some(other) => Err(format!("{at}: '{key}' must be true or false, not {other}")),
    }
}

/// Tags as RabbitMQ writes them: a list, or one comma-separated string.
pub fn tags(v: Option<&Value>, at: &str) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(s
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("{at}: a tag must be a string, not {t}"))
            })
            .collect(),
        Some(other) => Err(format!(
            "{at}: tags must be a list or a string, not {other}"
        )),
    }
}

/// Limits as a map, or as the list of pairs rabbitmqctl writes for vhosts.
fn limits_map(v: Option<&Value>, at: &str) -> Result<Option<Map<String, Value>>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m.clone())),
        Some(Value::Array(pairs)) => {
            let mut m = Map::new();
            for p in pairs {
                match p.as_array().map(Vec::as_slice) {
                    Some([Value::String(k), v]) => {
                        m.insert(k.clone(), v.clone());
                    }
                    _ => return Err(format!("{at}: a limit must be [name, value], not {p}")),
                }
            }
            Ok(Some(m))
        }
        Some(other) => Err(format!("{at}: limits must be an object, not {other}")),
    }
}

fn section<'a>(root: &'a Map<String, Value>, key: &str) -> Result<&'a [Value], String> {
    match root.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(format!("'{key}' must be a list, not {}", kind_of(other))),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// An entry of a section, with where it is ("queues[3] 'q'").
type Entry<'a> = (&'a Map<String, Value>, String);

/// Each entry of `key` as an object, with where it is.
fn entries<'a>(root: &'a Map<String, Value>, key: &str) -> Result<Vec<Entry<'a>>, String> {
    section(root, key)?
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let o = e
                .as_object()
                .ok_or_else(|| format!("{key}[{i}] must be an object, not {}", kind_of(e)))?;
            let name = ["name", "user", "source"]
                .iter()
                .find_map(|k| o.get(*k).and_then(Value::as_str));
            let at = match name {
                Some(n) => format!("{key}[{i}] '{n}'"),
                None => format!("{key}[{i}]"),
            };
            Ok((o, at))
        })
        .collect()
}

/// Imports `file` (node-wide, or into `into_vhost`, whose entries then
/// need no "vhost" field, as RabbitMQ's per-vhost import). Nothing is
/// applied unless all of it can be.
pub fn import(broker: &Broker, file: &Value, into_vhost: Option<&str>) -> Result<Imported, String> {
    let root = file
        .as_object()
        .ok_or_else(|| format!("definitions must be a JSON object, not {}", kind_of(file)))?;
    let plan = read(root, into_vhost)?;
    check(broker, &plan)?;
    apply(broker, plan)
}

fn vhost_of(o: &Map<String, Value>, into: Option<&str>, at: &str) -> Result<String, String> {
    match into {
        Some(v) => Ok(v.to_string()),
        None => text(o, "vhost", at),
    }
}

fn read(root: &Map<String, Value>, into: Option<&str>) -> Result<Plan, String> {
    let mut plan = Plan::default();
    if into.is_none() {
        for (o, at) in entries(root, "users")? {
            let name = text(o, "name", &at)?;
            let hash = text_or(o, "password_hash", "", &at)?;
            let alg_name = text_or(o, "hashing_algorithm", "", &at)?;
            let algorithm = Algorithm::parse(&alg_name)
                .ok_or_else(|| format!("{at}: unknown hashing_algorithm '{alg_name}'"))?;
            if !hash.is_empty() && !password::well_formed(algorithm, &hash) {
                return Err(format!(
                    "{at}: password_hash is not a {} hash",
                    algorithm.name()
                ));
            }
            let limits = match limits_map(o.get("limits"), &at)? {
                None => Default::default(),
                Some(m) => m
                    .iter()
                    .map(|(k, v)| match (k.as_str(), v.as_i64()) {
                        ("max-connections" | "max-channels", Some(n)) => Ok((k.clone(), n)),
                        ("max-connections" | "max-channels", None) => {
                            Err(format!("{at}: limit '{k}' must be an integer, not {v}"))
                        }
                        _ => Err(format!("{at}: unknown user limit '{k}'")),
                    })
                    .collect::<Result<_, _>>()?,
            };
            plan.users.push(User {
                name,
                password_hash: hash,
                algorithm,
                tags: tags(o.get("tags"), &at)?,
                limits,
            });
        }
        for (o, at) in entries(root, "vhosts")? {
            let name = text(o, "name", &at)?;
            // Top-level fields (the HTTP API's) or "metadata" (rabbitmqctl's).
            let meta = o.get("metadata").and_then(Value::as_object).unwrap_or(o);
            let vh = Meta {
                name,
                description: text_or(meta, "description", "", &at)?,
                tags: tags(meta.get("tags"), &at)?,
                default_queue_type: text_or(meta, "default_queue_type", "", &at)?
                    .replace("undefined", ""),
            };
            plan.vhosts.push((vh, limits_map(o.get("limits"), &at)?));
        }
        for (o, at) in entries(root, "permissions")? {
            plan.permissions.push([
                text(o, "user", &at)?,
                text(o, "vhost", &at)?,
                text_or(o, "configure", "", &at)?,
                text_or(o, "write", "", &at)?,
                text_or(o, "read", "", &at)?,
            ]);
        }
        for (o, at) in entries(root, "topic_permissions")? {
            plan.topic_permissions.push([
                text(o, "user", &at)?,
                text(o, "vhost", &at)?,
                text(o, "exchange", &at)?,
                text_or(o, "write", "", &at)?,
                text_or(o, "read", "", &at)?,
            ]);
        }
        for (o, at) in entries(root, "global_parameters")? {
            let name = text(o, "name", &at)?;
            let value = o.get("value").cloned().unwrap_or(Value::Null);
            plan.globals.push(GlobalParameterDef { name, value });
        }
    }
    for (o, at) in entries(root, "parameters")? {
        let vhost = vhost_of(o, into, &at)?;
        let component = text(o, "component", &at)?;
        let name = text(o, "name", &at)?;
        let value = o.get("value").cloned().unwrap_or(Value::Null);
        match component.as_str() {
            LIMITS_COMPONENT => {
                let m = limits_map(Some(&value), &at)?.unwrap_or_default();
                parse_limits(&m).map_err(|e| format!("{at}: {}", e.text))?;
                plan.limits.push((vhost, m));
            }
            POLICY | OPERATOR_POLICY => {
                let spec = PolicySpec::from_value(&value).map_err(|e| format!("{at}: {e}"))?;
                plan.policies
                    .push((vhost, name, spec, component == OPERATOR_POLICY));
            }
            crate::shovel::COMPONENT => {
                crate::shovel::Spec::parse(&name, &value).map_err(|e| format!("{at}: {e}"))?;
                plan.shovels.push((vhost, name, value));
            }
            c if crate::broker::federation::is_federation(c) => {
                crate::broker::federation::check_federation_parameter(c, &name, &value)
                    .map_err(|e| format!("{at}: {e}"))?;
                plan.federation.push((component, vhost, name, value));
            }
            _ => return Err(format!("{at}: {}", component_not_found(&component))),
        }
    }
    for (o, at) in entries(root, "policies")? {
        let vhost = vhost_of(o, into, &at)?;
        let name = text(o, "name", &at)?;
        let spec =
            PolicySpec::from_value(&Value::Object(o.clone())).map_err(|e| format!("{at}: {e}"))?;
        plan.policies.push((vhost, name, spec, false));
    }
    for (o, at) in entries(root, "exchanges")? {
        let vhost = vhost_of(o, into, &at)?;
        let spec = ExchangeSpec {
            name: text(o, "name", &at)?,
            kind: text(o, "type", &at)?,
            durable: flag(o, "durable", true, &at)?,
            auto_delete: flag(o, "auto_delete", false, &at)?,
            internal: flag(o, "internal", false, &at)?,
            arguments: from_json(o.get("arguments"), &at)?,
        };
        plan.exchanges.push((vhost, spec));
    }
    for (o, at) in entries(root, "queues")? {
        let vhost = vhost_of(o, into, &at)?;
        let mut arguments = from_json(o.get("arguments"), &at)?;
        // rabbitmqctl writes the type beside the arguments too.
        if let (Some(t), false) = (
            o.get("type").and_then(Value::as_str),
            arguments.contains_key("x-queue-type"),
        ) {
            if t != "classic" {
                arguments.insert(
                    "x-queue-type".into(),
                    amq_protocol::types::AMQPValue::LongString(t.into()),
                );
            }
        }
        let spec = QueueSpec {
            name: text(o, "name", &at)?,
            durable: flag(o, "durable", true, &at)?,
            exclusive: false,
            auto_delete: flag(o, "auto_delete", false, &at)?,
            arguments,
            server_named: false,
        };
        plan.queues.push((vhost, spec));
    }
    for (o, at) in entries(root, "bindings")? {
        let vhost = vhost_of(o, into, &at)?;
        let kind = text_or(o, "destination_type", "queue", &at)?;
        let to_exchange = match kind.as_str() {
            "queue" => false,
            "exchange" => true,
            other => {
                return Err(format!(
                    "{at}: destination_type must be queue or exchange, not '{other}'"
                ))
            }
        };
        plan.bindings.push(Binding {
            vhost,
            source: text(o, "source", &at)?,
            destination: text(o, "destination", &at)?,
            to_exchange,
            routing_key: text_or(o, "routing_key", "", &at)?,
            arguments: from_json(o.get("arguments"), &at)?,
        });
    }
    Ok(plan)
}

fn check(broker: &Broker, plan: &Plan) -> Result<(), String> {
    let new_vhosts: HashSet<&str> = plan.vhosts.iter().map(|(m, _)| m.name.as_str()).collect();
    let vhost_known = |v: &str| broker.vhost(v).is_some() || new_vhosts.contains(v);
    let need_vhost = |v: &str, at: &str| {
        if vhost_known(v) {
            Ok(())
        } else {
            Err(format!("{at}: no vhost '{v}' on this node or in the file"))
        }
    };
    for (m, limits) in &plan.vhosts {
        if m.name.is_empty() {
            return Err("vhosts: a vhost needs a name".into());
        }
        if let Some(l) = limits {
            parse_limits(l).map_err(|e| format!("vhosts '{}': {}", m.name, e.text))?;
        }
    }
    let new_users: HashSet<&str> = plan.users.iter().map(|u| u.name.as_str()).collect();
    for (i, u) in plan.users.iter().enumerate() {
        if u.name.is_empty() {
            return Err(format!("users[{i}]: a user needs a name"));
        }
    }
    let user_known = |u: &str| broker.users.get(u).is_some() || new_users.contains(u);
    for [user, vhost, c, w, r] in &plan.permissions {
        let at = format!("permissions for user '{user}' on vhost '{vhost}'");
        need_vhost(vhost, &at)?;
        if !user_known(user) {
            return Err(format!(
                "{at}: no user '{user}' on this node or in the file"
            ));
        }
        Permission::new(c, w, r).map_err(|e| format!("{at}: {e}"))?;
    }
    for [user, vhost, x, w, r] in &plan.topic_permissions {
        let at = format!("topic_permissions for user '{user}' on vhost '{vhost}'");
        need_vhost(vhost, &at)?;
        if !user_known(user) {
            return Err(format!(
                "{at}: no user '{user}' on this node or in the file"
            ));
        }
        TopicPermission::new(user, vhost, x, w, r).map_err(|e| format!("{at}: {e}"))?;
    }
    for (vhost, _) in &plan.limits {
        need_vhost(vhost, "parameters (vhost-limits)")?;
    }
    for (vhost, name, spec, operator) in &plan.policies {
        let at = format!("policy '{name}' in vhost '{vhost}'");
        need_vhost(vhost, &at)?;
        crate::policy::Policy::new(
            vhost,
            name,
            &spec.pattern,
            &spec.apply_to,
            spec.priority,
            spec.definition.clone(),
            *operator,
        )
        .map_err(|e| format!("{at}: {e}"))?;
    }
    let mut exchanges: HashSet<(&str, &str)> = HashSet::new();
    for (vhost, spec) in &plan.exchanges {
        let at = format!("exchange '{}' in vhost '{vhost}'", spec.name);
        need_vhost(vhost, &at)?;
        if is_builtin(&spec.name) {
            continue;
        }
        checks::exchange(
            broker.vhost(vhost).as_deref(),
            vhost,
            broker.plugins(),
            spec,
        )
        .map_err(|e| format!("{at}: {}", e.text))?;
        exchanges.insert((vhost, &spec.name));
    }
    let mut queues: HashSet<(&str, &str)> = HashSet::new();
    for (vhost, spec) in &plan.queues {
        let at = format!("queue '{}' in vhost '{vhost}'", spec.name);
        need_vhost(vhost, &at)?;
        checks::queue(broker.vhost(vhost).as_deref(), vhost, spec)
            .map_err(|e| format!("{at}: {}", e.text))?;
        queues.insert((vhost, &spec.name));
    }
    for b in &plan.bindings {
        let at = format!(
            "binding from '{}' to {} '{}' in vhost '{}'",
            b.source,
            if b.to_exchange { "exchange" } else { "queue" },
            b.destination,
            b.vhost
        );
        need_vhost(&b.vhost, &at)?;
        let vh = broker.vhost(&b.vhost);
        let has_exchange = |n: &str| {
            is_builtin(n)
                || exchanges.contains(&(b.vhost.as_str(), n))
                || vh.as_ref().is_some_and(|v| v.exchange(n).is_some())
        };
        if b.source.is_empty() {
            return Err(format!("{at}: the default exchange takes no bindings"));
        }
        if !has_exchange(&b.source) {
            return Err(format!("{at}: no exchange '{}'", b.source));
        }
        let dest_ok = if b.to_exchange {
            has_exchange(&b.destination)
        } else {
            queues.contains(&(b.vhost.as_str(), b.destination.as_str()))
                || vh
                    .as_ref()
                    .is_some_and(|v| v.queue(&b.destination).is_some())
        };
        if !dest_ok {
            return Err(format!("{at}: no such destination"));
        }
    }
    let shovels = plan
        .shovels
        .iter()
        .map(|(v, n, value)| (crate::shovel::COMPONENT, v, n, value));
    let upstreams = plan
        .federation
        .iter()
        .map(|(c, v, n, value)| (c.as_str(), v, n, value));
    for (component, vhost, name, value) in shovels.chain(upstreams) {
        broker
            .check_link_tls_files(component, value)
            .map_err(|e| format!("parameters '{vhost}' {component} '{name}': {e}"))?;
    }
    Ok(())
}

/// The exchanges every vhost has ("" and amq.*): a file may list them;
/// they are left as they are.
fn is_builtin(name: &str) -> bool {
    name.is_empty() || name.starts_with("amq.")
}

fn apply(broker: &Broker, plan: Plan) -> Result<Imported, String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("importing {what} failed: {e}");
    let mut done = Imported::default();
    for u in plan.users {
        let name = u.name.clone();
        broker
            .users
            .put_user(u)
            .map_err(|e| fail(&format!("user '{name}'"), &e))?;
        done.users += 1;
    }
    for (meta, limits) in plan.vhosts {
        let name = meta.name.clone();
        broker
            .put_vhost(meta)
            .map_err(|e| fail(&format!("vhost '{name}'"), &e))?;
        if let (Some(l), Some(vh)) = (limits, broker.vhost(&name)) {
            broker
                .set_vhost_limits(&vh, l)
                .map_err(|e| fail(&format!("limits of vhost '{name}'"), &e))?;
        }
        done.vhosts += 1;
    }
    for [user, vhost, c, w, r] in plan.permissions {
        broker
            .users
            .set_permission(&user, &vhost, &c, &w, &r)
            .map_err(|e| fail(&format!("permissions of '{user}'"), &e))?;
        done.permissions += 1;
    }
    for [user, vhost, x, w, r] in plan.topic_permissions {
        broker
            .users
            .set_topic_permission(&user, &vhost, &x, &w, &r)
            .map_err(|e| fail(&format!("topic permissions of '{user}'"), &e))?;
        done.permissions += 1;
    }
    for (vhost, limits) in plan.limits {
        if let Some(vh) = broker.vhost(&vhost) {
            broker
                .set_vhost_limits(&vh, limits)
                .map_err(|e| fail(&format!("limits of vhost '{vhost}'"), &e))?;
            done.parameters += 1;
        }
    }
    for g in plan.globals {
        broker
            .store
            .put_global_parameter(&g)
            .map_err(|e| fail(&format!("global parameter '{}'", g.name), &e))?;
        done.parameters += 1;
    }
    for (vhost, name, spec, operator) in plan.policies {
        broker
            .put_policy(&vhost, &name, &spec, operator)
            .map_err(|e| fail(&format!("policy '{name}'"), &e))?;
        done.policies += 1;
    }
    for (vhost, name, value) in plan.shovels {
        broker
            .put_shovel(&vhost, &name, &value)
            .map_err(|e| fail(&format!("shovel '{name}'"), &e))?;
        done.parameters += 1;
    }
    for (component, vhost, name, value) in plan.federation {
        broker
            .put_federation_parameter(&component, &vhost, &name, &value)
            .map_err(|e| fail(&format!("{component} '{name}'"), &e))?;
        done.parameters += 1;
    }
    for (vhost, spec) in plan.exchanges {
        if is_builtin(&spec.name) {
            continue;
        }
        let vh = broker
            .vhost(&vhost)
            .ok_or_else(|| fail("an exchange", &"vhost gone"))?;
        vh.declare_exchange(&spec, false)
            .map_err(|e| fail(&format!("exchange '{}'", spec.name), &e))?;
        done.exchanges += 1;
    }
    for (vhost, spec) in plan.queues {
        let vh = broker
            .vhost(&vhost)
            .ok_or_else(|| fail("a queue", &"vhost gone"))?;
        vh.declare_queue(&spec, false, 0)
            .map_err(|e| fail(&format!("queue '{}'", spec.name), &e))?;
        done.queues += 1;
    }
    for b in plan.bindings {
        let vh = broker
            .vhost(&b.vhost)
            .ok_or_else(|| fail("a binding", &"vhost gone"))?;
        let dest = vh
            .destination(&b.destination, b.to_exchange, 0)
            .map_err(|e| fail("a binding", &e))?;
        vh.bind(&b.source, dest, &b.routing_key, &b.arguments)
            .map_err(|e| fail(&format!("binding from '{}'", b.source), &e))?;
        done.bindings += 1;
    }
    Ok(done)
}

/// Why a parameter of `component` is refused: no part of Warren acts on
/// it, so storing one would list it as if it ran. RabbitMQ's wording for
/// a component no plugin provides.
pub fn component_not_found(component: &str) -> String {
    format!(
        "Validation failed\n\ncomponent {component} not found (Warren acts on the components \
         {LIMITS_COMPONENT}, {POLICY}, {OPERATOR_POLICY}, shovel, federation-upstream and \
         federation-upstream-set)\n"
    )
}
