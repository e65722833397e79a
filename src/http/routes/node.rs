//! The node and its health: RabbitMQ's /api/overview, /api/nodes,
//! /api/health/checks/*, /api/aliveness-test and the small endpoints tools
//! probe (extensions, feature-flags, auth). Warren is one node; its name
//! is rabbit@<hostname>, as a RabbitMQ node's.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use crate::access::Access;
use crate::definitions::RABBITMQ_VERSION;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult};
use crate::http::render::{self, counter, ChannelTotals, Totals};
use crate::http::Api;

fn totals(api: &Api, caller: &Caller) -> (Totals, usize, usize, usize) {
    let mut t = Totals::default();
    let (mut queues, mut exchanges, mut consumers) = (0, 0, 0);
    for vh in api.broker.vhosts() {
        if !caller.sees(api, &vh.name) {
            continue;
        }
        exchanges += vh.exchanges().len();
        for q in vh.queues() {
            let d = q.depth();
            consumers += d.consumers as usize;
            queues += 1;
            t.add(&d);
        }
    }
    (t, queues, exchanges, consumers)
}

fn listeners(api: &Api) -> Vec<Value> {
    api.listeners
        .iter()
        .map(|(protocol, addr)| {
            json!({
                "node": api.node,
                "protocol": protocol,
                "ip_address": addr.ip().to_string(),
                "port": addr.port(),
                "socket_opts": [],
            })
        })
        .collect()
}

fn exchange_types(api: &Api) -> Vec<Value> {
    let mut names = vec!["direct", "fanout", "headers", "topic"];
    names.extend(api.broker.plugins().names());
    names
        .into_iter()
        .map(|n| match n {
            // RabbitMQ marks it so, and its UI leaves it out of the form.
            "x-federation-upstream" => json!({
                "name": n,
                "description": "Federation upstream helper exchange",
                "internal_purpose": "federation",
                "enabled": true,
            }),
            _ => json!({"name": n, "description": "", "enabled": true}),
        })
        .collect()
}

pub async fn overview(
    State(api): State<Arc<Api>>,
    caller: Caller,
    axum::extract::Query(sq): axum::extract::Query<crate::http::samples::SampleQuery>,
) -> Json<Value> {
    let (t, queues, exchanges, consumers) = totals(&api, &caller);
    let per_vhost = api.broker.connections.by_vhost();
    let seen: Vec<String> = api
        .broker
        .vhosts()
        .into_iter()
        .filter(|v| caller.sees(&api, &v.name))
        .map(|v| v.name.clone())
        .collect();
    let message_stats = ChannelTotals::of_vhosts(&api, &per_vhost, seen.iter().map(String::as_str));
    let conns = api.broker.connections.list();
    let channels: usize = conns.iter().map(|c| c.channels.lock().len()).sum();
    let mut queue_totals = Map::new();
    t.depth(&mut queue_totals);
    depth_rates(&api, &seen, &mut queue_totals);
    let mut message_stats = message_stats.json();
    if sq.wanted() {
        let history = vhosts_history(&api, &seen, &sq);
        if let Value::Object(stats) = &mut message_stats {
            crate::http::samples::add(
                &sq,
                &history,
                &crate::http::OVERVIEW_HISTORY,
                3,
                &mut queue_totals,
                stats,
            );
        }
    }
    // Node-wide, as RabbitMQ's (whoever asks).
    let mut churn_rates = Map::new();
    let (counts, rates) = api.churn();
    for (i, name) in crate::http::CHURN.iter().enumerate() {
        counter(&mut churn_rates, name, counts[i], rates[i]);
    }
    Json(json!({
        "management_version": RABBITMQ_VERSION,
        "rates_mode": "basic",
        "sample_retention_policies": {"global": [600, 3600, 28800, 86400], "basic": [600, 3600], "detailed": [600]},
        "exchange_types": exchange_types(&api),
        "product_version": env!("CARGO_PKG_VERSION"),
        "product_name": "Warren",
        "rabbitmq_version": RABBITMQ_VERSION,
        "cluster_name": render::cluster_name(&api),
        "erlang_version": "none (Warren is written in Rust)",
        "erlang_full_version": "none (Warren is written in Rust)",
        "release_series_support_status": "supported",
        "disable_stats": false,
        "enable_queue_totals": true,
        "message_stats": message_stats,
        "churn_rates": churn_rates,
        "queue_totals": queue_totals,
        "object_totals": {
            "channels": channels,
            "connections": conns.len(),
            "consumers": consumers,
            "exchanges": exchanges,
            "queues": queues,
        },
        "statistics_db_event_queue": 0,
        "node": api.node,
        "listeners": listeners(&api),
        "contexts": [],
    }))
}

/// The depths' rates in `queue_totals`: the change between the sampler's
/// last two samples, summed over the vhosts `seen`.
fn depth_rates(api: &Api, seen: &[String], queue_totals: &mut Map<String, Value>) {
    let history = api.vhost_history.lock();
    for (i, name) in crate::http::OVERVIEW_HISTORY[..3].iter().enumerate() {
        let rate: f64 = seen
            .iter()
            .filter_map(|v| history.get(v))
            .map(|h| h.rate(i))
            .sum();
        queue_totals.insert(format!("{name}_details"), json!({ "rate": rate }));
    }
}

/// The history of the vhosts `seen`, summed sample by sample (the sampler
/// records every vhost at the same moment), newest first.
fn vhosts_history(
    api: &Api,
    seen: &[String],
    sq: &crate::http::samples::SampleQuery,
) -> Vec<crate::history::Sample<7>> {
    let (age, incr) = sq.window();
    let now = crate::util::now_ms();
    let mut sum: std::collections::BTreeMap<u64, [u64; 7]> = Default::default();
    let history = api.vhost_history.lock();
    for name in seen {
        let Some(h) = history.get(name) else { continue };
        for (at, values) in h.select(now, age, incr) {
            let slot = sum.entry(at).or_default();
            for (s, v) in slot.iter_mut().zip(values) {
                *s += v;
            }
        }
    }
    sum.into_iter().rev().collect()
}

fn node_json(api: &Api) -> Value {
    let uptime = api.started.elapsed().as_millis().min(u32::MAX as u128) as u64;
    let mem_used = crate::alarm::resident_bytes().unwrap_or(0);
    let mem_limit = api.broker.memory.limit().min(i64::MAX as u64);
    let mut o = json!({
        "name": api.node,
        "type": "disc",
        "running": true,
        "being_drained": false,
        "os_pid": std::process::id().to_string(),
        "uptime": uptime,
        "run_queue": 0,
        "processors": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "mem_used": mem_used,
        "mem_limit": mem_limit,
        "mem_alarm": api.broker.memory.is_raised(),
        "mem_calculation_strategy": "rss",
        "disk_free": api.broker.disk.free_now(),
        "disk_free_limit": api.broker.disk.limit(),
        "disk_free_alarm": api.broker.disk.is_raised(),
        "fd_used": open_fds(),
        "fd_total": fd_limit(),
        "sockets_used": api.broker.connections.count(),
        "sockets_total": fd_limit(),
        "proc_used": 0,
        "proc_total": 1_048_576,
        "rates_mode": "basic",
        "rabbitmq_version": RABBITMQ_VERSION,
        "enabled_plugins": ["rabbitmq_management", "rabbitmq_prometheus"],
        "applications": [
            {"name": "rabbit", "description": "Warren", "version": RABBITMQ_VERSION},
            {"name": "warren", "description": "Warren", "version": env!("CARGO_PKG_VERSION")},
        ],
        "exchange_types": exchange_types(api),
        "auth_mechanisms": [
            {"name": "PLAIN", "description": "SASL PLAIN authentication mechanism", "enabled": true},
            {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism", "enabled": true},
        ],
        "partitions": [],
        "cluster_links": [],
        "contexts": [],
        "config_files": [],
        "log_files": [],
        "db_dir": api.broker.config.data_dir.display().to_string(),
        "net_ticktime": 60,
    });
    if let Value::Object(m) = &mut o {
        for k in [
            "mem_used",
            "fd_used",
            "sockets_used",
            "proc_used",
            "disk_free",
        ] {
            let v = m.get(k).and_then(Value::as_u64).unwrap_or(0);
            counter(m, k, v, 0.0);
        }
    }
    o
}

/// Open file descriptors (Linux: /proc/self/fd).
pub fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// The file descriptor limit.
pub fn fd_limit() -> u64 {
    // SAFETY: getrlimit fills the struct it is given.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        r.rlim_cur as u64
    }
}

pub async fn nodes(State(api): State<Arc<Api>>, caller: Caller) -> ApiResult<Json<Value>> {
    caller.monitor()?;
    if let Some(c) = &api.broker.cluster {
        return Ok(Json(super::cluster::nodes(c, node_json(&api)).await));
    }
    Ok(Json(json!([node_json(&api)])))
}

pub async fn node(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.monitor()?;
    if name != api.node {
        return Err(ApiError::not_found());
    }
    Ok(Json(node_json(&api)))
}

pub async fn node_memory(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.monitor()?;
    if name != api.node {
        return Err(ApiError::not_found());
    }
    Ok(Json(json!({"memory": "not_available"})))
}

fn failed(body: Value) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// /health/checks/alarms: every node's alarms (a cluster's members' as
/// they last reported them to this leader).
pub async fn alarms(State(api): State<Arc<Api>>, _caller: Caller) -> Response {
    let mut alarms = own_alarms(&api);
    if let Some(c) = &api.broker.cluster {
        let names: std::collections::HashMap<u64, String> = c
            .local_status()
            .members
            .iter()
            .map(|m| (m.id, super::cluster::member_name(m.id, &m.raft)))
            .collect();
        for (id, r) in api.broker.alarms.members_raised() {
            let node = names
                .get(&id)
                .cloned()
                .unwrap_or_else(|| format!("warren-{id}"));
            alarms.push(json!({"node": node, "resource": r.name()}));
        }
    }
    alarms_answer(alarms, "There are alarms in effect in the cluster")
}

/// /health/checks/local-alarms: this node's alone.
pub async fn local_alarms(State(api): State<Arc<Api>>, _caller: Caller) -> Response {
    alarms_answer(own_alarms(&api), "There are alarms in effect on the node")
}

/// GET /healthchecks/node: RabbitMQ 3.x's node health check, still used
/// by clients and monitors (newer checks are under /health/checks). As
/// RabbitMQ's, it answers 200 either way: {"status":"ok"}, or
/// {"status":"failed","reason":..} while the node has an alarm raised.
pub async fn healthcheck(State(api): State<Arc<Api>>, _caller: Caller) -> Response {
    let raised: Vec<_> = api.broker.alarms.raised();
    Json(node_health(&api.node, &raised)).into_response()
}

/// GET /healthchecks/node/{node}: the same for a named node (a cluster's
/// member, as it last reported to this leader); 404 for a node the
/// cluster does not have.
pub async fn healthcheck_of(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Response {
    if name == api.node {
        return healthcheck(State(api), caller).await;
    }
    let Some(c) = &api.broker.cluster else {
        return ApiError::not_found().into_response();
    };
    let member = c
        .local_status()
        .members
        .into_iter()
        .find(|m| super::cluster::member_name(m.id, &m.raft) == name);
    let Some(m) = member else {
        return ApiError::not_found().into_response();
    };
    let body = match c.member_report(m.id) {
        Some(r) => node_health(&name, &crate::alarm::resources(r.raised)),
        None => json!({"status": "failed", "reason": format!("node {name} does not answer")}),
    };
    Json(body).into_response()
}

/// RabbitMQ's answer for `node` with `raised` alarms.
fn node_health(node: &str, raised: &[crate::alarm::Resource]) -> Value {
    if raised.is_empty() {
        return json!({"status": "ok"});
    }
    let alarms: Vec<String> = raised
        .iter()
        .map(|r| format!("{{resource_limit,{},'{node}'}}", r.name()))
        .collect();
    json!({
        "status": "failed",
        "reason": format!("resource alarm(s) in effect:[{}]", alarms.join(",")),
    })
}

fn own_alarms(api: &Api) -> Vec<Value> {
    api.broker
        .alarms
        .raised()
        .iter()
        .map(|r| json!({"node": api.node, "resource": r.name()}))
        .collect()
}

fn alarms_answer(alarms: Vec<Value>, reason: &str) -> Response {
    if alarms.is_empty() {
        return Json(json!({"status": "ok"})).into_response();
    }
    failed(json!({"status": "failed", "reason": reason, "alarms": alarms}))
}

pub async fn port_listener(
    State(api): State<Arc<Api>>,
    _caller: Caller,
    Path(port): Path<String>,
) -> Response {
    let Ok(port) = port.parse::<u16>() else {
        return ApiError::bad_request(format!("invalid port '{port}'")).into_response();
    };
    if api.listeners.iter().any(|(_, a)| a.port() == port) {
        return Json(json!({"status": "ok", "port": port})).into_response();
    }
    let ports: Vec<u16> = api.listeners.iter().map(|(_, a)| a.port()).collect();
    failed(
        json!({"status": "failed", "reason": "No active listener", "missing": port, "ports": ports}),
    )
}

pub async fn protocol_listener(
    State(api): State<Arc<Api>>,
    _caller: Caller,
    Path(protocol): Path<String>,
) -> Response {
    let wanted = match protocol.as_str() {
        "amqp091" | "amqp0-9-1" => "amqp",
        p => p,
    };
    if api.listeners.iter().any(|(p, _)| *p == wanted) {
        return Json(json!({"status": "ok", "protocol": wanted})).into_response();
    }
    let protocols: Vec<&str> = api.listeners.iter().map(|(p, _)| *p).collect();
    failed(
        json!({"status": "failed", "reason": "No active listener", "missing": wanted, "protocols": protocols}),
    )
}

pub async fn virtual_hosts(_caller: Caller) -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn single_node(_caller: Caller) -> Json<Value> {
    Json(json!({"status": "ok", "reason": "single node cluster"}))
}

pub async fn ok(_caller: Caller) -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Declares aliveness-test in the vhost, publishes to it and gets the
/// message back, as RabbitMQ's aliveness test does.
pub async fn aliveness(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(vhost): Path<String>,
) -> ApiResult<Json<Value>> {
    let vh = super::vhost_for(&api, &caller, &vhost, false)?;
    // What the same declare, publish and get need over AMQP.
    caller.resource(&api, &vhost, Access::Configure, "aliveness-test")?;
    caller.resource(&api, &vhost, Access::Write, "amq.default")?;
    caller.resource(&api, &vhost, Access::Read, "aliveness-test")?;
    let spec = crate::vhost::QueueSpec {
        name: "aliveness-test".into(),
        durable: false,
        exclusive: false,
        auto_delete: false,
        arguments: Default::default(),
        server_named: false,
    };
    let q = vh.declare_queue(&spec, false, 0)?;
    let msg = Arc::new(crate::message::Message::new(
        b"",
        b"aliveness-test",
        &[0, 0],
        b"test_message",
        Default::default(),
    ));
    q.push(&msg)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    q.purge()?;
    Ok(Json(json!({"status": "ok"})))
}

pub async fn extensions(_caller: Caller) -> Json<Value> {
    Json(json!([]))
}

pub async fn empty_list(_caller: Caller) -> Json<Value> {
    Json(json!([]))
}

pub async fn auth() -> Json<Value> {
    Json(
        json!({"enable_uaa": false, "uaa_client_id": "", "uaa_location": "", "oauth_enabled": false}),
    )
}

/// Rebalancing queue leaders: one node leads them all, so there is
/// nothing to move (RabbitMQ answers 204 too).
pub async fn rebalance(caller: Caller) -> ApiResult<StatusCode> {
    caller.admin()?;
    Ok(StatusCode::NO_CONTENT)
}

/// POST /api/tls/reload (administrators): reads every TLS listener's
/// certificate, key and CA files again, as SIGHUP does. 204; 400 with the
/// reason if a file does not load (the old ones stay in force); 404
/// without TLS.
pub async fn reload_tls(State(api): State<Arc<Api>>, caller: Caller) -> ApiResult<StatusCode> {
    caller.admin()?;
    if api.tls.is_empty() {
        return Err(ApiError::not_found());
    }
    crate::tls::reload_all(&api.tls).map_err(ApiError::bad_request)?;
    tracing::info!(user = %caller.user.name, "TLS certificate files reloaded over the API");
    Ok(StatusCode::NO_CONTENT)
}
