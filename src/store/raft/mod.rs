//! The replicated store: the operation stream (op.rs) behind a Raft log
//! (openraft 0.9). The leader's journal (journal.rs) gathers the
//! operations submitted while the previous entry was in flight into one
//! log entry (a `Batch`); an entry is committed once a majority has
//! fsynced it (log.rs: one sync covers every entry appended while the
//! previous one ran), and then every node's state machine (machine.rs)
//! applies it through the one applier: definitions to sled, messages to
//! the message log (store/msglog), made durable by checkpoints
//! (checkpoint.rs) rather than per entry. Snapshots (snapshot.rs)
//! stream the applied trees to a node that is too far behind, from a file,
//! in chunks.
//!
//! Applying on commit, on every node, keeps the applied state exactly the
//! committed one; what the leader must read back before its commit (a
//! message paged out of memory) is staged (apply.rs).

// openraft's traits fix the error type (StorageError, over 200 bytes).
#![allow(clippy::result_large_err)]

mod backlog;
mod checkpoint;
mod entries;
mod journal;
mod log;
mod machine;
mod pending;
mod snapshot;
mod snapshot_data;

use std::io::Cursor;

use serde::{Deserialize, Serialize};

pub use journal::RaftJournal;
pub use log::LogStore;
pub use machine::StateMachine;

/// A cluster member as the membership carries it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// host:port of its Raft listener (Raft messages, proxied clients).
    pub raft: String,
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.raft)
    }
}

/// One log entry's operations: each a u32 length (big-endian) and the
/// operation's encoding (op.rs). Shared, not copied, between the log's
/// cache, replication and apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch(pub bytes::Bytes);

impl Batch {
    /// An entry's bytes, near enough (memory, the wire).
    pub fn weight(e: &openraft::Entry<TypeConfig>) -> usize {
        match &e.payload {
            openraft::EntryPayload::Normal(b) => b.0.len() + 64,
            _ => 256,
        }
    }
}

impl std::fmt::Display for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "batch of {} bytes", self.0.len())
    }
}

openraft::declare_raft_types!(
    /// Warren's Raft types.
    pub TypeConfig:
        D = Batch,
        R = (),
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = snapshot_data::SnapshotData,
        AsyncRuntime = openraft::TokioRuntime,
);

// `declare_raft_types!` names Cursor in its defaults.
#[allow(dead_code)]
type Unused = Cursor<Vec<u8>>;

/// A running Raft node of this store.
pub type Raft = openraft::Raft<TypeConfig>;

/// A storage error as openraft takes it.
pub type StorageError = openraft::StorageError<u64>;

/// An I/O failure of the log or the state machine, for openraft.
pub(crate) fn storage_error(e: impl std::fmt::Display) -> StorageError {
    openraft::StorageError::IO {
        source: openraft::StorageIOError::write(openraft::AnyError::error(e)),
    }
}

/// What a cluster node opens once: sled, the applier, the Raft log and
/// the state machine; the store of each term it leads is made from it.
pub struct Replica {
    db: sled::Db,
    applier: std::sync::Arc<crate::store::Applier>,
    /// The Raft log.
    pub log: LogStore,
    machine: Option<StateMachine>,
    applied: tokio::sync::watch::Receiver<u64>,
}

impl Replica {
    /// Opens (or creates) a node's state in `dir`.
    pub fn open(dir: &std::path::Path, cache_bytes: u64) -> crate::store::Result<Replica> {
        use std::sync::Arc;
        let (db, syncer, marks) = crate::store::Store::open_files(dir, cache_bytes)?;
        // The Raft log is what the member applied until a checkpoint
        // commits the message log: puts wait for that commit.
        let messages =
            Arc::new(crate::store::msglog::MessageLog::open(&dir.join("messages"))?.hold_puts());
        let applier = Arc::new(crate::store::Applier::with_log(
            &db,
            marks,
            Some(Arc::clone(&messages)),
        )?);
        // An older build's messages, in sled, move to the log once.
        crate::store::migrate::messages_to_log(&db, &applier.msgs, &messages)?;
        let checkpoint = checkpoint::Checkpoint::start(
            messages,
            db.open_tree("raft_sm")?,
            applier.defs.clone(),
        )?;
        let syncer = Arc::new(checkpoint::CheckpointSync {
            checkpoint: Arc::clone(&checkpoint),
            inner: syncer,
        });
        let log = LogStore::open(&db, &dir.join("raft-log"), syncer)?;
        let machine =
            StateMachine::open(&db, Arc::clone(&applier), checkpoint, dir.join("snapshots"))?;
        let applied = machine.applied();
        Ok(Replica {
            db,
            applier,
            log,
            machine: Some(machine),
            applied,
        })
    }

    /// Makes node `id` the only voter of the cluster this store knows, with
    /// the node stopped (`warren cluster promote`): the survivor of a
    /// two-node mirror then leads alone. Returns the index of the entry
    /// that says so.
    /// Refused unless the mirror has two voters and `reachable` says the
    /// other one's Raft address does not answer.
    pub fn promote(&self, id: u64, reachable: &dyn Fn(&str) -> bool) -> Result<u64, String> {
        let machine = self
            .machine
            .as_ref()
            .ok_or_else(|| "the state machine is taken".to_string())?;
        self.log
            .force_single_voter(id, machine.applied_membership(), reachable)
    }

    /// The state machine, for openraft (once).
    pub fn take_machine(&mut self) -> Option<StateMachine> {
        self.machine.take()
    }

    /// Watches the last applied log index.
    pub fn applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied.clone()
    }

    /// The store of a term `raft` leads here: everything committed before
    /// it must be applied; it delivers while `lease` holds.
    pub fn store_for_term(
        &self,
        raft: Raft,
        lease: std::sync::Arc<crate::store::lease::Lease>,
    ) -> crate::store::Result<std::sync::Arc<crate::store::Store>> {
        let applier = std::sync::Arc::clone(&self.applier);
        crate::store::Store::for_term(
            self.db.clone(),
            std::sync::Arc::clone(&applier),
            |deferred| {
                let j = RaftJournal::start(applier, raft, deferred, lease)?;
                Ok(std::sync::Arc::new(j) as std::sync::Arc<dyn crate::store::Journal>)
            },
        )
    }

    /// A view of the applied state that takes no writes (a follower
    /// serving stream readers from its own copy: server/follow_reads).
    pub fn view(&self) -> crate::store::Result<std::sync::Arc<crate::store::Store>> {
        crate::store::Store::for_term(
            self.db.clone(),
            std::sync::Arc::clone(&self.applier),
            |_| Ok(std::sync::Arc::new(crate::store::journal::ReadOnly::new())),
        )
    }

    /// Forgets what the last term staged (this node stopped leading).
    pub fn clear_staged(&self) -> crate::store::Result<()> {
        self.applier.clear_pending()
    }

    /// The cluster version the applied state records.
    pub fn cluster_version(&self) -> crate::store::Result<u32> {
        self.applier.cluster_version()
    }

    /// Bytes sled and the message log use on disk.
    pub fn size_on_disk(&self) -> u64 {
        let log = self.applier.log.as_ref().map_or(0, |l| l.size_on_disk());
        self.db.size_on_disk().unwrap_or(0) + log
    }
}
