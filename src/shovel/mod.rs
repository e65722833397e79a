//! Dynamic shovels (RabbitMQ's shovel plugin): each `shovel` runtime
//! parameter runs a worker that moves messages from a source queue or
//! exchange to a destination, over AMQP 0-9-1, possibly between brokers
//! (spec.rs reads the definition, uri.rs its URIs, worker.rs does the
//! work). `Shovels` is one broker's set: started with the broker (on a
//! cluster's leader, so they move with leadership), restarted after the
//! reconnect delay when a run fails, stopped when their parameter goes,
//! and their status is what /api/shovels shows.

mod acker;
pub mod client;
pub mod spec;
pub mod tls;
pub mod uri;
mod worker;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{json, Value};

pub use spec::Spec;

/// The runtime parameter component of shovels.
pub const COMPONENT: &str = "shovel";

/// Where static shovels are kept in the set: no vhost has an empty name.
const STATIC: &str = "";

/// Whether a shovel is a runtime parameter or from the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Dynamic,
    Static,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Dynamic => "dynamic",
            Kind::Static => "static",
        }
    }
}

/// Reads the config file's static shovels: every one, or the faults of
/// the first bad one, named.
pub fn check_static(config: &crate::config::Config) -> Result<Vec<(String, Spec)>, String> {
    let dir = config.link_tls_dir.as_deref();
    config
        .shovels
        .iter()
        .map(|(name, value)| {
            Spec::parse(name, value)
                .and_then(|spec| spec.check_tls_files(dir).map(|()| spec))
                .map(|spec| (name.clone(), spec))
                .map_err(|e| format!("static shovel '{name}' (shovels.{name}): {e}"))
        })
        .collect()
}

/// Where a running shovel is connected (credentials taken out).
#[derive(Debug, Clone)]
pub struct Ends {
    pub src: String,
    pub dest: String,
    /// The destination connection's state: whether its broker blocked
    /// its publishers (connection.blocked), read when the status is.
    pub dest_conn: lapin::ConnectionStatus,
}

/// A shovel's state, as RabbitMQ's status shows it.
#[derive(Debug, Clone)]
enum State {
    Starting,
    Running(Ends),
    Terminated(String),
    /// Shown while an operator has it paused (never set by a run).
    Paused,
}

/// A shovel's state and when it last changed.
#[derive(Debug, Clone)]
pub struct Status {
    state: State,
    /// Unix seconds of the last change.
    since: u64,
}

impl Status {
    fn new() -> Status {
        Status {
            state: State::Starting,
            since: crate::util::now_ms() / 1000,
        }
    }

    fn set(&mut self, state: State) {
        self.state = state;
        self.since = crate::util::now_ms() / 1000;
    }

    pub fn set_starting(&mut self) {
        self.set(State::Starting);
    }

    pub fn set_running(&mut self, ends: Ends) {
        self.set(State::Running(ends));
    }
}

/// One shovel the broker runs.
struct Entry {
    kind: Kind,
    spec: Arc<Spec>,
    status: Arc<Mutex<Status>>,
    forwarded: Arc<AtomicU64>,
    /// Paused by an operator: its run stopped, its connections closed,
    /// until it is resumed (or restarted, or the broker starts again).
    paused: Option<u64>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Entry {
    /// Asks the run to close its connections (the source requeues what it
    /// had not acked, at once, rather than when a heartbeat fails), and
    /// cuts it off if it has not within the grace.
    fn stop_run(&self) {
        self.stop.send_replace(true);
        let task = self.task.abort_handle();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    tokio::time::sleep(CLOSE_GRACE).await;
                    task.abort();
                });
            }
            Err(_) => task.abort(),
        }
    }
}

/// Why a shovel cannot be paused or resumed.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No shovel of that name runs here.
    NotFound,
    /// It is paused already (pause), or not paused (resume).
    AlreadySo,
}

/// How long a stopped shovel has to close its connections before its
/// task is cut off.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for Entry {
    fn drop(&mut self) {
        self.stop_run();
    }
}

/// Called with (vhost, name) when a shovel finished its `src-delete-after`:
/// its parameter is cleared, as RabbitMQ clears it.
pub type Finished = Box<dyn Fn(&str, &str) + Send + Sync>;

/// What a run that finished needs: its set, its own status (which tells
/// it from a later run of the same name) and what clears its parameter.
struct Done {
    shovels: std::sync::Weak<Shovels>,
    status: Arc<Mutex<Status>>,
    finished: Arc<Finished>,
}

/// One broker's shovels.
pub struct Shovels {
    running: Mutex<BTreeMap<(String, String), Entry>>,
    /// This broker's AMQP listener, once it is bound, and where a URI's
    /// TLS files may be.
    reach: Mutex<client::Reach>,
    node: Mutex<String>,
    cluster: Mutex<String>,
    finished: Mutex<Option<Arc<Finished>>>,
}

impl Default for Shovels {
    fn default() -> Shovels {
        Shovels {
            running: Mutex::new(BTreeMap::new()),
            reach: Mutex::new(client::Reach::default()),
            node: Mutex::new(String::new()),
            cluster: Mutex::new(String::new()),
            finished: Mutex::new(None),
        }
    }
}

/// "YYYY-MM-DD H:MM:SS" (UTC), RabbitMQ's form of a status timestamp.
fn timestamp(secs: u64) -> String {
    let (y, m, d, h, mi, s) = crate::util::civil(secs as i64);
    format!("{y:04}-{m:02}-{d:02} {h}:{mi:02}:{s:02}")
}

impl Shovels {
    /// What this broker's URIs reach (its AMQP listener for a URI without
    /// a host, the directory of TLS files), its node name and its cluster
    /// name; what a finished shovel calls.
    pub fn configure(&self, reach: client::Reach, node: &str, cluster: &str, finished: Finished) {
        *self.reach.lock() = reach;
        *self.node.lock() = node.to_string();
        *self.cluster.lock() = cluster.to_string();
        *self.finished.lock() = Some(Arc::new(finished));
    }

    /// Starts shovel `name` of `vhost` (replacing one of that name); not
    /// before `configure` (a definitions file imported at boot stores its
    /// shovels first, and the broker starts them once it listens).
    pub fn start(self: &Arc<Self>, vhost: &str, name: &str, spec: Spec) {
        self.start_kind(Kind::Dynamic, vhost, name, spec);
    }

    /// Starts static shovel `name` (from the config file).
    pub fn start_static(self: &Arc<Self>, name: &str, spec: Spec) {
        self.start_kind(Kind::Static, STATIC, name, spec);
    }

    fn start_kind(self: &Arc<Self>, kind: Kind, vhost: &str, name: &str, spec: Spec) {
        let Some(entry) = self.entry(kind, vhost, name, spec) else {
            return;
        };
        let old = self
            .running
            .lock()
            .insert((vhost.to_string(), name.to_string()), entry);
        drop(old);
    }

    /// A shovel's entry with its run started; None before `configure`.
    fn entry(self: &Arc<Self>, kind: Kind, vhost: &str, name: &str, spec: Spec) -> Option<Entry> {
        let finished = self.finished.lock().clone()?;
        let spec = Arc::new(spec);
        let status = Arc::new(Mutex::new(Status::new()));
        let forwarded = Arc::new(AtomicU64::new(0));
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let ctx = worker::Context {
            kind,
            stop: stop_rx,
            name: name.to_string(),
            vhost: vhost.to_string(),
            reach: self.reach.lock().clone(),
            cluster: self.cluster.lock().clone(),
            status: Arc::clone(&status),
            forwarded: Arc::clone(&forwarded),
        };
        let done = Done {
            shovels: Arc::downgrade(self),
            status: Arc::clone(&status),
            finished,
        };
        let task = tokio::spawn(Self::supervise(Arc::clone(&spec), ctx, done));
        Some(Entry {
            kind,
            spec,
            status,
            forwarded,
            paused: None,
            stop,
            task,
        })
    }

    /// Starts shovel `name` of `vhost` again from its definition, if it is
    /// in the set and `may` allows it, in one step under the set's lock (a
    /// delete meanwhile is not undone).
    fn rerun(
        self: &Arc<Self>,
        vhost: &str,
        name: &str,
        may: impl Fn(&Entry) -> Result<(), Refused>,
    ) -> Result<(), Refused> {
        let old = {
            let mut running = self.running.lock();
            let key = (vhost.to_string(), name.to_string());
            let e = running.get(&key).ok_or(Refused::NotFound)?;
            may(e)?;
            let entry = self
                .entry(e.kind, vhost, name, Spec::clone(&e.spec))
                .ok_or(Refused::NotFound)?;
            running.insert(key, entry)
        };
        // Its drop stops the old run, outside the lock.
        drop(old);
        Ok(())
    }

    /// Runs a shovel until it is done, restarting a failed run after the
    /// reconnect delay (never, if it has none).
    async fn supervise(spec: Arc<Spec>, ctx: worker::Context, done: Done) {
        loop {
            match worker::run(&spec, &ctx).await {
                worker::Ended::Done => {
                    // Only if this run is still the shovel's: one made
                    // again meanwhile keeps its parameter and runs on.
                    let current = done
                        .shovels
                        .upgrade()
                        .is_some_and(|s| s.remove_if_current(&ctx.vhost, &ctx.name, &done.status));
                    if current && ctx.kind == Kind::Static {
                        tracing::info!(shovel = %ctx.name, "static shovel done");
                    } else if current {
                        tracing::info!(vhost = %ctx.vhost, shovel = %ctx.name, "shovel done: clearing its parameter");
                        let (vhost, name) = (ctx.vhost.clone(), ctx.name.clone());
                        let f = done.finished;
                        let _ = tokio::task::spawn_blocking(move || f(&vhost, &name)).await;
                    }
                    return;
                }
                worker::Ended::Stopped => return,
                worker::Ended::Failed(why) => {
                    tracing::warn!(vhost = %ctx.vhost, shovel = %ctx.name, "shovel stopped: {why}");
                    ctx.status.lock().set(State::Terminated(why));
                    let Some(delay) = spec.reconnect_delay else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = worker::stopped(&ctx) => return,
                    }
                }
            }
        }
    }

    /// Forgets shovel `name` of `vhost` if its run is the one whose
    /// status is `status` (it finished); whether it was.
    fn remove_if_current(&self, vhost: &str, name: &str, status: &Arc<Mutex<Status>>) -> bool {
        let mut running = self.running.lock();
        let key = (vhost.to_string(), name.to_string());
        let current = running
            .get(&key)
            .is_some_and(|e| Arc::ptr_eq(&e.status, status));
        if current {
            // Its own task: the drop asks it to stop, which it does.
            running.remove(&key);
        }
        current
    }

    /// Stops shovel `name` of `vhost`; whether it ran.
    pub fn stop(&self, vhost: &str, name: &str) -> bool {
        let gone = self
            .running
            .lock()
            .remove(&(vhost.to_string(), name.to_string()));
        gone.is_some()
    }

    /// Stops every shovel of `vhost` (it was deleted).
    pub fn stop_vhost(&self, vhost: &str) {
        let mut running = self.running.lock();
        let gone: Vec<_> = running
            .keys()
            .filter(|(v, _)| v == vhost)
            .cloned()
            .collect();
        for k in gone {
            running.remove(&k);
        }
    }

    /// Stops every shovel (the broker stops).
    pub fn stop_all(&self) {
        let all = std::mem::take(&mut *self.running.lock());
        drop(all);
    }

    /// Restarts shovel `name` of `vhost` from its definition; whether it
    /// ran.
    pub fn restart(self: &Arc<Self>, vhost: &str, name: &str) -> bool {
        self.rerun(vhost, name, |_| Ok(())).is_ok()
    }

    /// Pauses shovel `name` of `vhost`: its run stops and closes its
    /// connections (the source requeues what was not acked), until
    /// `resume` (LavinMQ's pause).
    pub fn pause(&self, vhost: &str, name: &str) -> Result<(), Refused> {
        let mut running = self.running.lock();
        let e = running
            .get_mut(&(vhost.to_string(), name.to_string()))
            .ok_or(Refused::NotFound)?;
        if e.paused.is_some() {
            return Err(Refused::AlreadySo);
        }
        e.paused = Some(crate::util::now_ms() / 1000);
        e.stop_run();
        tracing::info!(vhost, shovel = name, "shovel paused");
        Ok(())
    }

    /// Runs a paused shovel again, from its definition.
    pub fn resume(self: &Arc<Self>, vhost: &str, name: &str) -> Result<(), Refused> {
        self.rerun(vhost, name, |e| match e.paused {
            Some(_) => Ok(()),
            None => Err(Refused::AlreadySo),
        })?;
        tracing::info!(vhost, shovel = name, "shovel resumed");
        Ok(())
    }

    /// How many shovels of each kind are in each state, and each one's
    /// forwarded count: (vhost, name, forwarded; a static one's vhost is
    /// empty), for Prometheus.
    #[allow(clippy::type_complexity)]
    pub fn metrics(
        &self,
    ) -> (
        BTreeMap<(Kind, &'static str), u64>,
        Vec<(String, String, u64)>,
    ) {
        let running = self.running.lock();
        let mut states = BTreeMap::new();
        let mut each = Vec::with_capacity(running.len());
        for ((vhost, name), e) in running.iter() {
            let state = match (&e.paused, &e.status.lock().state) {
                (Some(_), _) | (None, State::Paused) => "paused",
                (None, State::Starting) => "starting",
                (None, State::Running(_)) => "running",
                (None, State::Terminated(_)) => "terminated",
            };
            *states.entry((e.kind, state)).or_insert(0) += 1;
            each.push((
                vhost.clone(),
                name.clone(),
                e.forwarded.load(Ordering::Relaxed),
            ));
        }
        (states, each)
    }

    /// The status of every shovel (of `vhost`, if given) as RabbitMQ's
    /// /api/shovels lists it.
    pub fn list(&self, vhost: Option<&str>) -> Vec<Value> {
        let node = self.node.lock().clone();
        let running = self.running.lock();
        running
            .iter()
            .filter(|((v, _), _)| vhost.is_none_or(|want| want == v))
            .map(|((v, name), e)| {
                let mut status = e.status.lock().clone();
                if let Some(since) = e.paused {
                    status = Status {
                        state: State::Paused,
                        since,
                    };
                }
                let mut o = json!({
                    "node": node,
                    "timestamp": timestamp(status.since),
                    "name": name,
                    "type": e.kind.name(),
                    "forwarded": e.forwarded.load(Ordering::Relaxed),
                });
                // A static shovel has no vhost (RabbitMQ lists it so).
                if e.kind == Kind::Dynamic {
                    o["vhost"] = json!(v);
                }
                let spec = &e.spec;
                match status.state {
                    State::Starting => o["state"] = json!("starting"),
                    State::Paused => o["state"] = json!("paused"),
                    State::Terminated(why) => {
                        o["state"] = json!("terminated");
                        o["reason"] = json!(why);
                    }
                    State::Running(ends) => {
                        o["state"] = json!("running");
                        // RabbitMQ's word for a destination that blocked
                        // the shovel's publishes (its resource alarms).
                        let blocked = ends.dest_conn.blocked();
                        o["blocked_status"] = json!(if blocked { "blocked" } else { "running" });
                        o["src_uri"] = json!(ends.src);
                        o["dest_uri"] = json!(ends.dest);
                        o["src_protocol"] = json!("amqp091");
                        o["dest_protocol"] = json!("amqp091");
                        match &spec.source {
                            spec::Source::Queue { name, .. } => o["src_queue"] = json!(name),
                            spec::Source::Exchange { name, key } => {
                                o["src_exchange"] = json!(name);
                                o["src_exchange_key"] = json!(key);
                            }
                        }
                        match &spec.dest {
                            spec::Dest::Queue { name, .. } => o["dest_queue"] = json!(name),
                            spec::Dest::Exchange { name, key } => {
                                o["dest_exchange"] = json!(name);
                                if let Some(k) = key {
                                    o["dest_exchange_key"] = json!(k);
                                }
                            }
                            spec::Dest::Original { key: Some(k) } => {
                                o["dest_exchange_key"] = json!(k)
                            }
                            spec::Dest::Original { key: None } => {}
                        }
                    }
                }
                o
            })
            .collect()
    }

    /// Whether shovel `name` of `vhost` runs here.
    pub fn has(&self, vhost: &str, name: &str) -> bool {
        self.running
            .lock()
            .contains_key(&(vhost.to_string(), name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_read_as_rabbitmq_writes_them() {
        assert_eq!(super::timestamp(0), "1970-01-01 0:00:00");
        assert_eq!(super::timestamp(1_796_000_000), "2026-11-30 0:53:20");
    }
}
