//! An append-only log of records in segment files: the groundwork of the
//! message store that replaces sled's messages tree (issue 26). Nothing
//! writes messages here yet; this module owns the file format, appends,
//! reads by position, the group sync, the torn tail and whole-segment
//! removal.
//!
//! A record is a header (CRC-32 of the rest, payload length, kind) and its
//! payload. Positions are byte offsets in one endless log: a segment file
//! is named by the position of its first byte (after its magic), and the
//! next segment starts where the last one ends, so a position names a
//! record for good and orders records by when they were appended.
//!
//! Appends go to a buffer and reach the file in one write per `flush` (or
//! sooner, once the buffer holds `BUFFER_MAX`); `sync` flushes, then
//! fdatasyncs every segment written since the last sync (and the
//! directory when a segment was added): one sync serves every record
//! appended before it. After a sync the file `synced` names
//! the position it covered, rewritten at most once per `mark_every` (an
//! older value only vouches for less, and a second fsync per group commit
//! would double the syncs of a confirm), and always by a sync that
//! reached a new segment: only the last segment's tail is ever above it.
//! A failed sync poisons the log until it is opened again. At open, a record cut short or
//! failing its CRC past that position was never reported durable: it is
//! cut off, with everything after it. Damage at or below it is damaged
//! data: the log does not open if the open reads it (msglog reads only
//! the segments its summaries do not cover), and a read of it fails.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Bytes of a segment file, at the most (a record larger than that gets
/// a segment of its own).
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// Each segment file begins with this.
const MAGIC: &[u8; 8] = b"WSEG0001";
/// CRC-32 (of the length, kind and payload), payload length, kind.
const HEADER: usize = 9;
/// A record's header bytes, before its payload.
pub const RECORD_HEADER: u64 = HEADER as u64;
pub use spans::Spans;
/// The file naming the last position a finished sync covered.
const SYNCED: &str = "synced";
/// The largest payload a record may carry.
pub const MAX_PAYLOAD: usize = u32::MAX as usize;
/// Appends past this many bytes are written out without waiting for a
/// flush (paged transient messages may go a while without a commit), and
/// a buffer a large record grew is given back down to it.
const BUFFER_MAX: usize = 8 << 20;

/// One record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kind: u8,
    pub payload: Vec<u8>,
}

/// The segment log of one node.
pub struct SegmentLog {
    dir: PathBuf,
    /// The directory, open for its fsync (new segments' names).
    dir_handle: File,
    segment_bytes: u64,
    inner: Mutex<Inner>,
    /// One sync at a time: a sync may name as synced only what it synced,
    /// and another under way may hold what this one did not take. Holds
    /// when the synced mark was last written.
    syncing: Mutex<Option<Instant>>,
    /// How long the synced mark may lag behind a sync.
    mark_every: Duration,
    /// A sync failed: what the page cache held is unknown, so no later
    /// sync may vouch for it, nor anything be removed on its word.
    failed: std::sync::atomic::AtomicBool,
    /// Unlinks dead segments off the commit path (segments/reaper.rs).
    reaper: reaper::Reaper,
}

struct Inner {
    /// Every segment by the position of its first record, open for reads.
    segments: BTreeMap<u64, Arc<File>>,
    /// The last segment: its first position, and where the file ends.
    active: u64,
    written: u64,
    /// Appended and not yet written: records from position `written`.
    buffer: Vec<u8>,
    /// Segments written since the last sync, and whether one is new.
    unsynced: BTreeSet<u64>,
    added: bool,
}

fn corrupt(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn header(kind: u8, payload: &[u8]) -> [u8; HEADER] {
    let len = (payload.len() as u32).to_be_bytes();
    let mut h = crc32fast::Hasher::new();
    h.update(&len);
    h.update(&[kind]);
    h.update(payload);
    let mut out = [0u8; HEADER];
    out[..4].copy_from_slice(&h.finalize().to_be_bytes());
    out[4..8].copy_from_slice(&len);
    out[8] = kind;
    out
}

/// `header`, for a payload whose bytes from `at` on have the CRC-32
/// `tail_crc`.
fn header_with_tail(kind: u8, payload: &[u8], at: usize, tail_crc: u32) -> [u8; HEADER] {
    let len = (payload.len() as u32).to_be_bytes();
    let mut h = crc32fast::Hasher::new();
    h.update(&len);
    h.update(&[kind]);
    h.update(&payload[..at]);
    let tail = (payload.len() - at) as u64;
    h.combine(&crc32fast::Hasher::new_with_initial_len(tail_crc, tail));
    let mut out = [0u8; HEADER];
    out[..4].copy_from_slice(&h.finalize().to_be_bytes());
    out[4..8].copy_from_slice(&len);
    out[8] = kind;
    out
}

impl SegmentLog {
    /// Opens (or creates) the log in `dir`, cutting off a torn tail.
    pub fn open(dir: &Path) -> io::Result<SegmentLog> {
        SegmentLog::open_with(dir, SEGMENT_BYTES)
    }

    /// The same, with segments of `segment_bytes` (tests use small ones)
    /// and a synced mark written at every sync.
    pub fn open_with(dir: &Path, segment_bytes: u64) -> io::Result<SegmentLog> {
        SegmentLog::open_tuned(dir, segment_bytes, Duration::ZERO)
    }

    /// The same, with the synced mark rewritten at most once per
    /// `mark_every`.
    pub fn open_tuned(
        dir: &Path,
        segment_bytes: u64,
        mark_every: Duration,
    ) -> io::Result<SegmentLog> {
        fs::create_dir_all(dir)?;
        let dir_handle = File::open(dir)?;
        let mut bases = Vec::new();
        for e in fs::read_dir(dir)? {
            let name = e?.file_name();
            let name = name.to_string_lossy();
            if let Some(base) = name
                .strip_suffix(".seg")
                .and_then(|n| n.parse::<u64>().ok())
            {
                bases.push(base);
            }
        }
        bases.sort_unstable();
        let synced = match fs::read(dir.join(SYNCED)) {
            Ok(b) => b
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| corrupt(format!("{}: not a position", dir.join(SYNCED).display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        let log = SegmentLog {
            dir: dir.to_path_buf(),
            dir_handle,
            segment_bytes,
            inner: Mutex::new(Inner {
                segments: BTreeMap::new(),
                active: 0,
                written: 0,
                buffer: Vec::new(),
                unsynced: BTreeSet::new(),
                added: false,
            }),
            syncing: Mutex::new(None),
            mark_every,
            failed: false.into(),
            reaper: reaper::Reaper::start(File::open(dir)?),
        };
        let mut inner = log.inner.lock();
        let mut end = 0;
        for (i, &base) in bases.iter().enumerate() {
            if i == 0 {
                end = base;
            }
            if base != end {
                if end >= synced {
                    // The previous segment lost its unsynced end in a crash
                    // after this one was made: a torn tail too.
                    log.remove_from(&bases[i..])?;
                    log.dir_handle.sync_all()?;
                    break;
                }
                return Err(corrupt(format!(
                    "{}: segment {base} does not follow the one ending at {end}",
                    dir.display()
                )));
            }
            let path = log.path(base);
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            let len = file.metadata()?.len();
            let mut magic = [0u8; 8];
            if len < MAGIC.len() as u64
                || file.read_exact_at(&mut magic, 0).is_err()
                || &magic != MAGIC
            {
                if base >= synced {
                    // Created and never synced: a crash before its magic.
                    drop(file);
                    log.remove_from(&bases[i..])?;
                    break;
                }
                return Err(corrupt(format!("{}: no segment header", path.display())));
            }
            end = base + len - MAGIC.len() as u64;
            if end > synced {
                // Records past the synced position are checked, and cut at
                // the first that is not whole.
                let good = check(&file, base, synced)?;
                if good < end {
                    tracing::warn!(
                        segment = %path.display(),
                        from = good,
                        "cutting off a torn tail of the message log"
                    );
                    // Later segments first (durably), so a crash midway
                    // never leaves this one short before them.
                    log.remove_from(&bases[i + 1..])?;
                    log.dir_handle.sync_all()?;
                    file.set_len(good - base + MAGIC.len() as u64)?;
                    file.sync_all()?;
                    end = good;
                    inner.segments.insert(base, Arc::new(file));
                    break;
                }
            }
            inner.segments.insert(base, Arc::new(file));
        }
        if end < synced {
            return Err(corrupt(format!(
                "{}: the log ends at {end}, below the synced position {synced}",
                dir.display()
            )));
        }
        match inner.segments.last_key_value() {
            Some((&base, _)) => {
                inner.active = base;
                inner.written = end;
            }
            // None left (a new log, or a crash before the first magic).
            None => log.add_segment(&mut inner, bases.first().copied().unwrap_or(0))?,
        }
        drop(inner);
        Ok(log)
    }

    fn path(&self, base: u64) -> PathBuf {
        self.dir.join(format!("{base:020}.seg"))
    }

    /// Removes the segments `bases` (newest first: what stays never has a
    /// hole).
    fn remove_from(&self, bases: &[u64]) -> io::Result<()> {
        for &b in bases.iter().rev() {
            fs::remove_file(self.path(b))?;
        }
        Ok(())
    }

    fn add_segment(&self, inner: &mut Inner, base: u64) -> io::Result<()> {
        let path = self.path(base);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        file.write_all_at(MAGIC, 0)?;
        inner.segments.insert(base, Arc::new(file));
        inner.active = base;
        inner.unsynced.insert(base);
        inner.added = true;
        Ok(())
    }

    /// Appends a record; returns its position. It reaches the file at the
    /// next `flush` or `sync` (or once `BUFFER_MAX` bytes wait), and is
    /// durable once a `sync` that began after this call returns.
    pub fn append(&self, kind: u8, payload: &[u8]) -> io::Result<u64> {
        self.append_known(kind, payload, None)
    }

    /// The same, for a payload whose bytes from `tail.0` on have the
    /// CRC-32 `tail.1` (a stream batch's entries, msglog's CHUNK): the
    /// record's CRC is combined from it, not computed over them again.
    pub fn append_known(
        &self,
        kind: u8,
        payload: &[u8],
        tail: Option<(usize, u32)>,
    ) -> io::Result<u64> {
        if payload.len() > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a record of {} bytes is too large", payload.len()),
            ));
        }
        // Outside the lock.
        let head = match tail {
            Some((at, crc)) if at <= payload.len() => header_with_tail(kind, payload, at, crc),
            _ => header(kind, payload),
        };
        let mut inner = self.inner.lock();
        let size = (HEADER + payload.len()) as u64;
        let pos = inner.written + inner.buffer.len() as u64;
        let used = pos - inner.active;
        if used > 0 && used + size > self.segment_bytes {
            // The next segment starts where this one ends.
            self.write_buffer(&mut inner)?;
            self.add_segment(&mut inner, pos)?;
        }
        if inner.buffer.len() + size as usize > BUFFER_MAX {
            self.write_buffer(&mut inner)?;
        }
        inner.buffer.extend_from_slice(&head);
        inner.buffer.extend_from_slice(payload);
        Ok(pos)
    }

    fn write_buffer(&self, inner: &mut Inner) -> io::Result<()> {
        if inner.buffer.is_empty() {
            return Ok(());
        }
        let file = Arc::clone(&inner.segments[&inner.active]);
        let at = inner.written - inner.active + MAGIC.len() as u64;
        file.write_all_at(&inner.buffer, at)?;
        inner.written += inner.buffer.len() as u64;
        inner.buffer.clear();
        inner.buffer.shrink_to(BUFFER_MAX);
        let active = inner.active;
        inner.unsynced.insert(active);
        Ok(())
    }

    /// Writes what was appended, in one write per segment.
    pub fn flush(&self) -> io::Result<()> {
        let mut inner = self.inner.lock();
        self.write_buffer(&mut inner)
    }

    /// Makes every record appended before the call durable; returns the
    /// position it covers (every record below it).
    pub fn sync(&self) -> io::Result<u64> {
        self.sync_and_mark(false)
    }

    /// The same, and writes the synced mark whenever it was last written
    /// (a clean stop).
    pub fn sync_marked(&self) -> io::Result<u64> {
        self.sync_and_mark(true)
    }

    fn sync_and_mark(&self, always: bool) -> io::Result<u64> {
        let mut marked = self.syncing.lock();
        self.check_not_failed()?;
        let (files, added, end) = {
            let mut inner = self.inner.lock();
            self.write_buffer(&mut inner)?;
            let bases = std::mem::take(&mut inner.unsynced);
            let files: Vec<(u64, Arc<File>)> = bases
                .iter()
                .filter_map(|b| Some((*b, inner.segments.get(b).cloned()?)))
                .collect();
            (files, std::mem::take(&mut inner.added), inner.written)
        };
        // Outside the lock: appends go on meanwhile, for the next sync.
        let synced = files
            .iter()
            .try_for_each(|(_, f)| f.sync_data())
            .and_then(|()| match added {
                true => self.dir_handle.sync_all(),
                false => Ok(()),
            });
        if let Err(e) = synced {
            // A retry could succeed with the pages already dropped: the
            // log must be opened again from the disk.
            self.failed.store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(e);
        }
        // Lazily within the active segment only: a crash can tear just its
        // tail, so every other segment lies below the mark, where damage
        // stops the open instead of being cut.
        let crossed = added || files.len() > 1;
        let due = always || crossed || marked.is_none_or(|at| at.elapsed() >= self.mark_every);
        if due {
            // Replaced whole (a crash leaves the old value or the new).
            let tmp = self.dir.join("synced.new");
            let mut f = File::create(&tmp)?;
            io::Write::write_all(&mut f, &end.to_be_bytes())?;
            f.sync_data()?;
            fs::rename(&tmp, self.dir.join(SYNCED))?;
            if crossed {
                // The mark past a finished segment must survive a crash.
                self.dir_handle.sync_all()?;
            }
            *marked = Some(Instant::now());
        }
        Ok(end)
    }

    /// The first position of the segment a record of `len` payload bytes
    /// appended now would go to (the caller keeps other appends out).
    pub fn next_base(&self, len: usize) -> u64 {
        let inner = self.inner.lock();
        let pos = inner.written + inner.buffer.len() as u64;
        let used = pos - inner.active;
        match used > 0 && used + (HEADER + len) as u64 > self.segment_bytes {
            true => pos,
            false => inner.active,
        }
    }

    /// Fails every later sync, as a failed sync does: what the log holds
    /// is no longer known to be what its writers meant (a write of records
    /// that exist nowhere else failed), so nothing may be vouched for.
    pub fn poison(&self) {
        self.failed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn check_not_failed(&self) -> io::Result<()> {
        match self.failed.load(std::sync::atomic::Ordering::SeqCst) {
            true => Err(io::Error::other(
                "an earlier write or sync of the message log failed: it must be opened again",
            )),
            false => Ok(()),
        }
    }

    /// The first position of the segment appends go to.
    pub fn active(&self) -> u64 {
        self.inner.lock().active
    }

    /// Bytes the segment files hold.
    pub fn size(&self) -> u64 {
        let inner = self.inner.lock();
        let first = inner.segments.keys().next().copied().unwrap_or(0);
        let files = inner.segments.len() as u64 * MAGIC.len() as u64;
        inner.written + inner.buffer.len() as u64 - first + files
    }

    /// The position the next record gets.
    pub fn end(&self) -> u64 {
        let inner = self.inner.lock();
        inner.written + inner.buffer.len() as u64
    }

    /// Reads the record at `pos`.
    pub fn read(&self, pos: u64) -> io::Result<Record> {
        let (base, file) = {
            let inner = self.inner.lock();
            if pos >= inner.written {
                let at = (pos - inner.written) as usize;
                return parse(inner.buffer.get(at..).unwrap_or_default())
                    .map(|(r, _)| r)
                    .ok_or_else(|| corrupt(format!("no record at {pos}")));
            }
            let (&base, file) = inner
                .segments
                .range(..=pos)
                .next_back()
                .ok_or_else(|| corrupt(format!("no segment holds {pos}")))?;
            (base, Arc::clone(file))
        };
        read_at(&file, base, pos)
    }

    /// The records at `positions` (ascending), each as `read` gives it
    /// (`read_spans`, copied out).
    #[cfg(test)]
    pub fn read_many(&self, positions: &[u64], ends: &[u64]) -> Vec<io::Result<Record>> {
        self.read_spans(positions, ends).into_records()
    }

    /// Calls `f` with every record from `from` (a record's position) on,
    /// in order, until it returns false. Records appended meanwhile may or
    /// may not be seen.
    pub fn scan(&self, from: u64, mut f: impl FnMut(u64, Record) -> bool) -> io::Result<()> {
        let mut pos = from;
        loop {
            let (base, file, end) = {
                let inner = self.inner.lock();
                if pos >= inner.written {
                    // The buffer, under the lock (it is small).
                    let buffered = inner.buffer.clone();
                    let start = inner.written;
                    drop(inner);
                    let mut at = (pos - start) as usize;
                    while let Some((r, size)) = parse(buffered.get(at..).unwrap_or_default()) {
                        if !f(pos, r) {
                            return Ok(());
                        }
                        at += size;
                        pos += size as u64;
                    }
                    return Ok(());
                }
                let Some((&base, file)) = inner.segments.range(..=pos).next_back() else {
                    return Err(corrupt(format!("no segment holds {pos}")));
                };
                let end = inner
                    .segments
                    .range(base + 1..)
                    .next()
                    .map_or(inner.written, |(&next, _)| next);
                (base, Arc::clone(file), end)
            };
            let mut reader = io::BufReader::with_capacity(
                1 << 20,
                ReadAt {
                    file: &file,
                    at: pos - base + MAGIC.len() as u64,
                },
            );
            while pos < end {
                let mut h = [0u8; HEADER];
                reader.read_exact(&mut h)?;
                let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
                if pos + (HEADER + len) as u64 > end {
                    return Err(corrupt(format!(
                        "the record at {pos} runs past its segment"
                    )));
                }
                let mut payload = vec![0u8; len];
                reader.read_exact(&mut payload)?;
                if header(h[8], &payload) != h {
                    return Err(corrupt(format!("the record at {pos} fails its checksum")));
                }
                let next = pos + (HEADER + len) as u64;
                if !f(
                    pos,
                    Record {
                        kind: h[8],
                        payload,
                    },
                ) {
                    return Ok(());
                }
                pos = next;
            }
        }
    }

    /// Removes every segment that ends at or below `pos` (what is below it
    /// is no longer needed); the active segment stays.
    pub fn remove_below(&self, pos: u64) -> io::Result<usize> {
        self.check_not_failed()?;
        let gone: Vec<u64> = {
            let mut inner = self.inner.lock();
            let bases: Vec<u64> = inner.segments.keys().copied().collect();
            let mut gone = Vec::new();
            for w in bases.windows(2) {
                if w[1] <= pos {
                    gone.push(w[0]);
                }
            }
            for b in &gone {
                inner.segments.remove(b);
                inner.unsynced.remove(b);
            }
            gone
        };
        // Oldest first (the reaper keeps the order): a crash midway leaves
        // no hole.
        let files = gone.iter().map(|&b| self.path(b)).collect();
        self.reaper.reap(files, &self.dir_handle)?;
        Ok(gone.len())
    }

    /// Waits until the dead segments handed to the reaper are unlinked
    /// (a clean stop: the directory may be opened again at once).
    pub fn finish_reaping(&self) {
        self.reaper.finish();
    }

    /// The segments' first positions (metrics, tests).
    pub fn segments(&self) -> Vec<u64> {
        self.inner.lock().segments.keys().copied().collect()
    }

    /// Makes segment `base`, finished before this log was opened, durable
    /// (its tail may have been past the synced mark).
    pub fn sync_segment(&self, base: u64) -> io::Result<()> {
        let file = self.inner.lock().segments.get(&base).cloned();
        match file {
            Some(f) => f.sync_data(),
            None => Err(corrupt(format!("no segment {base}"))),
        }
    }
}

/// The record at the start of `buf`, and its size; None unless it is
/// whole and its checksum holds.
fn parse(buf: &[u8]) -> Option<(Record, usize)> {
    let (kind, len) = whole(buf)?;
    Some((
        Record {
            kind,
            payload: buf[HEADER..HEADER + len].to_vec(),
        },
        HEADER + len,
    ))
}

/// The kind and payload length of the whole record at the start of
/// `buf`, if it passes its checksum.
fn whole(buf: &[u8]) -> Option<(u8, usize)> {
    let h: [u8; HEADER] = buf.get(..HEADER)?.try_into().ok()?;
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    let payload = buf.get(HEADER..HEADER + len)?;
    (header(h[8], payload) == h).then_some((h[8], len))
}

/// Reads into `buf` from `at` until it is full or the file ends; how
/// much it read.
fn read_full_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn read_at(file: &File, base: u64, pos: u64) -> io::Result<Record> {
    let at = pos - base + MAGIC.len() as u64;
    let mut h = [0u8; HEADER];
    file.read_exact_at(&mut h, at)?;
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    if at + (HEADER + len) as u64 > file.metadata()?.len() {
        return Err(corrupt(format!("no record at {pos}")));
    }
    let mut payload = vec![0u8; len];
    file.read_exact_at(&mut payload, at + HEADER as u64)?;
    if header(h[8], &payload) != h {
        return Err(corrupt(format!("the record at {pos} fails its checksum")));
    }
    Ok(Record {
        kind: h[8],
        payload,
    })
}

/// The position after the last whole record of segment `file` (first
/// position `base`), checking records from the start; damage at or below
/// `synced` is an error.
fn check(file: &File, base: u64, synced: u64) -> io::Result<u64> {
    let len = file.metadata()?.len() - MAGIC.len() as u64;
    let mut reader = io::BufReader::with_capacity(
        1 << 20,
        ReadAt {
            file,
            at: MAGIC.len() as u64,
        },
    );
    let mut pos = base;
    let end = base + len;
    let mut h = [0u8; HEADER];
    let mut payload = Vec::new();
    while pos < end {
        let left = (end - pos) as usize;
        let whole = left >= HEADER && reader.read_exact(&mut h).is_ok() && {
            let n = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
            // The length is checked before anything is allocated for it: a
            // torn header may claim gigabytes.
            left >= HEADER + n && {
                payload.resize(n, 0);
                reader.read_exact(&mut payload).is_ok() && header(h[8], &payload) == h
            }
        };
        if !whole {
            if pos < synced {
                return Err(corrupt(format!(
                    "the message log is damaged at {pos}, below the synced position {synced}"
                )));
            }
            return Ok(pos);
        }
        pos += (HEADER + payload.len()) as u64;
    }
    Ok(pos)
}

/// Sequential reads of a file from an offset, through `read_at`.
struct ReadAt<'a> {
    file: &'a File,
    at: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

mod reaper;
mod spans;
#[cfg(test)]
mod tests;
