//! The Raft log's entries, one file each in `raft-log/` (named by index),
//! with the newest in memory. Not in sled: an entry is a whole group
//! commit (up to megabytes), and sled keeps sixteen values to a leaf, so
//! a leaf of entries was a multi-megabyte blob that every split, and every
//! segment its pages lived in being cleaned, wrote again: a third of a
//! 3-node cluster's CPU went to rewriting them. A file is written once,
//! read back only by a follower far behind, and unlinked when purged.
//!
//! A file is a header (magic, length, CRC-32 of the body, the entry's log
//! id) and the body: a normal entry's batch as it is, after a tag octet
//! (`WRL2`; written from the batch without a copy), any other entry's
//! bincode after another tag, or (`WRL1`, older builds) the bincode of
//! the entry. Writes are not synced when made: the
//! log's sync thread takes the files written since its last round
//! (`sync_point`) and fdatasyncs them, then the directory (`sync`), and
//! only then does openraft count an entry. Nothing else on the disk is
//! waited for: not the state machine's sled writes, not other programs'
//! (a whole-filesystem syncfs did, and a busy disk then held up every
//! commit and vote). A file cut short by a crash (its
//! header or length wrong, or, among the last files, its checksum) past
//! the last index a finished sync covered was never reported durable: at
//! open it is removed, with every later one. That index is kept in the
//! file `synced`, written after a sync finished, at most once per
//! `MARK_EVERY` (so it only ever names entries already synced; a crash,
//! or the wait, may leave an older value, which only vouches for less);
//! damage at or below it is not a torn tail but
//! damaged data, and the log does not open.
//!
//! Purged entries' files are not unlinked but kept, up to the bytes
//! `set_pool_bytes` says (the cluster's `log_max_mb`: what the log grows
//! by before the next purge), under names of their own (`free-N`), and a
//! new entry is written over the oldest: the page cache still holds its
//! pages, and writing over them costs far less than filling new ones (on
//! this project's virtual machines the host backs a page again after the
//! guest frees it, and the copy into new page-cache pages was the largest
//! single cost of a cluster member). A file taken from the pool is renamed
//! to its entry's name, then written and cut to length: until a sync
//! covers it, a crash may leave the old contents, or a new header on an
//! old body, which the open treats as any entry a crash cut short (every
//! file past the synced mark is read whole: header index, length and
//! checksum).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use openraft::{Entry, LogId};
use parking_lot::Mutex;

use super::TypeConfig;

/// The body is the bincode of the entry (older builds).
const MAGIC_V1: &[u8; 4] = b"WRL1";
/// The body is a tag, then a normal entry's batch (`RAW`) or the bincode
/// of any other entry (`ENCODED`).
const MAGIC: &[u8; 4] = b"WRL2";
const RAW: u8 = 1;
const ENCODED: u8 = 0;
/// Unsynced entries' files kept open for their sync, at the most.
const OPEN_UNSYNCED: usize = 256;
/// How often the file `synced` is rewritten at the most.
const MARK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Magic, body length, CRC-32 of the body, then the entry's log id (term,
/// leader node, index), so that opening the log reads headers only.
const HEADER: usize = 36;
/// Files at the end whose whole body is checked at open (a crash can cut
/// short only what was written since the last sync).
const CHECKED_AT_OPEN: usize = 64;

/// Entries kept in memory at most (bytes of their batches): what apply and
/// replication read back, and a follower a little behind.
const CACHE_BYTES: usize = 64 << 20;

/// The file naming the last index a finished sync covered.
const SYNCED: &str = "synced";
/// How the pool's files are named (then a number).
const POOL_PREFIX: &str = "free-";

/// The entry files of one node.
pub struct Entries {
    dir: PathBuf,
    /// The directory, open for its fsync (new files' names).
    dir_handle: fs::File,
    inner: Mutex<Inner>,
    /// Bumped by every truncation: a sync that began before one may not
    /// vouch for the indexes it removed (they may be written again).
    truncations: std::sync::atomic::AtomicU64,
    /// When the file `synced` was last written.
    marked: Mutex<Option<std::time::Instant>>,
    /// Purged entries' files, to be written over.
    pool: Mutex<Pool>,
}

/// Purged entries' files kept to be written over: each file's name and
/// size, their bytes, and the number the next one is named by.
#[derive(Default)]
struct Pool {
    /// Oldest first: a file is written over as late as can be, long
    /// after any read of its purged entry that began before the purge.
    files: std::collections::VecDeque<(PathBuf, u64)>,
    bytes: u64,
    next: u64,
    /// Bytes kept at the most (none until `set_pool_bytes`).
    max: u64,
}

#[derive(Default)]
struct Inner {
    /// Every index on disk, with the entry's log id.
    on_disk: BTreeMap<u64, LogId<u64>>,
    /// The size of each entry's file (read at open from its header).
    sizes: BTreeMap<u64, u64>,
    /// The newest entries.
    cache: BTreeMap<u64, Entry<TypeConfig>>,
    cached_bytes: usize,
    /// Entries written since the last `sync_point`, with their files
    /// still open (the first `OPEN_UNSYNCED`: a stalled sync must not use
    /// up the process's descriptors).
    unsynced: Vec<(u64, Option<fs::File>)>,
}

/// What one sync of the log covers: the files written before it began,
/// the last index then, and the truncations so far (a sync that began
/// before a truncation may not vouch for what it removed).
pub struct SyncPoint {
    index: u64,
    truncations: u64,
    files: Vec<(u64, Option<fs::File>)>,
}

use super::Batch;

fn weight(e: &Entry<TypeConfig>) -> usize {
    Batch::weight(e)
}

impl Entries {
    /// Opens (or creates) `dir`, dropping a torn tail.
    pub fn open(dir: &Path) -> std::io::Result<Entries> {
        fs::create_dir_all(dir)?;
        let mut indexes: Vec<u64> = fs::read_dir(dir)?
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u64>().ok())
            .collect();
        indexes.sort_unstable();
        let this = Entries {
            dir: dir.to_path_buf(),
            dir_handle: fs::File::open(dir)?,
            inner: Mutex::new(Inner::default()),
            truncations: Default::default(),
            marked: Mutex::new(None),
            pool: Mutex::new(Pool::default()),
        };
        // The pool starts empty: a file left in it is no entry.
        for e in fs::read_dir(dir)?.flatten() {
            if e.file_name().to_string_lossy().starts_with(POOL_PREFIX) {
                fs::remove_file(e.path())?;
            }
        }
        let synced = this.synced();
        let mut on_disk = BTreeMap::new();
        let mut sizes = BTreeMap::new();
        let mut torn = None;
        let check_from = indexes.len().saturating_sub(CHECKED_AT_OPEN);
        for (n, &i) in indexes.iter().enumerate() {
            // Whole past the synced mark too: a file written over one from
            // the pool may hold a new header and an old body.
            let read = match n >= check_from || i > synced {
                true => this.read_file(i).map(|e| e.log_id),
                false => this.read_header(i),
            };
            // A gap is a tail cut short too: files are written unsynced,
            // so a later one may survive a crash that an earlier one did not.
            let follows = n == 0 || indexes[n - 1] + 1 == i;
            match read {
                Ok(id) if id.index == i && follows => {
                    on_disk.insert(i, id);
                    let size = fs::metadata(this.path(i)).map_or(0, |m| m.len());
                    sizes.insert(i, size);
                }
                // Synced, then damaged: not a crash's torn tail.
                bad if i <= synced => {
                    let what = match bad {
                        Err(e) => e.to_string(),
                        Ok(_) if !follows => "entries before it are missing".to_string(),
                        Ok(id) => format!("it holds entry {}", id.index),
                    };
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "Raft log entry {i} in {} is damaged ({what}), and a sync covered \
                             the log up to {synced}: this node's data is damaged. Restore it, or \
                             start the node with an empty data directory and replace it \
                             (warren cluster replace)",
                            dir.display()
                        ),
                    ));
                }
                _ => {
                    torn = Some(n);
                    break;
                }
            }
        }
        if let Some(n) = torn {
            tracing::warn!(
                from = indexes[n],
                "the Raft log ends in an entry cut short: it and what follows are dropped"
            );
            for &i in &indexes[n..] {
                fs::remove_file(this.path(i))?;
            }
        }
        {
            let mut inner = this.inner.lock();
            inner.on_disk = on_disk;
            inner.sizes = sizes;
        }
        Ok(this)
    }

    fn path(&self, index: u64) -> PathBuf {
        self.dir.join(format!("{index:020}"))
    }

    /// The last index a finished sync covered, as recorded (0: none, or
    /// unreadable: then nothing is vouched for).
    fn synced(&self) -> u64 {
        fs::read(self.dir.join(SYNCED))
            .ok()
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, u64::from_be_bytes)
    }

    /// What a sync starting now will cover: every file written so far
    /// that no earlier sync point took.
    pub fn sync_point(&self) -> SyncPoint {
        let mut inner = self.inner.lock();
        SyncPoint {
            index: inner.on_disk.last_key_value().map_or(0, |(&i, _)| i),
            truncations: self.truncations.load(std::sync::atomic::Ordering::Acquire),
            files: std::mem::take(&mut inner.unsynced),
        }
    }

    /// Makes the files `point` took durable (fdatasync each, then the
    /// directory that names them). A file a truncation removed since is
    /// synced for nothing, or not found by its name: the truncation synced
    /// its removal.
    pub fn sync(&self, point: &SyncPoint) -> std::io::Result<()> {
        for (i, f) in &point.files {
            match f {
                Some(f) => f.sync_data()?,
                None => match fs::File::open(self.path(*i)) {
                    Ok(f) => f.sync_data()?,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                },
            }
        }
        if !point.files.is_empty() {
            self.dir_handle.sync_all()?;
        }
        Ok(())
    }

    /// Records that a finished sync covered the log up to `point`, unless
    /// a truncation came since, or the last record is younger than
    /// `MARK_EVERY`. Not synced itself: a crash may leave an older value,
    /// which vouches for less; it never names an entry no sync covered.
    pub fn mark_synced(&self, point: &SyncPoint) -> std::io::Result<()> {
        let mut marked = self.marked.lock();
        if marked.is_some_and(|at| at.elapsed() < MARK_EVERY) {
            return Ok(());
        }
        // The lock keeps a truncation from running in between.
        let _inner = self.inner.lock();
        let now = self.truncations.load(std::sync::atomic::Ordering::Acquire);
        if now != point.truncations {
            return Ok(());
        }
        fs::write(self.dir.join(SYNCED), point.index.to_be_bytes())?;
        *marked = Some(std::time::Instant::now());
        Ok(())
    }

    fn bad(index: u64, what: &str) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("Raft log entry {index}: {what}"),
        )
    }

    /// The header's log id, if the file is as long as it says.
    fn read_header(&self, index: u64) -> std::io::Result<LogId<u64>> {
        use std::io::Read;
        let mut f = fs::File::open(self.path(index))?;
        let size = f.metadata()?.len();
        let mut h = [0u8; HEADER];
        f.read_exact(&mut h)?;
        let (len, _, id, _) = parse_header(&h).ok_or_else(|| Self::bad(index, "no header"))?;
        if size != (HEADER + len) as u64 {
            return Err(Self::bad(index, "cut short"));
        }
        Ok(id)
    }

    fn read_file(&self, index: u64) -> std::io::Result<Entry<TypeConfig>> {
        let raw = bytes::Bytes::from(fs::read(self.path(index))?);
        let (len, crc, log_id, v1) = raw
            .get(..HEADER)
            .and_then(parse_header)
            .ok_or_else(|| Self::bad(index, "no header"))?;
        let body = raw.slice(HEADER..);
        if body.len() != len {
            return Err(Self::bad(index, "cut short"));
        }
        if log_id.index != index {
            // Written over since it was listed (purged into the pool).
            return Err(Self::bad(
                index,
                &format!("it holds entry {}", log_id.index),
            ));
        }
        if crc32fast::hash(&body) != crc {
            return Err(Self::bad(index, "checksum mismatch"));
        }
        let decode =
            |b: &[u8]| bincode::deserialize(b).map_err(|e| Self::bad(index, &e.to_string()));
        match (v1, body.first()) {
            (true, _) => decode(&body),
            (false, Some(&RAW)) => Ok(Entry {
                log_id,
                payload: openraft::EntryPayload::Normal(super::Batch(body.slice(1..))),
            }),
            (false, Some(&ENCODED)) => decode(&body[1..]),
            (false, tag) => Err(Self::bad(index, &format!("unknown body tag {tag:?}"))),
        }
    }

    /// Writes `e` to a new file of its own (replacing one of the same
    /// index, written before a truncation); returns the file and its size.
    fn write_file(&self, e: &Entry<TypeConfig>) -> std::io::Result<(fs::File, usize)> {
        let mut head = Vec::with_capacity(HEADER + 1);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&[0u8; 8]);
        head.extend_from_slice(&e.log_id.leader_id.term.to_be_bytes());
        head.extend_from_slice(&e.log_id.leader_id.node_id.to_be_bytes());
        head.extend_from_slice(&e.log_id.index.to_be_bytes());
        let encoded;
        let rest: &[u8] = match &e.payload {
            openraft::EntryPayload::Normal(batch) => {
                head.push(RAW);
                &batch.0
            }
            _ => {
                head.push(ENCODED);
                encoded = bincode::serialize(e).map_err(std::io::Error::other)?;
                &encoded
            }
        };
        let len = u32::try_from(1 + rest.len())
            .map_err(|_| std::io::Error::other("a Raft log entry over 4 GiB"))?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head[HEADER..]);
        crc.update(rest);
        head[4..8].copy_from_slice(&len.to_be_bytes());
        head[8..12].copy_from_slice(&crc.finalize().to_be_bytes());
        let mut f = self.new_file(&self.path(e.log_id.index))?;
        let mut parts = [std::io::IoSlice::new(&head), std::io::IoSlice::new(rest)];
        let mut parts = &mut parts[..];
        while !parts.is_empty() {
            match f.write_vectored(parts) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => std::io::IoSlice::advance_slices(&mut parts, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let size = (head.len() + rest.len()) as u64;
        if f.metadata()?.len() > size {
            f.set_len(size)?;
        }
        Ok((f, size as usize))
    }

    /// A file at `path` to write an entry into from its start: one from
    /// the pool, or a new one.
    fn new_file(&self, path: &Path) -> std::io::Result<fs::File> {
        let taken = {
            let mut pool = self.pool.lock();
            let taken = pool.files.pop_front();
            if let Some((_, size)) = &taken {
                pool.bytes -= size;
            }
            taken
        };
        if let Some((from, _)) = taken {
            // Replaces a file of the same index written before a truncation.
            match fs::rename(&from, path) {
                Ok(()) => return fs::OpenOptions::new().write(true).open(path),
                Err(e) => {
                    tracing::warn!("cannot reuse {}: {e}", from.display());
                    let _ = fs::remove_file(&from);
                }
            }
        }
        fs::File::create(path)
    }

    /// Writes `entries` (not synced: the log's sync covers them).
    pub fn append(&self, entries: Vec<Entry<TypeConfig>>) -> std::io::Result<()> {
        for e in entries {
            let (file, size) = self.write_file(&e)?;
            let index = e.log_id.index;
            let mut inner = self.inner.lock();
            let file = (inner.unsynced.len() < OPEN_UNSYNCED).then_some(file);
            inner.unsynced.push((index, file));
            inner.on_disk.insert(index, e.log_id);
            inner.sizes.insert(index, size as u64);
            inner.cached_bytes += weight(&e);
            if let Some(old) = inner.cache.insert(index, e) {
                inner.cached_bytes -= weight(&old);
            }
            while inner.cached_bytes > CACHE_BYTES {
                let Some((_, old)) = inner.cache.pop_first() else {
                    break;
                };
                inner.cached_bytes -= weight(&old);
            }
        }
        Ok(())
    }

    /// The entries with indexes in `range` that exist, in order.
    pub fn range<R: std::ops::RangeBounds<u64>>(
        &self,
        range: R,
    ) -> std::io::Result<Vec<Entry<TypeConfig>>> {
        let (wanted, mut found): (Vec<u64>, BTreeMap<u64, Entry<TypeConfig>>) = {
            let inner = self.inner.lock();
            let wanted: Vec<u64> = inner.on_disk.range(range).map(|(&i, _)| i).collect();
            let found = wanted
                .iter()
                .filter_map(|i| inner.cache.get(i).map(|e| (*i, e.clone())))
                .collect();
            (wanted, found)
        };
        let mut out = Vec::with_capacity(wanted.len());
        for i in wanted {
            match found.remove(&i) {
                Some(e) => out.push(e),
                None => out.push(self.read_file(i)?),
            }
        }
        Ok(out)
    }

    /// The last entry's log id.
    pub fn last(&self) -> Option<LogId<u64>> {
        self.inner.lock().on_disk.last_key_value().map(|(_, l)| *l)
    }

    /// Entries on disk.
    pub fn len(&self) -> usize {
        self.inner.lock().on_disk.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.inner.lock().on_disk.is_empty()
    }

    /// Bytes of the entries after `index` on disk.
    pub fn bytes_after(&self, index: u64) -> u64 {
        let inner = self.inner.lock();
        inner
            .sizes
            .range(index.saturating_add(1)..)
            .map(|(_, s)| s)
            .sum()
    }

    /// The newest index at or before `index` whose purge, with every one
    /// before it, leaves at most `bytes` of entries up to `index` on disk
    /// (0: what is there holds no more).
    pub fn last_beyond(&self, index: u64, bytes: u64) -> u64 {
        let inner = self.inner.lock();
        let mut held = 0u64;
        for (&i, &size) in inner.sizes.range(..=index).rev() {
            held = held.saturating_add(size);
            if held > bytes {
                return i;
            }
        }
        0
    }

    /// The indexes on disk, newest first.
    pub fn indexes_newest_first(&self) -> Vec<u64> {
        self.inner.lock().on_disk.keys().rev().copied().collect()
    }

    /// Removes every entry from `index` on.
    pub fn truncate(&self, index: u64) -> std::io::Result<()> {
        let gone: Vec<u64> = {
            let mut inner = self.inner.lock();
            self.truncations
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            // What goes is no longer vouched for, durably so before it goes
            // (it may be written again, unsynced).
            if self.synced() >= index {
                let p = self.dir.join(SYNCED);
                let mut f = fs::File::create(&p)?;
                f.write_all(&index.saturating_sub(1).to_be_bytes())?;
                f.sync_all()?;
            }
            let gone = inner.on_disk.split_off(&index);
            inner.sizes.split_off(&index);
            let dropped = inner.cache.split_off(&index);
            inner.cached_bytes -= dropped.values().map(weight).sum::<usize>();
            gone.into_keys().collect()
        };
        // Newest first: a crash midway leaves a log with no hole.
        for i in gone.into_iter().rev() {
            remove(&self.path(i))?;
        }
        Ok(())
    }

    /// Forgets every entry up to `index`: no read sees them from now on.
    /// Returns their indexes, oldest first, for `remove_files` once what
    /// replaces them is durable (log.rs `purge`).
    pub fn forget(&self, index: u64) -> Vec<u64> {
        let mut inner = self.inner.lock();
        let kept = inner.on_disk.split_off(&(index + 1));
        let gone = std::mem::replace(&mut inner.on_disk, kept);
        let kept = inner.sizes.split_off(&(index + 1));
        inner.sizes = kept;
        let kept = inner.cache.split_off(&(index + 1));
        let dropped = std::mem::replace(&mut inner.cache, kept);
        inner.cached_bytes -= dropped.values().map(weight).sum::<usize>();
        gone.into_keys().collect()
    }

    /// Keeps up to `max` bytes of purged entries' files to write new
    /// entries over.
    pub fn set_pool_bytes(&self, max: u64) {
        self.pool.lock().max = max;
    }

    /// Removes the files of forgotten entries, oldest first: a crash
    /// midway leaves a log with no hole (what stays below the purged id
    /// nothing reads, and the next start's first purge removes). They go
    /// to the pool while it has room.
    pub fn remove_files(&self, gone: &[u64]) -> std::io::Result<()> {
        for &i in gone {
            let path = self.path(i);
            let size = match fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let mut pool = self.pool.lock();
            if pool.bytes + size > pool.max {
                drop(pool);
                remove(&path)?;
                continue;
            }
            let to = self.dir.join(format!("{POOL_PREFIX}{}", pool.next));
            fs::rename(&path, &to)?;
            pool.next += 1;
            pool.bytes += size;
            pool.files.push_back((to, size));
        }
        Ok(())
    }
}

/// A header's body length, CRC and log id, and whether the body is an
/// older build's (`MAGIC_V1`).
fn parse_header(h: &[u8]) -> Option<(usize, u32, LogId<u64>, bool)> {
    if h.len() < HEADER {
        return None;
    }
    let v1 = match &h[..4] {
        m if m == MAGIC => false,
        m if m == MAGIC_V1 => true,
        _ => return None,
    };
    let u32_at = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[i..i + 8]);
        u64::from_be_bytes(b)
    };
    let id = LogId::new(
        openraft::CommittedLeaderId::new(u64_at(12), u64_at(20)),
        u64_at(28),
    );
    Some((u32_at(4) as usize, u32_at(8), id, v1))
}

fn remove(p: &Path) -> std::io::Result<()> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::raft::Batch;
    use openraft::{CommittedLeaderId, EntryPayload};

    /// Cuts entry `i`'s file short, as a crash during its write would.
    fn cut_short(dir: &Path, i: u64) -> PathBuf {
        let p = dir.join(format!("{i:020}"));
        let raw = fs::read(&p).unwrap();
        fs::write(&p, &raw[..raw.len() - 3]).unwrap();
        p
    }

    fn entry(i: u64, body: &[u8]) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
            payload: EntryPayload::Normal(Batch(bytes::Bytes::copy_from_slice(body))),
        }
    }

    #[test]
    fn append_read_truncate_purge_and_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let e = Entries::open(dir.path()).unwrap();
        e.append((1..=5).map(|i| entry(i, &[i as u8; 10])).collect())
            .unwrap();
        assert_eq!(e.range(2..4).unwrap().len(), 2);
        assert_eq!(e.last().map(|l| l.index), Some(5));
        e.truncate(5).unwrap();
        let gone = e.forget(1);
        e.remove_files(&gone).unwrap();
        assert_eq!(e.len(), 3);
        drop(e);
        // Read back from the files (nothing cached).
        let e = Entries::open(dir.path()).unwrap();
        let all = e.range(..).unwrap();
        assert_eq!(
            all.iter().map(|x| x.log_id.index).collect::<Vec<_>>(),
            [2, 3, 4]
        );
        assert_eq!(
            all[0].payload,
            EntryPayload::Normal(Batch(vec![2; 10].into()))
        );
        drop(e);
        // A crash cut entry 4 short: it goes, 2 and 3 stay.
        let p = cut_short(dir.path(), 4);
        let e = Entries::open(dir.path()).unwrap();
        assert_eq!(e.last().map(|l| l.index), Some(3));
        assert!(!p.exists());
    }

    /// What a purge up to `last_beyond` leaves before an index holds at
    /// most the bytes asked for.
    #[test]
    fn last_beyond_keeps_at_most_the_bytes_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let e = Entries::open(dir.path()).unwrap();
        e.append((1..=5).map(|i| entry(i, &[0; 100])).collect())
            .unwrap();
        let one = e.bytes_after(4);
        assert_eq!(e.bytes_after(0), 5 * one);
        assert_eq!(e.last_beyond(4, 0), 4);
        assert_eq!(e.last_beyond(4, 2 * one), 2);
        assert_eq!(e.last_beyond(4, 2 * one - 1), 3);
        assert_eq!(e.last_beyond(4, 4 * one), 0);
        assert_eq!(e.last_beyond(5, 4 * one), 1);
    }

    /// An older build's file (the bincode of the entry) reads back, and
    /// so does an entry that is not a batch.
    #[test]
    fn older_files_and_other_payloads_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let old = entry(1, b"written by an older build");
        let body = bincode::serialize(&old).unwrap();
        let mut raw = MAGIC_V1.to_vec();
        raw.extend_from_slice(&(body.len() as u32).to_be_bytes());
        raw.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
        raw.extend_from_slice(&1u64.to_be_bytes());
        raw.extend_from_slice(&1u64.to_be_bytes());
        raw.extend_from_slice(&1u64.to_be_bytes());
        raw.extend_from_slice(&body);
        fs::write(dir.path().join(format!("{:020}", 1)), raw).unwrap();
        let e = Entries::open(dir.path()).unwrap();
        let blank = Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(2, 1), 2),
            payload: EntryPayload::Blank,
        };
        e.append(vec![blank.clone(), entry(3, b"new")]).unwrap();
        drop(e);
        let e = Entries::open(dir.path()).unwrap();
        let all = e.range(..).unwrap();
        assert_eq!(all, [old, blank, entry(3, b"new")]);
    }

    /// Purged entries' files are written over by new ones: what reads
    /// back is the new entry, whatever the file held; a file that took an
    /// entry's name but was not written over (a crash) is a torn tail.
    #[test]
    fn purged_files_are_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let pooled = |d: &Path| {
            fs::read_dir(d)
                .unwrap()
                .flatten()
                .filter(|f| f.file_name().to_string_lossy().starts_with(POOL_PREFIX))
                .count()
        };
        let e = Entries::open(dir.path()).unwrap();
        e.set_pool_bytes(1 << 20);
        e.append((1..=4).map(|i| entry(i, &[i as u8; 100])).collect())
            .unwrap();
        let gone = e.forget(2);
        e.remove_files(&gone).unwrap();
        assert_eq!(pooled(dir.path()), 2);
        // Shorter than the file it is written over.
        e.append(vec![entry(5, &[5; 10])]).unwrap();
        assert_eq!(pooled(dir.path()), 1);
        drop(e);
        let e = Entries::open(dir.path()).unwrap();
        assert_eq!(pooled(dir.path()), 0, "the pool starts empty");
        let all = e.range(..).unwrap();
        assert_eq!(
            all,
            [entry(3, &[3; 100]), entry(4, &[4; 100]), entry(5, &[5; 10])]
        );
        drop(e);
        let name = |i: u64| dir.path().join(format!("{i:020}"));
        fs::copy(name(3), name(6)).unwrap();
        let e = Entries::open(dir.path()).unwrap();
        assert_eq!(e.last().map(|l| l.index), Some(5));
        assert!(!name(6).exists());
    }

    /// Every file past the synced mark is read whole at open, not only
    /// the last ones: one written over (from the pool) may keep its new
    /// header and length over an old body.
    #[test]
    fn a_body_past_the_synced_mark_is_checked_however_far_back() {
        let dir = tempfile::tempdir().unwrap();
        let e = Entries::open(dir.path()).unwrap();
        let n = CHECKED_AT_OPEN as u64 + 8;
        e.append((1..=n).map(|i| entry(i, &[i as u8; 32])).collect())
            .unwrap();
        drop(e);
        let p = dir.path().join(format!("{:020}", 2));
        let mut raw = fs::read(&p).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 0x55;
        fs::write(&p, raw).unwrap();
        let e = Entries::open(dir.path()).unwrap();
        assert_eq!(e.last().map(|l| l.index), Some(1));
    }

    #[test]
    fn damage_a_sync_covered_stops_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let e = Entries::open(dir.path()).unwrap();
        e.append((1..=6).map(|i| entry(i, &[i as u8; 10])).collect())
            .unwrap();
        // A sync covered 1..=4; 5 and 6 were written after it began.
        let mut point = e.sync_point();
        point.index = 4;
        e.sync(&point).unwrap();
        e.mark_synced(&point).unwrap();
        drop(e);
        // 6 cut short: a torn tail, dropped.
        cut_short(dir.path(), 6);
        let e = Entries::open(dir.path()).unwrap();
        assert_eq!(e.last().map(|l| l.index), Some(5));
        drop(e);
        // 2 cut short: synced data damaged; the log does not open, and
        // nothing is deleted.
        cut_short(dir.path(), 2);
        let err = Entries::open(dir.path())
            .err()
            .expect("a damaged log opened");
        assert!(err.to_string().contains("entry 2"), "{err}");
        assert!(dir.path().join(format!("{:020}", 5)).exists());
        // A missing synced file is damage too.
        fs::remove_file(dir.path().join(format!("{:020}", 2))).unwrap();
        assert!(Entries::open(dir.path()).is_err());
    }

    #[test]
    fn a_truncation_takes_back_what_the_mark_vouched_for() {
        let dir = tempfile::tempdir().unwrap();
        let e = Entries::open(dir.path()).unwrap();
        e.append((1..=4).map(|i| entry(i, &[1; 10])).collect())
            .unwrap();
        let before = e.sync_point();
        e.mark_synced(&before).unwrap();
        e.truncate(3).unwrap();
        // A sync that began before the truncation vouches for nothing.
        e.append(vec![entry(3, &[2; 10])]).unwrap();
        e.sync(&before).unwrap();
        e.mark_synced(&before).unwrap();
        drop(e);
        cut_short(dir.path(), 3);
        let e = Entries::open(dir.path()).unwrap();
        assert_eq!(e.last().map(|l| l.index), Some(2));
    }
}
