//! Users, permissions, topic permissions and user limits: RabbitMQ's
//! /api/users, /api/permissions, /api/topic-permissions, /api/user-limits
//! and /api/whoami. Users are administrators' business; tags are a list
//! on read and a list or a comma string on write; a user is made with a
//! password (hashed here, SHA-256) or a password_hash and its algorithm.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::{created_or_updated, no_content};
use crate::access::{password, Algorithm, User};
use crate::http::auth::Caller;
use crate::http::body::Body;
use crate::http::error::{ApiError, ApiResult};
use crate::http::list::{respond, ListQuery};
use crate::http::Api;

pub fn user_json(u: &User) -> Value {
    json!({
        "name": u.name,
        "password_hash": u.password_hash,
        "hashing_algorithm": u.algorithm.name(),
        "tags": u.tags,
        "limits": u.limits,
    })
}

pub async fn whoami(caller: Caller) -> Json<Value> {
    Json(json!({"name": caller.user.name, "tags": caller.user.tags}))
}

pub async fn list_users(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    let users = api.broker.users.list();
    respond(users, &q, |u| ("", &u.name), |u| user_json(u)).map(Json)
}

pub async fn users_without_permissions(
    State(api): State<Arc<Api>>,
    caller: Caller,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    let with: std::collections::HashSet<String> = api
        .broker
        .users
        .permissions()
        .into_iter()
        .map(|(_, u, _)| u)
        .collect();
    let list: Vec<Value> = api
        .broker
        .users
        .list()
        .iter()
        .filter(|u| !with.contains(&u.name))
        .map(|u| user_json(u))
        .collect();
    Ok(Json(Value::Array(list)))
}

pub async fn get_user(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    let u = api
        .broker
        .users
        .get(&name)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(user_json(&u)))
}

pub async fn put_user(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    let b = body.object().await?;
    let existed = api.broker.users.get(&name);
    // As RabbitMQ's put_user: tags are required (or the old
    // "administrator" flag), and a password or its hash, not both.
    let tags = match (b.get("tags"), b.get("administrator")) {
        (None, None) => return Err(ApiError::bad_request("tags_not_present")),
        (None, Some(admin)) => match admin {
            Value::Bool(true) => vec!["administrator".to_string()],
            Value::Bool(false) => Vec::new(),
            Value::String(s) if s == "true" => vec!["administrator".to_string()],
            Value::String(s) if s == "false" => Vec::new(),
            other => return Err(ApiError::bad_request_term(json!(["not_boolean", other]))),
        },
        (v, _) => crate::definitions::tags(v, "tags").map_err(ApiError::bad_request)?,
    };
    if b.contains_key("password") && b.contains_key("password_hash") {
        return Err(ApiError::bad_request(
            "both_password_and_password_hash_are_provided",
        ));
    }
    if let Some(Value::String(h)) = b.get("password_hash") {
        use base64::Engine;
        if base64::engine::general_purpose::STANDARD.decode(h).is_err() {
            return Err(ApiError::bad_request_term(json!(["not_base64", h])));
        }
    }
    let (hash, algorithm) = match (b.get("password"), b.get("password_hash")) {
        (Some(Value::String(p)), _) => (password::hash(Algorithm::Sha256, p), Algorithm::Sha256),
        (Some(_), _) => return Err(ApiError::bad_request("password must be a string")),
        (None, Some(Value::String(h))) => {
            let alg = match b.get("hashing_algorithm").and_then(Value::as_str) {
                // rabbitmqadmin sends no algorithm: tell SHA-512 (68 bytes
                // once decoded) from SHA-256 (36) by length.
                None if password::well_formed(Algorithm::Sha512, h) => Algorithm::Sha512,
                None => Algorithm::Sha256,
                Some(a) => Algorithm::parse(a).ok_or_else(|| {
                    ApiError::bad_request(format!("unknown hashing_algorithm '{a}'"))
                })?,
            };
            (h.clone(), alg)
        }
        (None, Some(_)) => return Err(ApiError::bad_request("password_hash must be a string")),
        (None, None) => match &existed {
            Some(u) => (u.password_hash.clone(), u.algorithm),
            None => {
                return Err(ApiError::bad_request(
                    "a new user needs a password or a password_hash",
                ))
            }
        },
    };
    let limits = existed
        .as_ref()
        .map(|u| u.limits.clone())
        .unwrap_or_default();
    api.broker.users.put_user(User {
        name,
        password_hash: hash,
        algorithm,
        tags,
        limits,
    })?;
    api.broker.store.sync().await?;
    Ok(created_or_updated(existed.is_none()))
}

pub async fn delete_user(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    api.broker.delete_user(&name)?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

pub async fn bulk_delete_users(
    State(api): State<Arc<Api>>,
    caller: Caller,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    let b = body.object().await?;
    let names = b
        .get("users")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad_request("expected {\"users\": [names]}"))?;
    for n in names.iter().filter_map(Value::as_str) {
        match api.broker.delete_user(n) {
            Ok(()) | Err(crate::access::Error::NoUser(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    api.broker.store.sync().await?;
    Ok(no_content())
}

fn permission_json(vhost: &str, user: &str, p: &crate::access::Permission) -> Value {
    json!({
        "user": user,
        "vhost": vhost,
        "configure": p.patterns[0],
        "write": p.patterns[1],
        "read": p.patterns[2],
    })
}

/// Every permission the caller may see, by (vhost, user) filter.
fn permissions(api: &Api, caller: &Caller, vhost: Option<&str>, user: Option<&str>) -> Vec<Value> {
    api.broker
        .users
        .permissions()
        .iter()
        .filter(|(v, u, _)| {
            vhost.is_none_or(|x| x == v) && user.is_none_or(|x| x == u) && caller.sees(api, v)
        })
        .map(|(v, u, p)| permission_json(v, u, p))
        .collect()
}

pub async fn list_permissions(
    State(api): State<Arc<Api>>,
    caller: Caller,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    Ok(Json(Value::Array(permissions(&api, &caller, None, None))))
}

pub async fn vhost_permissions(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(vhost): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    Ok(Json(Value::Array(permissions(
        &api,
        &caller,
        Some(&vhost),
        None,
    ))))
}

pub async fn user_permissions(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(user): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    api.broker
        .users
        .get(&user)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(Value::Array(permissions(
        &api,
        &caller,
        None,
        Some(&user),
    ))))
}

pub async fn get_permission(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    let p = api
        .broker
        .users
        .permission(&user, &vhost)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(permission_json(&vhost, &user, &p)))
}

/// A permission's user and vhost must both exist: 400
/// vhost_or_user_not_found otherwise, as RabbitMQ answers.
fn user_and_vhost(api: &Api, user: &str, vhost: &str) -> ApiResult<()> {
    if api.broker.vhost(vhost).is_none() || api.broker.users.get(user).is_none() {
        return Err(ApiError::bad_request("vhost_or_user_not_found"));
    }
    Ok(())
}

pub async fn put_permission(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    user_and_vhost(&api, &user, &vhost)?;
    let b = body.object().await?;
    require(&b, &["configure", "write", "read"])?;
    let field = |k: &str| -> ApiResult<String> {
        match b.get(k) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(ApiError::bad_request(format!("{k} must be a string"))),
        }
    };
    let existed = api.broker.users.permission(&user, &vhost).is_some();
    let (c, w, r) = (field("configure")?, field("write")?, field("read")?);
    api.broker.users.set_permission(&user, &vhost, &c, &w, &r)?;
    api.broker.store.sync().await?;
    Ok(created_or_updated(!existed))
}

pub async fn delete_permission(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    if api.broker.users.permission(&user, &vhost).is_none() {
        return Err(ApiError::not_found());
    }
    api.broker.users.clear_permission(&user, &vhost)?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

fn topic_json(vhost: &str, user: &str, t: &crate::access::TopicPermission) -> Value {
    json!({
        "user": user,
        "vhost": vhost,
        "exchange": t.exchange,
        "write": t.write_pattern,
        "read": t.read_pattern,
    })
}

fn topic_permissions(api: &Api, vhost: Option<&str>, user: Option<&str>) -> Vec<Value> {
    api.broker
        .users
        .all_topic_permissions()
        .iter()
        .filter(|(v, u, _)| vhost.is_none_or(|x| x == v) && user.is_none_or(|x| x == u))
        .map(|(v, u, t)| topic_json(v, u, t))
        .collect()
}

pub async fn list_topic_permissions(
    State(api): State<Arc<Api>>,
    caller: Caller,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    Ok(Json(Value::Array(topic_permissions(&api, None, None))))
}

pub async fn vhost_topic_permissions(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(vhost): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    Ok(Json(Value::Array(topic_permissions(
        &api,
        Some(&vhost),
        None,
    ))))
}

pub async fn user_topic_permissions(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(user): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    api.broker
        .users
        .get(&user)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(Value::Array(topic_permissions(
        &api,
        None,
        Some(&user),
    ))))
}

pub async fn get_topic_permission(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    let list = topic_permissions(&api, Some(&vhost), Some(&user));
    if list.is_empty() {
        return Err(ApiError::not_found());
    }
    Ok(Json(Value::Array(list)))
}

pub async fn put_topic_permission(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    user_and_vhost(&api, &user, &vhost)?;
    let b = body.object().await?;
    require(&b, &["exchange", "write", "read"])?;
    let field = |k: &str| b.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let exchange = field("exchange");
    if exchange.is_empty() {
        return Err(ApiError::bad_request(
            "a topic permission needs an exchange",
        ));
    }
    let existed = api
        .broker
        .users
        .topic_permissions(&user, &vhost)
        .is_some_and(|m| m.contains_key(&exchange));
    api.broker.users.set_topic_permission(
        &user,
        &vhost,
        &exchange,
        &field("write"),
        &field("read"),
    )?;
    api.broker.store.sync().await?;
    Ok(created_or_updated(!existed))
}

pub async fn delete_topic_permission(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    if api.broker.users.topic_permissions(&user, &vhost).is_none() {
        return Err(ApiError::not_found());
    }
    api.broker
        .users
        .clear_topic_permission(&user, &vhost, None)?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

fn user_limits(api: &Api, user: Option<&str>) -> Vec<Value> {
    api.broker
        .users
        .list()
        .iter()
        .filter(|u| !u.limits.is_empty() && user.is_none_or(|x| x == u.name))
        .map(|u| json!({"user": u.name, "value": u.limits}))
        .collect()
}

pub async fn list_user_limits(
    State(api): State<Arc<Api>>,
    caller: Caller,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    Ok(Json(Value::Array(user_limits(&api, None))))
}

pub async fn get_user_limits(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(user): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    api.broker
        .users
        .get(&user)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(Value::Array(user_limits(&api, Some(&user)))))
}

/// The keys of `body` among `keys` that are missing, as RabbitMQ's API
/// refuses them: 400 `[{key_missing,configure},...]`.
pub fn require(body: &serde_json::Map<String, Value>, keys: &[&str]) -> ApiResult<()> {
    let missing: Vec<String> = keys
        .iter()
        .filter(|k| body.get(**k).is_none_or(Value::is_null))
        .map(|k| format!("{{key_missing,{k}}}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(ApiError::bad_request(format!("[{}]", missing.join(","))))
}

/// Which limits a PUT sets, and how RabbitMQ words their errors.
pub enum Limits {
    /// vhost-limits: a runtime parameter ("Validation failed" first).
    Vhost,
    /// user-limits.
    User,
}

impl Limits {
    fn known(&self) -> &'static [&'static str] {
        match self {
            Limits::Vhost => &["max-connections", "max-queues"],
            Limits::User => &["max-connections", "max-channels"],
        }
    }

    fn refuse(&self, why: String) -> ApiError {
        ApiError::bad_request(match self {
            Limits::Vhost => format!("Validation failed\n\n{why}\n"),
            Limits::User => why,
        })
    }
}

/// The value of limit `name` in {"value": n}: an integer (negative means
/// none), refused as RabbitMQ's parameter validation refuses it.
pub async fn limit_value(body: Body, limits: Limits, name: &str) -> ApiResult<i64> {
    let b = body.object().await?;
    require(&b, &["value"])?;
    let v = &b["value"];
    if !limits.known().contains(&name) {
        let set = match limits {
            Limits::Vhost => "limits",
            Limits::User => "user-limits",
        };
        let term = crate::policy::erlang(v);
        return Err(limits.refuse(format!(
            "Unrecognised terms [{{<<{name:?}>>,{term}}}] in {set}"
        )));
    }
    v.as_i64().ok_or_else(|| {
        let term = crate::policy::erlang(v);
        limits.refuse(format!("{name} should be a number, actually was {term}"))
    })
}

pub async fn put_user_limit(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((user, name)): Path<(String, String)>,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    let value = limit_value(body, Limits::User, &name).await?;
    let mut u = User::clone(
        &*api
            .broker
            .users
            .get(&user)
            .ok_or_else(ApiError::not_found)?,
    );
    u.limits.insert(name, value);
    api.broker.users.put_user(u)?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

pub async fn delete_user_limit(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((user, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    let mut u = User::clone(
        &*api
            .broker
            .users
            .get(&user)
            .ok_or_else(ApiError::not_found)?,
    );
    if u.limits.remove(&name).is_none() {
        return Err(ApiError::not_found());
    }
    api.broker.users.put_user(u)?;
    api.broker.store.sync().await?;
    Ok(no_content())
}
