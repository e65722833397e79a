//! Prometheus metrics in the text exposition format, with
//! rabbitmq_prometheus's names and labels for the series RabbitMQ's
//! Grafana dashboards read: /metrics aggregates (one series per family,
//! cheap at any number of queues), /metrics/per-object adds one series per
//! queue. Its own listener, without authentication, as RabbitMQ's.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::render::{self, Totals};
use super::Api;
use crate::broker::message_sizes::{Sizes, BUCKETS, LE};
use crate::definitions::RABBITMQ_VERSION;
use crate::queue::stats::Depth;

/// A text exposition being written.
struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
        let _ = writeln!(self.0, "# HELP {name} {help}");
    }

    fn value(&mut self, name: &str, labels: &[(&str, &str)], v: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(val));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {v}");
    }

    fn gauge(&mut self, name: &str, help: &str, v: impl std::fmt::Display) {
        self.family(name, "gauge", help);
        self.value(name, &[], v);
    }

    fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: u64) {
        self.family(name, "counter", help);
        self.value(name, labels, v);
    }
}

/// A label value as the format wants it (backslash, quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The cluster's permanent id, made once and kept as the global
/// parameter internal_cluster_id, as RabbitMQ keeps it.
pub fn cluster_id(api: &Api) -> String {
    if let Some(id) = api.cluster_id.get() {
        return id.clone();
    }
    let store = &api.broker.store;
    if let Ok(all) = store.global_parameters() {
        if let Some(id) = all
            .iter()
            .find(|g| g.name == "internal_cluster_id")
            .and_then(|g| g.value.as_str())
        {
            return id.to_string();
        }
    }
    let id = format!("rabbitmq-cluster-id-{}", crate::util::random_name());
    let def = crate::store::GlobalParameterDef {
        name: "internal_cluster_id".into(),
        value: id.clone().into(),
    };
    if let Err(e) = store.put_global_parameter(&def) {
        tracing::warn!("cannot record the cluster id: {e}");
    }
    id
}

/// Reads (or makes, once) the cluster id at start.
pub fn init_cluster_id(api: &Api) {
    let id = cluster_id(api);
    let _ = api.cluster_id.set(id);
}

fn render(api: &Api, per_object: bool) -> String {
    let mut o = Out(String::with_capacity(16 << 10));
    let node = api.node.as_str();
    let cluster = render::cluster_name(api);
    let id = cluster_id(api);
    o.family(
        "rabbitmq_identity_info",
        "untyped",
        "RabbitMQ node & cluster identity info",
    );
    let endpoint = if per_object { "per-object" } else { "metrics" };
    o.value(
        "rabbitmq_identity_info",
        &[
            ("rabbitmq_node", node),
            ("rabbitmq_cluster", &cluster),
            ("rabbitmq_cluster_permanent_id", &id),
            ("rabbitmq_endpoint", endpoint),
        ],
        1,
    );
    build_info(&mut o);
    // The dashboards' node tables join the build on it; Warren has no
    // Erlang VM, so this is the process's uptime.
    o.gauge(
        "rabbitmq_erlang_uptime_seconds",
        "Node uptime",
        format!("{:.3}", api.started.elapsed().as_secs_f64()),
    );
    if let Some(cluster) = &api.broker.cluster {
        raft_metrics(&mut o, &cluster.local_status());
    }
    let c = api.broker.connections.totals();
    let conns = api.broker.connections.list();
    let channels: usize = conns.iter().map(|t| t.channels.lock().len()).sum();
    let mut depth = Totals::default();
    let (mut queues, mut consumers) = (0usize, 0u64);
    let mut per_queue = Vec::new();
    let mut per_stream = Vec::new();
    for vh in api.broker.vhosts() {
        for q in vh.queues() {
            queues += 1;
            if per_object {
                let s = q.snapshot();
                consumers += s.consumers as u64;
                depth.add(&Depth {
                    ready: s.ready,
                    unacked: s.unacked,
                    consumers: s.consumers,
                });
                if let Some(stream) = q.stream() {
                    per_stream.push((vh.name.clone(), q.name().to_string(), stream.extent()));
                }
                per_queue.push((vh.name.clone(), q.name().to_string(), s));
            } else {
                let d = q.depth();
                consumers += d.consumers as u64;
                depth.add(&d);
            }
        }
    }
    o.gauge(
        "rabbitmq_connections",
        "Connections currently open",
        conns.len(),
    );
    o.gauge("rabbitmq_channels", "Channels currently open", channels);
    o.gauge(
        "rabbitmq_consumers",
        "Consumers currently connected",
        consumers,
    );
    o.gauge("rabbitmq_queues", "Queues available", queues);
    o.counter(
        "rabbitmq_connections_opened_total",
        "Total number of connections opened",
        &[],
        c.connections_opened,
    );
    o.counter(
        "rabbitmq_connections_closed_total",
        "Total number of connections closed or terminated",
        &[],
        c.connections_closed,
    );
    o.counter(
        "rabbitmq_channels_opened_total",
        "Total number of channels opened",
        &[],
        c.channels_opened,
    );
    o.counter(
        "rabbitmq_channels_closed_total",
        "Total number of channels closed",
        &[],
        c.channels_closed,
    );
    let [declared, created, deleted] = api.broker.queue_churn.counters();
    for (name, help, v) in [
        (
            "rabbitmq_queues_declared_total",
            "Total number of queues declared",
            declared,
        ),
        (
            "rabbitmq_queues_created_total",
            "Total number of queues created",
            created,
        ),
        (
            "rabbitmq_queues_deleted_total",
            "Total number of queues deleted",
            deleted,
        ),
    ] {
        o.counter(name, help, &[], v);
    }
    let m = &c.messages;
    let amqp = [("protocol", "amqp091")];
    let classic = [
        ("protocol", "amqp091"),
        ("queue_type", "rabbit_classic_queue"),
    ];
    for (name, help, labels, v) in [
        ("received", "Total number of messages received from publishers", &amqp[..], m.received),
        ("received_confirm", "Total number of messages received from publishers expecting confirmations", &amqp[..], m.received_confirm),
        ("routed", "Total number of messages routed to queues or streams", &amqp[..], m.routed),
        ("unroutable_dropped", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable", &amqp[..], m.unroutable_dropped),
        ("unroutable_returned", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable", &amqp[..], m.unroutable_returned),
        ("confirmed", "Total number of messages confirmed to publishers", &amqp[..], m.confirmed),
        ("delivered", "Total number of messages delivered to consumers", &classic[..], m.delivered_consume_auto_ack + m.delivered_consume_manual_ack + m.delivered_get_auto_ack + m.delivered_get_manual_ack),
        ("delivered_consume_manual_ack", "Total number of messages delivered to consumers using basic.consume with manual acknowledgment", &classic[..], m.delivered_consume_manual_ack),
        ("delivered_consume_auto_ack", "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment", &classic[..], m.delivered_consume_auto_ack),
        ("delivered_get_manual_ack", "Total number of messages delivered to consumers using basic.get with manual acknowledgment", &classic[..], m.delivered_get_manual_ack),
        ("delivered_get_auto_ack", "Total number of messages delivered to consumers using basic.get with automatic acknowledgment", &classic[..], m.delivered_get_auto_ack),
        ("get_empty", "Total number of times basic.get operations fetched no message", &classic[..], m.get_empty),
        ("redelivered", "Total number of messages redelivered to consumers", &classic[..], m.redelivered),
        ("acknowledged", "Total number of messages acknowledged by consumers", &classic[..], m.acknowledged),
    ] {
        o.counter(&format!("rabbitmq_global_messages_{name}_total"), help, labels, v);
    }
    o.gauge(
        "rabbitmq_global_consumers",
        "Current number of consumers",
        consumers,
    );
    o.gauge(
        "rabbitmq_global_publishers",
        "Current number of publishers",
        c.publishers,
    );
    message_sizes(&mut o, &c.sizes);
    shovel_metrics(&mut o, &api.broker.shovels);
    federation_metrics(&mut o, &api.broker.federation);
    if per_object {
        queue_series(&mut o, &per_queue);
        stream_series(&mut o, &per_stream);
    } else {
        o.gauge(
            "rabbitmq_queue_messages",
            "Sum of ready and unacknowledged messages - total queue depth",
            depth.ready + depth.unacked,
        );
        o.gauge(
            "rabbitmq_queue_messages_ready",
            "Messages ready to be delivered to consumers",
            depth.ready,
        );
        o.gauge(
            "rabbitmq_queue_messages_unacked",
            "Messages delivered to consumers but not yet acknowledged",
            depth.unacked,
        );
        o.gauge(
            "rabbitmq_queue_consumers",
            "Consumers on a queue",
            consumers,
        );
        // No aggregate of the per-queue publish counters: it would go
        // back when a queue is deleted (per-object has them per queue).
    }
    resource_gauges(&mut o, &api.broker.memory, &api.broker.disk);
    o.gauge(
        "rabbitmq_process_open_fds",
        "Open file descriptors",
        super::routes::open_fds(),
    );
    o.gauge(
        "rabbitmq_process_max_fds",
        "Open file descriptors limit",
        super::routes::fd_limit(),
    );
    o.gauge(
        "rabbitmq_process_open_tcp_sockets",
        "Open TCP sockets",
        conns.len(),
    );
    o.gauge(
        "rabbitmq_process_max_tcp_sockets",
        "Open TCP sockets limit",
        super::routes::fd_limit(),
    );
    o.gauge(
        "rabbitmq_alarms_file_descriptor_limit",
        "is 1 if file descriptor limit alarm is in effect",
        0,
    );
    o.0
}

/// This node's memory and free disk against their limits, and its
/// alarms (a leader's and a follower's alike).
fn resource_gauges(
    o: &mut Out,
    memory: &crate::alarm::MemoryAlarm,
    disk: &crate::alarm::DiskAlarm,
) {
    let rss = crate::alarm::resident_bytes().unwrap_or(0);
    o.gauge(
        "rabbitmq_process_resident_memory_bytes",
        "Memory used in bytes",
        rss,
    );
    let limit = memory.limit();
    o.gauge(
        "rabbitmq_resident_memory_limit_bytes",
        "Memory high watermark in bytes",
        if limit == u64::MAX { 0 } else { limit },
    );
    o.gauge(
        "rabbitmq_disk_space_available_bytes",
        "Disk space available in bytes",
        disk.free_now(),
    );
    o.gauge(
        "rabbitmq_disk_space_available_limit_bytes",
        "Free disk space low watermark in bytes",
        disk.limit(),
    );
    o.gauge(
        "rabbitmq_alarms_memory_used_watermark",
        "is 1 if VM memory watermark alarm is in effect",
        memory.is_raised() as u8,
    );
    o.gauge(
        "rabbitmq_alarms_free_disk_space_watermark",
        "is 1 if free disk space watermark alarm is in effect",
        disk.is_raised() as u8,
    );
}

/// One series per queue, for each queue family.
fn queue_series(o: &mut Out, queues: &[(String, String, crate::queue::stats::Snapshot)]) {
    type Pick = fn(&crate::queue::stats::Snapshot) -> u64;
    let families: [(&str, &str, &str, Pick); 7] = [
        (
            "rabbitmq_queue_messages",
            "gauge",
            "Sum of ready and unacknowledged messages - total queue depth",
            |s| s.ready + s.unacked,
        ),
        (
            "rabbitmq_queue_messages_ready",
            "gauge",
            "Messages ready to be delivered to consumers",
            |s| s.ready,
        ),
        (
            "rabbitmq_queue_messages_unacked",
            "gauge",
            "Messages delivered to consumers but not yet acknowledged",
            |s| s.unacked,
        ),
        (
            "rabbitmq_queue_consumers",
            "gauge",
            "Consumers on a queue",
            |s| s.consumers as u64,
        ),
        (
            "rabbitmq_queue_messages_bytes",
            "gauge",
            "Size in bytes of ready and unacknowledged messages",
            |s| s.ready_bytes + s.unacked_bytes,
        ),
        (
            "rabbitmq_queue_process_memory_bytes",
            "gauge",
            "Memory in bytes the queue holds: its messages in memory and its index",
            |s| s.memory,
        ),
        (
            "rabbitmq_queue_messages_published_total",
            "counter",
            "Total number of messages published to queues",
            |s| s.stats.counters.publish,
        ),
    ];
    for (name, kind, help, pick) in families {
        o.family(name, kind, help);
        for (vhost, queue, s) in queues {
            o.value(name, &[("vhost", vhost), ("queue", queue)], pick(s));
        }
    }
}

/// One series per stream for each stream family (Warren's own: RabbitMQ
/// 3.10 has no per-stream offsets in Prometheus).
fn stream_series(o: &mut Out, streams: &[(String, String, crate::queue::stream::Extent)]) {
    type Pick = fn(&crate::queue::stream::Extent) -> u64;
    let families: [(&str, &str, Pick); 3] = [
        (
            "warren_stream_first_offset",
            "The offset of the first message a stream keeps",
            |e| e.first,
        ),
        (
            "warren_stream_next_offset",
            "The offset the next message appended to a stream gets",
            |e| e.next,
        ),
        (
            "warren_stream_segments",
            "Retention segments a stream holds",
            |e| e.segments,
        ),
    ];
    for (name, help, pick) in families {
        o.family(name, "gauge", help);
        for (vhost, stream, e) in streams {
            o.value(name, &[("vhost", vhost), ("queue", stream)], pick(e));
        }
    }
}

async fn metrics(State(api): State<Arc<Api>>) -> impl IntoResponse {
    text(render(&api, false))
}

async fn per_object(State(api): State<Arc<Api>>) -> impl IntoResponse {
    text(render(&api, true))
}

fn text(body: String) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

/// The Prometheus listener's routes.
pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/metrics/per-object", get(per_object))
        .with_state(api)
}

/// A follower's metrics: the build, this node's Raft series and its
/// memory, free disk and alarms (queues, connections and message counters
/// are the leader's, which serves them).
fn render_follower(cluster: &crate::cluster::Cluster) -> String {
    let mut o = Out(String::with_capacity(4 << 10));
    build_info(&mut o);
    raft_metrics(&mut o, &cluster.local_status());
    let m = cluster.monitors();
    resource_gauges(&mut o, &m.memory, &m.disk);
    o.counter(
        "warren_follower_stream_deliveries_total",
        "Messages this follower delivered from its own copy of a stream",
        &[],
        cluster
            .stream_reads
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    o.0
}

async fn follower_metrics(State(c): State<Arc<crate::cluster::Cluster>>) -> impl IntoResponse {
    text(render_follower(&c))
}

/// The Prometheus routes of a node that follows.
pub fn follower_router(cluster: Arc<crate::cluster::Cluster>) -> Router {
    Router::new()
        .route("/metrics", get(follower_metrics))
        .route("/metrics/per-object", get(follower_metrics))
        .with_state(cluster)
}

/// Serves a follower's metrics on `listener` until `stop` says so.
pub async fn serve_follower<L>(
    listener: L,
    cluster: Arc<crate::cluster::Cluster>,
    limits: crate::config::ManagementConfig,
    stop: tokio::sync::watch::Receiver<bool>,
) where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
    let app = follower_router(cluster);
    super::conns::serve(listener, app, limits, stop, "prometheus").await;
}

/// rabbitmq_shovel_prometheus's gauges (RabbitMQ 4: dynamic and static
/// shovels by status) and, one series per shovel, the messages it
/// forwarded since its run began (a static one's vhost label is empty).
/// Families without a series are left out.
fn shovel_metrics(o: &mut Out, shovels: &crate::shovel::Shovels) {
    use crate::shovel::Kind;
    let (states, each) = shovels.metrics();
    for (kind, family, help) in [
        (
            Kind::Dynamic,
            "rabbitmq_shovel_dynamic",
            "Current number of dynamic shovels",
        ),
        (
            Kind::Static,
            "rabbitmq_shovel_static",
            "Current number of static shovels",
        ),
    ] {
        let mut these = states.iter().filter(|((k, _), _)| *k == kind).peekable();
        if these.peek().is_none() {
            continue;
        }
        o.family(family, "gauge", help);
        for ((_, state), n) in these {
            o.value(family, &[("status", state)], n);
        }
    }
    if each.is_empty() {
        return;
    }
    o.family(
        "rabbitmq_shovel_messages_forwarded_total",
        "counter",
        "Messages a shovel forwarded since it last started",
    );
    for (vhost, name, n) in &each {
        o.value(
            "rabbitmq_shovel_messages_forwarded_total",
            &[("vhost", vhost), ("shovel", name)],
            n,
        );
    }
}

/// rabbitmq_federation_prometheus's gauge (RabbitMQ 4.1): the links by
/// status; left out when there are none.
fn federation_metrics(o: &mut Out, federation: &crate::federation::Federation) {
    let counts = federation.counts();
    if counts.is_empty() {
        return;
    }
    o.family(
        "rabbitmq_federation_links",
        "gauge",
        "Number of federation links",
    );
    for (status, n) in &counts {
        o.value("rabbitmq_federation_links", &[("status", status)], n);
    }
}

/// The histogram of published body sizes, with RabbitMQ 4's buckets.
fn message_sizes(o: &mut Out, sizes: &Sizes) {
    let name = "rabbitmq_message_size_bytes";
    o.family(
        name,
        "histogram",
        "Size of messages received from publishers",
    );
    let bucket = format!("{name}_bucket");
    let cumulative = sizes.cumulative();
    for (le, n) in LE.iter().zip(cumulative) {
        o.value(&bucket, &[("protocol", "amqp091"), ("le", le)], n);
    }
    let amqp = [("protocol", "amqp091")];
    o.value(&format!("{name}_sum"), &amqp, sizes.sum);
    o.value(&format!("{name}_count"), &amqp, cumulative[BUCKETS - 1]);
}

fn build_info(o: &mut Out) {
    o.family(
        "rabbitmq_build_info",
        "untyped",
        "RABBITMQ_VERSION, PROMETHEUS_VERSION, ERLANG_VERSION",
    );
    o.value(
        "rabbitmq_build_info",
        &[
            ("rabbitmq_version", RABBITMQ_VERSION),
            ("prometheus_plugin_version", RABBITMQ_VERSION),
            ("prometheus_client_version", "warren"),
            ("erlang_version", "none"),
            ("product_version", env!("CARGO_PKG_VERSION")),
        ],
        1,
    );
}

/// The node's Raft group, as RabbitMQ names a quorum queue's Raft series
/// (one group here, so no queue labels), and Warren's own.
fn raft_metrics(o: &mut Out, s: &crate::cluster::Status) {
    for (name, help, v) in [
        (
            "rabbitmq_raft_term_total",
            "Current Raft term number",
            s.term,
        ),
        (
            "rabbitmq_raft_log_commit_index",
            "Raft log commit index",
            s.committed,
        ),
        (
            "rabbitmq_raft_log_last_applied_index",
            "Raft log last applied index",
            s.applied,
        ),
        (
            "rabbitmq_raft_log_last_written_index",
            "Raft log last written index",
            s.last_log,
        ),
        (
            "rabbitmq_raft_log_snapshot_index",
            "Raft log snapshot index",
            s.snapshot,
        ),
        (
            "warren_raft_log_entries",
            "Entries in the Raft log (since the last purge)",
            s.log_entries(),
        ),
        (
            "warren_raft_members",
            "Members of the cluster",
            s.members.len() as u64,
        ),
        (
            "warren_raft_is_leader",
            "1 if this node leads the cluster",
            u64::from(s.leader == Some(s.id)),
        ),
    ] {
        o.gauge(name, help, v);
    }
    o.counter(
        "warren_raft_leader_changes_total",
        "Times the leader this node knows changed",
        &[],
        s.leader_changes,
    );
}
