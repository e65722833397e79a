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
//!
//! The message log holds puts back until a commit (msglog/held.rs), so a
//! message acked soon after it was applied is never written. The periodic
//! checkpoint leaves the puts of its last interval held
//! (`MessageLog::commit_older`) and so writes the marks noted at the
//! checkpoint before it: every put those cover was written by this one's
//! commit. A message then has one interval at least to be acked. The
//! checkpoints a purge or a stop runs write everything, and the newest
//! marks. One that fails stops the member:
//! the state machine refuses the next entry (`failure`), as a single
//! node's store is reopened after a failed commit; the Raft log keeps
//! every entry the mark does not cover.
//!
//! sled may flush definitions ahead of the mark, so a replay can put back
//! messages of a queue whose vhost's deletion sled already holds: the
//! deletion, replayed, finds no queue to purge. Once a minute the
//! checkpoint thread purges this member's messages of queue ids no
//! definition names (`sweep`). A queue's definition is applied before any
//! of its puts, so a live queue is never taken for one; a queue declared
//! by an entry a replay has not reached yet has every put after it, and
//! the replay puts them back.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::store::definitions;
use crate::store::msglog::MessageLog;
use crate::store::sync::Syncer;
use crate::store::Result;

/// How often a checkpoint runs while there is work for one.
const EVERY: Duration = Duration::from_millis(100);
/// How often messages of queues no definition names are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Keys and values of `raft_sm` waiting for the next checkpoint.
type Marks = Vec<(&'static [u8], Vec<u8>)>;

/// The checkpoints of one member.
pub struct Checkpoint {
    log: Arc<MessageLog>,
    meta: sled::Tree,
    /// The definitions (`sweep`).
    defs: sled::Tree,
    /// The marks the last apply reached, not written yet.
    wanted: Mutex<Option<Marks>>,
    /// The marks taken by the last periodic checkpoint, which the next
    /// one writes (guarded by `running`).
    previous: Mutex<Option<Marks>>,
    /// One checkpoint at a time: a mark is written only after a commit
    /// that began after it was noted.
    running: Mutex<()>,
    /// Why a checkpoint failed, if one did: none will succeed again.
    failure: Mutex<Option<String>>,
    /// Held by a sweep, and by a snapshot's load (`hold_sweep`): the
    /// definitions and the messages are replaced one after the other.
    sweeping: Mutex<()>,
}

impl Checkpoint {
    /// Checkpoints of `log` into `meta`, run every `EVERY` by a thread of
    /// their own while the checkpoint lives; `defs` for the sweep.
    pub fn start(
        log: Arc<MessageLog>,
        meta: sled::Tree,
        defs: sled::Tree,
    ) -> Result<Arc<Checkpoint>> {
        let c = Arc::new(Checkpoint::new(log, meta, defs));
        let weak = Arc::downgrade(&c);
        std::thread::Builder::new()
            .name("raft-checkpoint".into())
            .spawn(move || run_every(&weak))?;
        Ok(c)
    }

    fn new(log: Arc<MessageLog>, meta: sled::Tree, defs: sled::Tree) -> Checkpoint {
        Checkpoint {
            log,
            meta,
            defs,
            wanted: Mutex::new(None),
            previous: Mutex::new(None),
            running: Mutex::new(()),
            failure: Mutex::new(None),
            sweeping: Mutex::new(()),
        }
    }

    /// Keeps the sweep off while held (a snapshot being loaded: its
    /// messages may be in the log before their queues' definitions).
    pub fn hold_sweep(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.sweeping.lock()
    }

    /// Why a checkpoint failed, if one did.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Notes the marks of what was just applied: written by the next
    /// checkpoint (the last noted wins).
    pub fn note(&self, marks: Marks) {
        *self.wanted.lock() = Some(marks);
    }

    /// Commits the message log, every held put with it, then writes the
    /// newest marks noted before the commit began.
    pub fn run(&self) -> Result<()> {
        let _one = self.running.lock();
        let wanted = self.wanted.lock().take();
        let previous = self.previous.lock().take();
        self.commit(|| self.log.commit())?;
        self.write(wanted.or(previous))
    }

    /// The periodic checkpoint: commits the message log but for the puts
    /// held since the last one, then writes the marks that one noted.
    fn run_lagged(&self) -> Result<()> {
        let _one = self.running.lock();
        let wanted = self.wanted.lock().take();
        self.commit(|| self.log.commit_older())?;
        let due = std::mem::replace(&mut *self.previous.lock(), wanted);
        self.write(due)
    }

    fn commit(&self, commit: impl FnOnce() -> Result<()>) -> Result<()> {
        // One failed: whatever came since, no mark is written again.
        if let Some(e) = self.failure() {
            return Err(crate::store::Error::Sync(format!(
                "an earlier checkpoint failed: {e}"
            )));
        }
        if let Err(e) = commit() {
            // Not written, and never will be: a failed sync poisons the
            // log, and the member stops at its next entry.
            self.failure.lock().get_or_insert_with(|| e.to_string());
            return Err(e);
        }
        Ok(())
    }

    /// Writes `marks`, if any.
    fn write(&self, marks: Option<Marks>) -> Result<()> {
        if let Some(marks) = marks {
            let mut batch = sled::Batch::default();
            for (k, v) in marks {
                batch.insert(k, v);
            }
            self.meta.apply_batch(batch)?;
        }
        Ok(())
    }

    fn has_work(&self) -> bool {
        let wanted = self.wanted.lock().is_some() || self.previous.lock().is_some();
        wanted || self.log.wants_commit()
    }

    /// Purges this member's messages of queue ids no definition names
    /// (see the module's doc); returns how many queues'.
    pub fn sweep(&self) -> Result<usize> {
        let _one = self.sweeping.lock();
        let in_log = self.log.queue_ids()?;
        if in_log.is_empty() {
            return Ok(0);
        }
        // Read after the log's ids: a queue whose puts are in the log had
        // its definition applied before them.
        let defined = definitions::queue_ids(&self.defs)?;
        let mut swept = 0;
        for id in in_log {
            if !defined.contains(&id) && !crate::store::is_local(id) {
                tracing::warn!(queue_id = id, "deleting the messages of a deleted queue");
                self.log.purge_from(id, 0)?;
                swept += 1;
            }
        }
        Ok(swept)
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        // The last one, when it is dropped (a process that exits first
        // replays from the one before, which changes nothing).
        if let Err(e) = self.run() {
            tracing::warn!("last checkpoint of the applied state failed: {e}");
        }
    }
}

fn run_every(weak: &Weak<Checkpoint>) {
    let mut swept = Instant::now();
    loop {
        std::thread::sleep(EVERY);
        let Some(c) = weak.upgrade() else { return };
        if c.failure().is_some() {
            return;
        }
        if c.has_work() {
            if let Err(e) = c.run_lagged() {
                tracing::error!("checkpoint of the applied state failed: {e}");
            }
        }
        if swept.elapsed() >= SWEEP_EVERY {
            swept = Instant::now();
            if let Err(e) = c.sweep() {
                tracing::error!("cannot look for messages of deleted queues: {e}");
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
        let c = Checkpoint::new(Arc::clone(&log), meta.clone(), db.open_tree("d").unwrap());
        let m = Message::new(b"", b"q", &[0x10, 0, 2], b"body", Meta::default());
        log.put(1, 1, &m, false, 0, 0).unwrap();
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

    /// A periodic checkpoint leaves the puts of its last interval held
    /// and writes the marks the one before it noted: never a mark past
    /// what the log holds on disk. A full one writes all, and the newest.
    #[test]
    fn a_periodic_checkpoint_writes_the_marks_of_the_one_before() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let meta = db.open_tree("raft_sm").unwrap();
        let log = Arc::new(MessageLog::temporary().unwrap().hold_puts());
        let c = Checkpoint::new(Arc::clone(&log), meta.clone(), db.open_tree("d").unwrap());
        let m = Message::new(b"", b"q", &[0x10, 0, 2], b"body", Meta::default());
        let applied = || meta.get(b"applied").unwrap().map(|v| v.to_vec());
        log.put(1, 1, &m, false, 0, 0).unwrap();
        c.note(vec![(b"applied", vec![1])]);
        let empty = log.size_on_disk();
        c.run_lagged().unwrap();
        assert_eq!(applied(), None, "its put is still held");
        assert_eq!(log.size_on_disk(), empty);
        log.put(1, 2, &m, false, 0, 0).unwrap();
        c.note(vec![(b"applied", vec![2])]);
        c.run_lagged().unwrap();
        assert_eq!(applied(), Some(vec![1]));
        let one = log.size_on_disk();
        assert!(one > empty, "put 1 was written");
        // Put 2 is acked while held: neither it nor its ack is written.
        log.remove(1, 2).unwrap();
        c.run_lagged().unwrap();
        assert_eq!(applied(), Some(vec![2]));
        assert_eq!(log.size_on_disk(), one);
        log.put(1, 3, &m, false, 0, 0).unwrap();
        c.note(vec![(b"applied", vec![3])]);
        c.run().unwrap();
        assert_eq!(applied(), Some(vec![3]));
        assert!(log.size_on_disk() > one, "put 3 was written");
        assert!(!c.has_work());
    }

    /// A failed commit of the log fails the checkpoint for good, and the
    /// mark is not written.
    #[test]
    fn a_failed_commit_is_remembered_and_writes_no_mark() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let meta = db.open_tree("raft_sm").unwrap();
        let log = Arc::new(MessageLog::temporary().unwrap());
        let c = Checkpoint::new(Arc::clone(&log), meta.clone(), db.open_tree("d").unwrap());
        c.note(vec![(b"applied", vec![1])]);
        log.poison();
        assert!(c.run().is_err());
        assert!(c.failure().is_some());
        assert!(meta.get(b"applied").unwrap().is_none());
        assert!(c.run().is_err(), "and never again");
    }

    /// Messages of a queue no definition names go; a defined queue's stay.
    #[test]
    fn the_sweep_takes_only_undefined_queues() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let defs = db.open_tree("definitions").unwrap();
        let def = crate::store::QueueDef {
            vhost: "/".into(),
            name: "q".into(),
            id: 0,
            auto_delete: false,
            arguments: Default::default(),
        };
        let live = definitions::declare_queue(&defs, &def).unwrap();
        let log = Arc::new(MessageLog::temporary().unwrap());
        let m = Message::new(b"", b"q", &[0x10, 0, 2], b"body", Meta::default());
        log.put(live, 1, &m, false, 0, 0).unwrap();
        log.put(live + 1, 1, &m, false, 0, 0).unwrap();
        let c = Checkpoint::new(Arc::clone(&log), db.open_tree("raft_sm").unwrap(), defs);
        // A snapshot being loaded holds it off: its messages may be in
        // the log before their definitions.
        let c = Arc::new(c);
        let held = c.hold_sweep();
        let sweeper = std::thread::spawn({
            let c = Arc::clone(&c);
            move || c.sweep().unwrap()
        });
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            log.queue_ids().unwrap().len(),
            2,
            "nothing swept while held"
        );
        drop(held);
        assert_eq!(sweeper.join().unwrap(), 1);
        assert_eq!(log.queue_ids().unwrap(), vec![live]);
        assert_eq!(c.sweep().unwrap(), 0);
    }
}
