//! Durability on sled, behind a small interface: definitions (vhosts,
//! exchanges, queues, bindings) and persistent messages. Nothing outside this
//! module knows sled exists. Writes are applied at once (in memory, in sled's
//! log); `Store::ticket` + the flusher (`sync.rs`) make them durable in
//! groups: one fsync covers every write made before it started.

mod deferred;
mod definitions;
mod delayed;
mod marks;
mod messages;
mod sync;

use std::path::Path;
use std::sync::Arc;

pub use deferred::DeferredWrites;
pub use definitions::{BindingDef, ExchangeDef, QueueDef};
pub use delayed::DueMessage;
pub use messages::{decode_message, encode_message, StoredMessage};
pub use sync::Flusher;

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
    /// Per-queue delivery marks, written lazily by the flusher.
    marks: Arc<marks::Marks>,
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
        Self::from_db(db, Some(dir_handle))
    }

    /// A store that lives in a temp dir and vanishes on drop (unit tests).
    pub fn temporary() -> Result<Arc<Store>> {
        Self::from_db(sled::Config::new().temporary(true).open()?, None)
    }

    fn from_db(db: sled::Db, dir: Option<std::fs::File>) -> Result<Arc<Store>> {
        let defs = db.open_tree("definitions")?;
        let msgs = db.open_tree("messages")?;
        let delayed = db.open_tree("delayed")?;
        let marks = Arc::new(marks::Marks::default());
        let deferred = Arc::new(deferred::Registry::default());
        let before_flush: Box<dyn Fn() -> bool + Send> = {
            let (marks, defs) = (Arc::clone(&marks), defs.clone());
            let deferred = Arc::clone(&deferred);
            Box::new(move || {
                if let Err(e) = marks.write(&defs) {
                    tracing::warn!("cannot write delivery marks: {e}");
                }
                deferred.write_all()
            })
        };
        let flusher = Flusher::start(db.clone(), dir, before_flush);
        Ok(Arc::new(Store {
            db,
            defs,
            msgs,
            delayed,
            flusher,
            marks,
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
            self.db.flush()?;
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
    pub fn flush_now(&self) -> Result<()> {
        // The flusher's last round (deferred writes, then a flush) runs on
        // its own thread, so no epoch it publishes can confirm a write
        // still being made here; what registered since is written after.
        self.flusher.stop();
        let written = self.write_deferred();
        self.db.flush()?;
        written
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

    /// Registers a durable queue's delivery mark: returns the stored value
    /// and the atomic its deliveries raise (see marks.rs).
    pub fn delivery_mark(&self, queue_id: u64) -> Result<(u64, Arc<std::sync::atomic::AtomicU64>)> {
        let stored = marks::Marks::stored(&self.defs, queue_id)?;
        Ok((stored, self.marks.register(queue_id, stored)))
    }

    /// Writes the delivery marks that moved (the flusher does this itself).
    pub fn write_marks(&self) -> Result<()> {
        self.marks.write(&self.defs)
    }

    /// Bytes sled uses on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}
