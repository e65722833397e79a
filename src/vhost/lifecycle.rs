//! What a vhost is beside its entities: its description, tags and default
//! queue type (as RabbitMQ shows them), its limits (max-connections,
//! max-queues), and its end: `close` deletes everything in it, durably in
//! one store operation, and refuses every declare and bind after.

use std::sync::atomic::{AtomicI64, Ordering};

use super::error::{Error, Result};
use super::VHost;
use crate::store::VhostDef;

/// The topology lock held: when it is let go, whatever changed under it
/// is told to the vhost's watchers (`VHost::changes`).
pub(super) struct TopologyGuard<'a> {
    guard: parking_lot::MutexGuard<'a, super::bindings::Topology>,
    changes: &'a tokio::sync::watch::Sender<u64>,
}

impl std::ops::Deref for TopologyGuard<'_> {
    type Target = super::bindings::Topology;
    fn deref(&self) -> &Self::Target {
        &self.guard
    }
}

impl std::ops::DerefMut for TopologyGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.guard
    }
}

impl Drop for TopologyGuard<'_> {
    fn drop(&mut self) {
        // Still under the lock: a watcher woken now reads what changed.
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A vhost's description, tags and default queue type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Meta {
    pub name: String,
    pub description: String,
    pub tags: Vec<String>,
    pub default_queue_type: String,
}

impl Meta {
    /// A vhost called `name` with nothing else set.
    pub fn named(name: &str) -> Meta {
        Meta {
            name: name.to_string(),
            ..Meta::default()
        }
    }

    /// The record the store keeps.
    pub fn def(&self) -> VhostDef {
        VhostDef {
            name: self.name.clone(),
            description: self.description.clone(),
            tags: self.tags.clone(),
            default_queue_type: self.default_queue_type.clone(),
        }
    }

    /// From the store's record.
    pub fn from_def(def: &VhostDef) -> Meta {
        Meta {
            name: def.name.clone(),
            description: def.description.clone(),
            tags: def.tags.clone(),
            default_queue_type: def.default_queue_type.clone(),
        }
    }
}

/// A vhost's limits; negative means none (as RabbitMQ's -1), 0 allows none.
pub struct Limits {
    max_connections: AtomicI64,
    max_queues: AtomicI64,
    /// The node's queue limit, in force while the vhost sets none.
    node_max_queues: i64,
}

impl Limits {
    pub(super) fn new(node_max_queues: Option<u64>) -> Limits {
        let node = node_max_queues.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
        Limits {
            max_connections: AtomicI64::new(-1),
            max_queues: AtomicI64::new(-1),
            node_max_queues: node,
        }
    }

    /// Sets both (None: no limit).
    pub fn set(&self, max_connections: Option<i64>, max_queues: Option<i64>) {
        self.max_connections
            .store(max_connections.unwrap_or(-1), Ordering::Relaxed);
        self.max_queues
            .store(max_queues.unwrap_or(-1), Ordering::Relaxed);
    }

    /// The vhost's own max-connections, if set.
    pub fn max_connections(&self) -> Option<u64> {
        u64::try_from(self.max_connections.load(Ordering::Relaxed)).ok()
    }

    /// The vhost's own max-queues, if set.
    pub fn max_queues(&self) -> Option<u64> {
        u64::try_from(self.max_queues.load(Ordering::Relaxed)).ok()
    }

    /// The queue limit in force: the vhost's, else the node's.
    pub(super) fn queue_limit(&self) -> Option<u64> {
        self.max_queues()
            .or_else(|| u64::try_from(self.node_max_queues).ok())
    }
}

impl VHost {
    /// Its description, tags and default queue type.
    pub fn meta(&self) -> Meta {
        self.meta.read().clone()
    }

    /// Replaces description, tags and default queue type (durably).
    pub fn set_meta(&self, meta: Meta) -> Result<()> {
        let _topology = self.lock_topology()?;
        self.store.put_vhost(&meta.def())?;
        *self.meta.write() = meta;
        Ok(())
    }

    /// Whether the vhost was deleted.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The topology lock, unless the vhost was deleted.
    pub(super) fn lock_topology(&self) -> Result<TopologyGuard<'_>> {
        let guard = self.topology_even_closed();
        if self.is_closed() {
            return Err(Error::gone(format!("vhost '{}' is deleted", self.name)));
        }
        Ok(guard)
    }

    /// The topology lock, the vhost deleted or not.
    pub(super) fn topology_even_closed(&self) -> TopologyGuard<'_> {
        TopologyGuard {
            guard: self.topology.lock(),
            changes: &self.changes,
        }
    }

    /// Ticks after every change to the vhost's exchanges, queues or
    /// bindings (what federation links watch for their exchange's
    /// bindings).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Deletes the vhost and everything in it: one store operation takes
    /// every record under it (exchanges, queues and their messages,
    /// bindings, permissions, parameters, held delayed messages); in
    /// memory, queues are emptied and their consumers cancelled. After
    /// this, declares and binds are refused. Returns how many messages
    /// went with the queues.
    pub fn close(&self) -> Result<u64> {
        let _topology = self.lock_topology()?;
        self.closed.store(true, Ordering::Release);
        // Nothing of their caches is written after the deletion.
        for q in self.queues.read().values() {
            if let Some(d) = q.dedup() {
                d.close();
            }
        }
        for d in self
            .exchanges
            .read()
            .values()
            .filter_map(|x| x.dedup.as_ref())
        {
            d.close();
        }
        self.store.delete_vhost(&self.name)?;
        let queues: Vec<_> = self.queues.write().drain().map(|(_, q)| q).collect();
        self.churn.deleted(queues.len() as u64);
        let mut messages = 0u64;
        for q in queues {
            messages += q.delete().count as u64;
        }
        self.exchanges.write().clear();
        Ok(messages)
    }
}
