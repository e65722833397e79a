//! A virtual host: the registries of its exchanges and queues, the
//! declare / bind / delete operations on them (with RabbitMQ's checks and
//! reply texts), and `route`, the entry point of every publish.

mod bindings;
pub mod checks;
mod dedup;
mod entities;
mod equivalence;
pub mod error;
mod exchanges;
mod host;
mod lifecycle;
pub mod policies;
mod queues;
pub mod routing;
pub mod stats;
mod table;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use amq_protocol::types::FieldTable;
use parking_lot::RwLock;

pub use entities::{Destination, Exchange, ExchangePolicy};
pub use error::Error;
pub use exchanges::ExchangeSpec;
pub use lifecycle::{Limits, Meta};
pub use queues::QueueSpec;
pub use table::Table;

use crate::exchange::{Bindings, ExchangeKind};
use crate::queue::Queue;
use crate::store::Store;

/// A virtual host.
pub struct VHost {
    pub name: String,
    /// Itself, for the queues it creates (dead-lettering, x-expires).
    me: std::sync::Weak<VHost>,
    /// Exchange types from plugins.
    plugins: Arc<crate::plugins::Plugins>,
    /// Where delayed-message exchanges hold messages.
    delayed: Arc<crate::delayed::Scheduler>,
    /// Every change to exchanges, queues and bindings (and their stored
    /// definitions) runs under this lock, and it guards the reverse index
    /// of bindings (bindings.rs). Publishers never take it.
    topology: parking_lot::Mutex<bindings::Topology>,
    store: Arc<Store>,
    /// What RabbitMQ shows of a vhost (lifecycle.rs).
    meta: RwLock<Meta>,
    /// Its max-connections and max-queues.
    pub limits: Limits,
    /// Set (under the topology lock) once the vhost is deleted: nothing is
    /// declared or bound in it after that.
    closed: AtomicBool,
    /// Its policies and operator policies (policies.rs).
    policies: RwLock<Arc<crate::policy::Policies>>,
    exchanges: RwLock<HashMap<String, Arc<Exchange>>>,
    queues: RwLock<HashMap<String, Arc<Queue>>>,
    /// The default exchange's counters (routing counts them without
    /// looking the exchange up).
    default_stats: Arc<stats::ExchangeStats>,
    /// The node's queue churn counters.
    churn: Arc<stats::QueueChurn>,
    /// Ticks after each topology change (lifecycle.rs).
    changes: tokio::sync::watch::Sender<u64>,
}

impl VHost {
    /// A vhost with the default exchange and the `amq.*` exchanges;
    /// `max_queues` is the node's default queue limit (None: no limit),
    /// which the vhost's own max-queues replaces.
    pub fn new(
        meta: Meta,
        store: Arc<Store>,
        plugins: Arc<crate::plugins::Plugins>,
        delayed: Arc<crate::delayed::Scheduler>,
        max_queues: Option<u64>,
        churn: Arc<stats::QueueChurn>,
    ) -> Arc<VHost> {
        Arc::new_cyclic(|me| {
            Self::build(meta, store, plugins, delayed, max_queues, churn, me.clone())
        })
    }

    fn build(
        meta: Meta,
        store: Arc<Store>,
        plugins: Arc<crate::plugins::Plugins>,
        delayed: Arc<crate::delayed::Scheduler>,
        max_queues: Option<u64>,
        churn: Arc<stats::QueueChurn>,
        me: std::sync::Weak<VHost>,
    ) -> VHost {
        let vh = VHost {
            name: meta.name.clone(),
            me,
            plugins,
            delayed,
            topology: parking_lot::Mutex::new(bindings::Topology::default()),
            store,
            meta: RwLock::new(meta),
            limits: Limits::new(max_queues),
            closed: AtomicBool::new(false),
            policies: RwLock::default(),
            exchanges: RwLock::new(HashMap::new()),
            queues: RwLock::new(HashMap::new()),
            default_stats: Default::default(),
            churn,
            changes: tokio::sync::watch::Sender::new(0),
        };
        for (name, kind) in [
            ("", ExchangeKind::Direct),
            ("amq.direct", ExchangeKind::Direct),
            ("amq.fanout", ExchangeKind::Fanout),
            ("amq.topic", ExchangeKind::Topic),
            ("amq.headers", ExchangeKind::Headers),
            ("amq.match", ExchangeKind::Headers),
            ("amq.rabbitmq.trace", ExchangeKind::Topic),
        ] {
            vh.insert_exchange(Exchange {
                name: name.to_string(),
                kind: Some(kind),
                type_name: kind.as_str().to_string(),
                durable: true,
                auto_delete: false,
                // RabbitMQ's firehose exchange is internal.
                internal: name == "amq.rabbitmq.trace",
                arguments: FieldTable::default(),
                alternate: None,
                policy: Default::default(),
                bindings: RwLock::new(Table::Builtin(Bindings::new(kind))),
                ever_bound: AtomicBool::new(false),
                plugin: None,
                held: Default::default(),
                stats: if name.is_empty() {
                    Arc::clone(&vh.default_stats)
                } else {
                    Default::default()
                },
                dedup: None,
            });
        }
        vh
    }

    fn insert_exchange(&self, x: Exchange) -> Arc<Exchange> {
        let x = Arc::new(x);
        self.exchanges
            .write()
            .insert(x.name.clone(), Arc::clone(&x));
        x
    }

    /// The exchange called `name`.
    pub fn exchange(&self, name: &str) -> Option<Arc<Exchange>> {
        self.exchanges.read().get(name).cloned()
    }

    /// The queue called `name`.
    pub fn queue(&self, name: &str) -> Option<Arc<Queue>> {
        self.queues.read().get(name).cloned()
    }

    /// Every queue (for recovery and listing).
    pub fn queues(&self) -> Vec<Arc<Queue>> {
        self.queues.read().values().cloned().collect()
    }

    /// Every exchange.
    pub fn exchanges(&self) -> Vec<Arc<Exchange>> {
        self.exchanges.read().values().cloned().collect()
    }

    /// `"exchange 'x' in vhost '/'"`, RabbitMQ's way of naming a resource.
    pub fn describe(&self, kind: &str, name: &str) -> String {
        format!("{kind} '{name}' in vhost '{}'", self.name)
    }
}
