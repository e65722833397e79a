//! Who is calling: HTTP basic auth against Warren's users (loopback_users
//! hold here as on AMQP), and what their tags let them do, as RabbitMQ's
//! management plugin decides it: management sees and changes its own
//! vhosts; policymaker also their policies and parameters; monitoring
//! sees everything, read-only beyond its vhosts; administrator does all.
//! A user with none of these tags may not use the API.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use base64::Engine;

use super::error::{ApiError, ApiResult};
use super::Api;
use crate::access::{Access, User};

/// An authenticated caller.
pub struct Caller {
    pub user: Arc<User>,
}

impl Caller {
    fn tagged(&self, tags: &[&str]) -> bool {
        tags.iter().any(|t| self.user.has_tag(t))
    }

    /// Tagged administrator.
    pub fn is_admin(&self) -> bool {
        self.tagged(&["administrator"])
    }

    /// May see everything (monitoring or administrator).
    pub fn is_monitor(&self) -> bool {
        self.tagged(&["administrator", "monitoring"])
    }

    /// 401 unless the caller may see policies and parameters at all
    /// (policymaker or administrator; operator policies: administrator).
    pub fn policy_reader(&self, operator: bool) -> ApiResult<()> {
        if operator {
            return self.admin();
        }
        if self.tagged(&["administrator", "policymaker"]) {
            return Ok(());
        }
        Err(ApiError::not_authorised("Not policymaker user"))
    }

    /// 401 unless administrator.
    pub fn admin(&self) -> ApiResult<()> {
        if self.is_admin() {
            return Ok(());
        }
        Err(ApiError::not_authorised("Not administrator user"))
    }

    /// 401 unless monitoring or administrator.
    pub fn monitor(&self) -> ApiResult<()> {
        if self.is_monitor() {
            return Ok(());
        }
        Err(ApiError::not_authorised("Not monitor user"))
    }

    /// Whether the caller may see `vhost` (monitors see all; others need
    /// a permission on it).
    pub fn sees(&self, api: &Api, vhost: &str) -> bool {
        self.is_monitor()
            || api
                .broker
                .users
                .permission(&self.user.name, vhost)
                .is_some()
    }

    /// 401 unless the caller may use `vhost` (a permission on it; for
    /// read-only requests, monitors may see any).
    pub fn vhost(&self, api: &Api, vhost: &str, read_only: bool) -> ApiResult<()> {
        let allowed = if read_only {
            self.sees(api, vhost)
        } else {
            api.broker
                .users
                .permission(&self.user.name, vhost)
                .is_some()
        };
        if allowed {
            return Ok(());
        }
        Err(ApiError::not_authorised(
            "User not authorised to access virtual host",
        ))
    }

    /// 401 unless the caller may manage policies and parameters of
    /// `vhost` (policymaker or administrator, with access to it).
    pub fn policymaker(&self, api: &Api, vhost: &str) -> ApiResult<()> {
        if !self.tagged(&["administrator", "policymaker"]) {
            return Err(ApiError::not_authorised("Not policymaker user"));
        }
        self.vhost(api, vhost, false)
    }

    /// 401 unless the caller's AMQP permissions allow `access` to the
    /// resource `name` of `vhost` (declaring and deleting need configure,
    /// publishing write, getting and purging read), as in RabbitMQ.
    pub fn resource(&self, api: &Api, vhost: &str, access: Access, name: &str) -> ApiResult<()> {
        self.vhost(api, vhost, false)?;
        let allowed = api
            .broker
            .users
            .permission(&self.user.name, vhost)
            .is_some_and(|p| p.allows(access, name));
        if allowed {
            return Ok(());
        }
        Err(ApiError::not_authorised("Access refused."))
    }
}

impl Caller {
    /// 401 unless the caller's topic permissions on the topic exchange `x`
    /// of `vh` allow `access` with `routing_key` (as over AMQP).
    pub fn topic(
        &self,
        api: &Api,
        vh: &crate::vhost::VHost,
        x: &str,
        access: Access,
        routing_key: &str,
    ) -> ApiResult<()> {
        let Some(perms) = api
            .broker
            .users
            .topic_permissions(&self.user.name, &vh.name)
        else {
            return Ok(());
        };
        let Some(t) = perms.get(x) else {
            return Ok(());
        };
        let is_topic = vh
            .exchange(x)
            .is_some_and(|e| e.kind == Some(crate::exchange::ExchangeKind::Topic));
        if !is_topic || t.allows(access, routing_key) {
            return Ok(());
        }
        Err(ApiError::not_authorised(format!(
            "access to topic '{routing_key}' in exchange '{x}' in vhost '{}' refused for user '{}'",
            vh.name, self.user.name
        )))
    }
}

/// The user named by an `Authorization: Basic` header, if the password
/// is theirs.
pub fn basic_login(
    api: &Api,
    header: Option<&str>,
    peer: Option<SocketAddr>,
) -> ApiResult<Arc<User>> {
    let encoded = header
        .and_then(|h| {
            h.strip_prefix("Basic ")
                .or_else(|| h.strip_prefix("basic "))
        })
        .ok_or_else(ApiError::login_failed)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| ApiError::login_failed())?;
    let text = String::from_utf8(decoded).map_err(|_| ApiError::login_failed())?;
    let (name, password) = text.split_once(':').ok_or_else(ApiError::login_failed)?;
    let user = api
        .broker
        .users
        .authenticate(name, password)
        .ok_or_else(ApiError::login_failed)?;
    let loopback_only = api.broker.config.loopback_users.iter().any(|u| u == name);
    if loopback_only && !peer.is_some_and(|p| p.ip().is_loopback()) {
        return Err(ApiError::login_failed());
    }
    Ok(user)
}

impl FromRequestParts<Arc<Api>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Arc<Api>) -> ApiResult<Caller> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0);
        let user = basic_login(api, header, peer)?;
        let caller = Caller { user };
        if !caller.tagged(&["administrator", "monitoring", "policymaker", "management"]) {
            return Err(ApiError::not_authorised("Not management user"));
        }
        Ok(caller)
    }
}
