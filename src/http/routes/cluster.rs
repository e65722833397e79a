//! The cluster (mirroring): /api/nodes lists every member with its Raft
//! role; node-is-quorum-critical answers 503 when stopping this node would
//! leave the voters that answer short of a majority; Warren's own
//! /api/cluster shows this node's Raft state and changes the membership
//! (PUT /api/cluster/members/{id} with {"raft": "host:port"} adds a node,
//! DELETE removes one; administrators only). These are served by the
//! leader, which serves the whole management API (followers carry their
//! API clients to it); a node-local question asked through a follower is
//! answered about that follower, from the leader's view.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};

use crate::cluster::{Cluster, Status};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult};
use crate::http::{Api, Via};

/// A member's node name: warren-<id>@<its Raft host>.
pub fn member_name(id: u64, raft: &str) -> String {
    let host = raft.rsplit_once(':').map_or(raft, |(h, _)| h);
    format!("warren-{id}@{host}")
}

/// /api/nodes on a cluster: this node in full (`own`), the others with
/// what this node knows of them (their resources as they last reported
/// them to this leader).
pub async fn nodes(c: &Cluster, own: Value) -> Value {
    let s = c.status().await;
    let list: Vec<Value> = s
        .members
        .iter()
        .map(|m| {
            let mut o = if m.id == c.id {
                own.clone()
            } else {
                // What the member last reported (cluster/resources.rs).
                let r = c.member_report(m.id).unwrap_or_default();
                let alarm = |res: crate::alarm::Resource| r.raised & res as u8 != 0;
                json!({
                    "type": "disc",
                    "uptime": 0,
                    "mem_used": r.mem_used,
                    "mem_limit": r.mem_limit.min(i64::MAX as u64),
                    "mem_alarm": alarm(crate::alarm::Resource::Memory),
                    "disk_free": r.disk_free,
                    "disk_free_limit": r.disk_free_limit,
                    "disk_free_alarm": alarm(crate::alarm::Resource::Disk),
                })
            };
            if let Some(map) = o.as_object_mut() {
                map.insert("name".into(), member_name(m.id, &m.raft).into());
                map.insert("running".into(), m.reachable.into());
                map.insert(
                    "raft".into(),
                    json!({
                        "id": m.id,
                        "address": m.raft,
                        "role": if m.leader { "leader" } else if m.voter { "follower" } else { "learner" },
                        "voter": m.voter,
                        "matched_index": m.matched,
                    }),
                );
            }
            o
        })
        .collect();
    Value::Array(list)
}

fn status_json(s: &Status) -> Value {
    let (up, majority) = s.quorum();
    json!({
        "node_id": s.id,
        "state": s.state,
        "term": s.term,
        "leader": s.leader,
        "last_log_index": s.last_log,
        "commit_index": s.committed,
        "last_applied": s.applied,
        "snapshot_index": s.snapshot,
        "purged_index": s.purged,
        "log_entries": s.log_entries(),
        "leader_changes": s.leader_changes,
        "voters_reachable": up,
        "majority": majority,
        "members": s.members.iter().map(|m| json!({
            "id": m.id,
            "name": member_name(m.id, &m.raft),
            "raft": m.raft,
            "leader": m.leader,
            "voter": m.voter,
            "reachable": m.reachable,
            "matched_index": m.matched,
        })).collect::<Vec<_>>(),
    })
}

fn cluster_of(api: &Api) -> ApiResult<&Arc<Cluster>> {
    api.broker
        .cluster
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("this node is not a cluster member (no --node-id)"))
}

/// GET /api/cluster.
pub async fn show(State(api): State<Arc<Api>>, caller: Caller) -> ApiResult<Json<Value>> {
    caller.monitor()?;
    let c = cluster_of(&api)?;
    let mut out = status_json(&c.status().await);
    if let Some(o) = out.as_object_mut() {
        o.insert(
            "cluster_version".into(),
            api.broker.store.cluster_version()?.into(),
        );
        o.insert("applies_up_to".into(), crate::store::op::LEVEL.into());
    }
    Ok(Json(out))
}

/// PUT /api/cluster/members/{id} {"raft": "host:port"}: answers once the
/// node caught up and votes (201), or at once if it already did (204).
pub async fn add_member(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(id): Path<u64>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    caller.admin()?;
    let c = cluster_of(&api)?;
    let raft = body
        .get("raft")
        .and_then(Value::as_str)
        .filter(|a| {
            a.rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        })
        .ok_or_else(|| ApiError::bad_request("body must be {\"raft\": \"host:port\"}"))?;
    if id == 0 {
        return Err(ApiError::bad_request("node ids start at 1"));
    }
    let version = api.broker.store.cluster_version()?;
    let added = c
        .add_member(id, raft.to_string(), version)
        .await
        .map_err(ApiError::bad_request)?;
    // Already a voter there: as a PUT that changed nothing.
    let status = if added {
        StatusCode::CREATED
    } else {
        StatusCode::NO_CONTENT
    };
    Ok(status.into_response())
}

/// DELETE /api/cluster/members/{id}.
pub async fn remove_member(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(id): Path<u64>,
) -> ApiResult<Response> {
    caller.admin()?;
    let c = cluster_of(&api)?;
    c.remove_member(id).await.map_err(ApiError::bad_request)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// GET /api/health/checks/node-is-quorum-critical, about the node asked:
/// this one, or the follower that carried the request here.
pub async fn quorum_critical(
    State(api): State<Arc<Api>>,
    via: Option<Extension<Via>>,
    _caller: Caller,
) -> Response {
    let Some(c) = api.broker.cluster.as_ref() else {
        return Json(json!({"status": "ok", "reason": "single node cluster"})).into_response();
    };
    let s = c.status().await;
    let asked = via.map_or(s.id, |Extension(Via(id))| id);
    if s.quorum_critical_for(asked) {
        let (up, majority) = s.quorum();
        let body = json!({
            "status": "failed",
            "reason": "There are quorum queues that would lose their quorum if the target node is shut down",
            "voters_reachable": up,
            "majority": majority,
        });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    Json(json!({"status": "ok"})).into_response()
}
