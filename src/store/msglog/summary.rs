//! A finished segment's summary: what the index needs of each of its
//! records (a PUT's queue, seq, length and whether it was paged; the other
//! records without the messages a MOVE carries), in a file beside it, so
//! an open reads a few bytes a message instead of the whole log.
//!
//! The summary is built as records are appended (every append holds the
//! log's state lock, so it sees them in order) and handed at each commit
//! to the writer, which adds it to a temporary file. Once appends moved to
//! the next segment and a sync covers the segment's end, the file gets the
//! end and a CRC and is renamed: a summarized segment is durable whole and
//! is never cut as a torn tail. Summaries are not synced: a file lost or
//! damaged in a crash fails its CRC or its end check, and the open reads
//! that segment instead (and summarizes it again). A segment whose
//! summary is used is not read at the open: damage in it shows when a
//! message in it is read (each record's CRC is checked then).
//!
//! File: magic, the segment's first position, the entries, the segment's
//! end (the next one's first position), a CRC-32 of all that. An entry: the
//! record's kind and position, then for a PUT: queue, seq, the message's
//! length (u32), paged (u8), the body's length (u32) and whether it has a
//! deadline (u8); a REF: its payload and the body's length; an ACK, a
//! PURGE: its payload; a MOVE: from, to, its moves (from seq, to seq,
//! where in the payload and how long, the body's length, timed), its
//! removes. A MOVE of new messages at consecutive seqs, each right after
//! the one before and its 4-byte length (a CHUNK's, a stream protocol
//! batch) is written as a CHUNK entry instead: the queue, the first seq,
//! the count, where the first starts, then each one's length as a LEB128
//! varint (a byte or two a message where the MOVE's form took 29).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::record::{self, MovedAt, Reader, Rec, PUT_MESSAGE_AT};
use crate::store::messages::{is_paged, record_meta};

const MAGIC: &[u8; 8] = b"WIDX0002";

/// What the index needs of one record.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry {
    Put {
        queue: u64,
        seq: u64,
        len: u32,
        paged: bool,
        body_len: u32,
        timed: bool,
    },
    Ref {
        queue: u64,
        seq: u64,
        deadline: u64,
        paged: bool,
        body: u64,
        len: u32,
        /// Its PUT's body length (`of` leaves it 0: the PUT says).
        body_len: u32,
    },
    /// An ACK, a PURGE or a MOVE.
    Other(Rec),
}

impl Entry {
    /// The entry of a record; None if the record does not parse.
    pub fn of(kind: u8, payload: &[u8]) -> Option<Entry> {
        Some(match record::parse(kind, payload)? {
            Rec::Put { queue, seq } => {
                let message = payload.get(PUT_MESSAGE_AT as usize..)?;
                let (body_len, deadline) = record_meta(message)?;
                Entry::Put {
                    queue,
                    seq,
                    len: u32::try_from(message.len()).ok()?,
                    paged: is_paged(message),
                    body_len,
                    timed: deadline != 0,
                }
            }
            Rec::Ref {
                queue,
                seq,
                deadline,
                paged,
                body,
                len,
            } => Entry::Ref {
                queue,
                seq,
                deadline,
                paged,
                body,
                len,
                body_len: 0,
            },
            rec => Entry::Other(rec),
        })
    }
}

/// The path of segment `base`'s summary in `dir`.
pub fn path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.idx"))
}

fn tmp_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.idx.tmp"))
}

/// The entries of one segment not handed to the writer yet.
pub struct Summary {
    pub base: u64,
    /// The segment's end, once appends went past it.
    pub end: Option<u64>,
    pub bytes: Vec<u8>,
    /// Whether these are the segment's first entries (the writer begins
    /// its file with them).
    pub first: bool,
}

impl Summary {
    pub fn new(base: u64) -> Summary {
        Summary {
            base,
            end: None,
            bytes: Vec::new(),
            first: true,
        }
    }

    /// The entries so far, handed on (the next piece continues the file).
    pub fn take(&mut self) -> Summary {
        let piece = Summary {
            base: self.base,
            end: self.end,
            bytes: std::mem::take(&mut self.bytes),
            first: self.first,
        };
        self.first = false;
        piece
    }

    /// Adds the entry of the record at `pos`.
    pub fn add(&mut self, pos: u64, e: &Entry) {
        let b = &mut self.bytes;
        let head = |b: &mut Vec<u8>, kind: u8| {
            b.push(kind);
            b.extend_from_slice(&pos.to_be_bytes());
        };
        match e {
            Entry::Put {
                queue,
                seq,
                len,
                paged,
                body_len,
                timed,
            } => {
                head(b, record::PUT);
                b.extend_from_slice(&record::pair(*queue, *seq));
                b.extend_from_slice(&len.to_be_bytes());
                b.push(u8::from(*paged));
                b.extend_from_slice(&body_len.to_be_bytes());
                b.push(u8::from(*timed));
            }
            Entry::Other(Rec::Put { .. } | Rec::Ref { .. }) => {}
            Entry::Ref {
                queue,
                seq,
                deadline,
                paged,
                body,
                len,
                body_len,
            } => {
                head(b, record::REF);
                b.extend_from_slice(&record::reference(
                    *queue, *seq, *deadline, *paged, *body, *len,
                ));
                b.extend_from_slice(&body_len.to_be_bytes());
            }
            Entry::Other(Rec::Ack { queue, seq }) => {
                head(b, record::ACK);
                b.extend_from_slice(&record::pair(*queue, *seq));
            }
            Entry::Other(Rec::Purge { queue, from }) => {
                head(b, record::PURGE);
                b.extend_from_slice(&record::pair(*queue, *from));
            }
            Entry::Other(Rec::Move {
                from,
                to,
                moves,
                removes,
            }) if from == to && removes.is_empty() && dense(moves) => {
                head(b, record::CHUNK);
                b.extend_from_slice(&record::pair(*to, moves[0].to_seq));
                b.extend_from_slice(&(moves.len() as u32).to_be_bytes());
                b.extend_from_slice(&moves[0].at.to_be_bytes());
                for m in moves {
                    put_varint(b, m.len);
                }
            }
            Entry::Other(Rec::Move {
                from,
                to,
                moves,
                removes,
            }) => {
                head(b, record::MOVE);
                b.extend_from_slice(&record::pair(*from, *to));
                b.extend_from_slice(&(moves.len() as u32).to_be_bytes());
                for m in moves {
                    b.extend_from_slice(&record::pair(m.from_seq, m.to_seq));
                    b.extend_from_slice(&m.at.to_be_bytes());
                    b.extend_from_slice(&m.len.to_be_bytes());
                    b.extend_from_slice(&m.body_len.to_be_bytes());
                    b.push(u8::from(m.timed));
                }
                b.extend_from_slice(&(removes.len() as u32).to_be_bytes());
                for r in removes {
                    b.extend_from_slice(&r.to_be_bytes());
                }
            }
        }
    }
}

/// Whether `moves` are new messages at consecutive seqs, each right after
/// the one before and its 4-byte length, with nothing beside its body:
/// what a CHUNK entry says (`Summary::add`).
fn dense(moves: &[MovedAt]) -> bool {
    !moves.is_empty()
        && u32::try_from(moves.len()).is_ok()
        && moves
            .iter()
            .all(|m| m.from_seq == 0 && !m.timed && m.len == m.body_len)
        && moves.windows(2).all(|w| {
            w[0].to_seq.checked_add(1) == Some(w[1].to_seq)
                && record::chunk_next_at(w[0].at, w[0].len) == Some(w[1].at)
        })
}

fn put_varint(b: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        b.push(v as u8 | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

fn varint(r: &mut Reader<'_>) -> Option<u32> {
    let mut v = 0u32;
    for shift in (0..35).step_by(7) {
        let byte = r.u8()?;
        let bits = u32::from(byte & 0x7f);
        v |= bits.checked_shl(shift).filter(|s| s >> shift == bits)?;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Writes summaries a piece at a time into temporary files, and renames
/// each once its segment is finished and synced.
pub struct Writer {
    dir: PathBuf,
    /// Open summaries by segment: the file, the CRC so far, and the
    /// segment's end once known.
    open: BTreeMap<u64, Open>,
}

struct Open {
    file: Option<fs::File>,
    crc: crc32fast::Hasher,
    end: Option<u64>,
}

impl Writer {
    pub fn new(dir: &Path) -> Writer {
        Writer {
            dir: dir.to_path_buf(),
            open: BTreeMap::new(),
        }
    }

    /// Adds what `s` holds to its segment's file (begun if `s` is the
    /// segment's first piece). A failed write drops that summary: the
    /// segment is read at the next open instead.
    pub fn add(&mut self, s: Summary) {
        if s.first {
            let mut crc = crc32fast::Hasher::new();
            let mut head = Vec::with_capacity(16);
            head.extend_from_slice(MAGIC);
            head.extend_from_slice(&s.base.to_be_bytes());
            crc.update(&head);
            let file = fs::File::create(tmp_path(&self.dir, s.base))
                .and_then(|mut f| f.write_all(&head).map(|()| f))
                .map_err(|e| failed(&self.dir, s.base, e))
                .ok();
            self.open.insert(
                s.base,
                Open {
                    file,
                    crc,
                    end: None,
                },
            );
        }
        let Some(o) = self.open.get_mut(&s.base) else {
            return;
        };
        o.end = s.end.or(o.end);
        let Some(f) = &mut o.file else { return };
        o.crc.update(&s.bytes);
        if let Err(e) = f.write_all(&s.bytes) {
            failed(&self.dir, s.base, e);
            o.file = None;
        }
    }

    /// Finishes every summary whose segment ends at or below `synced`.
    pub fn finish(&mut self, synced: u64) {
        let done: Vec<u64> = self
            .open
            .iter()
            .filter(|(_, o)| o.end.is_some_and(|e| e <= synced))
            .map(|(b, _)| *b)
            .collect();
        for base in done {
            let Some(mut o) = self.open.remove(&base) else {
                continue;
            };
            let Some(mut f) = o.file.take() else { continue };
            let end = o.end.unwrap_or(base).to_be_bytes();
            o.crc.update(&end);
            let crc = o.crc.finalize().to_be_bytes();
            let r = f
                .write_all(&end)
                .and_then(|()| f.write_all(&crc))
                .and_then(|()| fs::rename(tmp_path(&self.dir, base), path(&self.dir, base)));
            if let Err(e) = r {
                failed(&self.dir, base, e);
            }
        }
    }

    /// Drops the summary of segment `base` (removed, or missed a record).
    pub fn drop_segment(&mut self, base: u64) {
        if self.open.remove(&base).is_some() {
            let _ = fs::remove_file(tmp_path(&self.dir, base));
        }
        if let Err(e) = remove(&self.dir, base) {
            tracing::warn!(segment = base, "message log summary not removed: {e}");
        }
    }
}

/// A summary that could not be written: gone, so the segment is read at
/// the next open.
fn failed(dir: &Path, base: u64, e: io::Error) {
    tracing::warn!(
        segment = base,
        "message log summary not written ({e}): the segment will be read at the next start"
    );
    let _ = fs::remove_file(tmp_path(dir, base));
}

/// Segment `base`'s summary, if it has a whole one for a segment that
/// ends at `end`: its entries, checked, for `each`.
pub fn read(dir: &Path, base: u64, end: u64) -> Option<Vec<u8>> {
    let mut bytes = fs::read(path(dir, base)).ok()?;
    let crc = bytes.split_off(bytes.len().checked_sub(4)?);
    if crc32fast::hash(&bytes).to_be_bytes()[..] != crc[..] {
        return None;
    }
    let ends = bytes.split_off(bytes.len().checked_sub(8)?);
    let mut r = Reader::new(&bytes);
    if r.take(8)? != MAGIC || r.u64()? != base || ends[..] != end.to_be_bytes() {
        return None;
    }
    each(&bytes, |pos, _| pos >= base && pos < end)?;
    Some(bytes)
}

/// Calls `f` with every entry of a summary `read` returned, in order,
/// while it returns true; None if an entry does not parse.
pub fn each(summary: &[u8], mut f: impl FnMut(u64, Entry) -> bool) -> Option<()> {
    let mut r = Reader::new(summary);
    r.take(16)?;
    while !r.done() {
        let kind = r.u8()?;
        let pos = r.u64()?;
        let e = match kind {
            record::PUT => Entry::Put {
                queue: r.u64()?,
                seq: r.u64()?,
                len: r.u32()?,
                paged: r.u8()? != 0,
                body_len: r.u32()?,
                timed: r.u8()? != 0,
            },
            record::REF => Entry::Ref {
                queue: r.u64()?,
                seq: r.u64()?,
                deadline: r.u64()?,
                paged: r.u8()? != 0,
                body: r.u64()?,
                len: r.u32()?,
                body_len: r.u32()?,
            },
            record::ACK => Entry::Other(Rec::Ack {
                queue: r.u64()?,
                seq: r.u64()?,
            }),
            record::PURGE => Entry::Other(Rec::Purge {
                queue: r.u64()?,
                from: r.u64()?,
            }),
            record::MOVE => {
                let (from, to) = (r.u64()?, r.u64()?);
                let n = r.u32()? as usize;
                let mut moves = Vec::with_capacity(n.min(summary.len() / 24));
                for _ in 0..n {
                    moves.push(MovedAt {
                        from_seq: r.u64()?,
                        to_seq: r.u64()?,
                        at: r.u32()?,
                        len: r.u32()?,
                        body_len: r.u32()?,
                        timed: r.u8()? != 0,
                    });
                }
                let m = r.u32()? as usize;
                let mut removes = Vec::with_capacity(m.min(summary.len() / 8));
                for _ in 0..m {
                    removes.push(r.u64()?);
                }
                Entry::Other(Rec::Move {
                    from,
                    to,
                    moves,
                    removes,
                })
            }
            record::CHUNK => {
                let (queue, first) = (r.u64()?, r.u64()?);
                let n = r.u32()? as usize;
                let mut at = r.u32()?;
                // Each length takes a byte at least; a batch holds at most
                // a CHUNK's count.
                let mut moves = Vec::with_capacity(n.min(summary.len()).min(record::CHUNK_MAX));
                for k in 0..n {
                    let len = varint(&mut r)?;
                    moves.push(MovedAt {
                        from_seq: 0,
                        to_seq: first.checked_add(k as u64)?,
                        at,
                        len,
                        body_len: len,
                        timed: false,
                    });
                    if k + 1 < n {
                        at = record::chunk_next_at(at, len)?;
                    }
                }
                Entry::Other(Rec::Move {
                    from: queue,
                    to: queue,
                    moves,
                    removes: Vec::new(),
                })
            }
            _ => return None,
        };
        if !f(pos, e) {
            return None;
        }
    }
    Some(())
}

/// Removes segment `base`'s summary, if it has one.
pub fn remove(dir: &Path, base: u64) -> io::Result<()> {
    match fs::remove_file(path(dir, base)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moved(to_seq: u64, at: u32, len: u32) -> MovedAt {
        MovedAt {
            from_seq: 0,
            to_seq,
            at,
            len,
            body_len: len,
            timed: false,
        }
    }

    /// Entries come back from a summary as they went in; a stream batch's
    /// takes a byte or so a message.
    #[test]
    fn entries_read_back_as_written() {
        let mut at = 40;
        let lens = [0u32, 1, 127, 128, 16_383, 16_384, 1 << 21, 20];
        let batch: Vec<MovedAt> = (0..lens.len())
            .map(|k| {
                let m = moved(1000 + k as u64, at, lens[k]);
                at += lens[k] + 4;
                m
            })
            .collect();
        let small: Vec<MovedAt> = (0..100)
            .map(|k| moved(5000 + k, 37 + 24 * k as u32, 20))
            .collect();
        let mut gap = batch.clone();
        gap[3].to_seq += 1;
        let mut timed = small.clone();
        timed[0].timed = true;
        let mv = |from, to, moves: &Vec<MovedAt>, removes: Vec<u64>| {
            Entry::Other(Rec::Move {
                from,
                to,
                moves: moves.clone(),
                removes,
            })
        };
        let entries = vec![
            mv(7, 7, &batch, vec![]),
            mv(7, 7, &gap, vec![]),
            mv(7, 7, &timed, vec![]),
            mv(3, 7, &small, vec![]),
            mv(7, 7, &small, vec![9]),
            Entry::Other(Rec::Ack { queue: 7, seq: 5 }),
            mv(7, 7, &small, vec![]),
        ];
        let mut s = Summary::new(0);
        let mut sizes = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            let before = s.bytes.len();
            s.add(100 * i as u64, e);
            sizes.push(s.bytes.len() - before);
        }
        // Kind, position, queue, seq, count, where the first starts, and
        // a byte a length under 128.
        assert_eq!(sizes[6], 1 + 8 + 16 + 4 + 4 + 100);
        assert!(sizes[3] > 29 * 100, "{sizes:?}");
        let mut file = MAGIC.to_vec();
        file.extend_from_slice(&0u64.to_be_bytes());
        file.extend_from_slice(&s.bytes);
        let mut back = Vec::new();
        each(&file, |pos, e| {
            back.push((pos, e));
            true
        })
        .unwrap();
        let want: Vec<(u64, Entry)> = entries
            .into_iter()
            .enumerate()
            .map(|(i, e)| (100 * i as u64, e))
            .collect();
        assert_eq!(back, want);
        // A length cut short does not parse.
        let cut = &file[..file.len() - 101];
        assert!(each(cut, |_, _| true).is_none());
    }

    #[test]
    fn varints_round_trip_and_refuse_overflow() {
        for v in [0, 1, 127, 128, 300, 1 << 21, u32::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut r = Reader::new(&b);
            assert_eq!(varint(&mut r), Some(v));
            assert!(r.done());
        }
        let over = [0xff, 0xff, 0xff, 0xff, 0x1f];
        assert_eq!(varint(&mut Reader::new(&over)), None);
        let long = [0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
        assert_eq!(varint(&mut Reader::new(&long)), None);
    }
}
