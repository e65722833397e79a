//! RabbitMQ's stream management endpoints: /api/stream/connections (a
//! DELETE closes one), and the publishers and consumers of those
//! connections, as the stream management plugin serves them. A
//! management user sees its own connections; monitors and
//! administrators see all. Stream connections are listed with every
//! other under /api/connections too, with protocol "stream".

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Map, Value};

use super::conns::{close_tracked, mine, reason};
use crate::broker::connections::{Protocol, Tracked};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult};
use crate::http::list::{respond, ListQuery};
use crate::http::{render, Api};

/// The caller's stream connections, in `vhost` if given.
fn connections(api: &Api, caller: &Caller, vhost: Option<&str>) -> Vec<Arc<Tracked>> {
    api.broker
        .connections
        .list()
        .into_iter()
        .filter(|t| t.info.protocol == Protocol::Stream)
        .filter(|t| mine(caller, t) && vhost.is_none_or(|v| v == t.info.vhost))
        .collect()
}

fn list(api: &Api, q: &ListQuery, all: Vec<Arc<Tracked>>) -> ApiResult<Json<Value>> {
    respond(
        all,
        q,
        |t| (&t.info.vhost, &t.info.name),
        |t| render::connection(api, t),
    )
    .map(Json)
}

pub async fn list_connections(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    list(&api, &q, connections(&api, &caller, None))
}

pub async fn vhost_connections(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(v): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    super::vhost_for(&api, &caller, &v, true)?;
    list(&api, &q, connections(&api, &caller, Some(&v)))
}

fn find(api: &Api, caller: &Caller, vhost: &str, name: &str) -> ApiResult<Arc<Tracked>> {
    connections(api, caller, Some(vhost))
        .into_iter()
        .find(|t| t.info.name == name)
        .ok_or_else(ApiError::not_found)
}

pub async fn get_connection(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let t = find(&api, &caller, &v, &name)?;
    Ok(Json(render::connection(&api, &t)))
}

pub async fn close_connection(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let t = find(&api, &caller, &v, &name)?;
    close_tracked(&caller, &t, &reason(&headers))
}

/// Who a publisher or consumer belongs to, as RabbitMQ shows it.
fn details(api: &Api, t: &Tracked) -> Value {
    json!({
        "name": t.info.name,
        "node": api.node,
        "user": t.info.user,
        "peer_host": t.info.peer.ip().to_string(),
        "peer_port": t.info.peer.port(),
    })
}

fn publishers_of(api: &Api, t: &Tracked, stream: Option<&str>) -> Vec<Value> {
    let Some(view) = &t.stream else {
        return Vec::new();
    };
    view.publishers()
        .into_iter()
        .filter(|p| stream.is_none_or(|s| s == p.stream))
        .map(|p| {
            json!({
                "connection_details": details(api, t),
                "queue": {"name": p.stream, "vhost": t.info.vhost},
                "reference": p.reference,
                "publisher_id": p.id,
                "published": p.published,
                "confirmed": p.confirmed,
                "errored": p.errored,
            })
        })
        .collect()
}

fn consumers_of(api: &Api, t: &Tracked) -> Vec<Value> {
    let Some(view) = &t.stream else {
        return Vec::new();
    };
    view.consumers()
        .into_iter()
        .map(|c| {
            let properties: Map<String, Value> = c
                .properties
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect();
            let status = if c.active { "up" } else { "waiting" };
            json!({
                "connection_details": details(api, t),
                "queue": {"name": c.stream, "vhost": t.info.vhost},
                "subscription_id": c.id,
                "credits": c.credits,
                "consumed": c.consumed,
                "offset": c.offset,
                "offset_lag": c.offset_lag,
                "properties": properties,
                "active": c.active,
                "activity_status": status,
            })
        })
        .collect()
}

pub async fn connection_publishers(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let t = find(&api, &caller, &v, &name)?;
    Ok(Json(Value::Array(publishers_of(&api, &t, None))))
}

pub async fn connection_consumers(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let t = find(&api, &caller, &v, &name)?;
    Ok(Json(Value::Array(consumers_of(&api, &t))))
}

pub async fn list_publishers(
    State(api): State<Arc<Api>>,
    caller: Caller,
) -> ApiResult<Json<Value>> {
    let all = connections(&api, &caller, None);
    let list = all.iter().flat_map(|t| publishers_of(&api, t, None));
    Ok(Json(Value::Array(list.collect())))
}

pub async fn vhost_publishers(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(v): Path<String>,
) -> ApiResult<Json<Value>> {
    super::vhost_for(&api, &caller, &v, true)?;
    let all = connections(&api, &caller, Some(&v));
    let list = all.iter().flat_map(|t| publishers_of(&api, t, None));
    Ok(Json(Value::Array(list.collect())))
}

pub async fn stream_publishers(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, stream)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let vh = super::vhost_for(&api, &caller, &v, true)?;
    if vh.queue(&stream).is_none_or(|q| q.stream().is_none()) {
        return Err(ApiError::not_found());
    }
    let all = connections(&api, &caller, Some(&v));
    let list = all
        .iter()
        .flat_map(|t| publishers_of(&api, t, Some(&stream)));
    Ok(Json(Value::Array(list.collect())))
}

pub async fn list_consumers(State(api): State<Arc<Api>>, caller: Caller) -> ApiResult<Json<Value>> {
    let all = connections(&api, &caller, None);
    let list = all.iter().flat_map(|t| consumers_of(&api, t));
    Ok(Json(Value::Array(list.collect())))
}

pub async fn vhost_consumers(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(v): Path<String>,
) -> ApiResult<Json<Value>> {
    super::vhost_for(&api, &caller, &v, true)?;
    let all = connections(&api, &caller, Some(&v));
    let list = all.iter().flat_map(|t| consumers_of(&api, t));
    Ok(Json(Value::Array(list.collect())))
}
