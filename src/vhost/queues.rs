//! Queues of a vhost: `queue.declare` (reserved names, the queue limit,
//! argument validation, equivalence with one already declared; a durable
//! queue's id comes from the store), exclusivity, delete, and restoring
//! durable queues and their messages at start.

use std::sync::Arc;

use amq_protocol::types::FieldTable;

use super::bindings::Topology;
use super::equivalence::{self, Mismatch};
use super::error::{Error, Result};
use super::{Destination, VHost};
use crate::queue::kind::{self, Declared, Kind};
use crate::queue::{Deleted, Queue, QueueConfig};
use crate::store::op::TRACKED_OFFSETS;
use crate::store::QueueDef;

/// What `queue.declare` asks for.
#[derive(Debug, Clone)]
pub struct QueueSpec {
    pub name: String,
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    pub arguments: FieldTable,
    /// The broker chose the name (`amq.gen-...`): the reserved prefix is ours.
    pub server_named: bool,
}

impl QueueSpec {
    /// What the queue-type checks look at.
    pub fn declared(&self) -> Declared<'_> {
        Declared {
            durable: self.durable,
            exclusive: self.exclusive,
            auto_delete: self.auto_delete,
            server_named: self.server_named,
            arguments: &self.arguments,
        }
    }
}

impl VHost {
    /// `queue.declare`. Returns the queue.
    pub fn declare_queue(
        &self,
        spec: &QueueSpec,
        passive: bool,
        conn_id: u64,
    ) -> Result<Arc<Queue>> {
        let q = self.declare_queue_inner(spec, passive, conn_id)?;
        if !passive {
            self.churn.declared();
        }
        Ok(q)
    }

    fn declare_queue_inner(
        &self,
        spec: &QueueSpec,
        passive: bool,
        conn_id: u64,
    ) -> Result<Arc<Queue>> {
        if passive {
            let q = self.queue(&spec.name).ok_or_else(|| {
                Error::not_found(format!("no {}", self.describe("queue", &spec.name)))
            })?;
            self.check_exclusive(&q, conn_id)?;
            return Ok(q);
        }
        // Check, id allocation and the stored definition happen as one, or
        // two racing declares of a new durable queue could store different
        // ids than the one in use (its messages lost at the next start).
        let _topology = self.lock_topology()?;
        // RabbitMQ refuses the reserved prefix before looking the name up,
        // so even an existing amq.gen- queue cannot be redeclared by name.
        if spec.name.starts_with("amq.") && !spec.server_named {
            return Err(Error::access_refused(format!(
                "queue name '{}' contains reserved prefix 'amq.*'",
                spec.name
            )));
        }
        if let Some(q) = self.queue(&spec.name) {
            self.check_exclusive(&q, conn_id)?;
            let subject = self.describe("queue", &spec.name);
            match equivalence::queue(spec, &q.config, &subject) {
                Ok(()) => {}
                Err(Mismatch::Exclusive) => return Err(self.locked(&spec.name)),
                Err(Mismatch::Field(text)) => return Err(Error::precondition_failed(text)),
            }
            q.touch();
            return Ok(q);
        }
        if let Some(max) = self
            .limits
            .queue_limit()
            .filter(|&max| self.queues.read().len() as u64 >= max)
        {
            return Err(Error::precondition_failed(format!(
                "cannot declare queue '{}': queue limit in vhost '{}' ({max}) is reached",
                spec.name, self.name
            )));
        }
        crate::queue::args::validate(&spec.arguments, &self.describe("queue", &spec.name))
            .map_err(Error::precondition_failed)?;
        kind::check_declare(
            Kind::of(&spec.arguments),
            spec.declared(),
            &self.describe("queue", &spec.name),
        )
        .map_err(Error::precondition_failed)?;
        if Kind::of(&spec.arguments) == Kind::Stream && self.store.delivers_after_commit() {
            // A stream's tracked offsets need every member to apply them.
            let at = self.store.cluster_version()?;
            if at < TRACKED_OFFSETS {
                return Err(Error::precondition_failed(format!(
                    "cannot declare {}: streams need cluster version {TRACKED_OFFSETS}; the \
                     cluster is at {at} until every member runs a build that applies it",
                    self.describe("queue", &spec.name)
                )));
            }
        }
        // RabbitMQ makes exclusive queues transient whatever the flag says:
        // they die with their connection, so they are never stored.
        let stored = spec.durable && !spec.exclusive;
        // Checked before the definition is stored.
        let dedup =
            self.check_dedup(&spec.arguments, stored, &self.describe("queue", &spec.name))?;
        // The id comes from the store's applied state (see store/op.rs).
        let store_id = if stored {
            self.store.declare_queue(&QueueDef {
                vhost: self.name.clone(),
                name: spec.name.clone(),
                id: 0,
                auto_delete: spec.auto_delete,
                arguments: spec.arguments.clone(),
            })?
        } else {
            0
        };
        let config = QueueConfig {
            name: spec.name.clone(),
            vhost: self.name.clone(),
            durable: stored,
            exclusive_owner: spec.exclusive.then_some(conn_id),
            auto_delete: spec.auto_delete,
            arguments: spec.arguments.clone(),
            store_id,
        };
        let owner = (store_id != 0).then(|| crate::store::dedup::queue_owner(store_id));
        let dedup = self.new_dedup(dedup, owner)?;
        let mut queues = self.queues.write();
        if let Some(q) = queues.get(&spec.name) {
            return Ok(Arc::clone(q));
        }
        let q = Queue::new(config, Arc::clone(&self.store), self.me.clone());
        if let Some(d) = dedup {
            q.set_dedup(d);
        }
        self.apply_to_queue(&self.policies(), &q);
        queues.insert(spec.name.clone(), Arc::clone(&q));
        self.churn.created();
        Ok(q)
    }

    pub(super) fn locked(&self, name: &str) -> Error {
        locked(&self.describe("queue", name))
    }

    /// 405 unless the queue is non-exclusive or owned by `conn_id`.
    pub fn check_exclusive(&self, q: &Queue, conn_id: u64) -> Result<()> {
        match q.config.exclusive_owner {
            Some(owner) if owner != conn_id => Err(self.locked(q.name())),
            _ => Ok(()),
        }
    }

    /// The queue `name`, usable by connection `conn_id`, or 404 / 405.
    pub fn queue_for(&self, name: &str, conn_id: u64) -> Result<Arc<Queue>> {
        let q = self
            .queue(name)
            .ok_or_else(|| Error::not_found(format!("no {}", self.describe("queue", name))))?;
        self.check_exclusive(&q, conn_id)?;
        Ok(q)
    }

    /// `queue.delete`. A missing queue deletes nothing and is not an error
    /// (RabbitMQ 3.x): then None.
    pub fn delete_queue(
        &self,
        name: &str,
        if_unused: bool,
        if_empty: bool,
        conn_id: u64,
    ) -> Result<Option<Deleted>> {
        let mut topology = self.lock_topology()?;
        let Some(q) = self.queue(name) else {
            return Ok(None);
        };
        self.check_exclusive(&q, conn_id)?;
        if if_unused && q.consumer_count() > 0 {
            return Err(Error::precondition_failed(format!(
                "{} in use",
                self.describe("queue", name)
            )));
        }
        if if_empty && q.message_count() > 0 {
            return Err(Error::precondition_failed(format!(
                "{} not empty",
                self.describe("queue", name)
            )));
        }
        self.remove_queue_locked(&mut topology, &q)
    }

    /// Removes a queue from the vhost, its bindings and its stored state;
    /// None if it was already gone.
    pub fn remove_queue(&self, q: &Arc<Queue>) -> Result<Option<Deleted>> {
        let mut topology = self.topology_even_closed();
        if self.is_closed() {
            return Ok(None);
        }
        self.remove_queue_locked(&mut topology, q)
    }

    fn remove_queue_locked(
        &self,
        topology: &mut Topology,
        q: &Arc<Queue>,
    ) -> Result<Option<Deleted>> {
        {
            let mut queues = self.queues.write();
            match queues.get(q.name()) {
                Some(cur) if Arc::ptr_eq(cur, q) => {
                    queues.remove(q.name());
                }
                _ => return Ok(None),
            }
        }
        let deleted = q.delete();
        self.churn.deleted(1);
        self.unbind_everywhere_locked(topology, &Destination::Queue(Arc::clone(q)))?;
        if q.config.store_id != 0 {
            self.store
                .delete_queue(&self.name, q.name(), q.config.store_id)?;
        }
        Ok(Some(deleted))
    }

    /// Recreates a durable queue and its messages from the store (startup).
    pub fn restore_queue(&self, def: &QueueDef) -> Result<usize> {
        let q = Queue::new(
            QueueConfig {
                name: def.name.clone(),
                vhost: self.name.clone(),
                durable: true,
                exclusive_owner: None,
                auto_delete: def.auto_delete,
                arguments: def.arguments.clone(),
                store_id: def.id,
            },
            Arc::clone(&self.store),
            self.me.clone(),
        );
        let owner = crate::store::dedup::queue_owner(def.id);
        let subject = self.describe("queue", &def.name);
        if let Some(d) = self.restore_dedup(&def.arguments, owner, &subject)? {
            q.set_dedup(d);
        }
        self.apply_to_queue(&self.policies(), &q);
        let n = q.recover()?;
        self.queues.write().insert(def.name.clone(), q);
        Ok(n)
    }
}

/// 405 RESOURCE_LOCKED for `subject` ("queue 'q' in vhost '/'"), another
/// connection's exclusive queue, in RabbitMQ's words.
pub(super) fn locked(subject: &str) -> Error {
    Error::resource_locked(format!(
        "cannot obtain exclusive access to locked {subject}. It could be originally declared on \
         another connection or the exclusive property value does not match that of the original \
         declaration."
    ))
}
