//! The leader's journal: operations go into the entry being built; the
//! group commit (store/sync.rs, with `Shipper` as its sync) makes the
//! deferred writes, ships the entry through Raft and waits until it is
//! committed (fsynced on a majority) and applied here, then publishes the
//! commit number confirms wait for. While one entry is in flight the next
//! one fills up, so the entry size follows the load.
//!
//! What stays on this node: delivered-mark reservations (applied here at
//! once; a new leader takes every message it recovers as possibly
//! delivered) and paged transient messages (staged only). Durable queue
//! ids are chosen here, from the applied counter, and travel in the
//! operation. A journal lives for one term of leadership: once a commit
//! fails (this node is no longer the leader) every submit fails.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::BufMut;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::backlog::Backlog;
use super::pending::{Gate, Pending};
use super::{Batch, Raft};
use crate::store::apply::Applier;
use crate::store::deferred::Registry;
use crate::store::journal::Journal;
use crate::store::lease::Lease;
use crate::store::op::{Applied, Op, TIMED_RECORDS};
use crate::store::sync::{Flusher, Syncer};
use crate::store::{Error, QueueDef, Result};

/// The journal of a Raft leader.
pub struct RaftJournal {
    applier: Arc<Applier>,
    entry: Arc<Mutex<Pending>>,
    gate: Arc<Gate>,
    open: Arc<AtomicBool>,
    closing: watch::Sender<bool>,
    next_queue_id: AtomicU64,
    defs_version: AtomicU64,
    flusher: Arc<Flusher>,
    /// The leadership this term serves under.
    lease: Arc<Lease>,
    /// Bytes waiting for commit: publishers wait past a bound.
    backlog: Arc<Backlog>,
    /// Whether the cluster's version lets message records carry their
    /// time (it only goes up: once true, never read again), and when it
    /// was last read (coarse ms).
    timed: AtomicBool,
    timed_read: AtomicU64,
}

/// How long the last commit of a term may wait (shutdown): a node that
/// lost its majority must still stop.
const LAST_COMMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Ships the entry being built and waits for its commit.
struct Shipper {
    raft: Raft,
    entry: Arc<Mutex<Pending>>,
    gate: Arc<Gate>,
    open: Arc<AtomicBool>,
    /// The term is ending: commits wait a bounded time.
    closing: watch::Receiver<bool>,
    runtime: tokio::runtime::Handle,
    backlog: Arc<Backlog>,
}

impl Syncer for Shipper {
    fn sync(&self) -> std::result::Result<(), String> {
        // While the backlog is raised, rounds follow one another until it
        // is lowered: its publishers wait for that, not for a ticket.
        loop {
            // A journal whose commit failed never confirms again: the
            // tickets of the failed entry may not be committed, and a later
            // round must not publish a number that covers them.
            if !self.open.load(Ordering::Acquire) {
                self.backlog.lower();
                return Err("this node no longer leads the cluster".into());
            }
            let entries = self.gate.when_closed(|| self.entry.lock().take(ENTRY_MAX));
            if entries.is_empty() {
                // Every entry shipped before was committed when its sync
                // returned: nothing is waiting.
                self.backlog.shipped(0);
                return Ok(());
            }
            self.backlog
                .shipping(entries.iter().map(bytes::Bytes::len).sum());
            if let Err(e) = self.commit(entries) {
                self.open.store(false, Ordering::Release);
                self.backlog.lower();
                return Err(format!("not committed: {e}"));
            }
            let pending = self.entry.lock().ops.len();
            if !self.backlog.shipped(pending) {
                return Ok(());
            }
        }
    }
}

impl Shipper {
    /// Appends `entries` and waits for their commit; the term ending cuts
    /// the wait short.
    fn commit(&self, entries: Vec<bytes::Bytes>) -> std::result::Result<(), String> {
        let raft = self.raft.clone();
        let mut closing = self.closing.clone();
        fail::fail_point!("raft-journal-commit", |_| Err(
            "failed by the raft-journal-commit fail point".to_string()
        ));
        self.runtime.block_on(async {
            let write = write_all(&raft, entries);
            if *closing.borrow() {
                return tokio::time::timeout(LAST_COMMIT_TIMEOUT, write)
                    .await
                    .map_err(|_| "no majority answered in time".to_string())?
                    .map_err(|e| e.to_string());
            }
            // The term ending (close) abandons a commit that hangs.
            tokio::select! {
                r = write => r.map_err(|e| e.to_string()),
                _ = closing.wait_for(|c| *c) => Err("the term ended".to_string()),
            }
        })
    }
}

/// The size a log entry is cut at: what was submitted while the last
/// entry was in flight goes in entries of at most this many bytes (one
/// operation, or group, larger than it goes alone), so a busy moment makes
/// many bounded entries, not one that holds everything.
const ENTRY_MAX: usize = 1 << 20;

/// Appends `entries` in order and waits until the last is committed and
/// applied here (so are all before it).
async fn write_all(raft: &Raft, entries: Vec<bytes::Bytes>) -> std::result::Result<(), String> {
    let mut waiting = Vec::new();
    for entry in entries {
        let rx = raft
            .client_write_ff(Batch(entry))
            .await
            .map_err(|e| e.to_string())?;
        waiting.push(rx);
    }
    for rx in waiting {
        rx.await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

impl RaftJournal {
    /// The journal of a term that `raft` leads, applying through
    /// `applier` (everything committed before the term already applied).
    pub fn start(
        applier: Arc<Applier>,
        raft: Raft,
        deferred: Arc<Registry>,
        lease: Arc<Lease>,
    ) -> Result<RaftJournal> {
        applier.clear_pending()?;
        let entry = Arc::new(Mutex::new(Pending::default()));
        let gate = Arc::new(Gate::default());
        let open = Arc::new(AtomicBool::new(true));
        let (closing, closing_rx) = watch::channel(false);
        let backlog = Arc::new(Backlog::default());
        let shipper = Arc::new(Shipper {
            raft,
            entry: Arc::clone(&entry),
            gate: Arc::clone(&gate),
            open: Arc::clone(&open),
            closing: closing_rx,
            runtime: tokio::runtime::Handle::current(),
            backlog: Arc::clone(&backlog),
        });
        let before_commit: Box<dyn Fn() -> bool + Send> = {
            let deferred = Arc::clone(&deferred);
            Box::new(move || deferred.write_all())
        };
        let flusher = Flusher::start(shipper, before_commit);
        Ok(RaftJournal {
            next_queue_id: AtomicU64::new(applier.last_queue_id()?),
            applier,
            entry,
            gate,
            open,
            closing,
            defs_version: AtomicU64::new(0),
            flusher,
            lease,
            backlog,
            timed: AtomicBool::new(false),
            timed_read: AtomicU64::new(0),
        })
    }

    /// Whether message records may carry their time: every member applies
    /// them once the cluster's version is `TIMED_RECORDS`. Read at most
    /// every 100 ms until it is.
    fn records_timed(&self) -> Result<bool> {
        if self.timed.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let now = crate::util::coarse_now_ms();
        let last = self.timed_read.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < 100 {
            return Ok(false);
        }
        self.timed_read.store(now.max(1), Ordering::Relaxed);
        let timed = self.applier.cluster_version()? >= TIMED_RECORDS;
        self.timed.store(timed, Ordering::Relaxed);
        Ok(timed)
    }

    fn ship(&self, op: &Op<'_>) -> Result<()> {
        if !Journal::is_open(self) {
            return Err(Error::Sync("this node no longer leads the cluster".into()));
        }
        let mut pending = self.entry.lock();
        let entry = &mut pending.ops;
        let at = entry.len();
        entry.put_u32(0);
        if let Err(e) = op.encode(entry) {
            entry.truncate(at);
            return Err(e);
        }
        let len = (entry.len() - at - 4) as u32;
        entry[at..at + 4].copy_from_slice(&len.to_be_bytes());
        pending.appended(&self.gate);
        let size = pending.ops.len();
        drop(pending);
        if self.backlog.added(size) {
            // Rounds run while someone waits on one: now publishers do.
            self.flusher.ticket();
        }
        Ok(())
    }
}

impl Journal for RaftJournal {
    fn submit(&self, op: &Op<'_>) -> Result<Applied> {
        if op.level() == TIMED_RECORDS {
            // Every put and move once the version allows it: answered from
            // what `records_timed` keeps, not read per message.
            if !self.records_timed()? {
                return self.submit(&op.untimed(&mut Vec::new()));
            }
        } else if op.level() > 1 && !matches!(op, Op::ClusterVersion { .. }) {
            // Only operations of a later version than every build's cost a
            // read here; `ClusterVersion` is raised once every member
            // applies it.
            let version = self.applier.cluster_version()?;
            if op.level() > version {
                return Err(Error::Version(format!(
                    "this needs cluster version {}; the cluster is at {version} until \
                     every member runs a build that applies it",
                    op.level()
                )));
            }
        }
        match *op {
            Op::Reserve { .. } => {
                if !Journal::is_open(self) {
                    return Err(Error::Sync("this node no longer leads the cluster".into()));
                }
                return self.applier.apply(op);
            }
            Op::PutMessage { paged: true, .. } => return self.submit_paged(op),
            Op::DeclareQueue(def) => {
                let id = self.next_queue_id.fetch_add(1, Ordering::SeqCst) + 1;
                let def = QueueDef { id, ..def.clone() };
                self.ship(&Op::DeclareQueue(&def))?;
                self.defs_version.fetch_add(1, Ordering::SeqCst);
                return Ok(Applied::Queue(id));
            }
            Op::PurgeFrom { queue_id, from } => self.applier.unstage_from(queue_id, from)?,
            Op::DeleteQueue { id, .. } => {
                self.applier.unstage_from(id, 0)?;
                self.defs_version.fetch_add(1, Ordering::SeqCst);
            }
            Op::Unhold { key } => self.applier.unholding(key),
            Op::MoveMessages { to, moves, .. } => {
                if !Journal::is_open(self) {
                    return Err(Error::Sync("this node no longer leads the cluster".into()));
                }
                self.applier.stage(op)?;
                if let Err(e) = self.ship(op) {
                    // Not moved: nothing of it may be read back.
                    if let Some(first) = moves.iter().map(|m| m.to_seq).min() {
                        self.applier.unstage_from(to, first)?;
                    }
                    return Err(e);
                }
                return Ok(Applied::Done);
            }
            Op::PutMessage { .. }
            | Op::RemoveMessage { .. }
            | Op::Hold { .. }
            | Op::TrackOffset { .. }
            | Op::Dedup { .. } => {}
            _ => {
                self.defs_version.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.ship(op)?;
        Ok(Applied::Done)
    }

    fn submit_paged(&self, op: &Op<'_>) -> Result<Applied> {
        if op.level() == TIMED_RECORDS && !self.records_timed()? {
            return self.submit_paged(&op.untimed(&mut Vec::new()));
        }
        if !Journal::is_open(self) {
            return Err(Error::Sync("this node no longer leads the cluster".into()));
        }
        self.applier.stage(op)?;
        if !matches!(op, Op::PutMessage { paged: true, .. }) {
            self.ship(op)?;
        }
        Ok(Applied::Done)
    }

    fn ticket(&self) -> u64 {
        self.flusher.ticket()
    }

    fn committed(&self) -> watch::Receiver<u64> {
        self.flusher.subscribe()
    }

    fn applies_on_commit(&self) -> bool {
        true
    }

    fn committed_now(&self) -> u64 {
        self.flusher.committed_now()
    }

    fn may_deliver(&self) -> bool {
        self.lease.holds()
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    fn congested(&self) -> bool {
        self.backlog.is_raised()
    }

    fn congestion(&self) -> Option<watch::Receiver<bool>> {
        Some(self.backlog.subscribe())
    }

    fn open_group(&self) {
        self.gate.open();
    }

    fn close_group(&self) {
        self.gate.close(&self.entry);
    }

    fn commit_now(&self) -> Result<()> {
        // Only reached once the committer stopped: nothing can be
        // committed any more by this journal.
        Err(Error::Sync("the committer stopped".into()))
    }

    fn close(&self) -> Result<()> {
        // The committer's last round ships what is left (if this node
        // still leads); it runs on its own thread, which needs this
        // runtime to make progress.
        self.closing.send_replace(true);
        let stop = || self.flusher.stop();
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(stop)
            }
            _ => stop(),
        }
        self.open.store(false, Ordering::Release);
        self.backlog.lower();
        Ok(())
    }

    fn defs_version(&self) -> u64 {
        self.defs_version.load(Ordering::SeqCst)
    }
}
