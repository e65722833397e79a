//! `Broker`: the state every connection shares: configuration, the store,
//! the vhosts (vhosts.rs), users, the open connections (connections.rs,
//! with what stream connections show: stream_clients.rs), the shovels
//! (shovels.rs), its federation (federation.rs).
//! Opening it recovers durable state from the store.

pub mod connections;
pub mod federation;
pub mod message_sizes;
pub mod policies;
mod shovels;
pub mod stream_clients;
pub mod vhosts;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::config::Config;
use crate::store::{self, Store};
use crate::vhost::{Meta, VHost};

pub use connections::Connections;

/// One admitted connection (see `Broker::admit_connection`).
pub struct ConnectionSlot(Arc<AtomicU64>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Shared broker state.
pub struct Broker {
    pub config: Config,
    pub store: Arc<Store>,
    vhosts: RwLock<HashMap<String, Arc<VHost>>>,
    /// Every open AMQP connection.
    pub connections: Arc<Connections>,
    /// Serializes policy changes (each replaces its vhost's whole set).
    policy_lock: parking_lot::Mutex<()>,
    next_connection: AtomicU64,
    /// Connections open now (past connection.open), for connection_max.
    open_connections: Arc<AtomicU64>,
    plugins: Arc<crate::plugins::Plugins>,
    /// Holds and releases messages of delayed-message exchanges.
    pub delayed: Arc<crate::delayed::Scheduler>,
    /// The raised resource alarms: while any is, publishers are blocked.
    pub alarms: Arc<crate::alarm::Alarms>,
    /// Raised while memory is over the limit.
    pub memory: Arc<crate::alarm::MemoryAlarm>,
    /// Raised while the data directory's free space is under the limit.
    pub disk: Arc<crate::alarm::DiskAlarm>,
    /// Users and their permissions.
    pub users: crate::access::Users,
    /// Queues declared, created and deleted in any vhost.
    pub queue_churn: Arc<crate::vhost::stats::QueueChurn>,
    /// The cluster this node leads, if it is a cluster member.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// The shovels it runs (shovels.rs).
    pub shovels: Arc<crate::shovel::Shovels>,
    /// Its federation links (federation.rs).
    pub federation: Arc<crate::federation::Federation>,
    /// The cluster name it announces (the `cluster_name` global parameter,
    /// else its node name), once it serves.
    cluster_name: RwLock<String>,
}

impl Broker {
    /// Opens the store in the configured data dir and recovers from it.
    pub fn open(config: Config) -> Result<Arc<Broker>, String> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| format!("cannot create {}: {e}", config.data_dir.display()))?;
        let store = Store::open(&config.data_dir, config.store_cache_mb << 20)
            .map_err(|e| format!("cannot open store in {}: {e}", config.data_dir.display()))?;
        Self::with_store(config, store, None)
    }

    /// Recovers from `store`; a cluster leader's for its term, with its
    /// `cluster`.
    pub fn with_store(
        config: Config,
        store: Arc<Store>,
        cluster: Option<Arc<crate::cluster::Cluster>>,
    ) -> Result<Arc<Broker>, String> {
        let (held, last_seq) = store
            .recover_delayed()
            .map_err(|e| format!("cannot read delayed messages: {e}"))?;
        let delayed = crate::delayed::Scheduler::new(last_seq);
        let users = crate::access::Users::open(
            Arc::clone(&store),
            &config.default_user,
            &config.default_pass,
        )
        .map_err(|e| format!("cannot read users: {e}"))?;
        // A cluster node's monitors live as long as the node (they are
        // what it reports to a leader); a single node's, as its broker.
        let monitors = match cluster.as_ref().map(|c| c.monitors()) {
            Some(m) => m,
            None => Self::monitors(&config)?,
        };
        let broker = Arc::new(Broker {
            alarms: monitors.alarms,
            memory: monitors.memory,
            disk: monitors.disk,
            users,
            config,
            delayed,
            store,
            vhosts: RwLock::new(HashMap::new()),
            connections: Arc::new(Connections::default()),
            policy_lock: parking_lot::Mutex::new(()),
            next_connection: AtomicU64::new(1),
            open_connections: Arc::new(AtomicU64::new(0)),
            plugins: Arc::new(crate::plugins::Plugins::enabled()),
            queue_churn: Arc::default(),
            cluster,
            shovels: Arc::default(),
            federation: Arc::default(),
            cluster_name: RwLock::new("warren".into()),
        });
        broker
            .recover()
            .map_err(|e| format!("recovery failed: {e}"))?;
        for (vhost, exchange) in held {
            if let Some(x) = broker.vhost(&vhost).and_then(|v| v.exchange(&exchange)) {
                x.held.fetch_add(1, Ordering::Relaxed);
            }
        }
        let releaser: std::sync::Weak<dyn crate::delayed::Release> = Arc::downgrade(&broker) as _;
        broker.delayed.start(releaser);
        Ok(broker)
    }

    /// Starts the memory and free-disk alarms `config` asks for.
    pub fn monitors(config: &Config) -> Result<crate::alarm::Monitors, String> {
        crate::alarm::Monitors::start(
            &config.data_dir,
            crate::alarm::limit_for(config.memory_limit_mb, config.memory_high_watermark),
            config.disk_free_limit.bytes(crate::alarm::total_memory())?,
        )
    }

    fn recover(&self) -> crate::vhost::error::Result<()> {
        let started = std::time::Instant::now();
        let mut defs = self.store.vhosts()?;
        if defs.is_empty() {
            // A fresh node has "/", as RabbitMQ's has.
            let meta = Meta {
                description: "Default virtual host".into(),
                default_queue_type: "classic".into(),
                ..Meta::named("/")
            };
            self.store.put_vhost(&meta.def())?;
            defs.push(meta.def());
        }
        for def in &defs {
            let vh = self.make_vhost(Meta::from_def(def));
            self.vhosts.write().insert(def.name.clone(), vh);
        }
        for p in self.store.parameters()? {
            let Some(vh) = self.vhost(&p.vhost) else {
                continue;
            };
            match p.component.as_str() {
                vhosts::LIMITS_COMPONENT => {
                    let limits = p.value.as_object().cloned().unwrap_or_default();
                    let (conns, queues) = vhosts::parse_limits(&limits)?;
                    vh.limits.set(conns, queues);
                }
                policies::POLICY | policies::OPERATOR_POLICY => self.restore_policy(&p)?,
                _ => {}
            }
        }
        // A definition that cannot be restored stops the start, naming it:
        // skipping a queue would lose its messages.
        let fail = |what: &str, name: &str, e: crate::vhost::Error| {
            crate::vhost::Error::internal(format!("{what} '{name}' cannot be restored: {}", e.text))
        };
        for def in self.store.exchanges()? {
            let Some(vh) = self.vhost(&def.vhost) else {
                self.store.delete_exchange(&def.vhost, &def.name)?;
                continue;
            };
            // E.g. a plugin type this build lacks.
            vh.restore_exchange(&def)
                .map_err(|e| fail("exchange", &def.name, e))?;
        }
        let mut messages = 0;
        let mut queues = self.store.queues()?;
        // A declare that raced the deletion of its vhost can leave a
        // record behind: it goes now (and its messages with the sweep).
        for def in queues.iter().filter(|q| self.vhost(&q.vhost).is_none()) {
            tracing::warn!(vhost = %def.vhost, queue = %def.name, "deleting a queue of a deleted vhost");
            self.store.delete_queue(&def.vhost, &def.name, def.id)?;
        }
        queues.retain(|q| self.vhost(&q.vhost).is_some());
        let live = queues.iter().map(|q| q.id).collect();
        self.store.sweep_orphans(&live)?;
        for def in queues {
            if let Some(vh) = self.vhost(&def.vhost) {
                messages += vh
                    .restore_queue(&def)
                    .map_err(|e| fail("queue", &def.name, e))?;
            }
        }
        for def in self.store.bindings()? {
            let Some(vh) = self.vhost(&def.vhost) else {
                self.store.delete_binding(&def)?;
                continue;
            };
            // A crash while an exchange was being deleted can leave its
            // bindings' records behind: they go now.
            if vh.exchange(&def.source).is_none() || !vh.has_destination(&def) {
                tracing::warn!(?def, "deleting the record of a binding to a deleted entity");
                self.store.delete_binding(&def)?;
                continue;
            }
            vh.restore_binding(&def)
                .map_err(|e| fail("binding from exchange", &def.source, e))?;
        }
        tracing::info!(
            vhosts = defs.len(),
            messages,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "recovered durable state"
        );
        Ok(())
    }

    /// The cluster name it announces to clients and federation peers.
    pub fn cluster_name(&self) -> String {
        self.cluster_name.read().clone()
    }

    /// Sets the cluster name it announces.
    pub fn set_cluster_name(&self, name: &str) {
        *self.cluster_name.write() = name.to_string();
    }

    /// The exchange types plugins provide.
    pub fn plugins(&self) -> &crate::plugins::Plugins {
        &self.plugins
    }

    /// The vhost called `name`.
    pub fn vhost(&self, name: &str) -> Option<Arc<VHost>> {
        self.vhosts.read().get(name).cloned()
    }

    /// Admits one more open connection, or None when `connection_max` is
    /// reached; the slot is given back when the returned guard is dropped.
    pub fn admit_connection(&self) -> Option<ConnectionSlot> {
        let max = self.config.connection_max;
        let n = self.open_connections.fetch_add(1, Ordering::AcqRel);
        let slot = ConnectionSlot(Arc::clone(&self.open_connections));
        if max != 0 && n >= max {
            return None;
        }
        Some(slot)
    }

    /// A fresh connection id.
    pub fn next_connection_id(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }

    /// Checks a login against the recorded users. Loopback-only users are
    /// refused from other addresses.
    pub fn authenticate(&self, user: &str, password: &str, peer: IpAddr) -> bool {
        let known = self.users.authenticate(user, password).is_some();
        let loopback_ok =
            !self.config.loopback_users.iter().any(|u| u == user) || peer.is_loopback();
        known && loopback_ok
    }

    /// Whether `user`, named by a verified client certificate (SASL
    /// EXTERNAL), may log in: the user must exist (with or without a
    /// password); loopback_users apply as to every login.
    pub fn authenticate_external(&self, user: &str, peer: IpAddr) -> bool {
        let known = self.users.get(user).is_some();
        let loopback_ok =
            !self.config.loopback_users.iter().any(|u| u == user) || peer.is_loopback();
        known && loopback_ok
    }

    /// Whether `user` may open a connection to `vhost` (any permission on
    /// it, as in RabbitMQ).
    pub fn may_open(&self, user: &str, vhost: &str) -> bool {
        self.users.permission(user, vhost).is_some()
    }

    /// Deletes a user, its permissions, and closes its connections with
    /// 320 ("user 'u' is deleted", as RabbitMQ).
    pub fn delete_user(&self, name: &str) -> Result<(), crate::access::Error> {
        self.users.delete_user(name)?;
        self.connections
            .close_user(name, &format!("user '{name}' is deleted"));
        Ok(())
    }

    /// Flushes the store (shutdown).
    pub fn flush(&self) -> store::Result<()> {
        self.store.flush_now()
    }
}

/// Delayed messages that are due go back through their vhost.
impl crate::delayed::Release for Broker {
    fn store(&self) -> &Store {
        &self.store
    }

    fn release(&self, vhost: &str, delay_ms: u64, msg: crate::message::Message) {
        if let Some(vh) = self.vhost(vhost) {
            vh.release_held(delay_ms, msg);
        }
    }
}
