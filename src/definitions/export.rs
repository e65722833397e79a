//! Export: the node's (or one vhost's) definitions in RabbitMQ's JSON, as
//! `rabbitmqctl export_definitions` writes them (vhost metadata and limits
//! included, which RabbitMQ's HTTP export drops). Exclusive queues are not
//! exported, nor the default and `amq.*` exchanges or the default
//! exchange's implicit bindings.

use serde_json::{json, Map, Value};

use super::args::to_json;
use super::RABBITMQ_VERSION;
use crate::broker::{policies::POLICY, vhosts::vhost_limits, Broker};
use crate::vhost::{policies::queue_type, Destination, VHost};

/// The definitions of the whole node (`vhost` None) or of one vhost (its
/// objects then carry no "vhost" field, as in RabbitMQ's per-vhost export).
pub fn export(broker: &Broker, vhost: Option<&str>) -> Result<Value, String> {
    let vhosts: Vec<_> = match vhost {
        None => broker.vhosts(),
        Some(name) => vec![broker
            .vhost(name)
            .ok_or_else(|| format!("no vhost '{name}'"))?],
    };
    let tag = |mut o: Map<String, Value>, vh: &VHost| {
        if vhost.is_none() {
            o.insert("vhost".into(), vh.name.clone().into());
        }
        Value::Object(o)
    };
    let (mut queues, mut exchanges, mut bindings, mut policies) = (vec![], vec![], vec![], vec![]);
    for vh in &vhosts {
        let mut qs = vh.queues();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        for q in qs.iter().filter(|q| q.config.exclusive_owner.is_none()) {
            let o = obj(json!({
                "name": q.name(),
                "durable": q.config.durable,
                "auto_delete": q.config.auto_delete,
                "type": queue_type(q),
                "arguments": to_json(&q.config.arguments),
            }));
            queues.push(tag(o, vh));
        }
        let mut xs = vh.exchanges();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in &xs {
            if x.name.is_empty() {
                continue;
            }
            for (key, args, dest) in x.bindings.read().list() {
                let (destination, kind) = match &dest {
                    Destination::Queue(q) if q.config.exclusive_owner.is_none() => {
                        (q.name().to_string(), "queue")
                    }
                    Destination::Queue(_) => continue,
                    Destination::Exchange(d) => (d.name.clone(), "exchange"),
                };
                let o = obj(json!({
                    "source": x.name,
                    "destination": destination,
                    "destination_type": kind,
                    "routing_key": key,
                    "arguments": to_json(&args),
                }));
                bindings.push(tag(o, vh));
            }
            if x.name.starts_with("amq.") {
                continue;
            }
            let o = obj(json!({
                "name": x.name,
                "type": x.type_name,
                "durable": x.durable,
                "auto_delete": x.auto_delete,
                "internal": x.internal,
                "arguments": to_json(&x.arguments),
            }));
            exchanges.push(tag(o, vh));
        }
        for p in vh.policies().list().iter().filter(|p| !p.operator) {
            let o = obj(json!({
                "name": p.name,
                "pattern": p.pattern,
                "apply-to": p.apply_to.as_str(),
                "definition": p.definition,
                "priority": p.priority,
            }));
            policies.push(tag(o, vh));
        }
    }
    // Table order is not stable: sort, so two exports of the same state
    // are the same file.
    let key = |b: &Value| {
        [
            "vhost",
            "source",
            "destination_type",
            "destination",
            "routing_key",
        ]
        .map(|k| b.get(k).and_then(Value::as_str).unwrap_or("").to_string())
    };
    bindings.sort_by_key(|a| (key(a), a.get("arguments").map(Value::to_string)));
    let mut parameters = Vec::new();
    for p in broker.store.parameters().map_err(|e| e.to_string())? {
        let Some(vh) = vhosts.iter().find(|v| v.name == p.vhost) else {
            continue;
        };
        if p.component == POLICY {
            continue;
        }
        let o = obj(json!({"component": p.component, "name": p.name, "value": p.value}));
        parameters.push(tag(o, vh));
    }
    let mut out = obj(json!({
        "rabbit_version": RABBITMQ_VERSION,
        "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": "Warren",
        "product_version": env!("CARGO_PKG_VERSION"),
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
        "policies": policies,
        "parameters": parameters,
    }));
    if vhost.is_none() {
        out.insert("users".into(), users(broker));
        out.insert("vhosts".into(), vhosts_json(&vhosts));
        let (permissions, topic) = permissions(broker);
        out.insert("permissions".into(), permissions);
        out.insert("topic_permissions".into(), topic);
        let globals: Vec<Value> = broker
            .store
            .global_parameters()
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|g| json!({"name": g.name, "value": g.value}))
            .collect();
        out.insert("global_parameters".into(), globals.into());
    }
    Ok(Value::Object(out))
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn users(broker: &Broker) -> Value {
    broker
        .users
        .list()
        .iter()
        .map(|u| {
            json!({
                "name": u.name,
                "password_hash": u.password_hash,
                "hashing_algorithm": u.algorithm.name(),
                "tags": u.tags,
                "limits": u.limits,
            })
        })
        .collect()
}

fn vhosts_json(vhosts: &[std::sync::Arc<VHost>]) -> Value {
    vhosts
        .iter()
        .map(|vh| {
            let m = vh.meta();
            let mut metadata = obj(json!({"description": m.description, "tags": m.tags}));
            if !m.default_queue_type.is_empty() {
                metadata.insert(
                    "default_queue_type".into(),
                    m.default_queue_type.clone().into(),
                );
            }
            let limits: Vec<Value> = vhost_limits(vh)
                .into_iter()
                .map(|(k, v)| json!([k, v]))
                .collect();
            let mut o = metadata.clone();
            o.insert("name".into(), m.name.clone().into());
            o.insert("metadata".into(), Value::Object(metadata));
            o.insert("limits".into(), limits.into());
            Value::Object(o)
        })
        .collect()
}

fn permissions(broker: &Broker) -> (Value, Value) {
    let perms = broker
        .users
        .permissions()
        .iter()
        .map(|(vhost, user, p)| {
            json!({
                "user": user,
                "vhost": vhost,
                "configure": p.patterns[0],
                "write": p.patterns[1],
                "read": p.patterns[2],
            })
        })
        .collect();
    let topic = broker
        .users
        .all_topic_permissions()
        .iter()
        .map(|(vhost, user, t)| {
            json!({
                "user": user,
                "vhost": vhost,
                "exchange": t.exchange,
                "write": t.write_pattern,
                "read": t.read_pattern,
            })
        })
        .collect();
    (perms, topic)
}
