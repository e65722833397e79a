//! Durability on sled, behind a small interface: definitions (vhosts,
//! exchanges, queues, bindings, users, permissions, runtime parameters),
//! persistent messages, delivered marks and held delayed messages. Nothing outside this module knows sled exists.
//!
//! Every change is an operation (op.rs) submitted to the journal
//! (journal.rs): one ordered stream, applied to sled by the applier
//! (apply.rs) and made durable by group commit (sync.rs): a writer takes a
//! ticket, and one sync covers every operation submitted before it started.
//! Reads go to the applied state directly.

mod access;
mod apply;
mod cluster_version;
pub mod dedup;
mod deferred;
mod definitions;
mod delayed;
mod delivered;
mod journal;
pub mod lease;
mod local;
mod messages;
mod migrate;
pub mod msglog;
pub mod op;
pub mod raft;
pub mod segments;
mod shipped;
mod sync;
mod tenancy;
mod tracked;
mod writes;

use std::path::Path;
use std::sync::Arc;

pub use access::{PermissionDef, TopicPermissionDef, UserDef};
pub use apply::Applier;
pub use deferred::DeferredWrites;
pub use definitions::{BindingDef, ExchangeDef, QueueDef};
pub use delayed::DueMessage;
pub use delivered::Mark;
pub use journal::{Journal, LocalJournal};
pub use local::{is_local, local_queue_id};
#[cfg(test)]
pub use messages::encode_record_at;
pub use messages::{
    decode_message, encode_message, record_parts, record_time, within_bytes, StoredMessage,
};
pub use msglog::{Found, StoredChunk};
pub use op::{Applied, Moved, Op};
pub use sync::{DiskSync, Flusher, LogSync, Syncer};
pub use tenancy::{GlobalParameterDef, ParameterDef, VhostDef};

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// sled reported an I/O or corruption error.
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// The data directory could not be opened.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A stored record could not be decoded.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// Making writes durable failed.
    #[error("sync: {0}")]
    Sync(String),
    /// An operation the cluster's version does not allow yet, or one
    /// written by a newer version than this build.
    #[error("{0}")]
    Version(String),
}

/// Result of a store operation.
pub type Result<T> = std::result::Result<T, Error>;

/// An open group of operations (`Store::group`).
pub struct Group<'a>(&'a Store);

impl Drop for Group<'_> {
    fn drop(&mut self) {
        self.0.journal.close_group();
    }
}

/// The broker's durable state.
pub struct Store {
    db: sled::Db,
    /// The applied state, read directly.
    defs: sled::Tree,
    msgs: sled::Tree,
    /// Messages held by delayed-message exchanges.
    delayed: sled::Tree,
    applier: Arc<Applier>,
    /// Where every change goes.
    journal: Arc<dyn Journal>,
    /// Holders of writes deferred to the next commit.
    deferred: Arc<deferred::Registry>,
    /// Every stored message may have been delivered (a cluster's new
    /// leader: reservations stay on the node that made them).
    all_delivered: bool,
}

impl Store {
    /// Opens (or creates) the store in `dir`. `cache_bytes` bounds sled's
    /// page cache. Messages go to the message log in `dir/messages`
    /// (msglog); a data dir whose messages are still in sled (an older
    /// version's) has them moved there first.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Arc<Store>> {
        // sled is written at commits only (never ahead of the log, whose
        // copies must reach the disk before what they replace in sled).
        let (db, syncer, marks) = Self::open_sled(dir, cache_bytes, None)?;
        let log = Arc::new(msglog::MessageLog::open(&dir.join("messages"))?);
        Self::from_db(db, syncer, marks, Some(log), |local| local)
    }

    /// sled in `dir`, its sync, and the delivered marks (a cluster
    /// member's store).
    fn open_files(
        dir: &Path,
        cache_bytes: u64,
    ) -> Result<(sled::Db, Arc<DiskSync>, delivered::DeliveredLog)> {
        Self::open_sled(dir, cache_bytes, Some(500))
    }

    fn open_sled(
        dir: &Path,
        cache_bytes: u64,
        flush_every_ms: Option<u64>,
    ) -> Result<(sled::Db, Arc<DiskSync>, delivered::DeliveredLog)> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .flush_every_ms(flush_every_ms)
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let dir_handle = std::fs::File::open(dir)?;
        let syncer = Arc::new(DiskSync::new(db.clone(), Some(dir_handle)));
        // A file-format migration of this node's own files, not a change
        // of state: older versions kept the marks in the definitions tree.
        let legacy = delivered::take_legacy_marks(&db.open_tree("definitions")?)?;
        let marks = delivered::DeliveredLog::open(dir, legacy)?;
        Ok((db, syncer, marks))
    }

    /// A store that lives in a temp dir and vanishes on drop (unit tests).
    pub fn temporary() -> Result<Arc<Store>> {
        let db = sled::Config::new().temporary(true).open()?;
        Self::temporary_with(db.clone(), Arc::new(DiskSync::new(db, None)))
    }

    /// A temporary store over `db` whose group commits call `syncer`
    /// after the message log's (tests of the sync seam).
    pub fn temporary_with(db: sled::Db, syncer: Arc<dyn Syncer>) -> Result<Arc<Store>> {
        let log = Arc::new(msglog::MessageLog::temporary()?);
        let marks = delivered::DeliveredLog::in_memory();
        Self::from_db(db, syncer, marks, Some(log), |j| j)
    }

    /// A temporary store whose journal is `wrap` of the local one (tests
    /// of the journal seam).
    #[cfg(test)]
    pub fn temporary_wrapped(
        wrap: impl FnOnce(Arc<dyn Journal>) -> Arc<dyn Journal>,
    ) -> Result<Arc<Store>> {
        let db = sled::Config::new().temporary(true).open()?;
        let syncer = Arc::new(DiskSync::new(db.clone(), None));
        let log = Arc::new(msglog::MessageLog::temporary()?);
        let marks = delivered::DeliveredLog::in_memory();
        Self::from_db(db, syncer, marks, Some(log), wrap)
    }

    fn from_db(
        db: sled::Db,
        syncer: Arc<dyn Syncer>,
        delivered: delivered::DeliveredLog,
        log: Option<Arc<msglog::MessageLog>>,
        wrap: impl FnOnce(Arc<dyn Journal>) -> Arc<dyn Journal>,
    ) -> Result<Arc<Store>> {
        let applier = Arc::new(Applier::with_log(&db, delivered, log.clone())?);
        let syncer: Arc<dyn Syncer> = match log {
            Some(log) => {
                migrate::messages_to_log(&db, &applier.msgs, &log)?;
                let dirty = Arc::clone(&applier.dirty);
                Arc::new(LogSync::new(log, syncer, dirty))
            }
            None => syncer,
        };
        let deferred = Arc::new(deferred::Registry::default());
        let local = LocalJournal::start(Arc::clone(&applier), syncer, Arc::clone(&deferred));
        Ok(Arc::new(Store {
            defs: applier.defs.clone(),
            msgs: applier.msgs.clone(),
            delayed: applier.delayed.clone(),
            db,
            applier,
            journal: wrap(Arc::new(local)),
            deferred,
            all_delivered: false,
        }))
    }

    /// The store of a cluster's leader for one term, over the replica's
    /// applied state (store/raft).
    pub(crate) fn for_term(
        db: sled::Db,
        applier: Arc<Applier>,
        journal: impl FnOnce(Arc<deferred::Registry>) -> Result<Arc<dyn Journal>>,
    ) -> Result<Arc<Store>> {
        let deferred = Arc::new(deferred::Registry::default());
        Ok(Arc::new(Store {
            defs: applier.defs.clone(),
            msgs: applier.msgs.clone(),
            delayed: applier.delayed.clone(),
            db,
            journal: journal(Arc::clone(&deferred))?,
            applier,
            deferred,
            all_delivered: true,
        }))
    }

    /// Submits one operation to the journal.
    pub fn submit(&self, op: &Op<'_>) -> Result<Applied> {
        self.journal.submit(op)
    }

    /// Asks for a commit covering every operation submitted so far;
    /// returns the commit number to wait for (see `committed`).
    pub fn ticket(&self) -> u64 {
        self.journal.ticket()
    }

    /// Registers a holder of writes to submit before the next commit (see
    /// deferred.rs). Register before taking the ticket that must cover them.
    pub fn defer(&self, holder: std::sync::Weak<dyn DeferredWrites>) {
        self.deferred.register(holder);
    }

    /// Watches the last commit number reached.
    pub fn flushed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.journal.committed()
    }

    /// The last commit number reached.
    pub fn committed_now(&self) -> u64 {
        self.journal.committed_now()
    }

    /// Opens a group of operations that commit together or not at all
    /// (a copy and the removal of its original); closed when the guard
    /// goes. Nothing in a group may wait for a commit.
    pub fn group(&self) -> Group<'_> {
        self.journal.open_group();
        Group(self)
    }

    /// Whether a queue may hand out a kept message now: a replicated
    /// journal's leadership lease holds (lease.rs).
    pub fn may_deliver(&self) -> bool {
        self.journal.may_deliver()
    }

    /// Whether the journal still commits (a replicated journal whose
    /// commit failed never does again).
    pub fn journal_open(&self) -> bool {
        self.journal.is_open()
    }

    /// Whether publishers should wait for commits to catch up (a
    /// replicated journal's backlog is past its bound).
    pub fn congested(&self) -> bool {
        self.journal.congested()
    }

    /// Watches `congested`, where it can change.
    pub fn congestion(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.journal.congestion()
    }

    /// Whether a queue hands out a kept message only once the commit that
    /// covers it is reached (a replicated journal applies on commit).
    pub fn delivers_after_commit(&self) -> bool {
        self.journal.applies_on_commit()
    }

    /// Waits until everything submitted so far is committed; fails once
    /// the journal failed a commit (it never commits again: the waiter
    /// must not hold its connection, and so the shutdown, for good).
    pub async fn sync(&self) -> Result<()> {
        let ticket = self.ticket();
        let mut rx = self.flushed();
        let mut check = tokio::time::interval(std::time::Duration::from_millis(100));
        loop {
            tokio::select! {
                done = rx.wait_for(|&done| done >= ticket) => {
                    // The committer never stops while the store lives; a
                    // closed channel means shutdown, and then a direct
                    // commit does the job.
                    if done.is_err() {
                        self.journal.commit_now()?;
                    }
                    return Ok(());
                }
                _ = check.tick() => if !self.journal.is_open() {
                    return Err(Error::Sync("the store failed a commit".into()));
                },
            }
        }
    }

    /// Commits everything now, synchronously, and stops the committer
    /// (shutdown): once the store is dropped, the data dir can be reopened.
    /// Then writes the exact delivered marks: this was a clean stop.
    pub fn flush_now(&self) -> Result<()> {
        self.journal.close()?;
        if let Some(log) = &self.applier.log {
            log.close()?;
        }
        self.applier.delivered.close_clean()
    }

    /// Counts definition changes: an operation that changed it touched
    /// durable state and must wait for a commit before answering.
    pub fn defs_version(&self) -> u64 {
        self.journal.defs_version()
    }

    /// Registers a durable queue's delivered mark: returns what the last
    /// stop left (every sequence at or below it may have been delivered)
    /// and the mark its deliveries raise (see delivered.rs).
    pub fn delivery_mark(&self, queue_id: u64) -> (u64, Arc<Mark>) {
        let (start, mark) = self.applier.delivered.register(queue_id);
        (if self.all_delivered { u64::MAX } else { start }, mark)
    }

    /// Called before message `seq` of queue `queue_id` goes out: a crash
    /// from now on brings it back redelivered.
    pub fn before_delivery(&self, queue_id: u64, mark: &Mark, seq: u64) {
        let Some(upto) = delivered::DeliveredLog::reservation_for(mark, seq) else {
            return;
        };
        if let Err(e) = self.submit(&Op::Reserve { queue_id, upto }) {
            tracing::error!(queue_id, "cannot write the delivered mark: {e}");
        }
    }

    /// Bytes the store uses on disk: sled's, and the message log's.
    pub fn size_on_disk(&self) -> u64 {
        let log = self.applier.log.as_ref().map_or(0, |l| l.size_on_disk());
        self.db.size_on_disk().unwrap_or(0) + log
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, Meta};
    use parking_lot::Mutex;

    /// The sync after the message log's (sled's part): records, at each
    /// call, whether message 1 of queue 1 was in the log, then syncs.
    struct Recording {
        inner: DiskSync,
        log: std::sync::OnceLock<Arc<msglog::MessageLog>>,
        calls: Mutex<Vec<bool>>,
    }

    impl Syncer for Recording {
        fn sync(&self) -> std::result::Result<(), String> {
            let present = self
                .log
                .get()
                .is_some_and(|l| l.get(1, 1).ok().flatten().is_some());
            self.calls.lock().push(present);
            self.inner.sync()
        }
    }

    fn recording() -> (Arc<Store>, Arc<Recording>) {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let sync = Arc::new(Recording {
            inner: DiskSync::new(db.clone(), None),
            log: std::sync::OnceLock::new(),
            calls: Mutex::new(Vec::new()),
        });
        let store = Store::temporary_with(db, Arc::clone(&sync) as Arc<dyn Syncer>).unwrap();
        if let Some(log) = &store.applier.log {
            let _ = sync.log.set(Arc::clone(log));
        }
        (store, sync)
    }

    fn commit(store: &Store) {
        let ticket = store.ticket();
        let mut rx = store.flushed();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(rx.wait_for(|&done| done >= ticket)).unwrap();
    }

    /// A commit of messages alone syncs the log and not sled: one sync per
    /// group of confirms (issue 26); a definition change syncs both.
    #[test]
    fn a_commit_of_messages_alone_leaves_sled_alone() {
        let (store, sync) = recording();
        commit(&store);
        let first = sync.calls.lock().len();
        assert_eq!(first, 1, "the first commit syncs sled too");
        for seq in 1..=3 {
            store.put_message(1, seq, &msg(), 0).unwrap();
            commit(&store);
            store.remove_message(1, seq).unwrap();
            commit(&store);
        }
        assert_eq!(
            sync.calls.lock().len(),
            first,
            "messages only: sled untouched"
        );
        store
            .put_vhost(&VhostDef {
                name: "v".into(),
                ..Default::default()
            })
            .unwrap();
        commit(&store);
        assert_eq!(
            sync.calls.lock().len(),
            first + 1,
            "a definition: sled synced"
        );
    }

    fn msg() -> Message {
        let meta = Meta::default().with_delivery_mode(2);
        Message::new(b"", b"q", &[0x10, 0, 2], b"body", meta)
    }

    #[test]
    fn the_shutdown_flush_syncs_as_a_group_commit_does() {
        let (store, sync) = recording();
        store.put_message(1, 1, &msg(), 0).unwrap();
        store.flush_now().unwrap();
        let calls = sync.calls.lock().clone();
        assert_eq!(
            calls.last(),
            Some(&true),
            "the last sync covers the write: {calls:?}"
        );
    }

    /// sled does not flush on a timer on a single node: a write outside
    /// the log that nobody waits for (a held delayed message published
    /// without confirms) is still synced by the flusher on its own.
    #[test]
    fn a_write_outside_the_log_nobody_waits_for_is_synced_soon() {
        let (store, sync) = recording();
        commit(&store);
        let before = sync.calls.lock().len();
        store.put_delayed(1, 1, "/", 10, &msg()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while sync.calls.lock().len() == before {
            assert!(
                std::time::Instant::now() < deadline,
                "sled was not synced after a hold"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn a_group_commit_goes_through_the_sync() {
        let (store, sync) = recording();
        store.put_message(1, 1, &msg(), 0).unwrap();
        commit(&store);
        assert!(sync.calls.lock().contains(&true));
    }
}
