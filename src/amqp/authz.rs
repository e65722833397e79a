//! Permission checks for one connection, as RabbitMQ makes them (see
//! docs/rabbitmq-permissions.md): configure, write or read on a named queue
//! or exchange, the default exchange named `amq.default`, refusals 403 with
//! RabbitMQ's text. The connection keeps its user's permissions and the
//! exchanges it was last allowed to publish to; one atomic load per check
//! tells whether users or permissions changed since (then both are read
//! again), so a publish takes no lock and allocates nothing.

use std::sync::Arc;

use crate::access::{Access, Permission, TopicPermission, TopicPermissions, Users};
use crate::amqp::error::{ProtocolError, Result};

/// How many exchanges a connection remembers it may publish to
/// (RabbitMQ's channels remember 12 checks).
const WRITE_CACHE: usize = 12;

/// A connection's view of its permissions.
pub struct Authz {
    user: String,
    vhost: String,
    generation: u64,
    permission: Option<Arc<Permission>>,
    /// Topic permissions by exchange (None: none set, all topics allowed).
    topic: Option<Arc<TopicPermissions>>,
    impersonator: bool,
    /// Exchanges publishing to was allowed at `generation`.
    may_publish: Vec<Box<[u8]>>,
}

impl Authz {
    /// `user`'s view of `vhost` now.
    pub fn new(users: &Users, user: &str, vhost: &str) -> Authz {
        let mut a = Authz {
            user: user.to_string(),
            vhost: vhost.to_string(),
            generation: u64::MAX,
            permission: None,
            topic: None,
            impersonator: false,
            may_publish: Vec::new(),
        };
        a.refresh(users);
        a
    }

    fn refresh(&mut self, users: &Users) {
        let now = users.generation();
        if now == self.generation {
            return;
        }
        self.generation = now;
        self.permission = users.permission(&self.user, &self.vhost);
        self.topic = users.topic_permissions(&self.user, &self.vhost);
        self.impersonator = users
            .get(&self.user)
            .is_some_and(|u| u.has_tag("impersonator"));
        self.may_publish.clear();
    }

    /// 403 unless `access` to the `kind` ("queue", "exchange") `name` is
    /// allowed.
    pub fn check(&mut self, users: &Users, access: Access, kind: &str, name: &str) -> Result<()> {
        self.refresh(users);
        let name = if kind == "exchange" && name.is_empty() {
            "amq.default"
        } else {
            name
        };
        if self
            .permission
            .as_ref()
            .is_some_and(|p| p.allows(access, name))
        {
            return Ok(());
        }
        Err(ProtocolError::access_refused(format!(
            "access to {kind} '{name}' in vhost '{}' refused for user '{}'",
            self.vhost, self.user
        )))
    }

    /// 403 unless the user may publish to `exchange` (remembered once
    /// allowed, until users or permissions change).
    pub fn check_publish(&mut self, users: &Users, exchange: &[u8]) -> Result<()> {
        if users.generation() == self.generation
            && self.may_publish.iter().any(|e| &e[..] == exchange)
        {
            return Ok(());
        }
        let name = String::from_utf8_lossy(exchange);
        self.check(users, Access::Write, "exchange", &name)?;
        if self.may_publish.len() == WRITE_CACHE {
            self.may_publish.remove(0);
        }
        self.may_publish.push(exchange.into());
        Ok(())
    }

    /// Whether the user had any topic permission on this vhost when last
    /// looked (a publish checks this first: most users have none).
    pub fn has_topic_permissions(&self) -> bool {
        self.topic.is_some()
    }

    /// The topic permission the user has on `exchange`, if any (only then
    /// does a topic check apply).
    pub fn topic_for(&mut self, users: &Users, exchange: &[u8]) -> Option<Arc<TopicPermission>> {
        self.refresh(users);
        let topic = self.topic.as_ref()?;
        let name = std::str::from_utf8(exchange).ok()?;
        topic.get(name).cloned()
    }

    /// 403 unless `t` allows `access` with `routing_key` (RabbitMQ's
    /// check_topic_access; the caller knows the exchange is a topic one).
    pub fn check_topic(
        &self,
        t: &TopicPermission,
        access: Access,
        routing_key: &[u8],
    ) -> Result<()> {
        let key = String::from_utf8_lossy(routing_key);
        if t.allows(access, &key) {
            return Ok(());
        }
        Err(ProtocolError::access_refused(format!(
            "access to topic '{key}' in exchange '{}' in vhost '{}' refused for user '{}'",
            t.exchange, self.vhost, self.user
        )))
    }

    /// 406 if a message's user_id is not the connection's user, unless the
    /// user is an impersonator (RabbitMQ's check_user_id_header).
    pub fn check_user_id(&mut self, users: &Users, user_id: &[u8]) -> Result<()> {
        self.refresh(users);
        if user_id == self.user.as_bytes() || self.impersonator {
            return Ok(());
        }
        Err(ProtocolError::precondition_failed(format!(
            "user_id property set to '{}' but authenticated user was '{}'",
            String::from_utf8_lossy(user_id),
            self.user
        )))
    }
}
