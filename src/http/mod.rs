//! The HTTP listeners: Prometheus metrics (prometheus.rs) and the
//! management HTTP API: RabbitMQ's /api, as rabbitmqadmin, the
//! rabbitmq_http_client crate and scripts that curl it use it. axum over
//! one listener; basic auth against Warren's users (auth.rs); errors as
//! RabbitMQ's JSON (error.rs); lists with RabbitMQ's paging, sorting and
//! columns (list.rs); one module per group of endpoints under routes/;
//! the web UI's files at `/` (ui.rs).

mod auth;
mod body;
mod conns;
mod error;
mod guard;
mod list;
mod message;
pub mod prometheus;
mod render;
pub use render::cluster_name;
mod routes;
mod samples;
pub mod tls;
mod ui;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use parking_lot::Mutex;

use crate::broker::connections::MessageCounters;
use crate::broker::Broker;
use crate::rates::Rates;

pub use error::ApiError;

/// What the handlers share.
pub struct Api {
    pub broker: Arc<Broker>,
    /// The node's name as the API shows it (rabbit@host style).
    pub node: String,
    pub started: Instant,
    /// The listeners, for overview and health checks: (protocol, address).
    pub listeners: Vec<(&'static str, SocketAddr)>,
    /// The cluster's permanent id (made once, at start).
    pub cluster_id: std::sync::OnceLock<String>,
    /// The TLS configurations in force (reloaded by POST /api/tls/reload).
    pub tls: Vec<Arc<crate::tls::Tls>>,
    /// The rates of what each vhost's channels counted (the sampler's).
    pub vhost_rates: Mutex<HashMap<String, Rates<{ MessageCounters::LEN }>>>,
    /// The rates of the overview's churn counters (`churn`'s order).
    pub churn_rates: Mutex<Rates<7>>,
    /// Each vhost's depth and message totals over the last minutes, in
    /// `OVERVIEW_HISTORY`'s order (the overview's charts).
    pub vhost_history: Mutex<HashMap<String, crate::history::History<7>>>,
}

/// What a vhost's history holds, by the API's names: three depths, then
/// four running totals.
pub const OVERVIEW_HISTORY: [&str; 7] = [
    "messages",
    "messages_ready",
    "messages_unacknowledged",
    "publish",
    "deliver_get",
    "ack",
    "confirm",
];

impl Api {
    /// The state for `broker`, whose listeners are `listeners`.
    pub fn new(
        broker: Arc<Broker>,
        listeners: Vec<(&'static str, SocketAddr)>,
        tls: Vec<Arc<crate::tls::Tls>>,
    ) -> Arc<Api> {
        // A cluster member goes by warren-<id>@<its Raft host>.
        let node = match &broker.cluster {
            Some(c) => broker
                .config
                .cluster
                .peers
                .iter()
                .find(|p| p.id == c.id)
                .map(|p| routes::member_name(p.id, &p.raft))
                .unwrap_or_else(node_name),
            None => node_name(),
        };
        let api = Arc::new(Api {
            tls,
            node,
            broker,
            started: Instant::now(),
            listeners,
            cluster_id: std::sync::OnceLock::new(),
            vhost_rates: Mutex::default(),
            churn_rates: Mutex::default(),
            vhost_history: Mutex::default(),
        });
        prometheus::init_cluster_id(&api);
        api
    }
}

/// The overview's churn_rates names, and the counters for them.
pub const CHURN: [&str; 7] = [
    "channel_closed",
    "channel_created",
    "connection_closed",
    "connection_created",
    "queue_created",
    "queue_declared",
    "queue_deleted",
];

fn churn(broker: &Broker) -> [u64; 7] {
    let t = broker.connections.totals();
    let [declared, created, deleted] = broker.queue_churn.counters();
    [
        t.channels_closed,
        t.channels_opened,
        t.connections_closed,
        t.connections_opened,
        created,
        declared,
        deleted,
    ]
}

impl Api {
    /// The churn counters now, with their rates.
    pub fn churn(&self) -> ([u64; 7], [f64; 7]) {
        (churn(&self.broker), *self.churn_rates.lock().per_sec())
    }
}

/// rabbit@<hostname>, as a RabbitMQ node calls itself.
fn node_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("rabbit@{host}")
}

/// How often message rates are sampled.
const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Samples the counters of every queue, exchange, connection, channel and
/// vhost every few seconds (the rates the API shows are the change between
/// the last two samples).
async fn sample(api: Arc<Api>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        sample_once(&api, crate::util::now_ms());
    }
}

fn sample_once(api: &Api, now: u64) {
    let vhosts = api.broker.vhosts();
    let mut depths: HashMap<String, (u64, u64)> = HashMap::with_capacity(vhosts.len());
    for vh in &vhosts {
        let (mut ready, mut unacked) = (0, 0);
        for q in vh.queues() {
            if let Some(d) = q.dedup() {
                d.sample(now);
            }
            let d = q.sample_stats(now);
            ready += d.ready;
            unacked += d.unacked;
        }
        depths.insert(vh.name.clone(), (ready, unacked));
        for x in vh.exchanges() {
            x.stats.sample(now);
            if let Some(d) = &x.dedup {
                d.sample(now);
            }
        }
    }
    let now_churn = churn(&api.broker);
    api.churn_rates.lock().sample(now, now_churn);
    let connections = &api.broker.connections;
    for t in connections.list() {
        t.sample(now);
    }
    connections.retain_vhosts(|v| api.broker.vhost(v).is_some());
    let per_vhost = connections.by_vhost();
    let mut history = api.vhost_history.lock();
    history.retain(|v, _| depths.contains_key(v));
    for (v, (ready, unacked)) in depths {
        let c = per_vhost.get(&v).copied().unwrap_or_default();
        let deliver_get = c.delivered_consume_manual_ack
            + c.delivered_consume_auto_ack
            + c.delivered_get_manual_ack
            + c.delivered_get_auto_ack;
        history.entry(v).or_default().push(
            now,
            [
                ready + unacked,
                ready,
                unacked,
                c.received,
                deliver_get,
                c.acknowledged,
                c.confirmed,
            ],
        );
    }
    drop(history);
    let mut rates = api.vhost_rates.lock();
    rates.retain(|v, _| per_vhost.contains_key(v));
    for (v, c) in per_vhost {
        rates.entry(v).or_default().sample(now, c.values());
    }
}

/// Starts the rate sampler (once, however many API listeners run).
pub fn start_sampler(api: &Arc<Api>, stop: watch::Receiver<bool>) {
    tokio::spawn(sample(Arc::clone(api), stop));
}

/// Serves Prometheus metrics on `listener` until `stop` says so.
pub async fn serve_metrics<L>(listener: L, api: Arc<Api>, stop: watch::Receiver<bool>)
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let limits = api.broker.config.management.clone();
    let app = prometheus::router(api);
    conns::serve(listener, app, limits, stop, "prometheus").await;
}

/// Who a connection a cluster member carried here is from: the client's
/// address, and the member it connected to.
#[derive(Debug, Clone, Copy)]
pub struct Carried {
    pub client: SocketAddr,
    pub via: u64,
}

/// The member a request came through (node-local questions, such as
/// node-is-quorum-critical, are about that member).
#[derive(Debug, Clone, Copy)]
pub struct Via(pub u64);

/// Serves the API to the connections members carry here (`listener`)
/// until `stop` says so: as the API's own, with the client's address.
pub async fn serve_carried<L>(listener: L, api: Arc<Api>, stop: watch::Receiver<bool>)
where
    L: axum::serve::Listener<Addr = Carried>,
{
    let limits = api.broker.config.management.clone();
    let app = routes::router(api);
    conns::serve(listener, app, limits, stop, "carried management").await;
}

/// The API's routes, as a listener serves them: the fuzz target's way in
/// (src/fuzz/), which tags each request with its peer as conns.rs does.
pub fn routes(api: Arc<Api>) -> axum::Router {
    routes::router(api)
}

/// Serves the API on `listener` (plain or TLS) until `stop` says so.
pub async fn serve<L>(listener: L, api: Arc<Api>, stop: watch::Receiver<bool>)
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let limits = api.broker.config.management.clone();
    let app = routes::router(api);
    conns::serve(listener, app, limits, stop, "management").await;
}
