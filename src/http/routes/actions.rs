//! POST /api/queues/{vhost}/{name}/actions: RabbitMQ's `sync` and
//! `cancel_sync` (classic mirroring's; nothing to do here), and Warren's
//! `move`: `{"action": "move", "destination": "q2", "count": 100}` moves
//! up to `count` ready messages (all those ready now without it), head
//! first, to another queue of the vhost, each exactly once even across a
//! crash (see queue/transfer.rs); answers `{"moved": n}` once they are
//! durable.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{no_content, off_runtime};
use crate::access::Access;
use crate::http::auth::Caller;
use crate::http::body::Body;
use crate::http::error::{ApiError, ApiResult};
use crate::http::Api;

fn no_queue(name: &str, vhost: &str) -> ApiError {
    ApiError::from(crate::vhost::Error::not_found(format!(
        "NOT_FOUND - no queue '{name}' in vhost '{vhost}'"
    )))
}

pub async fn queue_action(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
    body: Body,
) -> ApiResult<Response> {
    let vh = super::vhost_for(&api, &caller, &v, false)?;
    let q = vh.queue(&name).ok_or_else(|| no_queue(&name, &v))?;
    let b = body.object().await?;
    match b.get("action").and_then(Value::as_str) {
        Some("sync" | "cancel_sync") => Ok(no_content().into_response()),
        Some("move") => {
            let dest = b
                .get("destination")
                .and_then(Value::as_str)
                .filter(|d| !d.is_empty())
                .ok_or_else(|| ApiError::bad_request("a move needs a destination queue"))?;
            // Taking from the source is reading it; putting into the
            // destination is writing it.
            caller.resource(&api, &v, Access::Read, &name)?;
            caller.resource(&api, &v, Access::Write, dest)?;
            let to = vh.queue(dest).ok_or_else(|| no_queue(dest, &v))?;
            vh.check_exclusive(&q, super::entities::NO_CONNECTION)?;
            vh.check_exclusive(&to, super::entities::NO_CONNECTION)?;
            if Arc::ptr_eq(&q, &to) {
                return Err(ApiError::bad_request("the destination is the queue itself"));
            }
            if q.stream().is_some() || to.stream().is_some() {
                return Err(ApiError::bad_request(
                    "a stream's messages are read by offset, not moved: move to or from a queue",
                ));
            }
            // "All" is what is ready now: publishers keep no move going.
            let ready = q.message_count() as usize;
            let max = match b.get("count") {
                None | Some(Value::Null) => ready,
                Some(c) => c
                    .as_u64()
                    .ok_or_else(|| ApiError::bad_request("count must be a whole number"))?
                    .min(ready as u64) as usize,
            };
            let moved = off_runtime(move || q.move_to(&to, max)).await?;
            api.broker.store.sync().await?;
            Ok(Json(json!({ "moved": moved })).into_response())
        }
        Some(other) => Err(ApiError::bad_request(format!(
            "unknown action '{other}': sync, cancel_sync or move"
        ))),
        None => Err(ApiError::bad_request("an action is required")),
    }
}
