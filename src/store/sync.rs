//! Group commit. Writers put records into sled (no fsync) and take a
//! *ticket*: the number of the flush that will cover their write. One
//! flusher thread runs flushes back to back while there is demand, so every
//! writer that came in during a flush shares the next one.
//!
//! sled's own flush writes its log and calls sync_file_range(2), which
//! waits for the data to reach the device but neither flushes the device's
//! cache nor syncs metadata. So after it the flusher calls syncfs(2) on the
//! data directory's filesystem: a confirm then means what RabbitMQ's does
//! (fsync before confirm), and one such sync serves a whole group.
//!
//! Correctness: a writer reads the epoch counter after its write (or after
//! registering a deferred write). The flusher bumps the counter, then makes
//! the deferred writes, then flushes. So a writer that read epoch `g` wrote
//! (or registered) before flush `g + 1` began, and that flush covers it.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use tokio::sync::watch;

/// What makes every write made so far durable: the seam between the group
/// commit and the disk. Every path that promises durability (a group
/// commit, `Store::sync` after the flusher stopped, the shutdown flush)
/// goes through it.
pub trait Syncer: Send + Sync {
    /// Makes everything written before the call durable.
    fn sync(&self) -> Result<(), String>;
    /// Whether a sync has work though no writer waits for one (the
    /// flusher then runs one on its own: the message log's acks, and the
    /// space it gives back).
    fn wants_sync(&self) -> bool {
        false
    }
}

/// sled's flush, then syncfs(2) on the data directory's filesystem.
pub struct DiskSync {
    db: sled::Db,
    /// None for a temporary store (nothing to sync past sled).
    dir: Option<File>,
}

impl DiskSync {
    /// The sync of `db`, whose files live in `dir`.
    pub fn new(db: sled::Db, dir: Option<File>) -> DiskSync {
        DiskSync { db, dir }
    }
}

impl Syncer for DiskSync {
    fn sync(&self) -> Result<(), String> {
        self.db.flush().map_err(|e| e.to_string())?;
        if let Some(dir) = &self.dir {
            syncfs(dir).map_err(|e| format!("syncfs of the data directory: {e}"))?;
        }
        Ok(())
    }
}

/// A single node's sync: the message log's commit (one fdatasync of the
/// segments written), then `rest` (sled's flush and syncfs) only if
/// something outside the log was written since the last: definitions,
/// held delayed messages, delivered marks. A confirm of a persistent
/// message then costs one sync, shared by its group.
pub struct LogSync {
    log: Arc<crate::store::msglog::MessageLog>,
    rest: Arc<dyn Syncer>,
    /// Set by every write outside the log (apply.rs).
    dirty: Arc<AtomicBool>,
}

impl LogSync {
    /// The sync of `log`, and of `rest` when `dirty` says so.
    pub fn new(
        log: Arc<crate::store::msglog::MessageLog>,
        rest: Arc<dyn Syncer>,
        dirty: Arc<AtomicBool>,
    ) -> LogSync {
        LogSync { log, rest, dirty }
    }
}

impl Syncer for LogSync {
    fn sync(&self) -> Result<(), String> {
        // Taken before the log's sync: a write outside the log made after
        // this sets it again for the next.
        let dirty = self.dirty.swap(false, Ordering::SeqCst);
        let synced = self
            .log
            .commit()
            .map_err(|e| format!("message log: {e}"))
            .and_then(|()| if dirty { self.rest.sync() } else { Ok(()) });
        if synced.is_err() && dirty {
            self.dirty.store(true, Ordering::SeqCst);
        }
        synced
    }

    fn wants_sync(&self) -> bool {
        // sled does not flush on a timer here: a write nobody waits for
        // (a hold without confirms, a reservation) is synced within one
        // tick.
        self.dirty.load(Ordering::SeqCst) || self.log.wants_commit()
    }
}

/// The group-commit flusher of one store.
pub struct Flusher {
    epoch: AtomicU64,
    /// The last completed epoch, as `done` says, read without its lock
    /// (a cluster's queues read it on every dispatch).
    completed: AtomicU64,
    wanted: AtomicBool,
    /// The first flush that failed, if one did: from then on the store
    /// must be reopened (sled refuses every write after an I/O error, and
    /// after a failed sync what the page cache holds is unknown).
    failure: Mutex<Option<String>>,
    lock: Mutex<Signal>,
    wake: Condvar,
    done: watch::Sender<u64>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What the flusher thread waits for.
#[derive(Default)]
struct Signal {
    pending: bool,
    stop: bool,
}

impl Flusher {
    /// Starts the flusher thread for `db`.
    /// `before_flush` runs before every flush and every 100 ms otherwise
    /// (it makes the deferred writes); false means a write failed, and the
    /// flush then confirms nothing.
    pub fn start(
        syncer: Arc<dyn Syncer>,
        before_flush: Box<dyn Fn() -> bool + Send>,
    ) -> Arc<Flusher> {
        let (done, _) = watch::channel(0);
        let f = Arc::new(Flusher {
            epoch: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            wanted: AtomicBool::new(false),
            failure: Mutex::new(None),
            lock: Mutex::new(Signal::default()),
            wake: Condvar::new(),
            done,
            thread: Mutex::new(None),
        });
        let weak = Arc::downgrade(&f);
        let spawned = std::thread::Builder::new()
            .name("warren-flusher".into())
            .spawn(move || Self::run(weak, syncer, before_flush));
        match spawned {
            Ok(handle) => *f.thread.lock() = Some(handle),
            Err(e) => tracing::error!("cannot start the flusher thread: {e}"),
        }
        f
    }

    /// The flush epoch that will cover every write made before this call.
    pub fn ticket(&self) -> u64 {
        let ticket = self.epoch.load(Ordering::SeqCst) + 1;
        if !self.wanted.swap(true, Ordering::SeqCst) {
            self.lock.lock().pending = true;
            self.wake.notify_one();
        }
        ticket
    }

    /// Stops the thread after a last flush and waits for it, so that its
    /// handle on the database is gone (sled's directory lock goes with the
    /// last handle).
    pub fn stop(&self) {
        self.lock.lock().stop = true;
        self.wake.notify_one();
        if let Some(handle) = self.thread.lock().take() {
            let _ = handle.join();
        }
    }

    /// The last completed epoch.
    pub fn committed_now(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// Watches the last completed epoch.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.done.subscribe()
    }

    /// Why a flush failed, if one did.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    fn run(
        this: std::sync::Weak<Flusher>,
        syncer: Arc<dyn Syncer>,
        before_flush: Box<dyn Fn() -> bool + Send>,
    ) {
        loop {
            let Some(f) = this.upgrade() else { return };
            {
                let mut signal = f.lock.lock();
                while !signal.pending && !signal.stop {
                    // Wake now and then: to make deferred writes nobody
                    // waits on (publishers without confirms), and to
                    // notice that the store was dropped.
                    if f.wake
                        .wait_for(&mut signal, std::time::Duration::from_millis(100))
                        .timed_out()
                    {
                        if std::sync::Arc::strong_count(&f) == 1 {
                            return;
                        }
                        let written = parking_lot::MutexGuard::unlocked(&mut signal, &before_flush);
                        if !written {
                            f.failed("a deferred write failed".into());
                        } else if syncer.wants_sync() {
                            signal.pending = true;
                        }
                    }
                }
                if signal.stop {
                    // The last round is a group commit like any other.
                    if let Err(e) = Self::flush(syncer.as_ref(), &before_flush) {
                        tracing::error!("last store flush failed: {e}");
                    }
                    return;
                }
                signal.pending = false;
            }
            f.wanted.store(false, Ordering::SeqCst);
            let epoch = f.epoch.fetch_add(1, Ordering::SeqCst) + 1;
            match Self::flush(syncer.as_ref(), &before_flush) {
                Ok(()) => {
                    // Before the watch wakes anyone who then reads it.
                    f.completed.store(epoch, Ordering::Release);
                    f.done.send_replace(epoch);
                }
                Err(e) => {
                    // Confirms stay pending rather than lie; try again,
                    // soon the first time (a single node's server reopens
                    // the store; a cluster's term gives way).
                    let again = if f.failed(e) { 50 } else { 1000 };
                    std::thread::sleep(std::time::Duration::from_millis(again));
                    f.lock.lock().pending = true;
                }
            }
        }
    }
}

impl Flusher {
    /// Records a failure; true (and logged as an error) if it is the first.
    fn failed(&self, e: String) -> bool {
        let mut failure = self.failure.lock();
        if failure.is_some() {
            tracing::debug!("store flush failed again: {e}");
            return false;
        }
        tracing::error!("store flush failed: {e}");
        *failure = Some(e);
        true
    }

    /// One group commit: deferred writes, then the sync.
    fn flush(syncer: &dyn Syncer, before_flush: &dyn Fn() -> bool) -> Result<(), String> {
        if !before_flush() {
            return Err("a deferred write failed".into());
        }
        syncer.sync()
    }
}

/// Syncs the filesystem that holds `dir` (Linux); elsewhere, fsyncs it.
fn syncfs(dir: &File) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: the fd is valid for the life of `dir`; syncfs only reads it.
        if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        dir.sync_all()
    }
}
