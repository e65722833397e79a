//! A cluster node (`--node-id`): Raft runs for the node's whole life; the
//! broker runs only while this node leads. Leading a term, it recovers a
//! broker from the applied state (everything committed before the term)
//! with the term's journal, binds the usual listeners and serves, also
//! serving the clients followers proxy to it. When the term ends (another
//! node leads, or this one stepped down) it closes every connection with
//! 320 CONNECTION_FORCED, forgets what it staged and follows: its AMQP
//! port then carries each client to the leader (cluster/proxy.rs).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::follow::Listeners;
use super::follow_reads::Reads;
use super::Server;
use crate::broker::Broker;
use crate::cluster::{Cluster, Role};
use crate::config::Config;
use crate::store::raft::Replica;

/// How often a term's broker checks that its journal still commits.
const JOURNAL_CHECK: Duration = Duration::from_millis(100);

/// A running cluster node.
pub struct ClusterNode {
    /// Its membership.
    pub cluster: Arc<Cluster>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    tls: TlsInForce,
}

/// The TLS configurations of the listeners open now.
type TlsInForce = Arc<parking_lot::Mutex<Vec<Arc<crate::tls::Tls>>>>;

impl ClusterNode {
    /// Opens the node's state, starts Raft and the role loop.
    pub async fn start(config: Config) -> Result<ClusterNode, String> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| format!("cannot create {}: {e}", config.data_dir.display()))?;
        let mut replica = Replica::open(&config.data_dir, config.store_cache_mb << 20)
            .map_err(|e| format!("cannot open store in {}: {e}", config.data_dir.display()))?;
        // A newer build raised the cluster version past what this one
        // applies: following its log would meet operations this build
        // cannot apply.
        let version = replica
            .cluster_version()
            .map_err(|e| format!("cannot read the cluster version: {e}"))?;
        if version > crate::store::op::LEVEL {
            return Err(format!(
                "this data is at cluster version {version}; this build applies up to {}: \
                 run the newer build",
                crate::store::op::LEVEL
            ));
        }
        let machine = replica
            .take_machine()
            .ok_or_else(|| "the state machine is taken".to_string())?;
        // Mutual TLS between members when [tls] has a certificate, its
        // key and a CA.
        let tls = match (
            &config.tls.certfile,
            &config.tls.keyfile,
            &config.tls.cacertfile,
        ) {
            (Some(_), Some(_), Some(_)) => Some(crate::cluster::LinkTls::new(
                crate::tls::cluster::cluster(&config.tls)?,
            )),
            _ => None,
        };
        // The node's own alarms watch its memory and disk whether it
        // leads or follows (a leader asks the members: cluster/resources.rs).
        let monitors = Broker::monitors(&config)?;
        let cluster = Cluster::start(
            &config.cluster,
            config.bind,
            &config.data_dir,
            tls,
            replica.log.clone(),
            machine,
            monitors,
        )
        .await?;
        let (stop, stop_rx) = watch::channel(false);
        let tls = TlsInForce::default();
        let task = tokio::spawn(run(
            config,
            replica,
            Arc::clone(&cluster),
            Arc::clone(&tls),
            stop_rx,
        ));
        Ok(ClusterNode {
            cluster,
            stop,
            task,
            tls,
        })
    }

    /// Reads the TLS certificate files of the listeners in force again
    /// (SIGHUP): the broker's while leading, the carrying ones while
    /// following.
    pub fn reload_tls(&self) -> Result<(), String> {
        let tls = self.tls.lock().clone();
        crate::tls::reload_all(&tls)
    }

    /// Waits until Raft stops on a fatal error (the log or the state
    /// machine failed, e.g. an entry that cannot be applied) and says why.
    pub async fn failed(&self) -> String {
        let mut metrics = self.cluster.raft.metrics();
        loop {
            if let Err(e) = &metrics.borrow_and_update().running_state {
                return e.to_string();
            }
            if metrics.changed().await.is_err() {
                return "Raft stopped".into();
            }
        }
    }

    /// Stops serving (closing connections with 320 if leading), then Raft.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.cluster.shutdown().await;
        info!("cluster node stopped");
    }
}

async fn run(
    mut config: Config,
    replica: Replica,
    cluster: Arc<Cluster>,
    tls: TlsInForce,
    mut stop: watch::Receiver<bool>,
) {
    let mut role = cluster.role();
    loop {
        if *stop.borrow() {
            return;
        }
        let now = *role.borrow_and_update();
        match now {
            Role::Leader { term } => {
                // openraft keeps a leader that stepped down leader of its
                // term, so this term may have had a broker here already:
                // its entries must be applied before a new one reads the
                // applied state (its queues, queue ids and hold keys).
                if !applied_all(&replica, &cluster, &mut role, now).await {
                    continue;
                }
                match lead(&config, &replica, &cluster).await {
                    Ok(server) => {
                        info!(term, "leading: serving clients");
                        // load_definitions is imported once per start of
                        // this node (as RabbitMQ imports it at boot), not
                        // at every term it leads.
                        config.load_definitions = None;
                        if let Some(a) = server.accepted() {
                            cluster.set_handler(Some(Arc::new(move |s, h| a.serve(s, h))));
                        }
                        *tls.lock() = server.tls_in_force();
                        let raising = tokio::spawn(raise_version(
                            Arc::clone(&cluster),
                            Arc::clone(&server.broker.store),
                        ));
                        // Members' alarms block publishers here too.
                        let watching = tokio::spawn(Arc::clone(&cluster).watch_members());
                        // Until the term ends, or the term's journal fails
                        // a commit while Raft still has this node lead it
                        // (a commit cut short by a step-down the role watch
                        // did not show, or one that timed out): that
                        // broker can never confirm again, so it goes, and
                        // a new one serves if the node still leads.
                        let mut check = tokio::time::interval(JOURNAL_CHECK);
                        loop {
                            tokio::select! {
                                r = role.changed() => if r.is_err() || *role.borrow() != now { break },
                                _ = stop.changed() => break,
                                _ = check.tick() => if !server.broker.store.journal_open() {
                                    warn!(term, "the term's journal failed a commit: serving anew");
                                    break;
                                },
                            }
                        }
                        raising.abort();
                        watching.abort();
                        let _ = watching.await;
                        cluster.forget_members();
                        cluster.set_handler(None);
                        tls.lock().clear();
                        info!(term, "no longer serving: closing client connections");
                        server.shutdown().await;
                    }
                    Err(e) => {
                        error!(term, "cannot serve as the leader: {e}");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                if let Err(e) = replica.clear_staged() {
                    warn!("cannot clear staged messages: {e}");
                }
            }
            Role::Follower { .. } => {
                // Stream readers of this node's clients read its own copy.
                let reads = match replica.view() {
                    Ok(store) => Some(Arc::new(Reads::new(
                        store,
                        replica.applied(),
                        Arc::clone(&cluster),
                        replica.log.clone(),
                        Arc::new(config.clone()),
                    ))),
                    Err(e) => {
                        warn!("stream readers go to the leader: {e}");
                        None
                    }
                };
                let listeners = match Listeners::bind(&config, &cluster, reads).await {
                    Ok(l) => l,
                    Err(e) => {
                        // The broker that just stopped may hold a port a
                        // moment longer.
                        warn!("{e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                *tls.lock() = listeners.tls();
                let leading = loop {
                    tokio::select! {
                        r = role.changed() => {
                            if r.is_err() {
                                break false;
                            }
                            if matches!(*role.borrow(), Role::Leader { .. }) {
                                break true;
                            }
                        }
                        _ = stop.changed() => break false,
                    }
                };
                tls.lock().clear();
                listeners.close().await;
                if !leading {
                    return;
                }
            }
        }
    }
}

/// Waits until this node applied every entry in its log, those a broker
/// of this node wrote earlier in the same term included; false if the
/// role changed first (or Raft stopped).
async fn applied_all(
    replica: &Replica,
    cluster: &Cluster,
    role: &mut watch::Receiver<Role>,
    now: Role,
) -> bool {
    // A round trip through Raft's core: every write a journal handed it
    // before is in the log once it answers.
    if let Err(e) = cluster.raft.with_raft_state(|_| ()).await {
        warn!("Raft stopped: {e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        return false;
    }
    let last = replica.log.last_index();
    let mut applied = replica.applied();
    if *applied.borrow() >= last {
        return true;
    }
    info!(last, "waiting for the log to be applied before serving");
    loop {
        tokio::select! {
            r = applied.wait_for(|&a| a >= last) => return r.is_ok(),
            r = role.changed() => if r.is_err() || *role.borrow() != now { return false },
        }
    }
}

/// The broker of this term, serving.
async fn lead(
    config: &Config,
    replica: &Replica,
    cluster: &Arc<Cluster>,
) -> Result<Server, String> {
    let store = replica
        .store_for_term(cluster.raft.clone(), cluster.lease())
        .map_err(|e| format!("store: {e}"))?;
    let broker = Broker::with_store(config.clone(), store, Some(Arc::clone(cluster)))?;
    // The proxy listener just closed: its port may take a moment.
    let mut tries = 0;
    loop {
        match Server::serve(Arc::clone(&broker)).await {
            Ok(s) => return Ok(s),
            Err(e) if tries < 40 => {
                tries += 1;
                tracing::debug!("binding the listeners: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// While this node leads: raises the cluster version committed in the log
/// to what every member applies (store/op.rs `LEVEL`), once they all say
/// so (after a rolling upgrade, once the last member runs this build).
async fn raise_version(cluster: Arc<Cluster>, store: Arc<crate::store::Store>) {
    use crate::store::op::LEVEL;
    let mut told = false;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = match store.cluster_version() {
            Ok(v) => v,
            Err(e) => {
                warn!("cannot read the cluster version: {e}");
                return;
            }
        };
        if now >= LEVEL {
            return;
        }
        match cluster.members_level().await {
            Ok(level) if level > now => match store.raise_cluster_version(level).await {
                Ok(()) => info!(from = now, to = level, "cluster version raised"),
                Err(e) => {
                    warn!("cannot raise the cluster version: {e}");
                    return;
                }
            },
            Ok(_) => {}
            Err(e) if !told => {
                info!("the cluster stays at version {now}: {e}");
                told = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
}
