//! The JSON of each kind of object, with the fields RabbitMQ 3.10's API
//! gives it (tests/fixtures/rabbitmq-3.10/api has RabbitMQ's own answers)
//! and that rabbitmq_http_client's response types require. Counters come
//! with `<name>_details: {"rate": r}`.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::Api;
use std::collections::HashMap;

use crate::broker::connections::{ChannelSnapshot, MessageCounters, Tracked};
use crate::broker::vhosts::vhost_limits;
use crate::queue::stats::{Counters, Depth, Snapshot};
use crate::queue::Queue;
use crate::vhost::{policies::queue_type, Destination, Exchange, VHost};

/// `{"rate": r}`.
pub fn details(rate: f64) -> Value {
    json!({ "rate": (rate * 10.0).round() / 10.0 })
}

/// `name` and `name_details` into `o`.
pub fn counter(o: &mut Map<String, Value>, name: &str, value: u64, rate: f64) {
    o.insert(name.into(), value.into());
    o.insert(format!("{name}_details"), details(rate));
}

/// The cluster's name: the global parameter if set, else the node's.
pub fn cluster_name(api: &Api) -> String {
    api.broker
        .store
        .global_parameters()
        .ok()
        .and_then(|g| {
            g.into_iter()
                .find(|p| p.name == "cluster_name")
                .and_then(|p| p.value.as_str().map(str::to_string))
        })
        .unwrap_or_else(|| api.node.clone())
}

/// ISO 8601 with ms, as RabbitMQ writes idle_since.
pub fn timestamp(ms: u64) -> String {
    let (y, m, d, h, mi, s) = crate::util::civil((ms / 1000) as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{:03}+00:00",
        ms % 1000
    )
}

/// message_stats of a queue (or a sum of queues).
pub fn message_stats(c: &Counters, rates: &[f64; 7]) -> Value {
    let mut o = Map::new();
    for (i, name) in Counters::NAMES.iter().enumerate() {
        counter(&mut o, name, c.values()[i], rates[i]);
    }
    let deliver_get = c.deliver + c.deliver_no_ack + c.get + c.get_no_ack;
    let dg_rate = rates[1] + rates[2] + rates[3] + rates[4];
    counter(&mut o, "deliver_get", deliver_get, dg_rate);
    Value::Object(o)
}

/// message_stats of a channel (or a sum of channels): RabbitMQ's names
/// for what the channel counted, with rates.
pub fn channel_stats(c: &MessageCounters, rates: &[f64; MessageCounters::LEN]) -> Value {
    // The index of each field in MessageCounters::values.
    const NAMES: [(&str, usize); 11] = [
        ("publish", 0),
        ("drop_unroutable", 3),
        ("return_unroutable", 4),
        ("confirm", 5),
        ("deliver", 6),
        ("deliver_no_ack", 7),
        ("get", 8),
        ("get_no_ack", 9),
        ("get_empty", 10),
        ("redeliver", 11),
        ("ack", 12),
    ];
    let v = c.values();
    let mut o = Map::new();
    for (name, i) in NAMES {
        counter(&mut o, name, v[i], rates[i]);
    }
    let deliver_get = (6..=9).map(|i| v[i]).sum();
    counter(
        &mut o,
        "deliver_get",
        deliver_get,
        (6..=9).map(|i| rates[i]).sum(),
    );
    Value::Object(o)
}

/// Channel counters with their rates, summed.
#[derive(Default)]
pub struct ChannelTotals {
    pub counters: MessageCounters,
    pub rates: [f64; MessageCounters::LEN],
}

impl ChannelTotals {
    /// What the channels of the vhosts `names` counted (`per_vhost` from
    /// the registry), with the rates the sampler keeps.
    pub fn of_vhosts<'a>(
        api: &Api,
        per_vhost: &HashMap<String, MessageCounters>,
        names: impl Iterator<Item = &'a str>,
    ) -> ChannelTotals {
        let rates = api.vhost_rates.lock();
        let mut t = ChannelTotals::default();
        for name in names {
            if let Some(c) = per_vhost.get(name) {
                t.counters.add(c);
            }
            if let Some(r) = rates.get(name) {
                for (sum, x) in t.rates.iter_mut().zip(r.per_sec()) {
                    *sum += x;
                }
            }
        }
        t
    }

    pub fn json(&self) -> Value {
        channel_stats(&self.counters, &self.rates)
    }
}

/// Depth summed over queues.
#[derive(Default)]
pub struct Totals {
    pub ready: u64,
    pub unacked: u64,
}

impl Totals {
    pub fn add(&mut self, d: &Depth) {
        self.ready += d.ready;
        self.unacked += d.unacked;
    }

    /// queue_totals / the messages fields.
    pub fn depth(&self, o: &mut Map<String, Value>) {
        counter(o, "messages", self.ready + self.unacked, 0.0);
        counter(o, "messages_ready", self.ready, 0.0);
        counter(o, "messages_unacknowledged", self.unacked, 0.0);
    }
}

/// A vhost, with its totals; `channels` is what the registry's channels
/// counted per vhost.
pub fn vhost(api: &Api, vh: &VHost, channels: &HashMap<String, MessageCounters>) -> Value {
    let m = vh.meta();
    let mut t = Totals::default();
    for q in vh.queues() {
        t.add(&q.depth());
    }
    let dqt = if m.default_queue_type.is_empty() {
        "classic".to_string()
    } else {
        m.default_queue_type.clone()
    };
    let mut o = json!({
        "name": m.name,
        "description": m.description,
        "tags": m.tags,
        "default_queue_type": dqt,
        "metadata": {"description": m.description, "tags": m.tags, "default_queue_type": dqt},
        "tracing": false,
        "cluster_state": {api.node.clone(): "running"},
        "limits": vhost_limits(vh),
        "message_stats": ChannelTotals::of_vhosts(api, channels, std::iter::once(vh.name.as_str())).json(),
    });
    if let Value::Object(map) = &mut o {
        t.depth(map);
        counter(map, "recv_oct", 0, 0.0);
        counter(map, "send_oct", 0, 0.0);
    }
    o
}

/// A queue; `detailed` adds consumer_details and the like (the one-queue
/// GET).
pub fn queue(api: &Api, vh: &VHost, q: &Arc<Queue>, detailed: bool) -> Value {
    let s = q.snapshot();
    let idle = s.consumers == 0;
    let mut o = json!({
        "name": q.name(),
        "vhost": vh.name,
        "durable": q.config.durable,
        "auto_delete": q.config.auto_delete,
        "exclusive": q.config.exclusive_owner.is_some(),
        "arguments": crate::definitions::args_json(&q.config.arguments),
        "type": queue_type(q),
        "node": api.node,
        "state": "running",
        "consumers": s.consumers,
        "consumer_capacity": if s.consumers > 0 { 1.0 } else { 0.0 },
        "consumer_utilisation": if s.consumers > 0 { 1.0 } else { 0.0 },
        "policy": s.policy,
        "operator_policy": s.operator_policy,
        "effective_policy_definition": q.effective_policy(),
        "exclusive_consumer_tag": Value::Null,
        "single_active_consumer_tag": q
            .args
            .single_active_consumer
            .then(|| q.consumer_list().first().map(|c| c.tag.clone()))
            .flatten(),
        "message_bytes_persistent": 0,
        "messages_persistent": 0,
        "head_message_timestamp": Value::Null,
        "recoverable_slaves": Value::Null,
        "backing_queue_status": {"mode": "default", "len": s.ready},
        "message_stats": message_stats(&s.stats.counters, s.stats.rates()),
    });
    let Value::Object(map) = &mut o else {
        return o;
    };
    // Messages its deduplication cache dropped (LavinMQ's name).
    if let (Some(d), Some(Value::Object(stats))) = (q.dedup(), map.get_mut("message_stats")) {
        counter(stats, "dedup", d.dropped(), d.rate());
    }
    for (field, value) in queue_memory(&s) {
        map.insert(field.into(), value.into());
    }
    let [total, ready, unacked] = s.depth_rates;
    counter(map, "messages", s.ready + s.unacked, total);
    counter(map, "messages_ready", s.ready, ready);
    counter(map, "messages_unacknowledged", s.unacked, unacked);
    if idle {
        map.insert("idle_since".into(), timestamp(s.idle_since).into());
    }
    if let Some(stream) = q.stream() {
        // RabbitMQ's stream fields (committed_offset, segments), and the
        // offsets a reader can start from, as its stream protocol's stats
        // give them; null while it holds nothing.
        let e = stream.extent();
        let first = e.last().map(|_| e.first);
        map.insert("segments".into(), e.segments.into());
        map.insert("first_offset".into(), first.into());
        map.insert("last_offset".into(), e.last().into());
        map.insert("committed_offset".into(), e.last().into());
    }
    if detailed {
        let consumers: Vec<Value> = q
            .consumer_list()
            .iter()
            .map(|c| consumer(api, vh, q, c))
            .collect();
        map.insert("consumer_details".into(), consumers.into());
        map.insert("deliveries".into(), json!([]));
        map.insert("incoming".into(), json!([]));
    }
    o
}

/// A queue's message bytes and counts by where they are held, and its
/// memory, as RabbitMQ names them.
fn queue_memory(s: &Snapshot) -> [(&'static str, u64); 10] {
    [
        ("message_bytes", s.ready_bytes + s.unacked_bytes),
        ("message_bytes_ready", s.ready_bytes),
        ("message_bytes_unacknowledged", s.unacked_bytes),
        ("message_bytes_ram", s.ready_ram_bytes + s.unacked_bytes),
        ("message_bytes_paged_out", s.paged_out_bytes),
        ("messages_ram", s.ready_ram + s.unacked),
        ("messages_ready_ram", s.ready_ram),
        ("messages_unacknowledged_ram", s.unacked),
        ("messages_paged_out", s.paged_out),
        ("memory", s.memory),
    ]
}

/// A queue's value of the list field `field`, without rendering the
/// queue (sorting 100,000 queues by depth); None for a field it does not
/// know, which is then rendered.
pub fn queue_sort_value(q: &Queue, field: &str) -> Option<Value> {
    let s = q.snapshot();
    if let Some((_, v)) = queue_memory(&s).into_iter().find(|(f, _)| *f == field) {
        return Some(v.into());
    }
    Some(match field {
        "messages" => (s.ready + s.unacked).into(),
        "messages_ready" | "backing_queue_status.len" => s.ready.into(),
        "messages_unacknowledged" => s.unacked.into(),
        "consumers" => s.consumers.into(),
        "policy" => s.policy.into(),
        "operator_policy" => s.operator_policy.into(),
        "durable" => q.config.durable.into(),
        "auto_delete" => q.config.auto_delete.into(),
        "exclusive" => q.config.exclusive_owner.is_some().into(),
        _ => {
            let rest = field.strip_prefix("message_stats.")?;
            let stats = message_stats(&s.stats.counters, s.stats.rates());
            rest.split('.')
                .try_fold(&stats, |v, k| v.get(k))
                .cloned()
                .unwrap_or(Value::Null)
        }
    })
}

/// A consumer.
pub fn consumer(api: &Api, vh: &VHost, q: &Queue, c: &crate::queue::Consumer) -> Value {
    let channel = c
        .sink
        .owner()
        .and_then(|(conn, number)| api.broker.connections.get(conn).map(|t| (t, number)))
        .map(|(t, number)| channel_details(api, &t, number))
        .unwrap_or_else(|| json!({}));
    json!({
        "consumer_tag": c.tag,
        "ack_required": !c.no_ack,
        "exclusive": c.exclusive,
        "prefetch_count": c.prefetch,
        "active": true,
        "activity_status": "up",
        "arguments": {},
        "channel_details": channel,
        "queue": {"name": q.name(), "vhost": vh.name},
    })
}

fn channel_details(api: &Api, t: &Tracked, number: u16) -> Value {
    json!({
        "connection_name": t.info.name,
        "name": format!("{} ({number})", t.info.name),
        "node": api.node,
        "number": number,
        "peer_host": t.info.peer.ip().to_string(),
        "peer_port": t.info.peer.port(),
        "user": t.info.user,
    })
}

/// An exchange.
pub fn exchange(vh: &VHost, x: &Exchange) -> Value {
    json!({
        "name": x.name,
        "vhost": vh.name,
        "type": x.type_name,
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
        "arguments": crate::definitions::args_json(&x.arguments),
        "policy": x.policy.read().name,
        "user_who_performed_action": "",
        "message_stats": exchange_stats(x),
        "incoming": [],
        "outgoing": [],
    })
}

fn exchange_stats(x: &Exchange) -> Value {
    let [published, routed] = x.stats.counters();
    let [published_rate, routed_rate] = x.stats.rates();
    let mut o = Map::new();
    counter(&mut o, "publish_in", published, published_rate);
    counter(&mut o, "publish_out", routed, routed_rate);
    if let Some(d) = &x.dedup {
        counter(&mut o, "dedup", d.dropped(), d.rate());
    }
    Value::Object(o)
}

/// RabbitMQ's properties_key: what names a binding in a URL (the routing
/// key, "~" for an empty one, then "~" and a digest of the arguments).
pub fn properties_key(routing_key: &str, args: &amq_protocol::types::FieldTable) -> String {
    // A key with "~" in it always takes the digest, so that it cannot be
    // mistaken for another key's.
    if args.inner().is_empty() && !routing_key.contains('~') {
        return if routing_key.is_empty() {
            "~".into()
        } else {
            routing_key.into()
        };
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(crate::wire::table::encode_table(args));
    let short: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{routing_key}~{short}")
}

/// Every binding of `vh` (the default exchange's implicit ones first, as
/// RabbitMQ lists them), as JSON.
pub fn bindings(vh: &VHost) -> Vec<Value> {
    bindings_where(vh, None, |_, _, _| true)
}

/// The bindings of `vh` from the exchange `source` (all exchanges if
/// None) that `keep` takes (source, destination, destination type):
/// only those are rendered.
pub fn bindings_where(
    vh: &VHost,
    source: Option<&str>,
    keep: impl Fn(&str, &str, &str) -> bool,
) -> Vec<Value> {
    let mut out = Vec::new();
    if source.is_none_or(str::is_empty) {
        let mut queues: Vec<_> = vh
            .queues()
            .into_iter()
            .filter(|q| keep("", q.name(), "queue"))
            .collect();
        queues.sort_by(|a, b| a.name().cmp(b.name()));
        for q in &queues {
            out.push(binding_json(
                vh,
                "",
                q.name(),
                "queue",
                q.name(),
                &Default::default(),
            ));
        }
    }
    let mut xs = match source {
        None => vh.exchanges(),
        Some(name) => vh.exchange(name).into_iter().collect(),
    };
    xs.sort_by(|a, b| a.name.cmp(&b.name));
    for x in xs.iter().filter(|x| !x.name.is_empty()) {
        let mut list = x.bindings.read().list();
        list.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, args, dest) in list {
            let (name, kind) = match &dest {
                Destination::Queue(q) => (q.name(), "queue"),
                Destination::Exchange(d) => (d.name.as_str(), "exchange"),
            };
            if keep(&x.name, name, kind) {
                out.push(binding_json(vh, &x.name, name, kind, &key, &args));
            }
        }
    }
    out
}

fn binding_json(
    vh: &VHost,
    source: &str,
    destination: &str,
    kind: &str,
    key: &str,
    args: &amq_protocol::types::FieldTable,
) -> Value {
    json!({
        "source": source,
        "vhost": vh.name,
        "destination": destination,
        "destination_type": kind,
        "routing_key": key,
        "arguments": crate::definitions::args_json(args),
        "properties_key": properties_key(key, args),
    })
}

/// A connection.
pub fn connection(api: &Api, t: &Tracked) -> Value {
    let i = &t.info;
    let (io, io_rates) = t.io();
    let mut channels = ChannelTotals::default();
    for c in t.channel_snapshots() {
        channels.counters.add(&c.counters);
        for (sum, x) in channels.rates.iter_mut().zip(c.rates) {
            *sum += x;
        }
    }
    let user_name = i
        .client_properties
        .inner()
        .get("connection_name")
        .and_then(crate::wire::value::text);
    let mut o = json!({
        "name": i.name,
        "node": api.node,
        "vhost": i.vhost,
        "user": i.user,
        "user_who_performed_action": i.user,
        "user_provided_name": user_name,
        "host": i.local.ip().to_string(),
        "port": i.local.port(),
        "peer_host": i.peer.ip().to_string(),
        "peer_port": i.peer.port(),
        "protocol": i.protocol.name(),
        "type": "network",
        "state": "running",
        "ssl": i.tls,
        "auth_mechanism": i.auth_mechanism,
        "connected_at": i.connected_at,
        "timeout": i.heartbeat,
        "frame_max": i.frame_max,
        "channel_max": i.channel_max,
        "channels": t.channels.lock().len(),
        "client_properties": crate::definitions::args_json(&i.client_properties),
        "send_pend": 0,
        "recv_cnt": io.recv_cnt,
        "send_cnt": io.send_cnt,
        "message_stats": channels.json(),
    });
    if let Value::Object(m) = &mut o {
        counter(m, "recv_oct", io.recv_oct, io_rates[0]);
        counter(m, "send_oct", io.send_oct, io_rates[1]);
    }
    o
}

/// A channel.
pub fn channel(api: &Api, t: &Tracked, c: &ChannelSnapshot) -> Value {
    json!({
        "name": format!("{} ({})", t.info.name, c.number),
        "number": c.number,
        "node": api.node,
        "vhost": t.info.vhost,
        "user": t.info.user,
        "user_who_performed_action": t.info.user,
        "connection_details": {
            "name": t.info.name,
            "peer_host": t.info.peer.ip().to_string(),
            "peer_port": t.info.peer.port(),
        },
        "state": "running",
        "consumer_count": c.consumers,
        "prefetch_count": c.prefetch,
        "global_prefetch_count": c.global_prefetch,
        "messages_unacknowledged": c.unacked,
        "messages_unconfirmed": c.unconfirmed,
        "messages_uncommitted": 0,
        "acks_uncommitted": 0,
        "confirm": c.confirm,
        "transactional": c.transactional,
        "pending_raft_commands": 0,
        "message_stats": channel_stats(&c.counters, &c.rates),
    })
}
