//! Durability on sled, behind a small interface: definitions (vhosts,
//! exchanges, queues, bindings) and persistent messages. Nothing outside this
//! module knows sled exists. Writes are applied at once (in memory, in sled's
//! log); `Store::ticket` + the flusher (`sync.rs`) make them durable in
//! groups: one fsync covers every write made before it started.

mod deferred;
mod definitions;
mod delayed;
mod delivered;
mod messages;
mod sync;

use std::path::Path;
use std::sync::Arc;

pub use deferred::DeferredWrites;
pub use definitions::{BindingDef, ExchangeDef, QueueDef};
pub use delayed::DueMessage;
pub use delivered::Mark;
pub use messages::{decode_message, encode_message, StoredMessage};
pub use sync::{DiskSync, Flusher, Syncer};

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
}

/// Result of a store operation.
pub type Result<T> = std::result::Result<T, Error>;

/// The broker's durable state.
pub struct Store {
    db: sled::Db,
    defs: sled::Tree,
    msgs: sled::Tree,
    /// Messages held by delayed-message exchanges.
    delayed: sled::Tree,
    flusher: Arc<Flusher>,
    /// What a group commit calls to make writes durable.
    syncer: Arc<dyn Syncer>,
    /// Per-queue delivered marks (delivered.rs).
    delivered: delivered::DeliveredLog,
    /// Holders of writes deferred to the next flush.
    deferred: Arc<deferred::Registry>,
    /// Bumped on every definitions write, so callers can tell whether an
    /// operation touched durable state and must wait for a flush.
    defs_version: std::sync::atomic::AtomicU64,
}

impl Store {
    /// Opens (or creates) the store in `dir`. `cache_bytes` bounds sled's
    /// page cache.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Arc<Store>> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .flush_every_ms(Some(500))
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let dir_handle = std::fs::File::open(dir)?;
        let syncer = Arc::new(DiskSync::new(db.clone(), Some(dir_handle)));
        let defs = db.open_tree("definitions")?;
        let legacy = delivered::take_legacy_marks(&defs)?;
        let marks = delivered::DeliveredLog::open(dir, legacy)?;
        Self::from_db(db, syncer, marks)
    }

    /// A store that lives in a temp dir and vanishes on drop (unit tests).
    pub fn temporary() -> Result<Arc<Store>> {
        let db = sled::Config::new().temporary(true).open()?;
        Self::temporary_with(db.clone(), Arc::new(DiskSync::new(db, None)))
    }

    /// A temporary store over `db` whose group commits call `syncer`
    /// (tests of the sync seam).
    pub fn temporary_with(db: sled::Db, syncer: Arc<dyn Syncer>) -> Result<Arc<Store>> {
        Self::from_db(db, syncer, delivered::DeliveredLog::in_memory())
    }

    fn from_db(
        db: sled::Db,
        syncer: Arc<dyn Syncer>,
        delivered: delivered::DeliveredLog,
    ) -> Result<Arc<Store>> {
        let defs = db.open_tree("definitions")?;
        let msgs = db.open_tree("messages")?;
        let delayed = db.open_tree("delayed")?;
        let deferred = Arc::new(deferred::Registry::default());
        let before_flush: Box<dyn Fn() -> bool + Send> = {
            let deferred = Arc::clone(&deferred);
            Box::new(move || deferred.write_all())
        };
        let flusher = Flusher::start(Arc::clone(&syncer), before_flush);
        Ok(Arc::new(Store {
            db,
            defs,
            msgs,
            delayed,
            flusher,
            syncer,
            delivered,
            deferred,
            defs_version: Default::default(),
        }))
    }

    /// Asks for a flush covering every write made so far; returns the flush
    /// epoch to wait for (see `Flusher`).
    pub fn ticket(&self) -> u64 {
        self.flusher.ticket()
    }

    /// Registers a holder of writes to make before the next flush (see
    /// deferred.rs). Register before taking the ticket that must cover them.
    pub fn defer(&self, holder: std::sync::Weak<dyn DeferredWrites>) {
        self.deferred.register(holder);
    }

    /// Watches the last completed flush epoch.
    pub fn flushed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.flusher.subscribe()
    }

    /// Waits until everything written so far is on disk.
    pub async fn sync(&self) -> Result<()> {
        let ticket = self.ticket();
        let mut rx = self.flushed();
        // The flusher never stops while the store lives; a closed channel
        // means shutdown, and then a direct flush does the job.
        if rx.wait_for(|&done| done >= ticket).await.is_err() {
            self.write_deferred()?;
            self.syncer.sync().map_err(Error::Sync)?;
        }
        Ok(())
    }

    /// Makes the deferred writes now (the flusher does this itself).
    fn write_deferred(&self) -> Result<()> {
        if self.deferred.write_all() {
            Ok(())
        } else {
            Err(Error::Io(std::io::Error::other("a deferred write failed")))
        }
    }

    /// Flushes everything now, synchronously, and stops the flusher
    /// (shutdown): once the store is dropped, the data dir can be reopened.
    /// Then writes the exact delivered marks: this was a clean stop.
    pub fn flush_now(&self) -> Result<()> {
        // The flusher's last round (deferred writes, then the sync) runs on
        // its own thread, so no epoch it publishes can confirm a write
        // still being made here; what registered since is written after,
        // and synced the same way as a group commit.
        self.flusher.stop();
        let written = self.write_deferred();
        self.syncer.sync().map_err(Error::Sync)?;
        written?;
        self.delivered.close_clean()
    }

    /// Counts definition writes: an operation that changed it touched
    /// durable state and must wait for a flush before answering.
    pub fn defs_version(&self) -> u64 {
        self.defs_version.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn defs_changed(&self) {
        self.defs_version
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Registers a durable queue's delivered mark: returns what the last
    /// stop left (every sequence at or below it may have been delivered)
    /// and the mark its deliveries raise (see delivered.rs).
    pub fn delivery_mark(&self, queue_id: u64) -> (u64, Arc<Mark>) {
        self.delivered.register(queue_id)
    }

    /// Called before message `seq` of queue `queue_id` goes out: a crash
    /// from now on brings it back redelivered.
    pub fn before_delivery(&self, queue_id: u64, mark: &Mark, seq: u64) {
        if let Err(e) = self.delivered.before_delivery(queue_id, mark, seq) {
            tracing::error!(queue_id, "cannot write the delivered mark: {e}");
        }
    }

    /// Bytes sled uses on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, Meta};
    use parking_lot::Mutex;

    /// A sync that records, at each call, whether message 1 of queue 1 was
    /// in sled yet, then syncs for real.
    struct Recording {
        inner: DiskSync,
        msgs: sled::Tree,
        calls: Mutex<Vec<bool>>,
    }

    impl Syncer for Recording {
        fn sync(&self) -> std::result::Result<(), String> {
            let present = self
                .msgs
                .get(messages::message_key(1, 1))
                .ok()
                .flatten()
                .is_some();
            self.calls.lock().push(present);
            self.inner.sync()
        }
    }

    fn recording() -> (Arc<Store>, Arc<Recording>) {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let sync = Arc::new(Recording {
            inner: DiskSync::new(db.clone(), None),
            msgs: db.open_tree("messages").unwrap(),
            calls: Mutex::new(Vec::new()),
        });
        let store = Store::temporary_with(db, Arc::clone(&sync) as Arc<dyn Syncer>).unwrap();
        (store, sync)
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

    #[test]
    fn a_group_commit_goes_through_the_sync() {
        let (store, sync) = recording();
        store.put_message(1, 1, &msg(), 0).unwrap();
        let ticket = store.ticket();
        let mut rx = store.flushed();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(rx.wait_for(|&done| done >= ticket)).unwrap();
        assert!(sync.calls.lock().contains(&true));
    }
}
