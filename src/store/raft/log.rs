//! The Raft log on sled: tree `raft_log` (index, big-endian, to the
//! bincode of the entry) and tree `raft_meta` (vote, committed, purged).
//!
//! Appends are group-committed: `append` writes the entries into sled and
//! hands openraft's callback to the log's sync thread, which runs one sync
//! (sled's flush, then syncfs, store/sync.rs) for every callback that came
//! in while the previous one ran, then reports them flushed. openraft
//! counts an entry toward a majority only once its callback has run.

use std::ops::RangeBounds;
use std::sync::mpsc;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{Entry, LogId, LogState, RaftLogReader, Vote};

use super::{storage_error, StorageError, TypeConfig};
use crate::store::sync::Syncer;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";

/// The log of one node (cheap to clone: the reader is a clone).
#[derive(Clone)]
pub struct LogStore {
    log: sled::Tree,
    meta: sled::Tree,
    syncer: Arc<dyn Syncer>,
    flushes: mpsc::Sender<LogFlushed<TypeConfig>>,
    /// The last committed index openraft saved (metrics).
    committed: Arc<std::sync::atomic::AtomicU64>,
}

impl LogStore {
    /// The log in `db`, made durable by `syncer`.
    pub(crate) fn open(db: &sled::Db, syncer: Arc<dyn Syncer>) -> crate::store::Result<LogStore> {
        let (flushes, rx) = mpsc::channel::<LogFlushed<TypeConfig>>();
        let thread_syncer = Arc::clone(&syncer);
        std::thread::Builder::new()
            .name("raft-log-sync".into())
            .spawn(move || sync_loop(rx, thread_syncer))?;
        Ok(LogStore {
            log: db.open_tree("raft_log")?,
            meta: db.open_tree("raft_meta")?,
            syncer,
            flushes,
            committed: Arc::default(),
        })
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

    /// Entries in the log (metrics).
    pub fn len(&self) -> usize {
        self.log.len()
    }

    /// Whether the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }
}

/// Runs one sync for every append that waits, back to back.
fn sync_loop(rx: mpsc::Receiver<LogFlushed<TypeConfig>>, syncer: Arc<dyn Syncer>) {
    while let Ok(first) = rx.recv() {
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        let result = syncer.sync().map_err(std::io::Error::other);
        for cb in waiting {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            };
            cb.log_io_completed(r);
        }
    }
}

impl LogStore {
    /// Makes node `id` the only voter (`warren cluster promote`, with the
    /// node stopped): a membership entry after the last one in the log, in
    /// a term above any seen, and a vote for `id` in that term, synced. On
    /// its next start the node leads alone and commits the log. `fallback`
    /// is the applied membership and last applied id (the log may be
    /// purged up to them). Returns the new entry's index.
    pub(crate) fn force_single_voter(
        &self,
        id: u64,
        fallback: (
            &openraft::StoredMembership<u64, super::Member>,
            Option<LogId<u64>>,
        ),
    ) -> Result<u64, String> {
        use std::collections::{BTreeMap, BTreeSet};
        let e = |e: StorageError| e.to_string();
        // The last membership: in the log, else the applied one.
        let mut membership = fallback.0.membership().clone();
        let mut last: Option<LogId<u64>> = None;
        for item in self.log.iter().rev() {
            let (_, v) = item.map_err(|x| x.to_string())?;
            let entry = decode(&v).map_err(e)?;
            last.get_or_insert(entry.log_id);
            if let openraft::EntryPayload::Membership(m) = entry.payload {
                membership = m;
                break;
            }
        }
        let purged: Option<LogId<u64>> = self.get_meta(PURGED).map_err(e)?;
        let last = last.or(purged).or(fallback.1);
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
        let v = bincode::serialize(&entry).map_err(|x| x.to_string())?;
        self.log
            .insert(index.to_be_bytes(), v)
            .map_err(|x| x.to_string())?;
        self.put_meta(VOTE, &Vote::new_committed(term, id))
            .map_err(e)?;
        self.syncer.sync()?;
        Ok(index)
    }
}

fn decode(v: &[u8]) -> Result<Entry<TypeConfig>, StorageError> {
    bincode::deserialize(v).map_err(storage_error)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        use std::ops::Bound;
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let mut out = Vec::new();
        for item in self.log.range(start.to_be_bytes()..) {
            let (k, v) = item.map_err(storage_error)?;
            let index = u64::from_be_bytes(
                <[u8; 8]>::try_from(&k[..]).map_err(|_| storage_error("log key"))?,
            );
            if !range.contains(&index) {
                break;
            }
            out.push(decode(&v)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId<u64>> = self.get_meta(PURGED)?;
        let last = match self.log.last().map_err(storage_error)? {
            Some((_, v)) => Some(decode(&v)?.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last,
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
        let mut batch = sled::Batch::default();
        for e in entries {
            let v = bincode::serialize(&e).map_err(storage_error)?;
            batch.insert(&e.log_id.index.to_be_bytes(), v);
        }
        self.log.apply_batch(batch).map_err(storage_error)?;
        self.flushes
            .send(callback)
            .map_err(|_| storage_error("the log's sync thread stopped"))
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for item in self.log.range(log_id.index.to_be_bytes()..) {
            let (k, _) = item.map_err(storage_error)?;
            batch.remove(k);
        }
        self.log.apply_batch(batch).map_err(storage_error)?;
        // A truncated entry must not come back after a crash.
        self.sync().await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        self.put_meta(PURGED, &log_id)?;
        let mut batch = sled::Batch::default();
        for item in self.log.range(..=log_id.index.to_be_bytes()) {
            let (k, _) = item.map_err(storage_error)?;
            batch.remove(k);
        }
        self.log.apply_batch(batch).map_err(storage_error)
    }
}
