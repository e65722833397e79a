//! /api/shovels: the status of the shovels the broker runs (crate::shovel),
//! their definitions and their restart, as RabbitMQ's
//! rabbitmq_shovel_management serves them, and their pause and resume, as
//! LavinMQ's API has them. A shovel is made and deleted as a `shovel`
//! runtime parameter (tenancy.rs), or here.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::{no_content, off_runtime};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult};
use crate::http::list::{respond, ListQuery};
use crate::http::Api;
use crate::shovel;

fn listed(
    api: &Api,
    caller: &Caller,
    vhost: Option<&str>,
    q: &ListQuery,
) -> ApiResult<Json<Value>> {
    caller.monitor()?;
    let mut all = api.broker.shovels.list(vhost);
    // A static shovel has no vhost: only administrators see it, as in
    // RabbitMQ.
    all.retain(|s| match s["vhost"].as_str() {
        Some(v) => caller.sees(api, v),
        None => caller.is_admin(),
    });
    let key = |s: &Value| {
        (
            s["vhost"].as_str().unwrap_or_default().to_string(),
            s["name"].as_str().unwrap_or_default().to_string(),
        )
    };
    all.sort_by_key(key);
    respond(
        all,
        q,
        |s| {
            (
                s["vhost"].as_str().unwrap_or_default(),
                s["name"].as_str().unwrap_or_default(),
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
    listed(&api, &caller, None, &q)
}

pub async fn list_vhost(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    caller.vhost(&api, &vhost, true)?;
    listed(&api, &caller, Some(&vhost), &q)
}

/// The shovel's definition, credentials taken out of its URIs (RabbitMQ
/// 3.13.7 shows them; only its later releases redact them).
pub async fn show(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    caller.monitor()?;
    caller.vhost(&api, &vhost, true)?;
    let p = api
        .broker
        .store
        .parameters()?
        .into_iter()
        .find(|p| p.component == shovel::COMPONENT && p.vhost == vhost && p.name == name)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(json!({
        "vhost": p.vhost,
        "component": p.component,
        "name": p.name,
        "value": shovel::spec::redacted(&p.value),
    })))
}

/// Stops and deletes the shovel (its parameter); 204 even if it does not
/// run now, as RabbitMQ 3.13.7 answers. Deleting takes what making one
/// takes (a policymaker of the vhost), not only a monitor's view.
pub async fn delete(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.policymaker(&api, &vhost)?;
    api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    let broker = Arc::clone(&api.broker);
    off_runtime(move || broker.delete_shovel(&vhost, &name)).await?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

/// Restarts the shovel from its definition; 404 if it does not run here.
pub async fn restart(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.policymaker(&api, &vhost)?;
    match api.broker.shovels.restart(&vhost, &name) {
        true => Ok(no_content()),
        false => Err(ApiError::not_found()),
    }
}

/// Pauses the shovel: it stops moving messages and closes its
/// connections until resumed (LavinMQ's pause). 404 if it does not run
/// here, 422 if it is paused already.
pub async fn pause(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.policymaker(&api, &vhost)?;
    match api.broker.shovels.pause(&vhost, &name) {
        Ok(()) => Ok(no_content()),
        Err(shovel::Refused::NotFound) => Err(ApiError::not_found()),
        Err(shovel::Refused::AlreadySo) => Err(ApiError::unprocessable(format!(
            "shovel '{name}' is paused already"
        ))),
    }
}

/// Runs a paused shovel again. 404 if it does not run here, 422 if it is
/// not paused.
pub async fn resume(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.policymaker(&api, &vhost)?;
    match api.broker.shovels.resume(&vhost, &name) {
        Ok(()) => Ok(no_content()),
        Err(shovel::Refused::NotFound) => Err(ApiError::not_found()),
        Err(shovel::Refused::AlreadySo) => Err(ApiError::unprocessable(format!(
            "shovel '{name}' is not paused"
        ))),
    }
}
