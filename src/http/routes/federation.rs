//! /api/federation-links: the links the broker's federation runs
//! (crate::federation), all or per vhost, those down, and a link's
//! restart, as RabbitMQ's rabbitmq_federation_management serves them.
//! Upstreams and upstream sets are runtime parameters (tenancy.rs).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::Value;

use super::no_content;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult};
use crate::http::list::{respond, ListQuery};
use crate::http::Api;

fn listed(
    api: &Api,
    caller: &Caller,
    vhost: Option<&str>,
    only_down: bool,
    q: &ListQuery,
) -> ApiResult<Json<Value>> {
    caller.monitor()?;
    if let Some(v) = vhost {
        api.broker.vhost(v).ok_or_else(ApiError::not_found)?;
        caller.vhost(api, v, true)?;
    }
    let mut all = api.broker.federation.list(vhost);
    all.retain(|l| caller.sees(api, l["vhost"].as_str().unwrap_or_default()));
    if only_down {
        all.retain(|l| !matches!(l["status"].as_str(), Some("running" | "starting")));
    }
    // An exchange link's object is its exchange, a queue link's its queue.
    let object = |l: &Value| {
        l["exchange"]
            .as_str()
            .or(l["queue"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let text = |l: &Value, k: &str| l[k].as_str().unwrap_or_default().to_string();
    all.sort_by_key(|l| (text(l, "vhost"), object(l), text(l, "upstream")));
    respond(
        all,
        q,
        |l| {
            (
                l["vhost"].as_str().unwrap_or_default(),
                l["exchange"]
                    .as_str()
                    .or(l["queue"].as_str())
                    .unwrap_or_default(),
            )
        },
        Value::clone,
    )
    .map(Json)
}

pub async fn list(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    listed(&api, &caller, None, false, &q)
}

pub async fn list_vhost(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    listed(&api, &caller, Some(&vhost), false, &q)
}

pub async fn down(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    listed(&api, &caller, None, true, &q)
}

pub async fn down_vhost(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    listed(&api, &caller, Some(&vhost), true, &q)
}

/// Restarts a link (its upstream queue and exchange made again): 204, or
/// 404 if no link of that id runs on that node in that vhost. It takes a
/// policymaker of the vhost (RabbitMQ 3.10 lets a monitoring user; its
/// later releases do not).
pub async fn restart(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, id, node)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    caller.policymaker(&api, &vhost)?;
    match api.broker.federation.restart(&vhost, &id, &node) {
        true => Ok(no_content()),
        false => Err(ApiError::not_found()),
    }
}
