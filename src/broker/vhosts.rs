//! Vhosts and their limits, node-wide: add (or update), delete (its
//! connections closed with 320 first, then everything in it, durably),
//! and the max-connections / max-queues limits, kept as RabbitMQ keeps
//! them: the runtime parameter "vhost-limits" / "limits" of the vhost.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::Broker;
use crate::store::ParameterDef;
use crate::vhost::{self, Meta, VHost};

/// The component and name RabbitMQ keeps vhost limits under.
pub const LIMITS_COMPONENT: &str = "vhost-limits";
const LIMITS_NAME: &str = "limits";
/// The limits a vhost may have.
pub const LIMIT_KEYS: [&str; 2] = ["max-connections", "max-queues"];

impl Broker {
    /// Every vhost, by name.
    pub fn vhosts(&self) -> Vec<Arc<VHost>> {
        let mut all: Vec<_> = self.vhosts.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    pub(super) fn make_vhost(&self, meta: Meta) -> Arc<VHost> {
        let max = self.config.vhost_max_queues;
        VHost::new(
            meta,
            Arc::clone(&self.store),
            Arc::clone(&self.plugins),
            Arc::clone(&self.delayed),
            (max != 0).then_some(max),
            Arc::clone(&self.queue_churn),
        )
    }

    /// Adds a vhost, or updates the description, tags and default queue
    /// type of the one of that name. True if it was added.
    pub fn put_vhost(&self, meta: Meta) -> vhost::error::Result<bool> {
        if meta.name.is_empty() {
            return Err(vhost::Error::precondition_failed("a vhost needs a name"));
        }
        // One writer at a time, so two adds of one name make one vhost.
        let mut vhosts = self.vhosts.write();
        if let Some(vh) = vhosts.get(&meta.name) {
            vh.set_meta(meta)?;
            return Ok(false);
        }
        self.store.put_vhost(&meta.def())?;
        let vh = self.make_vhost(meta);
        vhosts.insert(vh.name.clone(), vh);
        Ok(true)
    }

    /// Deletes a vhost: new connections to it are refused, open ones are
    /// closed with 320 ("vhost 'x' is deleted", as RabbitMQ), then
    /// everything in it goes in one store operation. False if there was
    /// no such vhost.
    pub fn delete_vhost(&self, name: &str) -> vhost::error::Result<bool> {
        // The map stays locked until everything under the name is gone, so
        // a vhost made again with it cannot be caught by this deletion.
        let mut vhosts = self.vhosts.write();
        let Some(vh) = vhosts.remove(name) else {
            return Ok(false);
        };
        let closed = self
            .connections
            .close_vhost(name, &format!("vhost '{name}' is deleted"));
        let messages = vh.close()?;
        self.users.forget_vhost(name);
        self.shovels.stop_vhost(name);
        drop(vhosts);
        // Outside the map's lock: federation looks vhosts up under its own.
        // A vhost of the same name made meanwhile gets its links back at
        // the next look.
        self.federation.stop_vhost(name);
        self.federation.changed(name);
        tracing::info!(
            vhost = name,
            connections = closed,
            messages,
            "vhost deleted"
        );
        Ok(true)
    }

    /// Sets (Some) or clears (None) one limit of `vhost`, "max-connections"
    /// or "max-queues"; a negative value is no limit, as in RabbitMQ.
    pub fn set_vhost_limit(
        &self,
        vhost: &str,
        key: &str,
        value: Option<i64>,
    ) -> vhost::error::Result<()> {
        let vh = self
            .vhost(vhost)
            .ok_or_else(|| vhost::Error::not_found(format!("no vhost '{vhost}'")))?;
        if !LIMIT_KEYS.contains(&key) {
            return Err(vhost::Error::precondition_failed(format!(
                "unknown vhost limit '{key}'"
            )));
        }
        let mut limits = vhost_limits(&vh);
        match value {
            Some(v) => limits.insert(key.into(), v.into()),
            None => limits.remove(key),
        };
        self.set_vhost_limits(&vh, limits)
    }

    /// Replaces every limit of `vh` with `limits` (what RabbitMQ's
    /// set_vhost_limits does), durably.
    pub fn set_vhost_limits(
        &self,
        vh: &VHost,
        limits: Map<String, Value>,
    ) -> vhost::error::Result<()> {
        let (conns, queues) = parse_limits(&limits)?;
        if limits.is_empty() {
            self.store
                .delete_parameter(&vh.name, LIMITS_COMPONENT, LIMITS_NAME)?;
        } else {
            self.store.put_parameter(&ParameterDef {
                vhost: vh.name.clone(),
                component: LIMITS_COMPONENT.into(),
                name: LIMITS_NAME.into(),
                value: Value::Object(limits),
            })?;
        }
        vh.limits.set(conns, queues);
        Ok(())
    }
}

/// max-connections and max-queues from a limits value; anything else in
/// it is refused.
pub fn parse_limits(
    limits: &Map<String, Value>,
) -> vhost::error::Result<(Option<i64>, Option<i64>)> {
    if let Some(k) = limits.keys().find(|k| !LIMIT_KEYS.contains(&k.as_str())) {
        return Err(vhost::Error::precondition_failed(format!(
            "unknown vhost limit '{k}'"
        )));
    }
    let int = |k: &str| -> vhost::error::Result<Option<i64>> {
        match limits.get(k) {
            None => Ok(None),
            Some(v) => v.as_i64().map(Some).ok_or_else(|| {
                vhost::Error::precondition_failed(format!(
                    "vhost limit '{k}' must be an integer, not {v}"
                ))
            }),
        }
    };
    Ok((int("max-connections")?, int("max-queues")?))
}

/// `vh`'s limits as RabbitMQ shows them ({"max-connections": 10, ...}).
pub fn vhost_limits(vh: &VHost) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(n) = vh.limits.max_connections() {
        m.insert("max-connections".into(), n.into());
    }
    if let Some(n) = vh.limits.max_queues() {
        m.insert("max-queues".into(), n.into());
    }
    m
}
