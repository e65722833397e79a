//! Vhosts, vhost limits, policies, operator policies, runtime and global
//! parameters, and definitions: RabbitMQ's /api/vhosts, /api/vhost-limits,
//! /api/policies, /api/operator-policies, /api/parameters,
//! /api/global-parameters and /api/definitions.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Map, Value};

use super::{created_or_updated, no_content, off_runtime};
use crate::broker::federation::{check_federation_parameter, is_federation};
use crate::broker::policies::{PolicySpec, OPERATOR_POLICY, POLICY};
use crate::broker::vhosts::{vhost_limits, LIMITS_COMPONENT};
use crate::http::auth::Caller;
use crate::http::body::Body;
use crate::http::error::{ApiError, ApiResult};
use crate::http::list::{respond, ListQuery};
use crate::http::{render, Api};
use crate::shovel;
use crate::store::GlobalParameterDef;
use crate::vhost::Meta;

pub async fn list_vhosts(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let vhosts: Vec<_> = api
        .broker
        .vhosts()
        .into_iter()
        .filter(|v| caller.sees(&api, &v.name))
        .collect();
    let channels = api.broker.connections.by_vhost();
    respond(
        vhosts,
        &q,
        |v| ("", &v.name),
        |v| render::vhost(&api, v, &channels),
    )
    .map(Json)
}

pub async fn get_vhost(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let vh = super::vhost_for(&api, &caller, &name, true)?;
    let channels = api.broker.connections.by_vhost();
    Ok(Json(render::vhost(&api, &vh, &channels)))
}

pub async fn put_vhost(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    let b = body.object().await?;
    let old = api.broker.vhost(&name).map(|v| v.meta());
    let text = |k: &str, old: Option<&str>| -> ApiResult<String> {
        match b.get(k) {
            None | Some(Value::Null) => Ok(old.unwrap_or("").to_string()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(ApiError::bad_request(format!("{k} must be a string"))),
        }
    };
    let meta = Meta {
        name: name.clone(),
        description: text("description", old.as_ref().map(|m| m.description.as_str()))?,
        tags: match b.get("tags") {
            None => old.as_ref().map(|m| m.tags.clone()).unwrap_or_default(),
            v => crate::definitions::tags(v, "tags").map_err(ApiError::bad_request)?,
        },
        default_queue_type: text(
            "default_queue_type",
            old.as_ref().map(|m| m.default_queue_type.as_str()),
        )?,
    };
    let created = api.broker.put_vhost(meta)?;
    if created {
        // As RabbitMQ's API: whoever makes a vhost may use it at once.
        api.broker
            .users
            .set_permission(&caller.user.name, &name, ".*", ".*", ".*")?;
    }
    api.broker.store.sync().await?;
    Ok(created_or_updated(created))
}

pub async fn delete_vhost(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    if !api.broker.delete_vhost(&name)? {
        return Err(ApiError::not_found());
    }
    api.broker.store.sync().await?;
    Ok(no_content())
}

fn limits_of(api: &Api, vhost: Option<&str>) -> Vec<Value> {
    api.broker
        .vhosts()
        .iter()
        .filter(|v| vhost.is_none_or(|x| x == v.name))
        .filter_map(|v| {
            let l = vhost_limits(v);
            (!l.is_empty()).then(|| json!({"vhost": v.name, "value": l}))
        })
        .collect()
}

pub async fn list_vhost_limits(
    State(api): State<Arc<Api>>,
    caller: Caller,
) -> ApiResult<Json<Value>> {
    caller.monitor()?;
    Ok(Json(Value::Array(limits_of(&api, None))))
}

pub async fn get_vhost_limits(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(vhost): Path<String>,
) -> ApiResult<Json<Value>> {
    super::vhost_for(&api, &caller, &vhost, true)?;
    Ok(Json(Value::Array(limits_of(&api, Some(&vhost)))))
}

pub async fn put_vhost_limit(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    let value = super::access::limit_value(body, super::access::Limits::Vhost, &name).await?;
    api.broker.set_vhost_limit(&vhost, &name, Some(value))?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

pub async fn delete_vhost_limit(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    api.broker.set_vhost_limit(&vhost, &name, None)?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

fn policy_json(p: &crate::policy::Policy) -> Value {
    json!({
        "vhost": p.vhost,
        "name": p.name,
        "pattern": p.pattern,
        "apply-to": p.apply_to.as_str(),
        "definition": p.definition,
        "priority": p.priority,
    })
}

fn policies(api: &Api, caller: &Caller, vhost: Option<&str>, operator: bool) -> Vec<Value> {
    api.broker
        .vhosts()
        .iter()
        .filter(|v| vhost.is_none_or(|x| x == v.name) && caller.sees(api, &v.name))
        .flat_map(|v| {
            v.policies()
                .list()
                .iter()
                .filter(|p| p.operator == operator)
                .map(|p| policy_json(p))
                .collect::<Vec<_>>()
        })
        .collect()
}

pub async fn list_policies(
    api: Arc<Api>,
    caller: Caller,
    operator: bool,
) -> ApiResult<Json<Value>> {
    caller.policy_reader(operator)?;
    Ok(Json(Value::Array(policies(&api, &caller, None, operator))))
}

pub async fn vhost_policies(
    api: Arc<Api>,
    caller: Caller,
    vhost: String,
    operator: bool,
) -> ApiResult<Json<Value>> {
    caller.policy_reader(operator)?;
    super::vhost_for(&api, &caller, &vhost, true)?;
    Ok(Json(Value::Array(policies(
        &api,
        &caller,
        Some(&vhost),
        operator,
    ))))
}

pub async fn get_policy(
    api: Arc<Api>,
    caller: Caller,
    (vhost, name): (String, String),
    operator: bool,
) -> ApiResult<Json<Value>> {
    caller.policy_reader(operator)?;
    let vh = super::vhost_for(&api, &caller, &vhost, true)?;
    let set = vh.policies();
    let p = set.get(&name, operator).ok_or_else(ApiError::not_found)?;
    Ok(Json(policy_json(p)))
}

pub async fn put_policy(
    api: Arc<Api>,
    caller: Caller,
    (vhost, name): (String, String),
    body: Body,
    operator: bool,
) -> ApiResult<StatusCode> {
    // Operator policies are administrators' (with or without a
    // permission on the vhost, as in RabbitMQ).
    if operator {
        caller.admin()?;
    } else {
        caller.policymaker(&api, &vhost)?;
    }
    let vh = api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    let spec = PolicySpec::from_value(&body.value().await?).map_err(ApiError::bad_request)?;
    let existed = vh.policies().get(&name, operator).is_some();
    let broker = Arc::clone(&api.broker);
    off_runtime(move || broker.put_policy(&vhost, &name, &spec, operator)).await?;
    api.broker.store.sync().await?;
    Ok(created_or_updated(!existed))
}

pub async fn delete_policy(
    api: Arc<Api>,
    caller: Caller,
    (vhost, name): (String, String),
    operator: bool,
) -> ApiResult<StatusCode> {
    // Operator policies are administrators' (with or without a
    // permission on the vhost, as in RabbitMQ).
    if operator {
        caller.admin()?;
    } else {
        caller.policymaker(&api, &vhost)?;
    }
    let broker = Arc::clone(&api.broker);
    if !off_runtime(move || broker.delete_policy(&vhost, &name, operator)).await? {
        return Err(ApiError::not_found());
    }
    api.broker.store.sync().await?;
    Ok(no_content())
}

/// Runtime parameters as RabbitMQ lists them (policies are not among
/// them; operator policies and vhost limits are).
fn parameters(
    api: &Api,
    caller: &Caller,
    component: Option<&str>,
    vhost: Option<&str>,
) -> ApiResult<Vec<Value>> {
    Ok(api
        .broker
        .store
        .parameters()?
        .into_iter()
        .filter(|p| p.component != POLICY)
        .filter(|p| component.is_none_or(|c| c == p.component))
        .filter(|p| vhost.is_none_or(|v| v == p.vhost) && caller.sees(api, &p.vhost))
        .map(|p| json!({"vhost": p.vhost, "component": p.component, "name": p.name, "value": p.value}))
        .collect())
}

pub async fn list_parameters(
    State(api): State<Arc<Api>>,
    caller: Caller,
) -> ApiResult<Json<Value>> {
    caller.policy_reader(false)?;
    Ok(Json(Value::Array(parameters(&api, &caller, None, None)?)))
}

pub async fn component_parameters(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(component): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.policy_reader(false)?;
    Ok(Json(Value::Array(parameters(
        &api,
        &caller,
        Some(&component),
        None,
    )?)))
}

pub async fn vhost_parameters(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((component, vhost)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    caller.policy_reader(false)?;
    super::vhost_for(&api, &caller, &vhost, true)?;
    Ok(Json(Value::Array(parameters(
        &api,
        &caller,
        Some(&component),
        Some(&vhost),
    )?)))
}

pub async fn get_parameter(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((component, vhost, name)): Path<(String, String, String)>,
) -> ApiResult<Json<Value>> {
    caller.policy_reader(false)?;
    caller.vhost(&api, &vhost, true)?;
    parameters(&api, &caller, Some(&component), Some(&vhost))?
        .into_iter()
        .find(|p| p["name"] == name.as_str())
        .map(Json)
        .ok_or_else(ApiError::not_found)
}

pub async fn put_parameter(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((component, vhost, name)): Path<(String, String, String)>,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.policymaker(&api, &vhost)?;
    let vh = api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    let b = body.object().await?;
    super::access::require(&b, &["value"])?;
    let value = b["value"].clone();
    let existed = parameters(&api, &caller, Some(&component), Some(&vhost))?
        .iter()
        .any(|p| p["name"] == name.as_str());
    match component.as_str() {
        LIMITS_COMPONENT => {
            let limits = value
                .as_object()
                .cloned()
                .ok_or_else(|| ApiError::bad_request("vhost limits must be an object"))?;
            api.broker.set_vhost_limits(&vh, limits)?;
        }
        // As RabbitMQ: policies have their own endpoint.
        POLICY => {
            return Err(ApiError::bad_request(
                "policies may not be set using this method",
            ))
        }
        OPERATOR_POLICY => {
            caller.admin()?;
            let spec = PolicySpec::from_value(&value).map_err(ApiError::bad_request)?;
            let broker = Arc::clone(&api.broker);
            off_runtime(move || broker.put_policy(&vhost, &name, &spec, true)).await?;
        }
        shovel::COMPONENT => {
            shovel::Spec::parse(&name, &value).map_err(ApiError::bad_request)?;
            let broker = Arc::clone(&api.broker);
            off_runtime(move || broker.put_shovel(&vhost, &name, &value)).await?;
        }
        c if is_federation(c) => {
            check_federation_parameter(c, &name, &value).map_err(ApiError::bad_request)?;
            let broker = Arc::clone(&api.broker);
            off_runtime(move || broker.put_federation_parameter(&component, &vhost, &name, &value))
                .await?;
        }
        _ => {
            return Err(ApiError::bad_request(
                crate::definitions::component_not_found(&component),
            ))
        }
    }
    api.broker.store.sync().await?;
    Ok(created_or_updated(!existed))
}

pub async fn delete_parameter(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((component, vhost, name)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    caller.policymaker(&api, &vhost)?;
    let vh = api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    match component.as_str() {
        LIMITS_COMPONENT => api.broker.set_vhost_limits(&vh, Map::new())?,
        OPERATOR_POLICY | POLICY => {
            caller.admin()?;
            let broker = Arc::clone(&api.broker);
            let operator = component == OPERATOR_POLICY;
            let (vhost, name) = (vhost.clone(), name.clone());
            off_runtime(move || broker.delete_policy(&vhost, &name, operator)).await?;
        }
        shovel::COMPONENT => {
            let broker = Arc::clone(&api.broker);
            off_runtime(move || broker.delete_shovel(&vhost, &name)).await?;
        }
        c if is_federation(c) => {
            // As RabbitMQ: deleting what is not there is 404.
            let there = parameters(&api, &caller, Some(c), Some(&vhost))?
                .iter()
                .any(|p| p["name"] == name.as_str());
            if !there {
                return Err(ApiError::not_found());
            }
            let broker = Arc::clone(&api.broker);
            off_runtime(move || broker.delete_federation_parameter(&component, &vhost, &name))
                .await?;
        }
        _ => api
            .broker
            .store
            .delete_parameter(&vhost, &component, &name)?,
    }
    api.broker.store.sync().await?;
    Ok(no_content())
}

pub async fn list_globals(State(api): State<Arc<Api>>, caller: Caller) -> ApiResult<Json<Value>> {
    caller.admin()?;
    let mut all: Vec<Value> = api
        .broker
        .store
        .global_parameters()?
        .into_iter()
        .map(|g| json!({"name": g.name, "value": g.value}))
        .collect();
    if !all.iter().any(|g| g["name"] == "cluster_name") {
        all.push(json!({"name": "cluster_name", "value": render::cluster_name(&api)}));
    }
    Ok(Json(Value::Array(all)))
}

pub async fn get_global(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    let Json(all) = list_globals(State(Arc::clone(&api)), caller).await?;
    all.as_array()
        .and_then(|a| a.iter().find(|g| g["name"] == name.as_str()).cloned())
        .map(Json)
        .ok_or_else(ApiError::not_found)
}

pub async fn put_global(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    let b = body.object().await?;
    super::access::require(&b, &["value"])?;
    let value = b["value"].clone();
    let existed = api
        .broker
        .store
        .global_parameters()?
        .iter()
        .any(|g| g.name == name);
    api.broker
        .store
        .put_global_parameter(&GlobalParameterDef { name, value })?;
    api.broker.store.sync().await?;
    Ok(created_or_updated(!existed))
}

pub async fn delete_global(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    api.broker.store.delete_global_parameter(&name)?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

pub async fn get_cluster_name(State(api): State<Arc<Api>>, _caller: Caller) -> Json<Value> {
    Json(json!({"name": render::cluster_name(&api)}))
}

pub async fn put_cluster_name(
    State(api): State<Arc<Api>>,
    caller: Caller,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    let b = body.object().await?;
    let name = b
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("expected {\"name\": ...}"))?;
    api.broker.store.put_global_parameter(&GlobalParameterDef {
        name: "cluster_name".into(),
        value: name.into(),
    })?;
    api.broker.store.sync().await?;
    api.broker.set_cluster_name(name);
    Ok(no_content())
}

pub async fn export_all(State(api): State<Arc<Api>>, caller: Caller) -> ApiResult<Json<Value>> {
    caller.admin()?;
    crate::definitions::export(&api.broker, None)
        .map(Json)
        .map_err(ApiError::internal)
}

pub async fn export_vhost(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(vhost): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.admin()?;
    api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    crate::definitions::export(&api.broker, Some(&vhost))
        .map(Json)
        .map_err(ApiError::internal)
}

pub async fn import_all(
    State(api): State<Arc<Api>>,
    caller: Caller,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    let defs = body.value().await?;
    let broker = Arc::clone(&api.broker);
    off_runtime(move || {
        crate::definitions::import(&broker, &defs, None).map_err(ApiError::bad_request)
    })
    .await?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

pub async fn import_vhost(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(vhost): Path<String>,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.admin()?;
    api.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    let defs = body.value().await?;
    let broker = Arc::clone(&api.broker);
    off_runtime(move || {
        crate::definitions::import(&broker, &defs, Some(&vhost)).map_err(ApiError::bad_request)
    })
    .await?;
    api.broker.store.sync().await?;
    Ok(no_content())
}
