//! Connections, channels and consumers: RabbitMQ's /api/connections (a
//! DELETE closes with 320 and the X-Reason header's text),
//! /api/channels and /api/consumers. A management user sees its own
//! connections; monitors and administrators see all.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value};

use super::no_content;
use crate::broker::connections::{ChannelSnapshot, Tracked};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult};
use crate::http::list::{respond, ListQuery};
use crate::http::{render, Api};

pub(super) fn mine(caller: &Caller, t: &Tracked) -> bool {
    caller.is_monitor() || t.info.user == caller.user.name
}

fn connections(api: &Api, caller: &Caller, vhost: Option<&str>) -> Vec<Arc<Tracked>> {
    api.broker
        .connections
        .list()
        .into_iter()
        .filter(|t| mine(caller, t) && vhost.is_none_or(|v| v == t.info.vhost))
        .collect()
}

pub async fn list_connections(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let all = connections(&api, &caller, None);
    respond(
        all,
        &q,
        |t| (&t.info.vhost, &t.info.name),
        |t| render::connection(&api, t),
    )
    .map(Json)
}

pub async fn vhost_connections(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(v): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    super::vhost_for(&api, &caller, &v, true)?;
    let all = connections(&api, &caller, Some(&v));
    respond(
        all,
        &q,
        |t| (&t.info.vhost, &t.info.name),
        |t| render::connection(&api, t),
    )
    .map(Json)
}

fn find(api: &Api, caller: &Caller, name: &str) -> ApiResult<Arc<Tracked>> {
    api.broker
        .connections
        .by_name(name)
        .filter(|t| mine(caller, t))
        .ok_or_else(ApiError::not_found)
}

pub async fn get_connection(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let t = find(&api, &caller, &name)?;
    Ok(Json(render::connection(&api, &t)))
}

pub(super) fn reason(headers: &HeaderMap) -> String {
    headers
        .get("x-reason")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| "Closed via management plugin".into())
}

pub async fn close_connection(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let t = find(&api, &caller, &name)?;
    close_tracked(&caller, &t, &reason(&headers))
}

/// Closes `t` for `caller` (an administrator, or its own user).
pub(super) fn close_tracked(caller: &Caller, t: &Tracked, reason: &str) -> ApiResult<StatusCode> {
    if !caller.is_admin() && t.info.user != caller.user.name {
        return Err(ApiError::not_authorised("Not administrator user"));
    }
    t.control.force_close(reason);
    Ok(no_content())
}

pub async fn user_connections(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(user): Path<String>,
) -> ApiResult<Json<Value>> {
    if user != caller.user.name {
        caller.monitor()?;
    }
    let list: Vec<Value> = connections(&api, &caller, None)
        .iter()
        .filter(|t| t.info.user == user)
        .map(|t| json!({"name": t.info.name, "node": api.node, "user": t.info.user, "vhost": t.info.vhost}))
        .collect();
    Ok(Json(Value::Array(list)))
}

pub async fn close_user_connections(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(user): Path<String>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    if user != caller.user.name {
        caller.admin()?;
    }
    api.broker.connections.close_user(&user, &reason(&headers));
    Ok(no_content())
}

/// A channel, named as RabbitMQ names it, rendered only if its page
/// shows it.
struct ChannelItem {
    t: Arc<Tracked>,
    c: ChannelSnapshot,
    name: String,
}

impl ChannelItem {
    fn key(&self) -> (&str, &str) {
        (&self.t.info.vhost, &self.name)
    }

    fn render(&self, api: &Api) -> Value {
        render::channel(api, &self.t, &self.c)
    }
}

fn channels(
    api: &Api,
    caller: &Caller,
    vhost: Option<&str>,
    conn: Option<&str>,
) -> Vec<ChannelItem> {
    let mut out = Vec::new();
    for t in connections(api, caller, vhost) {
        if conn.is_some_and(|c| c != t.info.name) {
            continue;
        }
        for c in t.channel_snapshots() {
            let name = format!("{} ({})", t.info.name, c.number);
            out.push(ChannelItem {
                t: Arc::clone(&t),
                c,
                name,
            });
        }
    }
    out
}

pub async fn list_channels(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    respond(
        channels(&api, &caller, None, None),
        &q,
        ChannelItem::key,
        |i| i.render(&api),
    )
    .map(Json)
}

pub async fn vhost_channels(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(v): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    super::vhost_for(&api, &caller, &v, true)?;
    respond(
        channels(&api, &caller, Some(&v), None),
        &q,
        ChannelItem::key,
        |i| i.render(&api),
    )
    .map(Json)
}

pub async fn connection_channels(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    find(&api, &caller, &name)?;
    let list = channels(&api, &caller, None, Some(&name));
    Ok(Json(Value::Array(
        list.iter().map(|i| i.render(&api)).collect(),
    )))
}

pub async fn get_channel(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    channels(&api, &caller, None, None)
        .iter()
        .find(|i| i.name == name)
        .map(|i| Json(i.render(&api)))
        .ok_or_else(ApiError::not_found)
}

fn consumers(api: &Api, caller: &Caller, vhost: Option<&str>) -> Vec<Value> {
    let mut out = Vec::new();
    for vh in api.broker.vhosts() {
        if vhost.is_some_and(|v| v != vh.name) || !caller.sees(api, &vh.name) {
            continue;
        }
        for q in vh.queues() {
            for c in q.consumer_list() {
                let mut j = render::consumer(api, &vh, &q, &c);
                j["consumer_timeout"] = json!(if c.timeout_ms == 0 {
                    api.broker.config.consumer_timeout
                } else {
                    c.timeout_ms
                });
                out.push(j);
            }
        }
    }
    out
}

pub async fn list_consumers(State(api): State<Arc<Api>>, caller: Caller) -> ApiResult<Json<Value>> {
    Ok(Json(Value::Array(consumers(&api, &caller, None))))
}

pub async fn vhost_consumers(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(v): Path<String>,
) -> ApiResult<Json<Value>> {
    super::vhost_for(&api, &caller, &v, true)?;
    Ok(Json(Value::Array(consumers(&api, &caller, Some(&v)))))
}
