//! Mirroring: this node's member of the cluster's one Raft group. It
//! runs openraft over the replica (store/raft) and the Raft listener
//! (Raft messages from peers, rpc.rs and network.rs; clients proxied by
//! followers, proxy.rs), forms the cluster on first start (the lowest id
//! does), and says what this node is now (`Role`): the leader once it has
//! applied everything committed before its term, else a follower that
//! knows (or not) who leads.
//!
//! A leader that cannot confirm its leadership with a majority, or whose
//! log sync stalls, for `step_down_ms` steps down: it stops
//! serving at once and stops sending heartbeats (and standing for
//! election) for a few election timeouts, so that a follower is elected.
//! openraft 0.9 has no leader transfer; this is built from its runtime
//! switches.

mod append;
mod catch_up;
mod compaction;
mod identity;
mod link;
mod network;
mod proxy;
mod raw_append;
mod resources;
mod rpc;
mod secret;
mod status;
mod stream_ends;
mod version;

pub use link::{Guard, Link, LinkTls};
pub use rpc::{ProxyHeader, Service};
pub use status::{MemberStatus, Status};
pub use stream_ends::StreamEnd;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use parking_lot::RwLock;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::config::ClusterConfig;
use crate::store::raft::{LogStore, Member, Raft, StateMachine};

/// Connections the Raft port serves at once.
const MAX_RAFT_PORT_CONNECTIONS: usize = 4096;
/// Connections from one address that have not proved the secret yet, at
/// most: the rest are closed at once, so one host cannot fill the port.
const MAX_UNPROVEN_PER_SOURCE: usize = 16;
/// How long a proved connection has to say what it is.
const FIRST_BYTE: Duration = Duration::from_secs(5);

/// What serves a client a follower proxied here (the leader's AMQP code
/// or its HTTP API, as the header says).
pub type ClientHandler = Arc<dyn Fn(Link, ProxyHeader) + Send + Sync>;

/// What this node is in the cluster now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not leading; `leader` is the node that does, if known.
    Follower { leader: Option<u64> },
    /// Leading `term`, with everything before it applied: serve clients.
    Leader { term: u64 },
}

/// This node's cluster membership.
pub struct Cluster {
    /// This node's id.
    pub id: u64,
    /// The Raft node.
    pub raft: Raft,
    /// Where proxied clients go while this node serves.
    handler: RwLock<Option<ClientHandler>>,
    role: watch::Sender<Role>,
    stop: watch::Sender<bool>,
    /// The address the Raft listener bound.
    pub raft_addr: SocketAddr,
    /// The log (its committed index, for metrics).
    log: LogStore,
    /// Times the leader this node knows changed.
    leader_changes: std::sync::atomic::AtomicU64,
    /// Mutual TLS between members and the cluster secret, if configured.
    tls: link::Tls,
    /// The members' Raft addresses the configuration lists (identity.rs).
    peers: Vec<String>,
    /// A step-down is under way: not serving, whatever Raft says.
    stepping_down: std::sync::atomic::AtomicBool,
    /// Renewed by the watchdog while a majority confirms this leader.
    lease: Arc<crate::store::lease::Lease>,
    /// How long a confirmation of the leadership holds (`step_down_ms`).
    step_down: Duration,
    /// When this node's role last became leader.
    led_since: parking_lot::Mutex<Option<tokio::time::Instant>>,
    /// This node's resource alarms, for the node's life (resources.rs).
    monitors: crate::alarm::Monitors,
    /// What each member last reported of its resources, while this node
    /// leads (resources.rs).
    reports: parking_lot::Mutex<BTreeMap<u64, crate::alarm::Report>>,
    /// What each member was last seen doing, for the log's purge
    /// (catch_up.rs).
    progress: Arc<catch_up::Progress>,
    /// Messages this node delivered from its own copy of a stream while
    /// following (server/follow_reads), for its Prometheus.
    pub stream_reads: std::sync::atomic::AtomicU64,
    /// Where this node's stream listeners are (stream_ends.rs).
    own_stream_end: RwLock<Option<StreamEnd>>,
    /// Where each member's are, as they last answered this leader.
    stream_ends: parking_lot::Mutex<BTreeMap<u64, StreamEnd>>,
}

impl Cluster {
    /// Starts Raft over `log` and `machine`, and the Raft listener on
    /// `bind`:raft_port.
    pub async fn start(
        cfg: &ClusterConfig,
        bind: IpAddr,
        data_dir: &std::path::Path,
        tls: Option<LinkTls>,
        log: LogStore,
        machine: StateMachine,
        monitors: crate::alarm::Monitors,
    ) -> Result<Arc<Cluster>, String> {
        // Every link proves the secret, whatever else guards it.
        let secret = secret::load(cfg, data_dir)?;
        let tls = Some(Arc::new(link::Guard {
            tls,
            secret: Some(secret),
        }));
        let (Some(id), Some(port)) = (cfg.node_id, cfg.raft_port) else {
            return Err("a cluster node needs --node-id and --raft-port".into());
        };
        let rc = openraft::Config {
            cluster_name: "warren".into(),
            heartbeat_interval: cfg.heartbeat_ms,
            election_timeout_min: cfg.election_timeout_ms,
            election_timeout_max: cfg.election_timeout_ms * 2,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(cfg.snapshot_every),
            // compaction.rs purges the log, keeping what members catching
            // up need: openraft purges nothing itself.
            max_in_snapshot_log_to_keep: u64::MAX,
            // An outer bound: network.rs gives each chunk the time its
            // bytes need, and the last one the time the install needs.
            install_snapshot_timeout: 3_600_000,
            snapshot_max_chunk_size: 1 << 20,
            ..Default::default()
        }
        .validate()
        .map_err(|e| format!("cluster settings: {e}"))?;
        let progress = Arc::new(catch_up::Progress::default());
        let net = network::Network {
            tls: tls.clone(),
            progress: Arc::clone(&progress),
        };
        let raft = Raft::new(id, Arc::new(rc), net, log.clone(), machine)
            .await
            .map_err(|e| format!("cannot start Raft: {e}"))?;
        let listener = TcpListener::bind((bind, port))
            .await
            .map_err(|e| format!("cannot listen for Raft on {bind}:{port}: {e}"))?;
        let raft_addr = listener
            .local_addr()
            .map_err(|e| format!("Raft listener: {e}"))?;
        info!(%raft_addr, node = id, "Raft listener started");
        let (stop, _) = watch::channel(false);
        let (role, _) = watch::channel(Role::Follower { leader: None });
        let cluster = Arc::new(Cluster {
            id,
            raft,
            handler: RwLock::new(None),
            role,
            stop,
            raft_addr,
            log,
            leader_changes: Default::default(),
            tls,
            peers: cfg.peers.iter().map(|p| p.raft.clone()).collect(),
            stepping_down: Default::default(),
            lease: Arc::default(),
            step_down: Duration::from_millis(cfg.step_down_ms),
            led_since: Default::default(),
            monitors,
            reports: Default::default(),
            progress,
            stream_reads: Default::default(),
            own_stream_end: Default::default(),
            stream_ends: Default::default(),
        });
        tokio::spawn(Arc::clone(&cluster).accept(listener));
        let first = cfg.peers.iter().map(|p| p.id).min();
        let initialized = cluster
            .raft
            .is_initialized()
            .await
            .map_err(|e| format!("Raft: {e}"))?;
        if first == Some(id) && !initialized {
            let members: BTreeMap<u64, Member> = cfg
                .peers
                .iter()
                .map(|p| {
                    (
                        p.id,
                        Member {
                            raft: p.raft.clone(),
                        },
                    )
                })
                .collect();
            info!(node = id, members = members.len(), "forming the cluster");
            if let Err(e) = cluster.raft.initialize(members).await {
                warn!("forming the cluster: {e}");
            }
        }
        let tick = Duration::from_millis(cfg.heartbeat_ms);
        // What a purge frees is about what the log grows by before the
        // next one: new entries are written over its files.
        cluster
            .log
            .set_pool_bytes(cfg.log_max_mb.saturating_mul(1 << 20));
        tokio::spawn(compaction::bound_log(
            Arc::clone(&cluster),
            compaction::Bounds {
                max_bytes: cfg.log_max_mb.saturating_mul(1 << 20),
                keep: cfg.log_keep,
                keep_bytes: cfg.log_keep_mb.saturating_mul(1 << 20),
                hold_bytes: cfg.log_hold_mb.saturating_mul(1 << 20),
            },
        ));
        tokio::spawn(Arc::clone(&cluster).watch_role(tick));
        tokio::spawn(Arc::clone(&cluster).watchdog(
            tick,
            Duration::from_millis(cfg.step_down_ms),
            Duration::from_millis(cfg.election_timeout_ms),
        ));
        Ok(cluster)
    }

    /// The lease this node's broker delivers under: it holds for
    /// `step_down_ms` from the start of the last heartbeat round a majority
    /// answered, ends when this node stops leading (see `watchdog`).
    pub fn lease(&self) -> Arc<crate::store::lease::Lease> {
        Arc::clone(&self.lease)
    }

    /// Times the leader this node knows changed.
    pub fn leader_changes(&self) -> u64 {
        self.leader_changes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Watches what this node is.
    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    /// Sets (or clears) what serves proxied clients here.
    pub fn set_handler(&self, h: Option<ClientHandler>) {
        *self.handler.write() = h;
    }

    /// The node leading now and its Raft address, if known.
    pub fn leader_addr(&self) -> Option<(u64, String)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader?;
        m.membership_config
            .membership()
            .get_node(&leader)
            .map(|n| (leader, n.raft.clone()))
    }

    /// Stops the Raft listener and Raft.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.raft.shutdown().await {
            warn!("Raft did not stop cleanly: {e}");
        }
    }

    async fn accept(self: Arc<Self>, listener: TcpListener) {
        let mut stop = self.stop.subscribe();
        // Connections at once at most (members' Raft links and proxied
        // clients); more wait in the listen backlog.
        let open = Arc::new(tokio::sync::Semaphore::new(MAX_RAFT_PORT_CONNECTIONS));
        let unproven = Arc::new(crate::util::PerSource::default());
        loop {
            let permit = tokio::select! {
                p = Arc::clone(&open).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = stop.changed() => return,
            };
            tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, peer)) => {
                        let Some(proving) = unproven.take(peer.ip(), MAX_UNPROVEN_PER_SOURCE) else {
                            warn!(%peer, "closed: {MAX_UNPROVEN_PER_SOURCE} connections from this \
                                 address are still to prove the cluster secret");
                            continue;
                        };
                        let this = Arc::clone(&self);
                        tokio::spawn(async move {
                            let _permit = permit;
                            let link = link::accept(s, this.tls.as_deref()).await;
                            drop(proving);
                            if let Err(e) = &link {
                                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                                    // Closed before the handshake's first
                                    // answer: a reachability probe
                                    // (status.rs), or a port scan.
                                    debug!(%peer, "a connection to the Raft port closed: {e}");
                                    return;
                                }
                            }
                            let link = link.map_err(|e| e.to_string()).and_then(|l| {
                                this.check_identity(&l)?;
                                Ok(l)
                            });
                            match link {
                                Ok(l) => this.serve_peer(l, peer).await,
                                Err(e) => warn!(%peer, "a connection to the Raft port failed: {e}"),
                            }
                        });
                    }
                    Err(e) => {
                        warn!("Raft accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = stop.changed() => return,
            }
        }
    }

    async fn serve_peer(self: Arc<Self>, mut s: Link, peer: SocketAddr) {
        use tokio::io::AsyncReadExt;
        let mut kind = [0u8; 1];
        let first = tokio::time::timeout(FIRST_BYTE, s.read_exact(&mut kind)).await;
        if !matches!(first, Ok(Ok(_))) {
            return;
        }
        match kind[0] {
            rpc::RAFT => {
                if let Err(e) = self.serve_raft(&mut s).await {
                    tracing::debug!(%peer, "Raft connection ended: {e}");
                }
            }
            rpc::PROXY => {
                let header = match rpc::read_frame(&mut s).await {
                    Ok((_, body)) => bincode::deserialize::<rpc::ProxyHeader>(&body),
                    Err(_) => return,
                };
                let Ok(header) = header else {
                    warn!(%peer, "a proxied connection with an unreadable header");
                    return;
                };
                // What the header says of the client is taken as true: the
                // member that sent it proved the cluster secret (accept).
                let handler = self.handler.read().clone();
                match handler {
                    Some(h) => h(s, header),
                    // Not serving (any more): the follower closes the
                    // client, which reconnects.
                    None => drop(s),
                }
            }
            other => warn!(%peer, "unknown connection kind {other} on the Raft port"),
        }
    }

    async fn serve_raft(&self, s: &mut Link) -> std::io::Result<()> {
        let bad = |e: bincode::Error| std::io::Error::other(e.to_string());
        let mut staged = append::Staged::default();
        loop {
            let (kind, body) = rpc::read_frame(s).await?;
            let answer = match kind {
                rpc::APPEND_PART => {
                    let part: append::Part = bincode::deserialize(&body).map_err(bad)?;
                    let head = part.head.clone();
                    let r = self.raft.append_entries(head).await;
                    if matches!(r, Ok(openraft::raft::AppendEntriesResponse::Success)) {
                        staged.keep(part).map_err(std::io::Error::other)?;
                    }
                    bincode::serialize(&r)
                }
                rpc::APPEND_STAGED => {
                    let req = bincode::deserialize(&body).map_err(bad)?;
                    let req = staged.complete(req).map_err(std::io::Error::other)?;
                    bincode::serialize(&self.raft.append_entries(req).await)
                }
                rpc::APPEND => {
                    let req = bincode::deserialize(&body).map_err(bad)?;
                    bincode::serialize(&self.raft.append_entries(req).await)
                }
                rpc::APPEND_RAW => {
                    let req = raw_append::decode(body.into()).map_err(std::io::Error::other)?;
                    bincode::serialize(&self.raft.append_entries(req).await)
                }
                rpc::VOTE => {
                    let req: openraft::raft::VoteRequest<u64> =
                        bincode::deserialize(&body).map_err(bad)?;
                    let candidate = req.vote.leader_id().voted_for();
                    if !self.knows(candidate) {
                        // A node this one's membership does not name (one a
                        // promotion left out, or a removed one) never gets
                        // a vote: it cannot lead again without rejoining.
                        return Err(std::io::Error::other(format!(
                            "a vote asked by node {candidate:?}, not a member"
                        )));
                    }
                    bincode::serialize(&self.raft.vote(req).await)
                }
                rpc::SNAPSHOT => {
                    let req = bincode::deserialize(&body).map_err(bad)?;
                    bincode::serialize(&self.raft.install_snapshot(req).await)
                }
                rpc::ELECT => {
                    info!("the leader stepped down and hands over: standing for election");
                    let r: Result<(), openraft::error::RaftError<u64>> = self
                        .raft
                        .trigger()
                        .elect()
                        .await
                        .map_err(openraft::error::RaftError::Fatal);
                    bincode::serialize(&r)
                }
                rpc::VERSION => {
                    let r: Result<u32, openraft::error::RaftError<u64>> =
                        Ok(crate::store::op::LEVEL);
                    bincode::serialize(&r)
                }
                rpc::RESOURCES => {
                    let r: Result<crate::alarm::Report, openraft::error::RaftError<u64>> =
                        Ok(self.monitors.report());
                    bincode::serialize(&r)
                }
                rpc::STREAM_END => {
                    let r: Result<Option<StreamEnd>, openraft::error::RaftError<u64>> =
                        Ok(self.stream_end());
                    bincode::serialize(&r)
                }
                other => return Err(std::io::Error::other(format!("unknown request {other}"))),
            }
            .map_err(bad)?;
            rpc::write_frame(s, 0, &answer).await?;
        }
    }

    /// Checks that a member over mutual TLS is one (identity.rs): its
    /// certificate names a configured member's host or a current one's.
    fn check_identity(&self, link: &Link) -> Result<(), String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let current = m
            .membership_config
            .membership()
            .nodes()
            .map(|(_, n)| n.raft.as_str());
        identity::check(link, self.peers.iter().map(String::as_str).chain(current))
    }

    /// Whether node `id` is in this node's membership (voter or learner,
    /// in any configuration of a joint one); any node while this one
    /// knows no membership yet (a node waiting to be added).
    fn knows(&self, id: Option<u64>) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        membership.nodes().next().is_none()
            || id.is_some_and(|id| membership.get_node(&id).is_some())
    }

    /// Steps down a leader that cannot lead. Once per `tick` it starts a
    /// probe, if none runs: a heartbeat round that confirms leadership
    /// with a majority (not waiting for the state machine, which a busy
    /// leader may have queued work for); a probe that succeeds, however
    /// slowly, confirms the leadership as of when it started. A leader
    /// whose last confirmation started more than `step_down` ago, or whose
    /// log sync under way has run longer than that (a stalled disk; appends
    /// queued for the next sync are load, not a stall), steps down. Time is
    /// monotonic. The followers grant no vote within their lease (twice the
    /// election timeout) of the heartbeats that confirmed it, and the
    /// configuration keeps `step_down` plus two ticks below that lease, so
    /// this node stops serving before another can be elected.
    async fn watchdog(self: Arc<Self>, tick: Duration, step_down: Duration, election: Duration) {
        use std::sync::atomic::{AtomicBool, Ordering};
        let mut stop = self.stop.subscribe();
        let confirmed: Arc<parking_lot::Mutex<Option<tokio::time::Instant>>> = Arc::default();
        let probing = Arc::new(AtomicBool::new(false));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = stop.changed() => return,
            }
            if !matches!(*self.role.borrow(), Role::Leader { .. }) {
                *confirmed.lock() = None;
                self.lease.end();
                continue;
            }
            let now = tokio::time::Instant::now();
            if !probing.swap(true, Ordering::AcqRel) {
                let (this, confirmed, probing) = (
                    Arc::clone(&self),
                    Arc::clone(&confirmed),
                    Arc::clone(&probing),
                );
                tokio::spawn(async move {
                    let probe = tokio::time::timeout(step_down, this.raft.get_read_log_id());
                    if matches!(probe.await, Ok(Ok(_))) {
                        let mut c = confirmed.lock();
                        // Not for a term this node no longer leads.
                        if let Some(t) = *c {
                            *c = Some(t.max(now));
                            this.renew_lease(now);
                        }
                    }
                    probing.store(false, Ordering::Release);
                });
            }
            // Being elected by a majority is the term's first
            // confirmation, as of when the role changed (not of this
            // tick, which may come long after: a node paused since).
            let since = *confirmed
                .lock()
                .get_or_insert_with(|| self.led_since.lock().unwrap_or(now));
            let lost = since.elapsed() > step_down;
            let stalled = self.log.sync_running_for() > step_down;
            if lost || stalled {
                warn!(
                    stalled,
                    lost,
                    "cannot confirm leadership with a majority, or the log's sync stalls: \
                     stepping down"
                );
                self.step_down(election).await;
                *confirmed.lock() = None;
            }
        }
    }

    /// Keeps `role` true.
    async fn watch_role(self: Arc<Self>, tick: Duration) {
        let mut metrics = self.raft.metrics();
        let mut stop = self.stop.subscribe();
        // The term this node leads and the last index when it began.
        let mut leading: Option<(u64, u64)> = None;
        let mut known_leader = None;
        loop {
            let m = metrics.borrow_and_update().clone();
            if m.current_leader.is_some() && m.current_leader != known_leader {
                known_leader = m.current_leader;
                self.leader_changes
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let role = if m.state == ServerState::Leader {
                let term = m.current_term;
                let start = match leading {
                    Some((t, i)) if t == term => i,
                    _ => {
                        let i = m.last_log_index.unwrap_or(0);
                        leading = Some((term, i));
                        i
                    }
                };
                let applied = m.last_applied.map_or(0, |l| l.index);
                if applied >= start
                    && !self
                        .stepping_down
                        .load(std::sync::atomic::Ordering::Acquire)
                {
                    Role::Leader { term }
                } else {
                    Role::Follower { leader: None }
                }
            } else {
                leading = None;
                Role::Follower {
                    leader: m.current_leader,
                }
            };
            let changed = self.role.send_if_modified(|r| {
                let changed = *r != role;
                *r = role;
                changed
            });
            if changed {
                match role {
                    Role::Leader { .. } => {
                        let now = tokio::time::Instant::now();
                        *self.led_since.lock() = Some(now);
                        // Elected a while ago, maybe (applying the log's
                        // tail can take seconds): the lease starts with a
                        // heartbeat round, at once, not with the election.
                        tokio::spawn(Arc::clone(&self).first_lease(now));
                    }
                    Role::Follower { .. } => {
                        let mut led = self.led_since.lock();
                        *led = None;
                        self.lease.end();
                    }
                }
            }
            tokio::select! {
                r = metrics.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(tick) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// The lease of a term this node began leading at `since`: from a
    /// heartbeat round a majority answers (the watchdog renews it).
    async fn first_lease(self: Arc<Self>, since: tokio::time::Instant) {
        let probe = tokio::time::timeout(self.step_down, self.raft.get_read_log_id());
        if matches!(probe.await, Ok(Ok(_))) {
            self.renew_lease(since);
        }
    }

    /// A heartbeat round begun at `start` was answered by a majority: the
    /// lease holds `step_down` past it, if this node has led since before
    /// it (not for a term that ended meanwhile).
    fn renew_lease(&self, start: tokio::time::Instant) {
        let led = self.led_since.lock();
        if led.is_some_and(|t| t <= start) {
            self.lease.hold_until((start + self.step_down).into_std());
        }
    }

    /// Stops serving, and hands leadership over: with its heartbeats off,
    /// once the followers' lease (twice the election timeout) has run out
    /// it asks the follower that has the most of the log to stand for
    /// election now, rather than waiting for one's random timeout (which
    /// the same follower tends to lose again: it is drawn once per
    /// process). It stands for election itself again only after that.
    async fn step_down(&self, election: Duration) {
        use std::sync::atomic::Ordering;
        self.stepping_down.store(true, Ordering::Release);
        {
            let mut led = self.led_since.lock();
            *led = None;
            self.lease.end();
        }
        self.role.send_replace(Role::Follower { leader: None });
        let rc = self.raft.runtime_config();
        rc.heartbeat(false);
        rc.elect(false);
        let lease = election * 2;
        // The closing journal's last entry may still reach the followers:
        // a little more than the lease.
        tokio::time::sleep(lease + election / 4).await;
        self.hand_over().await;
        tokio::time::sleep(election * 2).await;
        rc.heartbeat(true);
        rc.elect(true);
        self.stepping_down.store(false, Ordering::Release);
    }

    /// Asks the voter with the most of the log (by what this leader last
    /// knew it matched) to stand for election now; nothing if this node
    /// no longer leads.
    async fn hand_over(&self) {
        use openraft::network::RaftNetworkFactory;
        let (target, node) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            if m.state != ServerState::Leader {
                return;
            }
            let membership = m.membership_config.membership();
            let matched = |id: &u64| {
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(id).cloned().flatten())
                    .map_or(0, |l| l.index)
            };
            let Some(target) = membership
                .voter_ids()
                .filter(|v| *v != self.id)
                .max_by_key(|v| (matched(v), std::cmp::Reverse(*v)))
            else {
                return;
            };
            let Some(node) = membership.get_node(&target).cloned() else {
                return;
            };
            (target, node)
        };
        let mut net = self.network();
        let mut peer = net.new_client(target, &node).await;
        match peer.elect().await {
            Ok(()) => info!(to = target, "handed leadership over"),
            Err(e) => warn!(to = target, "cannot hand leadership over: {e}"),
        }
    }

    /// A client maker for requests of this node's own (not openraft's).
    fn network(&self) -> network::Network {
        network::Network {
            tls: self.tls.clone(),
            progress: Arc::clone(&self.progress),
        }
    }

    /// Serves a client that connected here while this node follows: its
    /// bytes go to the leader's Raft listener, after `header`.
    pub async fn proxy<S>(self: Arc<Self>, client: S, header: ProxyHeader)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        proxy::to_leader(&self, client, header).await
    }

    /// A link to the leader that carries one client (the header sent), and
    /// the leader's id: for a carrier that reads what passes
    /// (server/follow_reads). None if no leader answers in time.
    pub async fn open_to_leader(&self, header: ProxyHeader) -> Option<(Link, u64)> {
        proxy::open(self, header).await
    }

    /// Returns once a node other than `leader` leads.
    pub async fn leader_moved(&self, leader: u64) {
        proxy::leader_moved(self, leader).await
    }
}
