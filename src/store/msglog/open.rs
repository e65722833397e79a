//! Opening the message log: the directory's lock, and the index rebuilt
//! from every segment's summary (summary.rs) or, for a segment without a
//! whole one (the last, or one finished just before a crash), from its
//! records, summarized on the way for the next open.

use std::fs::{self, File};
use std::io;
use std::path::Path;

use super::index::{Index, Loc};
use super::record::{self, Rec, PUT_MESSAGE_AT};
use super::summary::{self, Entry, Summary, Writer};
use super::{corrupt, index_insert, Error, Result};
use crate::store::segments::SegmentLog;

/// What an open found.
pub struct Opened {
    pub index: Index,
    /// The summary of the segment appends go to, as far as it goes.
    pub summary: Option<Summary>,
    /// Segments read whole (no summary could serve).
    pub read: usize,
    /// Segments opened from their summary.
    pub summarized: usize,
}

/// The queue, seq, paged flag and place of the message a PUT or a REF
/// entry at `pos` stores (None: another kind).
pub fn entry_loc(pos: u64, e: &Entry) -> Option<(u64, u64, bool, Loc)> {
    let (queue, seq, paged, body, len, body_len, timed) = match *e {
        Entry::Put {
            queue,
            seq,
            len,
            paged,
            body_len,
            timed,
        } => (queue, seq, paged, pos, len, body_len, timed),
        Entry::Ref {
            queue,
            seq,
            deadline,
            paged,
            body,
            len,
            body_len,
        } => (queue, seq, paged, body, len, body_len, deadline != 0),
        Entry::Other(_) => return None,
    };
    let loc = Loc {
        rec: pos,
        body,
        at: PUT_MESSAGE_AT,
        len,
        body_len,
        timed,
    };
    Some((queue, seq, paged, loc))
}

/// Points the index at the message a PUT or a REF entry at `pos` stores,
/// paged or not (a write; `apply` drops paged ones at open).
pub fn insert_entry(index: &mut Index, pos: u64, e: &Entry) -> Result<()> {
    let (queue, seq, _, loc) =
        entry_loc(pos, e).ok_or_else(|| corrupt(format!("no message in the record at {pos}")))?;
    index_insert(index, queue, seq, loc)
}

/// What message `seq` of a record at `pos` does to the index. Paged
/// transient messages are dropped, as RabbitMQ drops transient messages
/// at a restart.
pub fn apply(index: &mut Index, pos: u64, e: &Entry) -> Result<()> {
    match e {
        Entry::Put { .. } | Entry::Ref { .. } => {
            if let Some((queue, seq, false, loc)) = entry_loc(pos, e) {
                index_insert(index, queue, seq, loc)?;
            }
        }
        Entry::Other(Rec::Ack { queue, seq }) => {
            index.remove(*queue, *seq);
        }
        Entry::Other(Rec::Purge { queue, from }) => {
            index.remove_from(*queue, *from);
        }
        Entry::Other(Rec::Move {
            from,
            to,
            moves,
            removes,
        }) => apply_move(index, pos, *from, *to, moves, removes)?,
        // `Entry::of` makes a PUT or a REF an entry of its own.
        Entry::Other(Rec::Put { .. } | Rec::Ref { .. }) => {}
    }
    Ok(())
}

/// A MOVE record at `pos`: each message in exactly one of the queues.
pub fn apply_move(
    index: &mut Index,
    pos: u64,
    from: u64,
    to: u64,
    at: &[record::MovedAt],
    removes: &[u64],
) -> Result<()> {
    for m in at {
        if m.from_seq != 0 {
            index.remove(from, m.from_seq);
        }
    }
    for &seq in removes {
        index.remove(from, seq);
    }
    let locs: Vec<(u64, Loc)> = at
        .iter()
        .map(|m| {
            let loc = Loc {
                rec: pos,
                body: pos,
                at: m.at,
                len: m.len,
                body_len: m.body_len,
                timed: m.timed,
            };
            (m.to_seq, loc)
        })
        .collect();
    index.insert_run(to, pos, &locs).map_err(|_| {
        corrupt(format!(
            "a message of queue {to} in the record at {pos} cannot be indexed"
        ))
    })
}

/// Rebuilds the index, segment by segment in log order. A record that
/// does not parse (a newer version's) stops the open: skipping it could
/// bring back what it removed.
pub fn read_index(log: &SegmentLog, dir: &Path, writer: &mut Writer) -> Result<Opened> {
    remove_stale(dir, &log.segments())?;
    let mut o = Opened {
        index: Index::default(),
        summary: None,
        read: 0,
        summarized: 0,
    };
    let bases = log.segments();
    for &b in &bases {
        o.index.segment(b);
    }
    let mut failed: Option<Error> = None;
    for (i, &base) in bases.iter().enumerate() {
        let end = bases.get(i + 1).copied();
        if let Some(bytes) = end.and_then(|end| summary::read(dir, base, end)) {
            summary::each(&bytes, |pos, e| match apply(&mut o.index, pos, &e) {
                Ok(()) => true,
                Err(err) => {
                    failed = Some(err);
                    false
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            o.summarized += 1;
            continue;
        }
        let mut s = Summary::new(base);
        // The body lengths of this segment's PUTs, for its REFs.
        let mut bodies = std::collections::HashMap::new();
        log.scan(base, |pos, r| {
            if end.is_some_and(|end| pos >= end) {
                return false;
            }
            let Some(mut e) = Entry::of(r.kind, &r.payload) else {
                failed = Some(corrupt(format!(
                    "the message log's record at {pos} (kind {}) cannot be read: damaged, or written by a newer version",
                    r.kind
                )));
                return false;
            };
            match &mut e {
                Entry::Put { body_len, .. } => {
                    bodies.insert(pos, *body_len);
                }
                Entry::Ref { body, body_len, .. } => match bodies.get(body) {
                    Some(n) => *body_len = *n,
                    None => {
                        failed = Some(corrupt(format!(
                            "the reference at {pos} names no message of its segment"
                        )));
                        return false;
                    }
                },
                Entry::Other(_) => {}
            }
            if let Err(err) = apply(&mut o.index, pos, &e) {
                failed = Some(err);
                return false;
            }
            s.add(pos, &e);
            true
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        o.read += 1;
        match end {
            Some(end) => {
                // Finished before the open: its summary is written now,
                // once the segment is surely durable.
                log.sync_segment(base)?;
                s.end = Some(end);
                writer.add(s);
                writer.finish(end);
            }
            None => o.summary = Some(s),
        }
    }
    Ok(o)
}

/// Removes summaries of segments that are gone, and summaries left
/// unfinished.
fn remove_stale(dir: &Path, bases: &[u64]) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        let stale = if let Some(b) = name.strip_suffix(".idx") {
            b.parse::<u64>()
                .is_ok_and(|b| bases.binary_search(&b).is_err())
        } else {
            name.ends_with(".idx.tmp")
        };
        if stale {
            fs::remove_file(dir.join(&*name))?;
        }
    }
    Ok(())
}

/// Takes the directory's lock: one process at a time (a store being
/// reopened waits until the old one is gone).
pub fn lock_dir(dir: &Path) -> Result<File> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))?;
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is valid for the life of `file`; flock only reads it.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return Err(Error::Io(io::Error::new(
            e.kind(),
            format!(
                "{} is locked: in use by another process ({e})",
                dir.display()
            ),
        )));
    }
    Ok(file)
}
