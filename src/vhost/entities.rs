//! The exchange record a vhost keeps, and `Destination`, what a binding
//! points at. Destinations compare by identity (the `Arc`), so two queues
//! that once had the same name are never confused.

use std::hash::{Hash, Hasher};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use amq_protocol::types::FieldTable;
use parking_lot::RwLock;

use super::table::Table;
use crate::exchange::ExchangeKind;
use crate::queue::Queue;

/// An exchange in a vhost.
pub struct Exchange {
    pub name: String,
    /// The built-in type, or None for a plugin's type.
    pub kind: Option<ExchangeKind>,
    /// The type name as declared ("topic", "x-consistent-hash").
    pub type_name: String,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    /// The `alternate-exchange` argument.
    pub alternate: Option<String>,
    /// What its policy says (policies.rs).
    pub policy: RwLock<ExchangePolicy>,
    /// Its bindings (read per publish, written on bind/unbind).
    pub bindings: RwLock<Table>,
    /// Set once it had a binding (auto-delete applies only after that).
    pub ever_bound: AtomicBool,
    /// The plugin providing its type, if any.
    pub plugin: Option<Arc<dyn warren_plugin_api::ExchangeType>>,
    /// Messages held for it (delayed-message exchanges).
    pub held: std::sync::atomic::AtomicU64,
    /// Messages in and out (stats.rs).
    pub stats: Arc<super::stats::ExchangeStats>,
    /// Its deduplication cache (`x-message-deduplication`).
    pub dedup: Option<Arc<crate::dedup::Dedup>>,
}

/// The policy that applies to an exchange.
#[derive(Debug, Default, Clone)]
pub struct ExchangePolicy {
    /// Its name.
    pub name: Option<String>,
    /// Its alternate-exchange (the argument wins over it).
    pub alternate: Option<String>,
}

impl Exchange {
    /// Looks up the alternate exchange in force (the argument's, else the
    /// policy's) with `lookup`, without copying its name.
    pub fn with_alternate<T>(&self, lookup: impl FnOnce(&str) -> Option<T>) -> Option<T> {
        if let Some(name) = self.alternate.as_deref() {
            return lookup(name);
        }
        let policy = self.policy.read();
        policy.alternate.as_deref().and_then(lookup)
    }

    /// How many messages it holds (delayed-message exchanges).
    pub fn held_count(&self) -> u64 {
        self.held.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Exchange {
    /// Whether this is one of the exchanges every vhost has.
    pub fn is_builtin(&self) -> bool {
        self.name.is_empty() || self.name.starts_with("amq.")
    }
}

/// What a binding routes to.
#[derive(Clone)]
pub enum Destination {
    Queue(Arc<Queue>),
    Exchange(Arc<Exchange>),
}

impl Destination {
    /// Name of the queue or exchange.
    pub fn name(&self) -> &str {
        match self {
            Destination::Queue(q) => q.name(),
            Destination::Exchange(x) => &x.name,
        }
    }

    fn addr(&self) -> usize {
        match self {
            Destination::Queue(q) => Arc::as_ptr(q) as *const u8 as usize,
            Destination::Exchange(x) => Arc::as_ptr(x) as *const u8 as usize,
        }
    }
}

impl PartialEq for Destination {
    fn eq(&self, other: &Self) -> bool {
        self.addr() == other.addr()
    }
}

impl Eq for Destination {}

impl Hash for Destination {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.addr().hash(state);
    }
}
