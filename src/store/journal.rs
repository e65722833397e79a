//! The journal: the ordered stream of operations (op.rs) and what makes
//! them durable. A writer submits an operation and takes a *ticket*; the
//! ticket's number is committed once every operation submitted before it
//! is durable, and a confirm waits for that.
//!
//! `LocalJournal` is today's: sled's own log is the stream. An operation
//! is applied at once (apply.rs) and the group commit (sync.rs) makes a
//! batch durable with one sync; writes deferred to the commit (deferred.rs:
//! a durable queue's unacked messages) are submitted just before it, so a
//! message acked first is never written. "Committed" means fsynced here.
//!
//! This is the seam the mirroring issue puts a Raft log behind: there,
//! `submit` appends to the batch that becomes the next log entry, the
//! committed watch follows the entries committed on a majority, and the
//! applier runs each committed entry on every node. Reads see applied
//! state, so a journal that applies on commit must still apply at once the
//! operations that stay local (transient messages paged out of memory).

use std::sync::Arc;

use tokio::sync::watch;

use super::apply::Applier;
use super::deferred::Registry;
use super::op::{Applied, Op};
use super::sync::{Flusher, Syncer};
use super::{Error, Result};

/// An ordered, committed stream of operations.
pub trait Journal: Send + Sync {
    /// Puts `op` in the stream, after every operation submitted before it
    /// returned, and says what applying it produced.
    fn submit(&self, op: &Op<'_>) -> Result<Applied>;
    /// The commit number that will cover every operation submitted before
    /// this call; asking for it starts a commit if none is under way.
    fn ticket(&self) -> u64;
    /// Watches the last commit number reached.
    fn committed(&self) -> watch::Receiver<u64>;
    /// Commits everything submitted so far, here and now, without the
    /// committer (it may have stopped: shutdown).
    fn commit_now(&self) -> Result<()>;
    /// Commits what is left and stops committing (shutdown).
    fn close(&self) -> Result<()>;
    /// Counts definition operations submitted: one that changed it must
    /// wait for a commit before answering.
    fn defs_version(&self) -> u64;
    /// Submits a message put whose body leaves memory (paged out): it must
    /// be readable at once, committed or not. A journal that applies on
    /// commit stages it (apply.rs); a paged transient message is staged
    /// only, it never leaves this node.
    fn submit_paged(&self, op: &Op<'_>) -> Result<Applied> {
        self.submit(op)
    }
    /// Whether operations are applied only once committed (a replicated
    /// journal): then a queue hands out a kept message only once the
    /// commit that covers it is reached.
    fn applies_on_commit(&self) -> bool {
        false
    }
    /// The last commit number reached.
    fn committed_now(&self) -> u64 {
        *self.committed().borrow()
    }
    /// Whether publishers should wait: work submitted and not committed
    /// is past the journal's bound (a replicated journal; raft/backlog.rs).
    fn congested(&self) -> bool {
        false
    }
    /// Watches `congested`, where it can change.
    fn congestion(&self) -> Option<watch::Receiver<bool>> {
        None
    }
    /// Whether what the journal replicates may be handed out now (a
    /// replicated journal: while its leadership lease holds).
    fn may_deliver(&self) -> bool {
        true
    }
    /// Whether the journal still commits: one whose commit failed never
    /// does again (a replicated term's broker must go; a single node's
    /// store is reopened, server.rs).
    fn is_open(&self) -> bool {
        true
    }
    /// Opens a group for this thread: until `close_group`, what it submits
    /// commits together or not at all (a replicated journal; see
    /// store/raft/pending.rs). Nested groups count as one.
    fn open_group(&self) {}
    /// Closes this thread's group.
    fn close_group(&self) {}
}

/// A journal that takes nothing: a follower's view of the applied state
/// (store/raft `Replica::view`), which only the applier changes.
pub struct ReadOnly {
    committed: watch::Sender<u64>,
}

impl ReadOnly {
    pub fn new() -> ReadOnly {
        ReadOnly {
            committed: watch::channel(0).0,
        }
    }
}

impl Default for ReadOnly {
    fn default() -> ReadOnly {
        ReadOnly::new()
    }
}

impl Journal for ReadOnly {
    fn submit(&self, _: &Op<'_>) -> Result<Applied> {
        Err(Error::Version(
            "a follower's view of the store takes no writes".into(),
        ))
    }
    fn ticket(&self) -> u64 {
        0
    }
    fn committed(&self) -> watch::Receiver<u64> {
        self.committed.subscribe()
    }
    fn commit_now(&self) -> Result<()> {
        Ok(())
    }
    fn close(&self) -> Result<()> {
        Ok(())
    }
    fn defs_version(&self) -> u64 {
        0
    }
    fn may_deliver(&self) -> bool {
        false
    }
}

/// The single-node journal: sled's log, made durable by group commit.
pub struct LocalJournal {
    applier: Arc<Applier>,
    flusher: Arc<Flusher>,
    syncer: Arc<dyn Syncer>,
    deferred: Arc<Registry>,
}

impl LocalJournal {
    /// A journal applying through `applier`, made durable by `syncer`;
    /// before each commit the holders in `deferred` submit their writes.
    pub fn start(
        applier: Arc<Applier>,
        syncer: Arc<dyn Syncer>,
        deferred: Arc<Registry>,
    ) -> LocalJournal {
        let before_commit: Box<dyn Fn() -> bool + Send> = {
            let deferred = Arc::clone(&deferred);
            Box::new(move || deferred.write_all())
        };
        let flusher = Flusher::start(Arc::clone(&syncer), before_commit);
        LocalJournal {
            applier,
            flusher,
            syncer,
            deferred,
        }
    }

    fn write_deferred(&self) -> Result<()> {
        if self.deferred.write_all() {
            Ok(())
        } else {
            Err(Error::Io(std::io::Error::other("a deferred write failed")))
        }
    }
}

impl Journal for LocalJournal {
    fn submit(&self, op: &Op<'_>) -> Result<Applied> {
        self.applier.apply(op)
    }

    fn ticket(&self) -> u64 {
        self.flusher.ticket()
    }

    fn committed(&self) -> watch::Receiver<u64> {
        self.flusher.subscribe()
    }

    fn commit_now(&self) -> Result<()> {
        self.write_deferred()?;
        self.syncer.sync().map_err(Error::Sync)
    }

    fn defs_version(&self) -> u64 {
        self.applier.defs_version()
    }

    fn is_open(&self) -> bool {
        self.flusher.failure().is_none()
    }

    fn close(&self) -> Result<()> {
        // The flusher's last round (deferred writes, then the sync) runs on
        // its own thread, so no number it publishes can confirm a write
        // still being made here; what registered since is written after,
        // and synced the same way as a group commit.
        self.flusher.stop();
        let written = self.write_deferred();
        self.syncer.sync().map_err(Error::Sync)?;
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, Meta};
    use crate::store::{delivered::DeliveredLog, QueueDef, Store};
    use amq_protocol::types::FieldTable;
    use bytes::BytesMut;
    use parking_lot::Mutex;

    /// A journal that passes operations on and keeps their encoding, as a
    /// replicating journal would ship them.
    struct Tee {
        inner: Arc<dyn Journal>,
        shipped: Arc<Mutex<Vec<bytes::Bytes>>>,
    }

    impl Journal for Tee {
        fn submit(&self, op: &Op<'_>) -> Result<Applied> {
            let mut buf = BytesMut::new();
            op.encode(&mut buf)?;
            self.shipped.lock().push(buf.freeze());
            self.inner.submit(op)
        }
        fn ticket(&self) -> u64 {
            self.inner.ticket()
        }
        fn committed(&self) -> watch::Receiver<u64> {
            self.inner.committed()
        }
        fn commit_now(&self) -> Result<()> {
            self.inner.commit_now()
        }
        fn close(&self) -> Result<()> {
            self.inner.close()
        }
        fn defs_version(&self) -> u64 {
            self.inner.defs_version()
        }
    }

    fn dump(tree: &sled::Tree) -> Vec<(sled::IVec, sled::IVec)> {
        tree.iter().map(|kv| kv.unwrap()).collect()
    }

    /// Applying the shipped stream elsewhere gives the same state, queue
    /// ids included.
    #[test]
    fn the_stream_applied_elsewhere_gives_the_same_state() {
        let shipped = Arc::new(Mutex::new(Vec::new()));
        let s = {
            let shipped = Arc::clone(&shipped);
            Store::temporary_wrapped(move |inner| Arc::new(Tee { inner, shipped })).unwrap()
        };
        let m = Message::new(
            b"",
            b"q",
            &[0x10, 0, 2],
            b"body",
            Meta::default().with_delivery_mode(2),
        );
        s.put_vhost(&crate::store::VhostDef {
            name: "/".into(),
            ..Default::default()
        })
        .unwrap();
        let def = |name: &str| QueueDef {
            vhost: "/".into(),
            name: name.into(),
            id: 0,
            auto_delete: false,
            arguments: FieldTable::default(),
        };
        let a = s.declare_queue(&def("a")).unwrap();
        let b = s.declare_queue(&def("b")).unwrap();
        for seq in 1..=5 {
            s.put_message(a, seq, &m, seq * 1000).unwrap();
            s.put_message(b, seq, &m, 0).unwrap();
        }
        s.remove_message(a, 2).unwrap();
        s.purge_from(a, 4).unwrap();
        s.delete_queue("/", "b", b).unwrap();
        s.put_delayed(10, 1, "/", 5, &m).unwrap();
        s.put_delayed(11, 2, "/", 5, &m).unwrap();
        s.remove_delayed(&[&10u64.to_be_bytes()[..], &1u64.to_be_bytes()[..]].concat())
            .unwrap();
        let (_, mark) = s.delivery_mark(a);
        s.before_delivery(a, &mark, 1);

        let db = sled::Config::new().temporary(true).open().unwrap();
        let replica = Applier::new(&db, DeliveredLog::in_memory()).unwrap();
        for raw in shipped.lock().iter() {
            crate::store::op::decode(raw.clone(), |op| replica.apply(&op))
                .unwrap()
                .unwrap();
        }
        assert_eq!(dump(&replica.defs), dump(&s.defs));
        assert_eq!(dump(&replica.delayed), dump(&s.delayed));
        // The replica keeps messages in sled, this single node in its log.
        let replicated: Vec<(u64, u64, Vec<u8>, u64)> = dump(&replica.msgs)
            .into_iter()
            .map(|(k, v)| {
                let (q, seq) = crate::store::messages::split_key(&k).unwrap();
                let d = crate::store::messages::decode_record(bytes::Bytes::copy_from_slice(&v))
                    .unwrap();
                (q, seq, d.message.body().to_vec(), d.deadline)
            })
            .collect();
        let here: Vec<(u64, u64, Vec<u8>, u64)> = [a, b]
            .into_iter()
            .flat_map(|q| s.messages(q).map(move |m| (q, m.unwrap())))
            .map(|(q, m)| (q, m.seq, m.message.body().to_vec(), m.deadline))
            .collect();
        assert_eq!(replicated, here);
        assert_eq!(here.len(), 2, "a: 1 and 3");
        let c = s.declare_queue(&def("c")).unwrap();
        assert_eq!(c, b + 1);
    }
}
