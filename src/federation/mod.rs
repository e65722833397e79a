//! Federation (RabbitMQ's federation plugin): an exchange whose policy
//! names upstreams (`federation-upstream`, `federation-upstream-set`,
//! `federation-upstream-pattern`) gets one link per upstream, which
//! receives what is published to the same exchange upstream, for the
//! bindings made here (params.rs reads the parameters, resolve.rs the
//! policy keys, link.rs is a link, headers.rs what a link writes into
//! messages and bindings).
//!
//! `Federation` is one broker's set of links: each change to a vhost's
//! policies, upstreams or topology makes it work out the links the vhost
//! should have and start, restart or stop links to match. The broker's
//! side (what exchanges there are, their bindings, publishing into them)
//! is the `Downstream` it is given.

mod deliver;
pub mod headers;
mod link;
pub mod params;
mod queue_link;
mod resolve;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use amq_protocol::types::FieldTable;
use parking_lot::Mutex;
use serde_json::{json, Value};

pub use params::Upstream;
pub use resolve::Choice;

use crate::message::Message;
use crate::shovel::client::Reach;

/// What makes published messages durable; Err says why they are not.
pub type Synced = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// What came of publishing a batch here.
pub struct Published {
    /// How many of the messages, from the first, were routed.
    pub done: usize,
    /// Why the next one was refused, if one was (the rest were not tried).
    pub error: Option<String>,
    /// What makes the routed ones durable.
    pub synced: Synced,
}

/// What federation needs of the broker it runs in.
pub trait Downstream: Send + Sync + 'static {
    /// The cluster name this broker announces.
    fn cluster_name(&self) -> String;
    /// What federation looks at in vhost `vhost`; None if it is gone.
    fn survey(&self, vhost: &str) -> Option<Survey>;
    /// The bindings whose source is exchange `exchange` of `vhost`: (key,
    /// arguments); None if the exchange is gone.
    fn bindings_of(&self, vhost: &str, exchange: &str) -> Option<Vec<(String, FieldTable)>>;
    /// Ticks after each change to `vhost`'s topology.
    fn changes(&self, vhost: &str) -> Option<tokio::sync::watch::Receiver<u64>>;
    /// What queue `queue` of `vhost` holds and who consumes it (queue
    /// federation pulls by it); None if it is gone.
    fn queue_demand(&self, vhost: &str, queue: &str) -> Option<crate::queue::Demand>;
    /// Routes `msgs` in `vhost` (each to its own exchange), in order,
    /// until one is refused.
    fn publish(&self, vhost: &str, msgs: &[Arc<Message>]) -> Published;
    /// Whether a resource alarm holds publishers back.
    fn blocked(&self) -> bool;
}

/// What a policy federates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Exchange,
    Queue,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Exchange => "exchange",
            Kind::Queue => "queue",
        }
    }
}

/// An exchange or a queue a policy federates.
#[derive(Debug, Clone, PartialEq)]
pub struct Federated {
    pub kind: Kind,
    pub name: String,
    pub type_name: String,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    /// The policy's name.
    pub policy: String,
    pub choice: Choice,
}

/// What one vhost holds that federation acts on.
#[derive(Debug, Default)]
pub struct Survey {
    /// `federation-upstream` parameters: name -> value.
    pub upstreams: BTreeMap<String, Value>,
    /// `federation-upstream-set` parameters: name -> value.
    pub sets: BTreeMap<String, Value>,
    /// Every exchange and queue whose policy carries a federation key.
    pub federated: Vec<Federated>,
    /// Whether any policy of the vhost carries one (a new exchange may
    /// match it).
    pub federating: bool,
}

/// What a link is: an exchange or a queue of a vhost, and one upstream's
/// settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSpec {
    pub vhost: String,
    pub object: Federated,
    pub upstream: Upstream,
}

impl LinkSpec {
    /// The upstream exchange's name (an exchange link's).
    pub fn upstream_exchange(&self) -> &str {
        self.upstream
            .exchange
            .as_deref()
            .unwrap_or(&self.object.name)
    }

    /// The upstream queue's name (a queue link's).
    pub fn upstream_queue(&self) -> &str {
        self.upstream.queue.as_deref().unwrap_or(&self.object.name)
    }

    /// A queue link's consumer tag upstream.
    pub fn consumer_tag(&self) -> String {
        match &self.upstream.consumer_tag {
            Some(t) => t.clone(),
            None => format!("federation-link-{}", self.upstream.name),
        }
    }

    /// The upstream object's name.
    fn upstream_object(&self) -> &str {
        match self.object.kind {
            Kind::Exchange => self.upstream_exchange(),
            Kind::Queue => self.upstream_queue(),
        }
    }

    /// RabbitMQ's link id: 8 hex digits of a hash of what the link joins,
    /// the same across restarts.
    pub fn id(&self) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for part in [
            self.vhost.as_str(),
            self.object.kind.name(),
            &self.object.name,
            &self.upstream.name,
            self.upstream_object(),
        ] {
            h.update((part.len() as u32).to_be_bytes());
            h.update(part.as_bytes());
        }
        let d = h.finalize();
        format!("{:02x}{:02x}{:02x}{:02x}", d[0], d[1], d[2], d[3])
    }
}

/// A link's state, as /api/federation-links shows it.
#[derive(Debug, Clone)]
pub enum State {
    Starting,
    /// Running, with the name of its connection (downstream, RabbitMQ
    /// shows its direct connection; Warren publishes in-process and shows
    /// the upstream connection's name).
    Running(String),
    /// Failed: the status word and the error, waiting to start again.
    Failed(&'static str, String),
}

/// A link's state and when it last changed (Unix seconds).
#[derive(Debug, Clone)]
pub struct Status {
    pub state: State,
    pub since: u64,
    /// The upstream URI it connected to (or tries), without credentials.
    pub uri: String,
}

impl Status {
    pub fn set(&mut self, state: State) {
        self.state = state;
        self.since = crate::util::now_ms() / 1000;
    }
}

/// How a link is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Run,
    /// Stop, leaving the upstream queue to collect messages (the broker
    /// stops, or this node stops leading).
    Keep,
    /// Stop for good (unfederated, changed, restarted): the upstream
    /// queue and exchange go, unless `resource-cleanup-mode` is never.
    CleanUp,
}

/// Key of a link: (vhost, what, its name, upstream).
type Key = (String, Kind, String, String);

struct Entry {
    spec: Arc<LinkSpec>,
    id: String,
    status: Arc<Mutex<Status>>,
    stop: tokio::sync::watch::Sender<Stop>,
    task: tokio::task::JoinHandle<()>,
    /// Turns true once its task has ended (cleaned up and closed).
    done: tokio::sync::watch::Receiver<bool>,
}

/// Tells a link's `done` when its task ends, aborted or not.
struct DoneOnDrop(tokio::sync::watch::Sender<bool>);

impl Drop for DoneOnDrop {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

impl Entry {
    fn stop(&self, how: Stop) {
        self.stop.send_replace(how);
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

impl Drop for Entry {
    fn drop(&mut self) {
        // Keep, unless asked otherwise first (the first word counts).
        if *self.stop.borrow() == Stop::Run {
            self.stop(Stop::Keep);
        }
    }
}

/// How long a stopped link has to clean up and close before it is cut
/// off.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// What the set was given when its broker started serving.
struct Setup {
    down: Arc<dyn Downstream>,
    node: String,
    reach: Reach,
    /// Tells the reconciler which vhost changed.
    changed: tokio::sync::mpsc::UnboundedSender<String>,
}

/// One broker's federation links.
#[derive(Default)]
pub struct Federation {
    links: Mutex<BTreeMap<Key, Entry>>,
    setup: Mutex<Option<Arc<Setup>>>,
    /// The vhosts whose topology is watched (they have federated
    /// exchanges): their watcher tasks.
    watched: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// Links stopped and maybe still cleaning up: the next run of the
    /// same link waits for it (its upstream queue is the same one).
    closing: Mutex<HashMap<Key, tokio::sync::watch::Receiver<bool>>>,
}

/// "YYYY-MM-DD H:MM:SS" (UTC), RabbitMQ's form of a status timestamp.
fn timestamp(secs: u64) -> String {
    let (y, m, d, h, mi, s) = crate::util::civil(secs as i64);
    format!("{y:04}-{m:02}-{d:02} {h}:{mi:02}:{s:02}")
}

impl Federation {
    /// Starts federation with this broker's side, node name and AMQP
    /// listener (a URI without a host); each vhost in `vhosts` is looked
    /// at once.
    pub fn start(
        self: &Arc<Self>,
        down: Arc<dyn Downstream>,
        node: &str,
        reach: Reach,
        vhosts: Vec<String>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self.setup.lock() = Some(Arc::new(Setup {
            down,
            node: node.to_string(),
            reach,
            changed: tx,
        }));
        tokio::spawn(Self::reconciler(Arc::downgrade(self), rx));
        for v in vhosts {
            self.changed(&v);
        }
    }

    /// Something federation looks at changed in `vhost` (its policies,
    /// upstreams, sets, exchanges or their bindings).
    pub fn changed(&self, vhost: &str) {
        if let Some(s) = self.setup.lock().as_ref() {
            let _ = s.changed.send(vhost.to_string());
        }
    }

    /// Takes the vhosts that changed, a short moment's worth at a time,
    /// and brings each one's links in line.
    async fn reconciler(
        me: std::sync::Weak<Self>,
        mut rx: tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        while let Some(first) = rx.recv().await {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            let mut vhosts = vec![first];
            while let Ok(v) = rx.try_recv() {
                if !vhosts.contains(&v) {
                    vhosts.push(v);
                }
            }
            let Some(fed) = me.upgrade() else { return };
            for v in vhosts {
                fed.reconcile(&v);
            }
        }
    }

    /// Starts, restarts and stops `vhost`'s links to match what its
    /// policies and parameters say now.
    fn reconcile(self: &Arc<Self>, vhost: &str) {
        let Some(setup) = self.setup.lock().clone() else {
            return;
        };
        let survey = setup.down.survey(vhost).unwrap_or_default();
        let mut want: BTreeMap<Key, LinkSpec> = BTreeMap::new();
        for x in &survey.federated {
            for (name, overrides) in resolve::upstreams(&x.choice, &survey) {
                let Some(value) = survey.upstreams.get(&name) else {
                    continue;
                };
                let Some(upstream) = Upstream::read(&name, value, &overrides) else {
                    continue;
                };
                want.insert(
                    (vhost.to_string(), x.kind, x.name.clone(), name),
                    LinkSpec {
                        vhost: vhost.to_string(),
                        object: x.clone(),
                        upstream,
                    },
                );
            }
        }
        self.watch(&setup, vhost, survey.federating);
        let mut links = self.links.lock();
        // Stopped since the survey: the set is not this survey's to touch.
        let current = self
            .setup
            .lock()
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &setup));
        if !current {
            return;
        }
        // The vhost deleted since the survey: nothing starts.
        if setup.down.changes(vhost).is_none() {
            want.clear();
        }
        let stale: Vec<Key> = links
            .keys()
            .filter(|k| k.0 == vhost && !want.contains_key(*k))
            .cloned()
            .collect();
        for k in stale {
            if let Some(e) = links.remove(&k) {
                self.retire(k, e, Stop::CleanUp);
            }
        }
        for (k, spec) in want {
            if links.get(&k).is_some_and(|e| *e.spec == spec) {
                continue;
            }
            if let Some(e) = links.remove(&k) {
                self.retire(k.clone(), e, Stop::CleanUp);
            }
            let entry = self.entry(&setup, &k, spec);
            links.insert(k, entry);
        }
    }

    /// Stops link `key`'s entry `e` as `how` says; a later run of the
    /// same link waits for it to finish.
    fn retire(&self, key: Key, e: Entry, how: Stop) {
        e.stop(how);
        let mut closing = self.closing.lock();
        closing.retain(|_, done| !*done.borrow());
        closing.insert(key, e.done.clone());
    }

    /// Watches `vhost`'s topology while a policy of it federates (a new
    /// exchange may match one), and not otherwise.
    fn watch(self: &Arc<Self>, setup: &Arc<Setup>, vhost: &str, on: bool) {
        // Subscribed before the lock: the broker's vhost map is not taken
        // under it (a vhost's deletion holds that map, then takes this).
        let rx = match on && !self.watched.lock().contains_key(vhost) {
            true => setup.down.changes(vhost),
            false => None,
        };
        let mut watched = self.watched.lock();
        match (on, watched.contains_key(vhost)) {
            (true, false) => {
                let Some(mut rx) = rx else {
                    return;
                };
                let me = Arc::downgrade(self);
                let v = vhost.to_string();
                let task = tokio::spawn(async move {
                    while rx.changed().await.is_ok() {
                        match me.upgrade() {
                            Some(f) => f.changed(&v),
                            None => return,
                        }
                    }
                });
                watched.insert(vhost.to_string(), task);
            }
            (false, true) => {
                if let Some(t) = watched.remove(vhost) {
                    t.abort();
                }
            }
            _ => {}
        }
    }

    fn entry(&self, setup: &Arc<Setup>, key: &Key, spec: LinkSpec) -> Entry {
        let spec = Arc::new(spec);
        let status = Arc::new(Mutex::new(Status {
            state: State::Starting,
            since: crate::util::now_ms() / 1000,
            uri: spec
                .upstream
                .uris
                .first()
                .map(|u| u.redacted())
                .unwrap_or_default(),
        }));
        let (stop, stop_rx) = tokio::sync::watch::channel(Stop::Run);
        let ctx = link::Context {
            down: Arc::clone(&setup.down),
            reach: setup.reach.clone(),
            status: Arc::clone(&status),
            stop: stop_rx,
        };
        let before = self.closing.lock().remove(key);
        let (done_tx, done) = tokio::sync::watch::channel(false);
        let run = Arc::clone(&spec);
        let task = tokio::spawn(async move {
            let _done = DoneOnDrop(done_tx);
            if let Some(mut before) = before {
                // Past the old run's abort: it is gone by then either way.
                let wait = CLOSE_GRACE + std::time::Duration::from_secs(1);
                let _ = tokio::time::timeout(wait, before.wait_for(|d| *d)).await;
            }
            link::supervise(run, ctx).await;
        });
        Entry {
            id: spec.id(),
            spec,
            status,
            stop,
            task,
            done,
        }
    }

    /// Stops every link of `vhost` (it was deleted).
    pub fn stop_vhost(&self, vhost: &str) {
        let mut links = self.links.lock();
        let keys: Vec<Key> = links.keys().filter(|k| k.0 == vhost).cloned().collect();
        for k in keys {
            if let Some(e) = links.remove(&k) {
                // Its exchanges went with it: as when they are deleted.
                self.retire(k, e, Stop::CleanUp);
            }
        }
        drop(links);
        if let Some(t) = self.watched.lock().remove(vhost) {
            t.abort();
        }
    }

    /// Stops every link, leaving their upstream queues (the broker stops).
    pub fn stop_all(&self) {
        *self.setup.lock() = None;
        let all = std::mem::take(&mut *self.links.lock());
        drop(all);
        for (_, t) in self.watched.lock().drain() {
            t.abort();
        }
    }

    /// Restarts link `id` of `vhost` on node `node` (cleaning up upstream
    /// as a clean stop does); whether it was found.
    pub fn restart(&self, vhost: &str, id: &str, node: &str) -> bool {
        let Some(setup) = self.setup.lock().clone() else {
            return false;
        };
        if setup.node != node {
            return false;
        }
        let mut links = self.links.lock();
        let Some(key) = links
            .iter()
            .find(|(k, e)| k.0 == vhost && e.id == id)
            .map(|(k, _)| k.clone())
        else {
            return false;
        };
        let Some(old) = links.remove(&key) else {
            return false;
        };
        let spec = LinkSpec::clone(&old.spec);
        self.retire(key.clone(), old, Stop::CleanUp);
        let entry = self.entry(&setup, &key, spec);
        links.insert(key, entry);
        true
    }

    /// How many links are in each state, for Prometheus.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        for e in self.links.lock().values() {
            *out.entry(status_word(&e.status.lock().state)).or_insert(0) += 1;
        }
        out
    }

    /// Every link (of `vhost`, if given) as /api/federation-links lists it.
    pub fn list(&self, vhost: Option<&str>) -> Vec<Value> {
        let node = self
            .setup
            .lock()
            .as_ref()
            .map(|s| s.node.clone())
            .unwrap_or_default();
        let links = self.links.lock();
        links
            .iter()
            .filter(|(k, _)| vhost.is_none_or(|v| v == k.0))
            .map(|(_, e)| {
                let st = e.status.lock().clone();
                let spec = &e.spec;
                let mut o = json!({"node": node});
                match spec.object.kind {
                    Kind::Exchange => {
                        o["exchange"] = json!(spec.object.name);
                        o["upstream_exchange"] = json!(spec.upstream_exchange());
                    }
                    Kind::Queue => {
                        o["queue"] = json!(spec.object.name);
                        o["upstream_queue"] = json!(spec.upstream_queue());
                        o["consumer_tag"] = json!(spec.consumer_tag());
                    }
                }
                o["type"] = json!(spec.object.kind.name());
                o["vhost"] = json!(spec.vhost);
                o["upstream"] = json!(spec.upstream.name);
                o["id"] = json!(e.id);
                o["status"] = json!(status_word(&st.state));
                match &st.state {
                    State::Starting => {}
                    State::Running(conn) => o["local_connection"] = json!(conn),
                    State::Failed(_, why) => o["error"] = json!(why),
                }
                o["uri"] = json!(st.uri);
                o["timestamp"] = json!(timestamp(st.since));
                o
            })
            .collect()
    }
}

/// The status word RabbitMQ shows for `state`.
fn status_word(state: &State) -> &'static str {
    match state {
        State::Starting => "starting",
        State::Running(_) => "running",
        State::Failed(word, _) => word,
    }
}
