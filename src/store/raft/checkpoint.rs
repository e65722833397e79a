//! Checkpoints of a cluster member's applied state. The state machine
//! (machine.rs) applies committed entries' messages to the message log
//! (store/msglog) without a sync of its own: the Raft log is the durable
//! copy. What says how far the applied state goes (the last applied log
//! id and the membership, in sled's tree `raft_sm`) is written only here,
//! after a commit of the message log covered every record the entries up
//! to it appended. sled may flush that mark whenever it likes: it never
//! runs ahead of the messages on disk, so a restart (kill -9 or power
//! loss) applies again, from the Raft log, whatever the log may have lost.
//! Applying an entry again changes nothing (snapshot.rs).
//!
//! A checkpoint runs at least every `EVERY` while entries are applied (or
//! while the log has work: acks to sync, dead segments to remove,
//! compaction), and before the Raft log removes purged entries' files
//! (`CheckpointSync`: a purge follows a snapshot of applied state, so the
//! mark then covers every purged entry).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::store::msglog::MessageLog;
use crate::store::sync::Syncer;
use crate::store::Result;

/// How often a checkpoint runs while there is work for one.
const EVERY: Duration = Duration::from_millis(100);

/// Keys and values of `raft_sm` waiting for the next checkpoint.
type Marks = Vec<(&'static [u8], Vec<u8>)>;

/// The checkpoints of one member.
pub struct Checkpoint {
    log: Arc<MessageLog>,
    meta: sled::Tree,
    /// The marks the last apply reached, not written yet.
    wanted: Mutex<Option<Marks>>,
    /// One checkpoint at a time: a mark is written only after a commit
    /// that began after it was noted.
    running: Mutex<()>,
    stop: AtomicBool,
}

impl Checkpoint {
    /// Checkpoints of `log` into `meta`, run every `EVERY` by a thread of
    /// their own while the checkpoint lives.
    pub fn start(log: Arc<MessageLog>, meta: sled::Tree) -> Result<Arc<Checkpoint>> {
        let c = Arc::new(Checkpoint {
            log,
            meta,
            wanted: Mutex::new(None),
            running: Mutex::new(()),
            stop: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&c);
        std::thread::Builder::new()
            .name("raft-checkpoint".into())
            .spawn(move || run_every(&weak))?;
        Ok(c)
    }

    /// Notes the marks of what was just applied: written by the next
    /// checkpoint (the last noted wins).
    pub fn note(&self, marks: Marks) {
        *self.wanted.lock() = Some(marks);
    }

    /// Commits the message log, then writes the marks noted before the
    /// commit began.
    pub fn run(&self) -> Result<()> {
        let _one = self.running.lock();
        let wanted = self.wanted.lock().take();
        if let Err(e) = self.log.commit() {
            // Not written: the next checkpoint tries again (a failed
            // sync poisons the log, so none will vouch for it).
            let mut w = self.wanted.lock();
            if w.is_none() {
                *w = wanted;
            }
            return Err(e);
        }
        if let Some(marks) = wanted {
            let mut batch = sled::Batch::default();
            for (k, v) in marks {
                batch.insert(k, v);
            }
            self.meta.apply_batch(batch)?;
        }
        Ok(())
    }

    fn has_work(&self) -> bool {
        self.wanted.lock().is_some() || self.log.wants_commit()
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The last one, so that a clean stop replays nothing.
        if let Err(e) = self.run() {
            tracing::warn!("last checkpoint of the applied state failed: {e}");
        }
    }
}

fn run_every(weak: &Weak<Checkpoint>) {
    loop {
        std::thread::sleep(EVERY);
        let Some(c) = weak.upgrade() else { return };
        if c.stop.load(Ordering::Relaxed) {
            return;
        }
        if c.has_work() {
            if let Err(e) = c.run() {
                tracing::error!("checkpoint of the applied state failed: {e}");
            }
        }
    }
}

/// A whole-store sync that runs a checkpoint first: the Raft log's purges
/// and its rarer durable writes (a vote, a truncation) go through it.
pub struct CheckpointSync {
    pub checkpoint: Arc<Checkpoint>,
    pub inner: Arc<dyn Syncer>,
}

impl Syncer for CheckpointSync {
    fn sync(&self) -> std::result::Result<(), String> {
        self.checkpoint
            .run()
            .map_err(|e| format!("checkpoint of the applied state: {e}"))?;
        self.inner.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, Meta};

    /// The mark is written only by a checkpoint, after a commit of the
    /// log: never while the records it covers may be in memory only.
    #[test]
    fn the_mark_waits_for_a_commit_of_the_log() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let meta = db.open_tree("raft_sm").unwrap();
        let log = Arc::new(MessageLog::temporary().unwrap());
        // No thread: this test runs each checkpoint itself.
        let c = Checkpoint {
            log: Arc::clone(&log),
            meta: meta.clone(),
            wanted: Mutex::new(None),
            running: Mutex::new(()),
            stop: AtomicBool::new(false),
        };
        let m = Message::new(b"", b"q", &[0x10, 0, 2], b"body", Meta::default());
        log.put(1, 1, &m, false, 0).unwrap();
        c.note(vec![(b"applied", vec![1])]);
        assert!(meta.get(b"applied").unwrap().is_none(), "not before");
        assert!(log.wants_commit(), "the put is not synced yet");
        c.run().unwrap();
        assert_eq!(meta.get(b"applied").unwrap().as_deref(), Some(&[1u8][..]));
        assert!(!log.wants_commit(), "the checkpoint synced the log");
        // Nothing noted since: the mark stays.
        c.run().unwrap();
        assert_eq!(meta.get(b"applied").unwrap().as_deref(), Some(&[1u8][..]));
    }
}
