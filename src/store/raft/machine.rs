//! The state machine: committed entries applied through the applier, on
//! every node (the leader too: its applied state is exactly the committed
//! one): definitions to sled, messages to the message log. Tree `raft_sm`
//! keeps the last applied log id, the membership and the current
//! snapshot's meta. Nothing is synced for an entry's sake (the Raft log is
//! durable, and a replay of entries already applied changes nothing, see
//! snapshot.rs, but for the messages a vhost's replayed deletion cannot
//! find: checkpoint.rs `sweep`); the last applied id and the membership are written by a
//! checkpoint (checkpoint.rs), after the message log's records up to them
//! are on disk, so a restart never starts past what the log holds.
//!
//! A snapshot is its meta only (the applied state is durable where it
//! is): its data is dumped when a leader first sends it
//! (snapshot_data.rs). A snapshot received is loaded, then its file goes.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StoredMembership};
use tokio::sync::watch;

use super::checkpoint::Checkpoint;
use super::snapshot_data::{self, SnapshotData};
use super::{snapshot, storage_error, Member, StorageError, TypeConfig};
use crate::store::apply::Applier;
use crate::store::op;

const APPLIED: &[u8] = b"applied";
const MEMBERSHIP: &[u8] = b"membership";
pub(super) const SNAPSHOT: &[u8] = b"snapshot";
/// Set (and synced) while a snapshot is being loaded: a crash then means
/// the trees are half loaded, and the next start loads it again.
const INSTALLING: &[u8] = b"installing";

type Membership = StoredMembership<u64, Member>;
type Meta = SnapshotMeta<u64, Member>;

/// The applied state of one node.
pub struct StateMachine {
    applier: Arc<Applier>,
    meta: sled::Tree,
    /// Writes the last applied id and the membership (checkpoint.rs).
    checkpoint: Arc<Checkpoint>,
    /// Where snapshot files live.
    dir: PathBuf,
    last_applied: Option<LogId<u64>>,
    membership: Membership,
    /// The last applied index, for the broker waiting to serve.
    applied: watch::Sender<u64>,
    /// Snapshot files received and not installed yet.
    incoming: u64,
    /// Held while the current snapshot changes (a build, an install):
    /// openraft builds on a task of its own.
    current: Arc<tokio::sync::Mutex<()>>,
    /// Held by a snapshot's dump (snapshot_data.rs).
    dumping: Arc<parking_lot::Mutex<()>>,
}

impl StateMachine {
    /// The state machine over `applier`'s trees; snapshots in `dir`.
    pub(crate) fn open(
        db: &sled::Db,
        applier: Arc<Applier>,
        checkpoint: Arc<Checkpoint>,
        dir: PathBuf,
    ) -> crate::store::Result<StateMachine> {
        std::fs::create_dir_all(&dir)?;
        let meta = db.open_tree("raft_sm")?;
        let read = |k: &[u8]| -> crate::store::Result<Option<sled::IVec>> { Ok(meta.get(k)?) };
        let corrupt = |e: bincode::Error| crate::store::Error::Corrupt(format!("raft_sm: {e}"));
        let last_applied = match read(APPLIED)? {
            Some(v) => bincode::deserialize(&v).map_err(corrupt)?,
            None => None,
        };
        let membership = match read(MEMBERSHIP)? {
            Some(v) => bincode::deserialize(&v).map_err(corrupt)?,
            None => Membership::default(),
        };
        // Snapshots received and never installed, and dumps made to be
        // sent (a snapshot built since may not have removed them).
        remove_files(&dir, |n| {
            n.starts_with("incoming-") || n.starts_with("sending-") || n.starts_with("dumping-")
        });
        // An older version kept the snapshot as current.snapshot.
        let legacy = dir.join("current.snapshot");
        if legacy.exists() {
            if let Some(snap) = current_snapshot(&meta)? {
                std::fs::rename(&legacy, snapshot_file(&dir, &snap.snapshot_id))?;
            }
        }
        let mut sm = StateMachine {
            applier,
            meta,
            checkpoint,
            dir,
            last_applied,
            membership,
            applied: watch::channel(0).0,
            incoming: 0,
            current: Arc::default(),
            dumping: Arc::default(),
        };
        if sm.meta.get(INSTALLING)?.is_some() {
            let snap = current_snapshot(&sm.meta)?.ok_or_else(|| {
                crate::store::Error::Corrupt("raft_sm: installing, no snapshot".into())
            })?;
            tracing::warn!(snapshot = %snap.snapshot_id, "a snapshot install was cut short: loading it again");
            let trees = sm.trees().map(Clone::clone);
            let path = sm.snapshot_path(&snap.snapshot_id);
            let no_sweep = sm.checkpoint.hold_sweep();
            snapshot::load(&trees.each_ref(), sm.applier.log.as_deref(), &path)?;
            drop(no_sweep);
            sm.last_applied = snap.last_log_id;
            sm.membership = snap.last_membership.clone();
            sm.save()
                .map_err(|e| crate::store::Error::Corrupt(e.to_string()))?;
            sm.checkpoint.run()?;
            sm.meta.remove(INSTALLING)?;
        }
        // Received snapshots once loaded, and older builds' snapshots:
        // the applied state is in the trees and the message log (flushed
        // first: an install's end may not be on disk yet).
        db.flush()?;
        remove_files(&sm.dir, |n| n.starts_with("snap-"));
        let index = sm.last_applied.map_or(0, |l: LogId<u64>| l.index);
        sm.applied.send_replace(index);
        Ok(sm)
    }

    /// The applied membership and the last applied log id.
    pub(crate) fn applied_membership(&self) -> (&Membership, Option<LogId<u64>>) {
        (&self.membership, self.last_applied)
    }

    /// Watches the last applied index.
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Notes the last applied id and the membership for the next
    /// checkpoint, which writes them once the log holds what they cover.
    fn save(&self) -> Result<(), StorageError> {
        if let Some(e) = self.checkpoint.failure() {
            return Err(storage_error(format!(
                "the applied state cannot be made durable (a checkpoint failed: {e})"
            )));
        }
        self.checkpoint.note(vec![
            (
                APPLIED,
                bincode::serialize(&self.last_applied).map_err(storage_error)?,
            ),
            (
                MEMBERSHIP,
                bincode::serialize(&self.membership).map_err(storage_error)?,
            ),
        ]);
        Ok(())
    }

    /// Writes them now, with a checkpoint (a snapshot was loaded).
    async fn save_now(&self) -> Result<(), StorageError> {
        self.save()?;
        let checkpoint = Arc::clone(&self.checkpoint);
        tokio::task::spawn_blocking(move || checkpoint.run())
            .await
            .map_err(storage_error)?
            .map_err(storage_error)
    }

    /// The file of received snapshot `id`, kept until it is loaded.
    fn snapshot_path(&self, id: &str) -> PathBuf {
        snapshot_file(&self.dir, id)
    }

    /// Where a snapshot's data is dumped from.
    fn source(&self) -> snapshot_data::Source {
        snapshot_data::Source {
            trees: self.trees().map(Clone::clone),
            log: self.applier.log.clone(),
            dir: self.dir.clone(),
            dumping: Arc::clone(&self.dumping),
            meta: self.meta.clone(),
        }
    }

    fn trees(&self) -> [&sled::Tree; 3] {
        [
            &self.applier.defs,
            &self.applier.msgs,
            &self.applier.delayed,
        ]
    }
}

/// Applies one entry's operations. Fail-stop: an operation that cannot
/// be read or applied stops this node's Raft (openraft takes a storage
/// error as fatal) before `last_applied` moves past the entry, so nothing
/// is skipped; the node stops with the error (server/mirror.rs), and a
/// restart applies the entry again from its first operation (applying
/// one twice changes nothing).
fn apply_batch(applier: &Applier, log_id: LogId<u64>, raw: Bytes) -> Result<(), StorageError> {
    let fail = |what: String| {
        tracing::error!(index = log_id.index, "log entry {log_id}: {what}");
        storage_error(format!("log entry {log_id}: {what}"))
    };
    let mut at = 0;
    while at < raw.len() {
        let Some(head) = raw.get(at..at + 4) else {
            return Err(fail("it ends inside an operation's length".into()));
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let Some(one) = raw.get(at + 4..at + 4 + len) else {
            return Err(fail("it ends inside an operation".into()));
        };
        match op::decode(raw.slice_ref(one), |op| applier.apply(&op)) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(fail(format!("an operation did not apply: {e}"))),
            Err(e) => {
                return Err(fail(format!(
                    "an operation cannot be read (written by a newer version?): {e}"
                )))
            }
        }
        at += 4 + len;
    }
    Ok(())
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<u64>>, Membership), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut out = Vec::new();
        for e in entries {
            match e.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(batch) => {
                    if let Err(e) = apply_batch(&self.applier, e.log_id, batch.0) {
                        // What the entries before it did is kept.
                        self.save()?;
                        if let Some(l) = self.last_applied {
                            self.applied.send_replace(l.index);
                        }
                        return Err(e);
                    }
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(e.log_id), m);
                }
            }
            self.last_applied = Some(e.log_id);
            out.push(());
        }
        self.save()?;
        if let Some(l) = self.last_applied {
            self.applied.send_replace(l.index);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Builder {
            source: self.source(),
            meta: self.meta.clone(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            current: Arc::clone(&self.current),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, StorageError> {
        // openraft receives one stream at a time: one begun before this
        // was abandoned.
        remove_files(&self.dir, |n| n.starts_with("incoming-"));
        self.incoming += 1;
        let path = self
            .dir
            .join(format!("incoming-{}.snapshot", self.incoming));
        let f = tokio::fs::File::create(&path)
            .await
            .map_err(storage_error)?;
        Ok(Box::new(SnapshotData::file(f)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        mut snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError> {
        use std::os::unix::fs::MetadataExt;
        use tokio::io::AsyncWriteExt;
        snapshot.flush().await.map_err(storage_error)?;
        let file = snapshot.as_file().map_err(storage_error)?;
        file.sync_all().await.map_err(storage_error)?;
        // The file this stream wrote, found by its inode: streams may have
        // begun (and been abandoned) since.
        let ino = file.metadata().await.map_err(storage_error)?.ino();
        drop(snapshot);
        let incoming = std::fs::read_dir(&self.dir)
            .map_err(storage_error)?
            .flatten()
            .find(|e| {
                e.file_name().to_string_lossy().starts_with("incoming-")
                    && e.metadata().is_ok_and(|m| m.ino() == ino)
            })
            .map(|e| e.path())
            .ok_or_else(|| storage_error("the received snapshot's file is gone"))?;
        let current = self.snapshot_path(&meta.snapshot_id);
        let lock = Arc::clone(&self.current);
        let guard = lock.lock().await;
        std::fs::rename(&incoming, &current).map_err(storage_error)?;
        // From here a crash loads the snapshot again at the next start.
        self.meta
            .insert(SNAPSHOT, bincode::serialize(meta).map_err(storage_error)?)
            .map_err(storage_error)?;
        self.meta
            .insert(INSTALLING, &[1u8])
            .map_err(storage_error)?;
        durable(&self.meta, &self.dir).await?;
        drop(guard);
        let trees = self.trees().map(Clone::clone);
        let (path, log) = (current.clone(), self.applier.log.clone());
        let checkpoint = Arc::clone(&self.checkpoint);
        tokio::task::spawn_blocking(move || {
            let _no_sweep = checkpoint.hold_sweep();
            snapshot::load(&trees.each_ref(), log.as_deref(), &path)
        })
        .await
        .map_err(storage_error)?
        .map_err(storage_error)?;
        self.applier.clear_pending().map_err(storage_error)?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.save_now().await?;
        self.meta.remove(INSTALLING).map_err(storage_error)?;
        // Durable (the loaded trees with it: sled flushes them all) before
        // the file goes: a start that still finds INSTALLING loads it again.
        durable(&self.meta, &self.dir).await?;
        if let Some(l) = self.last_applied {
            self.applied.send_replace(l.index);
        }
        // Loaded: the state is in the trees and the log now.
        let _ = std::fs::remove_file(&current);
        remove_other_dumps(&self.dir, &meta.snapshot_id);
        tracing::info!(snapshot = %meta.snapshot_id, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let Some(meta) = current_snapshot(&self.meta).map_err(storage_error)? else {
            return Ok(None);
        };
        let data = SnapshotData::lazy(self.source(), meta.snapshot_id.clone());
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(data),
        }))
    }
}

/// Builds a snapshot: its meta, recorded as the current one; its data is
/// dumped when first read (snapshot_data.rs).
pub struct Builder {
    source: snapshot_data::Source,
    meta: sled::Tree,
    last_applied: Option<LogId<u64>>,
    membership: Membership,
    current: Arc<tokio::sync::Mutex<()>>,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let id = match self.last_applied {
            Some(l) => format!(
                "{}-{}-{}",
                l.leader_id.term,
                l.index,
                crate::util::random_name()
            ),
            None => format!("0-0-{}", crate::util::random_name()),
        };
        let meta = Meta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id: id,
        };
        let _guard = self.current.lock().await;
        // A snapshot installed meanwhile (a follower catching up) is newer:
        // it stays the current one.
        let newer = current_snapshot(&self.meta)
            .map_err(storage_error)?
            .and_then(|m| m.last_log_id)
            .is_some_and(|l| Some(l) >= self.last_applied);
        if !newer {
            self.meta
                .insert(SNAPSHOT, bincode::serialize(&meta).map_err(storage_error)?)
                .map_err(storage_error)?;
            // Not flushed here: a purge of the log up to it runs a
            // checkpoint and flushes sled before any entry's file goes
            // (log.rs, checkpoint.rs `CheckpointSync`).
            remove_other_dumps(&self.source.dir, &meta.snapshot_id);
        }
        tracing::info!(snapshot = %meta.snapshot_id, "snapshot built");
        let data = SnapshotData::lazy(self.source.clone(), meta.snapshot_id.clone());
        Ok(Snapshot {
            meta,
            snapshot: Box::new(data),
        })
    }
}

/// The current snapshot's meta, if there is one.
pub(super) fn current_snapshot(meta: &sled::Tree) -> crate::store::Result<Option<Meta>> {
    let Some(raw) = meta.get(SNAPSHOT)? else {
        return Ok(None);
    };
    bincode::deserialize(&raw)
        .map(Some)
        .map_err(|e| crate::store::Error::Corrupt(format!("raft_sm: {e}")))
}

fn snapshot_file(dir: &std::path::Path, id: &str) -> PathBuf {
    dir.join(format!("snap-{id}.snapshot"))
}

/// Removes the dumps of every snapshot but `keep` (a stream reading one
/// keeps its file open).
fn remove_other_dumps(dir: &std::path::Path, keep: &str) {
    let keep = snapshot_data::sending_file(dir, keep);
    remove_files(dir, |n| {
        n.starts_with("sending-") && Some(n) != keep.file_name().and_then(|k| k.to_str())
    });
}

/// Removes the files in `dir` whose names `pick` says.
fn remove_files(dir: &std::path::Path, pick: impl Fn(&str) -> bool) {
    let Ok(all) = std::fs::read_dir(dir) else {
        return;
    };
    for e in all.flatten() {
        if pick(&e.file_name().to_string_lossy()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Makes the snapshot meta and the snapshot directory's entries durable
/// (sled's flush, then the directory's fsync), off the runtime's threads.
async fn durable(meta: &sled::Tree, dir: &std::path::Path) -> Result<(), StorageError> {
    let (meta, dir) = (meta.clone(), dir.to_path_buf());
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        meta.flush().map_err(std::io::Error::other)?;
        std::fs::File::open(&dir)?.sync_all()
    })
    .await
    .map_err(storage_error)?
    .map_err(storage_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{BufMut, BytesMut};
    use openraft::CommittedLeaderId;

    fn entry(index: u64, ops: &[&[u8]]) -> Entry<TypeConfig> {
        let mut raw = BytesMut::new();
        for op in ops {
            raw.put_u32(op.len() as u32);
            raw.extend_from_slice(op);
        }
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(super::super::Batch(raw.freeze())),
        }
    }

    /// A state machine over a temporary sled and message log, its
    /// snapshots in `dir`.
    fn machine(
        dir: &std::path::Path,
    ) -> (
        StateMachine,
        Arc<crate::store::msglog::MessageLog>,
        Arc<Checkpoint>,
    ) {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let delivered = crate::store::delivered::DeliveredLog::in_memory();
        let log = Arc::new(crate::store::msglog::MessageLog::temporary().unwrap());
        let applier = Arc::new(Applier::with_log(&db, delivered, Some(Arc::clone(&log))).unwrap());
        let (meta, defs) = (db.open_tree("raft_sm").unwrap(), db.open_tree("d").unwrap());
        let checkpoint = Checkpoint::start(Arc::clone(&log), meta, defs).unwrap();
        let snapshots = dir.join("snapshots");
        let sm = StateMachine::open(&db, applier, Arc::clone(&checkpoint), snapshots).unwrap();
        (sm, log, checkpoint)
    }

    #[tokio::test]
    async fn an_entry_that_cannot_be_applied_stops_apply_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sm, _, _) = machine(dir.path());
        let mut seeded = BytesMut::new();
        op::Op::UsersSeeded.encode(&mut seeded).unwrap();
        // An operation of a kind this build does not know (a newer
        // version's), after one it does.
        let unknown: &[u8] = &[0xff, 0xee, 1, 2, 3];
        let r = sm
            .apply(vec![entry(1, &[&seeded]), entry(2, &[&seeded, unknown])])
            .await;
        assert!(r.is_err(), "an unreadable operation was skipped");
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(1));
        // An entry cut inside an operation stops it too.
        let mut cut = entry(2, &[&seeded]);
        if let EntryPayload::Normal(b) = &mut cut.payload {
            b.0 = b.0.slice(..b.0.len() - 1);
        }
        assert!(sm.apply(vec![cut]).await.is_err());
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(1));
    }

    /// Once a checkpoint failed, the state machine refuses entries: the
    /// member stops rather than apply what it can no longer make durable.
    #[tokio::test]
    async fn a_failed_checkpoint_stops_apply() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sm, log, checkpoint) = machine(dir.path());
        let mut seeded = BytesMut::new();
        op::Op::UsersSeeded.encode(&mut seeded).unwrap();
        assert!(sm.apply(vec![entry(1, &[&seeded])]).await.is_ok());
        log.poison();
        assert!(checkpoint.run().is_err());
        assert!(sm.apply(vec![entry(2, &[&seeded])]).await.is_err());
    }

    /// A snapshot is built with no file; its data is dumped when read,
    /// and another member installs it, keeping no file once loaded.
    #[tokio::test]
    async fn a_snapshot_is_dumped_only_to_be_sent() {
        use crate::message::{Message, Meta as MsgMeta};
        let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut a, log_a, _) = machine(da.path());
        let (mut b, log_b, _) = machine(db.path());
        let mut seeded = BytesMut::new();
        op::Op::UsersSeeded.encode(&mut seeded).unwrap();
        a.apply(vec![entry(1, &[&seeded])]).await.unwrap();
        let m = Message::new(b"", b"q", &[0x10, 0, 2], b"body", MsgMeta::default());
        log_a.put(9, 1, &m, false, 0, 0).unwrap();

        let built = a
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(built.meta.last_log_id.map(|l| l.index), Some(1));
        let files = |d: &std::path::Path| std::fs::read_dir(d.join("snapshots")).unwrap().count();
        assert_eq!(files(da.path()), 0, "building wrote no file");

        let mut sent = a.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(sent.meta, built.meta);
        let mut rx = b.begin_receiving_snapshot().await.unwrap();
        tokio::io::copy(&mut sent.snapshot, &mut rx).await.unwrap();
        assert_eq!(files(da.path()), 1, "the dump being sent");
        b.install_snapshot(&sent.meta, rx).await.unwrap();
        assert_eq!(files(db.path()), 0, "the received file goes once loaded");
        assert_eq!(b.applied_state().await.unwrap().0, built.meta.last_log_id);
        let got: Vec<_> = log_b.stored(9).map(|r| r.unwrap().seq).collect();
        assert_eq!(got, vec![1]);
        assert_eq!(
            b.get_current_snapshot().await.unwrap().map(|s| s.meta),
            Some(sent.meta)
        );
    }
}
