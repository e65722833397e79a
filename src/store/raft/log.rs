//! The Raft log: its entries in files of their own (entries.rs), its
//! vote, committed and purged ids in sled's tree `raft_meta`.
//!
//! Appends are group-committed: `append` writes the entries' files and
//! hands openraft's callback to the log's sync thread, which runs one sync
//! (fdatasync of the files written since its last round, then of their
//! directory: entries.rs) for every callback that came in while the
//! previous one ran, then reports them flushed. openraft counts an entry
//! toward a majority only once its callback has run. The sync waits for
//! the log's own files only, not for the state machine's writes or other
//! programs' on the same disk.
//!
//! The rarer writes that must be durable before openraft goes on (a vote,
//! a truncation) take the store's whole sync (sled's flush, then syncfs of
//! the data directory's filesystem: store/sync.rs). A purge does not make
//! openraft wait: the entries are forgotten at once, and the log's purge
//! thread removes their files only after such a sync, which makes the
//! purged id and the applied state that replaces them durable first. A
//! purge past the log's end (a snapshot installed) waits for that, and
//! for every purge before it: the next entry follows the purged id, and
//! files left below it would leave a hole.
//! Under load that sync and the removal of a few hundred MiB of files took
//! long enough that members purging together (they snapshot at the same
//! index) answered no heartbeat, and the leader stepped down. The
//! committed id is not synced (openraft does not need it to be); sled
//! flushes it with everything else every 500 ms.

use std::ops::RangeBounds;
use std::sync::mpsc;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{Entry, LogId, LogState, RaftLogReader, Vote};

use super::entries::Entries;
use super::{storage_error, StorageError, TypeConfig};
use crate::store::sync::Syncer;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";

/// What the sync thread calls once an append's entries are durable (or
/// cannot be made so): openraft's callback, or a test's.
type Done = Box<dyn FnOnce(std::io::Result<()>) + Send>;

/// The log of one node (cheap to clone: the reader is a clone).
#[derive(Clone)]
pub struct LogStore {
    log: Arc<Entries>,
    meta: sled::Tree,
    syncer: Arc<dyn Syncer>,
    flushes: mpsc::Sender<Done>,
    /// Purged entries whose files are to go (`purge_loop`).
    purges: mpsc::Sender<PurgeJob>,
    /// The last committed index openraft saved (metrics).
    committed: Arc<std::sync::atomic::AtomicU64>,
    /// When the appends' sync under way began (monotonic ms, plus one;
    /// 0: none runs), for the leader's watchdog: a sync that does not
    /// finish is a stalled disk, whatever the load.
    sync_since: Arc<std::sync::atomic::AtomicU64>,
}

impl LogStore {
    /// The log in `db` and `dir`, made durable by `syncer`.
    pub(crate) fn open(
        db: &sled::Db,
        dir: &std::path::Path,
        syncer: Arc<dyn Syncer>,
    ) -> crate::store::Result<LogStore> {
        let log = Arc::new(Entries::open(dir)?);
        migrate(db, &log, syncer.as_ref())?;
        let (flushes, rx) = mpsc::channel::<Done>();
        let sync_since: Arc<std::sync::atomic::AtomicU64> = Arc::default();
        let since = Arc::clone(&sync_since);
        let entries = Arc::clone(&log);
        std::thread::Builder::new()
            .name("raft-log-sync".into())
            .spawn(move || sync_loop(rx, &since, &entries))?;
        let (purges, rx) = mpsc::channel::<PurgeJob>();
        let (entries, durable) = (Arc::clone(&log), Arc::clone(&syncer));
        std::thread::Builder::new()
            .name("raft-log-purge".into())
            .spawn(move || purge_loop(rx, durable.as_ref(), &entries))?;
        Ok(LogStore {
            log,
            meta: db.open_tree("raft_meta")?,
            syncer,
            flushes,
            purges,
            committed: Arc::default(),
            sync_since,
        })
    }

    /// How long the appends' sync under way has run (none runs: zero).
    pub fn sync_running_for(&self) -> std::time::Duration {
        let since = self.sync_since.load(std::sync::atomic::Ordering::Acquire);
        match since {
            0 => std::time::Duration::ZERO,
            s => {
                std::time::Duration::from_millis(crate::util::coarse_now_ms().saturating_sub(s - 1))
            }
        }
    }

    /// The last committed index.
    pub fn committed(&self) -> u64 {
        self.committed.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn get_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        match self.meta.get(key).map_err(storage_error)? {
            Some(v) => bincode::deserialize(&v).map(Some).map_err(storage_error),
            None => Ok(None),
        }
    }

    fn put_meta<T: serde::Serialize>(&self, key: &[u8], value: &T) -> Result<(), StorageError> {
        let v = bincode::serialize(value).map_err(storage_error)?;
        self.meta.insert(key, v).map_err(storage_error)?;
        Ok(())
    }

    /// Makes every write so far durable, off the runtime's threads.
    async fn sync(&self) -> Result<(), StorageError> {
        let syncer = Arc::clone(&self.syncer);
        tokio::task::spawn_blocking(move || syncer.sync())
            .await
            .map_err(storage_error)?
            .map_err(storage_error)
    }

    /// Writes `entries` and has the sync thread call `done` once a sync
    /// covered them.
    fn append_then(&self, entries: Vec<Entry<TypeConfig>>, done: Done) -> Result<(), StorageError> {
        self.log.append(entries).map_err(storage_error)?;
        self.flushes
            .send(done)
            .map_err(|_| storage_error("the log's sync thread stopped"))
    }

    /// Keeps up to `max` bytes of purged entries' files to write new
    /// entries over (entries.rs).
    pub fn set_pool_bytes(&self, max: u64) {
        self.log.set_pool_bytes(max);
    }

    /// The index of the last entry in the log (0: none).
    pub fn last_index(&self) -> u64 {
        self.log.last().map_or(0, |l| l.index)
    }

    /// Bytes of the log's entries after `index` (the last snapshot's).
    pub fn bytes_after(&self, index: u64) -> u64 {
        self.log.bytes_after(index)
    }

    /// The newest entry at or before `index` whose purge leaves at most
    /// `bytes` of entries up to `index` (entries.rs; 0: none need go).
    pub fn last_beyond(&self, index: u64, bytes: u64) -> u64 {
        self.log.last_beyond(index, bytes)
    }

    /// Entries in the log (metrics).
    pub fn len(&self) -> usize {
        self.log.len()
    }

    /// Whether the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }
}

/// Runs one sync for every append that waits, back to back, and records
/// after each what it covered (entries.rs: damage there is not a torn
/// tail).
fn sync_loop(rx: mpsc::Receiver<Done>, since: &std::sync::atomic::AtomicU64, log: &Entries) {
    use std::sync::atomic::Ordering;
    while let Ok(first) = rx.recv() {
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        // Every file the callbacks stand for was written before it was sent.
        let point = log.sync_point();
        since.store(crate::util::coarse_now_ms() + 1, Ordering::Release);
        // Tests stall the disk here (FAILPOINTS="raft-log-sync=...").
        fail::fail_point!("raft-log-sync");
        let result = log.sync(&point);
        since.store(0, Ordering::Release);
        if result.is_ok() {
            if let Err(e) = log.mark_synced(&point) {
                tracing::warn!("cannot record how far the Raft log is synced: {e}");
            }
        }
        for done in waiting {
            done(match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            });
        }
    }
}

/// The indexes of purged entries whose files are to go, and who waits
/// until they are gone (with every purge sent before).
struct PurgeJob {
    gone: Vec<u64>,
    done: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
}

/// Removes the files of purged entries, oldest first, each batch after a
/// sync of the whole store (the purged id, and the applied state that
/// replaces the entries, are durable before any file goes). A removal
/// that fails is tried again with the next batch, so no hole opens. A
/// sync that fails is not tried again (a later sync may succeed without
/// the lost writes): no file goes from then on, which is safe (what stays
/// below the purged id nothing reads), and waiters get the error.
fn purge_loop(rx: mpsc::Receiver<PurgeJob>, syncer: &dyn Syncer, log: &Entries) {
    let mut pending: Vec<u64> = Vec::new();
    let mut broken: Option<String> = None;
    while let Ok(first) = rx.recv() {
        let mut waiting = Vec::new();
        for job in std::iter::once(first).chain(rx.try_iter()) {
            pending.extend(job.gone);
            waiting.extend(job.done);
        }
        // A waiter is owed a durable purged id even with no file to remove.
        if broken.is_none() && !(pending.is_empty() && waiting.is_empty()) {
            if let Err(e) = syncer.sync() {
                tracing::error!(
                    "cannot sync the store: purged Raft log entries keep their files: {e}"
                );
                broken = Some(e);
            }
        }
        let result = match &broken {
            Some(e) => Err(e.clone()),
            None => log.remove_files(&pending).map_err(|e| e.to_string()),
        };
        match &result {
            Ok(()) => pending.clear(),
            Err(e) if broken.is_none() => tracing::warn!(
                entries = pending.len(),
                "purged Raft log entries keep their files for now: {e}"
            ),
            Err(_) => {}
        }
        for done in waiting {
            let _ = done.send(result.clone());
        }
    }
}

impl LogStore {
    /// Makes node `id` the only voter (`warren cluster promote`, with the
    /// node stopped): a membership entry after the last one in the log, in
    /// a term above any seen, and a vote for `id` in that term, synced. On
    /// its next start the node leads alone and commits the log. `fallback`
    /// is the applied membership and last applied id (the log may be
    /// purged up to them). Refused unless the cluster has exactly two
    /// voters, `id` one of them, and `reachable` says the other's Raft
    /// address does not answer: with three or more voters a majority still
    /// decides, and promoting beside a live peer makes two leaders. Returns
    /// the new entry's index.
    pub(crate) fn force_single_voter(
        &self,
        id: u64,
        fallback: (
            &openraft::StoredMembership<u64, super::Member>,
            Option<LogId<u64>>,
        ),
        reachable: &dyn Fn(&str) -> bool,
    ) -> Result<u64, String> {
        use std::collections::{BTreeMap, BTreeSet};
        let e = |e: StorageError| e.to_string();
        // The last membership: in the log, else the applied one.
        let mut membership = fallback.0.membership().clone();
        let last: Option<LogId<u64>> = self.log.last();
        let purged: Option<LogId<u64>> = self.get_meta(PURGED).map_err(e)?;
        // Files below the purged id (left by a crash during a purge) are
        // older than the applied state: not searched, not counted.
        let floor = purged.map_or(0, |p| p.index);
        for i in self.log.indexes_newest_first() {
            if i <= floor && purged.is_some() {
                break;
            }
            let entry = self.log.range(i..=i).map_err(|x| x.to_string())?;
            if let Some(openraft::EntryPayload::Membership(m)) =
                entry.into_iter().next().map(|e| e.payload)
            {
                membership = m;
                break;
            }
        }
        let last = match (last, purged) {
            (Some(l), Some(p)) if p.index > l.index => Some(p),
            (l, p) => l.or(p),
        }
        .or(fallback.1);
        if !membership.voter_ids().any(|v| v == id) {
            return Err(format!(
                "node {id} is not a voting member of the cluster this store knows"
            ));
        }
        let voters: Vec<u64> = membership.voter_ids().collect();
        if voters.len() != 2 {
            return Err(format!(
                "the cluster this store knows has {} voters ({voters:?}): promote is only for \
                 the survivor of a two-node mirror; with more voters a majority decides (replace \
                 a lost node with `warren cluster replace` through a running member)",
                voters.len()
            ));
        }
        if let Some((other, node)) = voters
            .iter()
            .filter(|&&v| v != id)
            .find_map(|v| Some((*v, membership.get_node(v)?)))
        {
            if reachable(&node.raft) {
                return Err(format!(
                    "node {other} answers at {}: promote only a survivor whose peer is lost \
                     (stop node {other} first, and never start it again with its data)",
                    node.raft
                ));
            }
        }
        let me = membership
            .get_node(&id)
            .cloned()
            .ok_or_else(|| format!("node {id} is not a member of the cluster this store knows"))?;
        let vote: Option<Vote<u64>> = self.get_meta(VOTE).map_err(e)?;
        let term = vote
            .map_or(0, |v| v.leader_id().term)
            .max(last.map_or(0, |l| l.leader_id.term))
            + 1;
        let index = last.map_or(0, |l| l.index + 1);
        let only_me =
            openraft::Membership::new(vec![BTreeSet::from([id])], BTreeMap::from([(id, me)]));
        let entry: Entry<TypeConfig> = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(term, id), index),
            payload: openraft::EntryPayload::Membership(only_me),
        };
        self.log.append(vec![entry]).map_err(|x| x.to_string())?;
        self.put_meta(VOTE, &Vote::new_committed(term, id))
            .map_err(e)?;
        self.syncer.sync()?;
        Ok(index)
    }
}

/// Moves the entries an older version kept in sled's tree `raft_log` into
/// files, once.
fn migrate(db: &sled::Db, log: &Entries, syncer: &dyn Syncer) -> crate::store::Result<()> {
    let old = db.open_tree("raft_log")?;
    if old.is_empty() {
        return Ok(());
    }
    let corrupt = |e: bincode::Error| crate::store::Error::Corrupt(format!("raft_log: {e}"));
    tracing::info!(entries = old.len(), "moving the Raft log out of sled");
    let mut entries = Vec::new();
    for item in old.iter() {
        let (_, v) = item?;
        entries.push(bincode::deserialize::<Entry<TypeConfig>>(&v).map_err(corrupt)?);
        if entries.len() == 64 {
            log.append(std::mem::take(&mut entries))?;
        }
    }
    log.append(entries)?;
    syncer.sync().map_err(crate::store::Error::Sync)?;
    old.clear()?;
    syncer.sync().map_err(crate::store::Error::Sync)?;
    Ok(())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        self.log.range(range).map_err(storage_error)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId<u64>> = self.get_meta(PURGED)?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id: self.log.last().or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError> {
        self.put_meta(VOTE, vote)?;
        self.sync().await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), StorageError> {
        if let Some(c) = committed {
            self.committed
                .fetch_max(c.index, std::sync::atomic::Ordering::Relaxed);
        }
        self.put_meta(COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError> {
        Ok(self.get_meta::<Option<LogId<u64>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let done: Done = Box::new(move |r| callback.log_io_completed(r));
        self.append_then(entries.into_iter().collect(), done)
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        self.log.truncate(log_id.index).map_err(storage_error)?;
        // A truncated entry must not come back after a crash.
        self.sync().await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        // The purged id first; the purge thread makes it durable (with the
        // snapshot and applied ids written before it) before any file
        // goes: a crash midway leaves files below it, which nothing reads
        // and the next purge removes.
        self.put_meta(PURGED, &log_id)?;
        // A purge that leaves no entry (a snapshot installed past the log's
        // end) waits until the files are gone, with those of every purge
        // before: the next append comes after the purged id, and files
        // left below it after a crash would leave a hole at open.
        let wait = log_id.index >= self.last_index();
        let gone = self.log.forget(log_id.index);
        let (done, gone_now) = match wait {
            true => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        self.purges
            .send(PurgeJob { gone, done })
            .map_err(|_| storage_error("the log's purge thread stopped"))?;
        if let Some(rx) = gone_now {
            rx.await
                .map_err(|_| storage_error("the log's purge thread stopped"))?
                .map_err(storage_error)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::raft::Batch;
    use openraft::{CommittedLeaderId, EntryPayload};

    #[tokio::test]
    async fn entries_kept_in_sled_by_an_older_version_move_to_files() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let old = db.open_tree("raft_log").unwrap();
        for i in 1..=3u64 {
            let e: Entry<TypeConfig> = Entry {
                log_id: LogId::new(CommittedLeaderId::new(2, 1), i),
                payload: EntryPayload::Normal(Batch(vec![i as u8; 4].into())),
            };
            old.insert(i.to_be_bytes(), bincode::serialize(&e).unwrap())
                .unwrap();
        }
        let syncer = Arc::new(crate::store::sync::DiskSync::new(db.clone(), None));
        let mut log = LogStore::open(&db, &dir.path().join("raft-log"), syncer).unwrap();
        assert!(old.is_empty());
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index), Some(3));
        let got = log.try_get_log_entries(2..=3).await.unwrap();
        assert_eq!(
            got[1].payload,
            EntryPayload::Normal(Batch(vec![3u8; 4].into()))
        );
    }

    /// The store's whole sync, held up until the test lets it go: a disk
    /// busy with the state machine's writes, or another program's.
    struct Busy {
        released: parking_lot::Mutex<bool>,
        release: parking_lot::Condvar,
    }

    impl Busy {
        fn held() -> Arc<Busy> {
            Arc::new(Busy {
                released: parking_lot::Mutex::new(false),
                release: parking_lot::Condvar::new(),
            })
        }

        fn release(&self) {
            *self.released.lock() = true;
            self.release.notify_all();
        }
    }

    impl Syncer for Busy {
        fn sync(&self) -> Result<(), String> {
            let mut released = self.released.lock();
            while !*released {
                self.release.wait(&mut released);
            }
            Ok(())
        }
    }

    #[test]
    fn an_append_is_durable_without_waiting_for_the_rest_of_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let busy = Busy::held();
        let log = LogStore::open(&db, &dir.path().join("raft-log"), busy.clone()).unwrap();
        let (tx, rx) = mpsc::channel();
        let entry = |i: u64| Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
            payload: EntryPayload::Normal(Batch(vec![1u8; 64].into())),
        };
        for i in 1..=3 {
            let tx = tx.clone();
            log.append_then(vec![entry(i)], Box::new(move |r| tx.send(r).unwrap()))
                .unwrap();
        }
        // Each append is reported durable while the store-wide sync is
        // still held up (the wait only keeps a broken build from hanging).
        for _ in 1..=3 {
            let r = rx.recv_timeout(std::time::Duration::from_secs(60));
            assert!(
                matches!(r, Ok(Ok(()))),
                "append not reported durable: {r:?}"
            );
        }
        busy.release();
        // What a sync covered is recorded (at most once a second: maybe
        // only the first's), never past it.
        let synced = std::fs::read(dir.path().join("raft-log").join("synced")).unwrap();
        let synced = u64::from_be_bytes(synced.try_into().unwrap());
        assert!((1..=3).contains(&synced), "{synced}");
    }

    #[tokio::test]
    async fn a_purge_does_not_wait_for_the_sync_and_removes_files_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let busy = Busy::held();
        let mut log = LogStore::open(&db, &dir.path().join("raft-log"), busy.clone()).unwrap();
        let entries: Vec<Entry<TypeConfig>> = (1..=5)
            .map(|i| Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
                payload: EntryPayload::Normal(Batch(vec![1u8; 64].into())),
            })
            .collect();
        log.log.append(entries).unwrap();
        // Entries' files (a purged one may stay in the pool, renamed).
        let files = || {
            std::fs::read_dir(dir.path().join("raft-log"))
                .unwrap()
                .flatten()
                .filter(|f| f.file_name().to_string_lossy().parse::<u64>().is_ok())
                .count()
        };
        let before = files();
        // Returns while the store's sync is held up (the timeout only
        // keeps a broken build from hanging).
        let purged = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            log.purge(LogId::new(CommittedLeaderId::new(1, 1), 3)),
        )
        .await;
        if !matches!(purged, Ok(Ok(()))) {
            busy.release();
            panic!("purge waited for the sync");
        }
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(3));
        let left = log.try_get_log_entries(..).await.unwrap();
        assert_eq!(
            left.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            [4, 5]
        );
        assert_eq!(files(), before, "no file goes before the sync");
        busy.release();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while files() != before - 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            files(),
            before - 3,
            "the purged entries' files went after it"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_purge_past_the_end_waits_until_every_purged_file_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let busy = Busy::held();
        let mut log = LogStore::open(&db, &dir.path().join("raft-log"), busy.clone()).unwrap();
        let id = |i| LogId::new(CommittedLeaderId::new(1, 1), i);
        let entries: Vec<Entry<TypeConfig>> = (1..=5)
            .map(|i| Entry {
                log_id: id(i),
                payload: EntryPayload::Normal(Batch(vec![1u8; 64].into())),
            })
            .collect();
        log.log.append(entries).unwrap();
        // Entries' files (a purged one may stay in the pool, renamed).
        let files = || {
            std::fs::read_dir(dir.path().join("raft-log"))
                .unwrap()
                .flatten()
                .filter(|f| f.file_name().to_string_lossy().parse::<u64>().is_ok())
                .count()
        };
        let before = files();
        // Within the log: at once, its files left to the purge thread.
        log.purge(id(2)).await.unwrap();
        // Past its end (a snapshot installed): the next entry comes after
        // 10, so nothing below may stay behind a crash.
        let mut other = log.clone();
        let past = tokio::spawn(async move { other.purge(id(10)).await });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let waited = !past.is_finished();
        busy.release();
        assert!(
            waited,
            "a purge past the end returned before its files went"
        );
        let r = tokio::time::timeout(std::time::Duration::from_secs(10), past).await;
        assert!(matches!(r, Ok(Ok(Ok(())))), "{r:?}");
        assert_eq!(files(), before - 5, "every purged file is gone");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_purge_past_the_end_of_an_empty_log_waits_for_the_purged_id_to_be_durable() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let busy = Busy::held();
        let log = LogStore::open(&db, &dir.path().join("raft-log"), busy.clone()).unwrap();
        // No file to remove, but entries will follow 7: the purged id must
        // be durable first, or a crash leaves openraft a log it cannot read.
        let mut other = log.clone();
        let past = tokio::spawn(async move {
            other
                .purge(LogId::new(CommittedLeaderId::new(1, 1), 7))
                .await
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let waited = !past.is_finished();
        busy.release();
        assert!(waited, "returned before the store's sync");
        let r = tokio::time::timeout(std::time::Duration::from_secs(10), past).await;
        assert!(matches!(r, Ok(Ok(Ok(())))), "{r:?}");
    }
}
