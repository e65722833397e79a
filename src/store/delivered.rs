//! Delivered marks: per durable queue, how far deliveries have gone, so
//! that messages handed out before a stop come back `redelivered`.
//!
//! Exact on a clean stop, safe on a crash, and never a store write per
//! delivery:
//! - Each queue keeps in memory the highest sequence it delivered
//!   (`Mark::delivered`) and a *reservation*: a sequence at or above every
//!   delivered one that is already in `delivered.log` in the data dir.
//!   Before the first delivery past the reservation, the queue appends a new
//!   one a window ahead (a 16-octet write(2), no fsync: once in the page
//!   cache it survives the process being killed; the group commit's syncfs
//!   takes it to disk with everything else). One write covers the next
//!   `RESERVE_AHEAD` deliveries.
//! - A clean stop rewrites the log with the exact delivered marks and a
//!   trailer saying so; the next start reads them and rewrites the log
//!   without the trailer, so a later crash is known to be one.
//! - After a crash, recovery takes the reservations: every message at or
//!   below one comes back `redelivered`, including some that were never
//!   delivered (those published into the window). That over-approximation
//!   happens only after an unclean stop, which is what AMQP allows
//!   (redelivered means "may have been delivered before").

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::Result;

/// How far past a delivery a reservation reaches.
pub const RESERVE_AHEAD: u64 = 1024;

/// The log's file name in the data dir.
const FILE: &str = "delivered.log";

/// The trailer record of a clean stop: an impossible queue id.
const CLEAN: [u8; 16] = *b"\xff\xff\xff\xff\xff\xff\xff\xffclean-ok";

/// Rewrite the log once it holds this many records.
const COMPACT_AT: u64 = 64 * 1024;

/// One durable queue's mark.
#[derive(Debug, Default)]
pub struct Mark {
    delivered: AtomicU64,
    reserved: AtomicU64,
}

impl Mark {
    /// The highest sequence delivered since start (or recovered).
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// Records that `seq` went out (after its reservation, see `DeliveredLog::reservation_for`).
    pub fn delivered_now(&self, seq: u64) {
        self.delivered.fetch_max(seq, Ordering::Relaxed);
    }
}

/// The log and every durable queue's mark.
pub struct DeliveredLog {
    /// None for a temporary store: marks live in memory only.
    file: Option<Mutex<LogFile>>,
    marks: RwLock<HashMap<u64, Arc<Mark>>>,
    /// What the last stop left: the mark of each queue.
    recovered: HashMap<u64, u64>,
}

struct LogFile {
    path: PathBuf,
    file: File,
    records: u64,
}

impl DeliveredLog {
    /// Opens the log in `dir` and reads what the last stop left (a clean
    /// stop's exact marks, or a crash's reservations), then rewrites it
    /// without the clean trailer. `legacy` are marks an older version kept
    /// elsewhere; the higher of the two wins.
    pub fn open(dir: &Path, legacy: HashMap<u64, u64>) -> Result<DeliveredLog> {
        let path = dir.join(FILE);
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let mut recovered = legacy;
        let whole = bytes.len() / 16 * 16;
        let clean = whole >= 16 && bytes[whole - 16..whole] == CLEAN;
        for rec in bytes[..whole].chunks_exact(16) {
            if rec == CLEAN {
                continue;
            }
            let (id, mark) = decode(rec);
            let m = recovered.entry(id).or_insert(0);
            *m = (*m).max(mark);
        }
        tracing::debug!(clean, queues = recovered.len(), "read delivered marks");
        let log = DeliveredLog {
            file: Some(Mutex::new(rewrite(&path, &recovered, false)?)),
            marks: RwLock::new(HashMap::new()),
            recovered,
        };
        Ok(log)
    }

    /// Marks kept in memory only (temporary stores).
    pub fn in_memory() -> DeliveredLog {
        DeliveredLog {
            file: None,
            marks: RwLock::new(HashMap::new()),
            recovered: HashMap::new(),
        }
    }

    /// Registers durable queue `queue_id`: its mark, starting from what the
    /// last stop left (0 for a new queue).
    pub fn register(&self, queue_id: u64) -> (u64, Arc<Mark>) {
        let start = self.recovered.get(&queue_id).copied().unwrap_or(0);
        let mark = Arc::new(Mark {
            delivered: AtomicU64::new(start),
            reserved: AtomicU64::new(start),
        });
        self.marks.write().insert(queue_id, Arc::clone(&mark));
        (start, mark)
    }

    /// Called before `seq` may be delivered: the reservation to record
    /// first (`reserve`), if the one in the log does not cover it. The
    /// delivered mark is raised apart, once the delivery happened
    /// (`Mark::delivered_now`).
    pub fn reservation_for(mark: &Mark, seq: u64) -> Option<u64> {
        (seq > mark.reserved.load(Ordering::Acquire)).then(|| seq.saturating_add(RESERVE_AHEAD))
    }

    /// Applies `Op::Reserve`: appends the reservation and raises the
    /// queue's mark (if the queue is registered here).
    pub fn reserve(&self, queue_id: u64, upto: u64) -> Result<()> {
        let mark = self.marks.read().get(&queue_id).cloned();
        let raise = || {
            if let Some(m) = &mark {
                m.reserved.fetch_max(upto, Ordering::AcqRel);
            }
        };
        let Some(file) = &self.file else {
            raise();
            return Ok(());
        };
        // Appended and raised under the file's lock, so a compaction
        // (which snapshots every mark under it) sees every reservation in
        // the log.
        let mut f = file.lock();
        f.append(&encode(queue_id, upto))?;
        raise();
        if f.records >= COMPACT_AT {
            let all = self.snapshot(|m| m.reserved.load(Ordering::Acquire));
            *f = rewrite(&f.path, &all, false)?;
        }
        Ok(())
    }

    /// Forgets a deleted queue (its record goes at the next rewrite).
    pub fn forget(&self, queue_id: u64) {
        self.marks.write().remove(&queue_id);
    }

    /// Writes the exact delivered marks and the clean trailer (a clean
    /// stop, after every channel has let go of its deliveries).
    pub fn close_clean(&self) -> Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let exact = self.snapshot(Mark::delivered);
        let mut f = file.lock();
        *f = rewrite(&f.path, &exact, true)?;
        Ok(())
    }

    fn snapshot(&self, value: impl Fn(&Mark) -> u64) -> HashMap<u64, u64> {
        self.marks
            .read()
            .iter()
            .map(|(&id, m)| (id, value(m)))
            .collect()
    }
}

impl LogFile {
    fn append(&mut self, rec: &[u8; 16]) -> Result<()> {
        self.file.write_all(rec)?;
        self.records += 1;
        Ok(())
    }
}

/// Takes the marks older versions kept in the definitions tree (key "d"
/// and the queue id), removing them.
pub fn take_legacy_marks(defs: &sled::Tree) -> Result<HashMap<u64, u64>> {
    let mut out = HashMap::new();
    for item in defs.scan_prefix(b"d") {
        let (k, v) = item?;
        if let (Ok(id), Ok(mark)) = (<[u8; 8]>::try_from(&k[1..]), <[u8; 8]>::try_from(&v[..])) {
            out.insert(u64::from_be_bytes(id), u64::from_be_bytes(mark));
        }
        defs.remove(k)?;
    }
    Ok(out)
}

fn encode(queue_id: u64, mark: u64) -> [u8; 16] {
    let mut rec = [0u8; 16];
    rec[..8].copy_from_slice(&queue_id.to_be_bytes());
    rec[8..].copy_from_slice(&mark.to_be_bytes());
    rec
}

fn decode(rec: &[u8]) -> (u64, u64) {
    let mut id = [0u8; 8];
    let mut mark = [0u8; 8];
    id.copy_from_slice(&rec[..8]);
    mark.copy_from_slice(&rec[8..16]);
    (u64::from_be_bytes(id), u64::from_be_bytes(mark))
}

/// Replaces the log with one record per queue (and the clean trailer):
/// written to a temporary file, synced, and renamed over the log, so a
/// crash leaves the old log or the new one, never half of one.
fn rewrite(path: &Path, marks: &HashMap<u64, u64>, clean: bool) -> Result<LogFile> {
    let tmp = path.with_extension("tmp");
    let mut bytes = Vec::with_capacity((marks.len() + 1) * 16);
    for (&id, &mark) in marks {
        bytes.extend_from_slice(&encode(id, mark));
    }
    if clean {
        bytes.extend_from_slice(&CLEAN);
    }
    {
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    let file = std::fs::OpenOptions::new().append(true).open(path)?;
    Ok(LogFile {
        path: path.to_path_buf(),
        file,
        records: marks.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the store does before a delivery.
    fn before(log: &DeliveredLog, queue_id: u64, m: &Mark, seq: u64) {
        if let Some(upto) = DeliveredLog::reservation_for(m, seq) {
            log.reserve(queue_id, upto).unwrap();
        }
    }

    #[test]
    fn a_crash_recovers_reservations_and_a_clean_stop_exact_marks() {
        let dir = tempfile::tempdir().unwrap();
        let log = DeliveredLog::open(dir.path(), HashMap::new()).unwrap();
        let (start, m) = log.register(7);
        assert_eq!(start, 0);
        before(&log, 7, &m, 5);
        before(&log, 7, &m, 6);
        m.delivered_now(6);
        drop(log);
        // A crash: the reservation, a window past the last delivery.
        let log = DeliveredLog::open(dir.path(), HashMap::new()).unwrap();
        let (start, m) = log.register(7);
        assert_eq!(start, 5 + RESERVE_AHEAD);
        before(&log, 7, &m, start + 3);
        m.delivered_now(start + 3);
        // Tried, not delivered: not in the exact mark.
        before(&log, 7, &m, start + 4);
        log.close_clean().unwrap();
        drop(log);
        // A clean stop: exact.
        let log = DeliveredLog::open(dir.path(), HashMap::new()).unwrap();
        assert_eq!(log.register(7).0, start + 3);
        drop(log);
        // ... and the start after it rewrote the log without the trailer:
        // a crash now recovers the same marks, not as exact ones.
        let log = DeliveredLog::open(dir.path(), [(8, 9)].into()).unwrap();
        assert_eq!(log.register(7).0, start + 3);
        assert_eq!(log.register(8).0, 9, "legacy marks are taken");
    }

    #[test]
    fn compaction_keeps_the_reservation_that_triggered_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = DeliveredLog::open(dir.path(), HashMap::new()).unwrap();
        let (_, m) = log.register(3);
        let mut seq = 1;
        let mut last = 0;
        for _ in 0..COMPACT_AT + 10 {
            before(&log, 3, &m, seq);
            last = seq + RESERVE_AHEAD;
            seq += RESERVE_AHEAD + 1;
        }
        drop(log);
        let log = DeliveredLog::open(dir.path(), HashMap::new()).unwrap();
        assert_eq!(log.register(3).0, last);
    }

    #[test]
    fn one_write_covers_a_window_of_deliveries() {
        let dir = tempfile::tempdir().unwrap();
        let log = DeliveredLog::open(dir.path(), HashMap::new()).unwrap();
        let (_, m) = log.register(1);
        for seq in 1..=3 * RESERVE_AHEAD {
            before(&log, 1, &m, seq);
        }
        let len = std::fs::metadata(dir.path().join(FILE)).unwrap().len();
        assert_eq!(len, 3 * 16);
    }
}
