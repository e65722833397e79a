//! The routes of /api, one module per group. Path segments are
//! percent-decoded once each, so "%2F" is the vhost "/". The default
//! exchange is an empty segment (`exchanges/%2F//publish`, which the router
//! matches as an empty name; `exchanges/%2F/` has its own route) or
//! `amq.default`, which the handlers read as "".

mod access;
mod actions;
mod cluster;
mod conns;
mod entities;
mod federation;
mod node;
mod shovels;
mod streams;

pub use cluster::member_name;
pub use node::{fd_limit, open_fds};
mod tenancy;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::Router;

use super::auth::Caller;
use super::body::Body;
use super::error::ApiError;
use super::Api;

/// Runs `f` on tokio's blocking pool: a policy change walks every queue of
/// its vhost (and may drop or dead-letter many messages) under the policy
/// lock, and an import may make thousands of entities, which must not hold
/// up the runtime's workers.
pub async fn off_runtime<T, E>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> crate::http::error::ApiResult<T>
where
    T: Send + 'static,
    E: Send + 'static,
    crate::http::ApiError: From<E>,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => Ok(r?),
        Err(e) => Err(crate::http::ApiError::internal(format!(
            "the change failed: {e}"
        ))),
    }
}

/// 201 for something made, 204 for something that was there.
pub fn created_or_updated(created: bool) -> StatusCode {
    if created {
        StatusCode::CREATED
    } else {
        StatusCode::NO_CONTENT
    }
}

/// 204.
pub fn no_content() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// The vhost `name` (404 if there is none) if the caller may use it (401
/// otherwise; `read_only` lets monitors see any).
pub fn vhost_for(
    api: &Api,
    caller: &Caller,
    name: &str,
    read_only: bool,
) -> Result<Arc<crate::vhost::VHost>, ApiError> {
    let vh = api.broker.vhost(name).ok_or_else(ApiError::not_found)?;
    caller.vhost(api, name, read_only)?;
    Ok(vh)
}

/// "" for the default exchange's alias.
pub fn exchange_name(name: String) -> String {
    if name == "amq.default" {
        String::new()
    } else {
        name
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found()
}

type S = State<Arc<Api>>;

/// Every route.
pub fn router(api: Arc<Api>) -> Router {
    use access as a;
    use conns as c;
    use entities as e;
    use streams as st;
    use tenancy as t;
    let policies = |operator: bool| {
        Router::new()
            .route(
                "/",
                get(move |State(s): S, caller: Caller| t::list_policies(s, caller, operator)),
            )
            .route(
                "/{vhost}",
                get(move |State(s): S, caller: Caller, Path(v): Path<String>| {
                    t::vhost_policies(s, caller, v, operator)
                }),
            )
            .route(
                "/{vhost}/{name}",
                get(
                    move |State(s): S, caller: Caller, Path(p): Path<(String, String)>| {
                        t::get_policy(s, caller, p, operator)
                    },
                )
                .put(
                    move |State(s): S, caller: Caller, Path(p): Path<(String, String)>, b: Body| {
                        t::put_policy(s, caller, p, b, operator)
                    },
                )
                .delete(
                    move |State(s): S, caller: Caller, Path(p): Path<(String, String)>| {
                        t::delete_policy(s, caller, p, operator)
                    },
                ),
            )
    };
    let api_routes = Router::new()
        .route("/overview", get(node::overview))
        .route("/whoami", get(a::whoami))
        .route(
            "/cluster-name",
            get(t::get_cluster_name).put(t::put_cluster_name),
        )
        .route("/nodes", get(node::nodes))
        .route("/nodes/{node}", get(node::node))
        .route("/nodes/{node}/memory", get(node::node_memory))
        .route("/extensions", get(node::extensions))
        .route("/feature-flags", get(node::empty_list))
        .route("/deprecated-features", get(node::empty_list))
        .route("/deprecated-features/used", get(node::empty_list))
        .route("/auth", get(node::auth))
        .route("/healthchecks/node", get(node::healthcheck))
        .route("/healthchecks/node/{node}", get(node::healthcheck_of))
        .route("/health/checks/alarms", get(node::alarms))
        .route("/health/checks/local-alarms", get(node::local_alarms))
        .route(
            "/health/checks/port-listener/{port}",
            get(node::port_listener),
        )
        .route(
            "/health/checks/protocol-listener/{protocol}",
            get(node::protocol_listener),
        )
        .route("/health/checks/virtual-hosts", get(node::virtual_hosts))
        .route(
            "/health/checks/node-is-quorum-critical",
            get(cluster::quorum_critical),
        )
        .route("/cluster", get(cluster::show))
        .route(
            "/cluster/members/{id}",
            put(cluster::add_member).delete(cluster::remove_member),
        )
        .route(
            "/health/checks/node-is-mirror-sync-critical",
            get(node::single_node),
        )
        .route("/health/checks/ready-to-serve-clients", get(node::ok))
        .route("/health/checks/is-in-service", get(node::ok))
        .route("/aliveness-test/{vhost}", get(node::aliveness))
        // Warren's own: reload the TLS certificate files (as SIGHUP).
        .route("/tls/reload", axum::routing::post(node::reload_tls))
        .route("/vhosts", get(t::list_vhosts))
        .route(
            "/vhosts/{vhost}",
            get(t::get_vhost).put(t::put_vhost).delete(t::delete_vhost),
        )
        .route("/vhosts/{vhost}/permissions", get(a::vhost_permissions))
        .route(
            "/vhosts/{vhost}/topic-permissions",
            get(a::vhost_topic_permissions),
        )
        .route("/vhosts/{vhost}/connections", get(c::vhost_connections))
        .route("/vhosts/{vhost}/channels", get(c::vhost_channels))
        .route("/users", get(a::list_users))
        .route(
            "/users/without-permissions",
            get(a::users_without_permissions),
        )
        .route("/users/bulk-delete", post(a::bulk_delete_users))
        .route(
            "/users/{user}",
            get(a::get_user).put(a::put_user).delete(a::delete_user),
        )
        .route("/users/{user}/permissions", get(a::user_permissions))
        .route(
            "/users/{user}/topic-permissions",
            get(a::user_topic_permissions),
        )
        .route("/permissions", get(a::list_permissions))
        .route(
            "/permissions/{vhost}/{user}",
            get(a::get_permission)
                .put(a::put_permission)
                .delete(a::delete_permission),
        )
        .route("/topic-permissions", get(a::list_topic_permissions))
        .route(
            "/topic-permissions/{vhost}/{user}",
            get(a::get_topic_permission)
                .put(a::put_topic_permission)
                .delete(a::delete_topic_permission),
        )
        .route("/user-limits", get(a::list_user_limits))
        .route("/user-limits/{user}", get(a::get_user_limits))
        .route(
            "/user-limits/{user}/{name}",
            put(a::put_user_limit).delete(a::delete_user_limit),
        )
        .route("/vhost-limits", get(t::list_vhost_limits))
        .route("/vhost-limits/{vhost}", get(t::get_vhost_limits))
        .route(
            "/vhost-limits/{vhost}/{name}",
            put(t::put_vhost_limit).delete(t::delete_vhost_limit),
        )
        .nest("/policies", policies(false))
        .nest("/operator-policies", policies(true))
        .route("/parameters", get(t::list_parameters))
        .route("/parameters/{component}", get(t::component_parameters))
        .route("/parameters/{component}/{vhost}", get(t::vhost_parameters))
        .route(
            "/parameters/{component}/{vhost}/{name}",
            get(t::get_parameter)
                .put(t::put_parameter)
                .delete(t::delete_parameter),
        )
        .route("/federation-links", get(federation::list))
        .route("/federation-links/state/down", get(federation::down))
        .route("/federation-links/{vhost}", get(federation::list_vhost))
        .route(
            "/federation-links/{vhost}/state/down",
            get(federation::down_vhost),
        )
        .route(
            "/federation-links/vhost/{vhost}/{id}/{node}/restart",
            axum::routing::delete(federation::restart),
        )
        .route("/shovels", get(shovels::list))
        .route("/shovels/{vhost}", get(shovels::list_vhost))
        .route(
            "/shovels/vhost/{vhost}/{name}",
            get(shovels::show).delete(shovels::delete),
        )
        .route(
            "/shovels/vhost/{vhost}/{name}/restart",
            axum::routing::delete(shovels::restart),
        )
        // LavinMQ's paths, and the same beside RabbitMQ's restart.
        .route("/shovels/{vhost}/{name}/pause", put(shovels::pause))
        .route("/shovels/{vhost}/{name}/resume", put(shovels::resume))
        .route("/shovels/vhost/{vhost}/{name}/pause", put(shovels::pause))
        .route("/shovels/vhost/{vhost}/{name}/resume", put(shovels::resume))
        .route("/global-parameters", get(t::list_globals))
        .route(
            "/global-parameters/{name}",
            get(t::get_global)
                .put(t::put_global)
                .delete(t::delete_global),
        )
        .route("/definitions", get(t::export_all).post(t::import_all))
        .route(
            "/definitions/{vhost}",
            get(t::export_vhost).post(t::import_vhost),
        )
        .route("/exchanges", get(e::list_exchanges))
        .route("/exchanges/{vhost}", get(e::vhost_exchanges))
        .route(
            "/exchanges/{vhost}/{name}",
            get(e::get_exchange)
                .put(e::put_exchange)
                .delete(e::delete_exchange),
        )
        .route("/exchanges/{vhost}/", get(e::get_default_exchange))
        .route("/exchanges/{vhost}/{name}/publish", post(e::publish))
        .route(
            "/exchanges/{vhost}/{name}/bindings/source",
            get(e::exchange_source_bindings),
        )
        .route(
            "/exchanges/{vhost}/{name}/bindings/destination",
            get(e::exchange_destination_bindings),
        )
        .route("/queues", get(e::list_queues))
        .route("/queues/detailed", get(e::list_queues))
        .route("/queues/{vhost}", get(e::vhost_queues))
        .route(
            "/queues/{vhost}/{name}",
            get(e::get_queue).put(e::put_queue).delete(e::delete_queue),
        )
        .route(
            "/queues/{vhost}/{name}/contents",
            axum::routing::delete(e::purge),
        )
        .route("/queues/{vhost}/{name}/get", post(e::get_messages))
        .route(
            "/queues/{vhost}/{name}/actions",
            post(actions::queue_action),
        )
        .route("/queues/{vhost}/{name}/bindings", get(e::queue_bindings))
        .route("/bindings", get(e::list_bindings))
        .route("/bindings/{vhost}", get(e::vhost_bindings))
        .route(
            "/bindings/{vhost}/e/{source}/{kind}/{dest}",
            get(e::between).post(e::bind),
        )
        .route(
            "/bindings/{vhost}/e/{source}/{kind}/{dest}/{props}",
            get(e::get_binding).delete(e::unbind),
        )
        .route("/connections", get(c::list_connections))
        .route(
            "/connections/username/{user}",
            get(c::user_connections).delete(c::close_user_connections),
        )
        .route(
            "/connections/{name}",
            get(c::get_connection).delete(c::close_connection),
        )
        .route("/connections/{name}/channels", get(c::connection_channels))
        .route("/channels", get(c::list_channels))
        .route("/channels/{name}", get(c::get_channel))
        .route("/consumers", get(c::list_consumers))
        .route("/consumers/{vhost}", get(c::vhost_consumers))
        .route("/stream/connections", get(st::list_connections))
        .route("/stream/connections/{vhost}", get(st::vhost_connections))
        .route(
            "/stream/connections/{vhost}/{name}",
            get(st::get_connection).delete(st::close_connection),
        )
        .route(
            "/stream/connections/{vhost}/{name}/publishers",
            get(st::connection_publishers),
        )
        .route(
            "/stream/connections/{vhost}/{name}/consumers",
            get(st::connection_consumers),
        )
        .route("/stream/publishers", get(st::list_publishers))
        .route("/stream/publishers/{vhost}", get(st::vhost_publishers))
        .route(
            "/stream/publishers/{vhost}/{stream}",
            get(st::stream_publishers),
        )
        .route("/stream/consumers", get(st::list_consumers))
        .route("/stream/consumers/{vhost}", get(st::vhost_consumers))
        .route("/rebalance/queues", post(node::rebalance))
        .fallback(not_found);
    Router::new()
        .nest("/api", api_routes)
        .merge(super::ui::router())
        .fallback(not_found)
        .layer(axum::middleware::from_fn(unchallenged))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&api),
            super::guard::guard,
        ))
        .with_state(api)
}

/// A script's request (X-Requested-With, as the web UI sends) gets a
/// failed login's 401 without the WWW-Authenticate challenge, which would
/// make the browser cover the page's login with its own.
async fn unchallenged(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let script = req.headers().contains_key("x-requested-with");
    let mut r = next.run(req).await;
    if script {
        r.headers_mut().remove(axum::http::header::WWW_AUTHENTICATE);
    }
    r
}
