//! Records read together: the records at a list of positions, read with
//! as few reads as their spacing allows into one buffer, each handed out
//! as a slice of it (a reader going through a stream or a backlog reads
//! a run of neighbours; one read each was three syscalls a record, and a
//! copy each was as much CPU again as the read).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::Arc;

use super::{read_at, read_full_at, whole, Record, SegmentLog, HEADER, MAGIC};

/// The most bytes one read takes (records further apart are read with
/// another read).
const SPAN_BYTES: u64 = 1 << 20;
/// A thread keeps its buffer up to this size (a large record can make one
/// larger, for that read).
const SPAN_KEPT: usize = 2 << 20;

thread_local! {
    /// The buffer of `read_spans`, kept by each thread that reads: a new
    /// megabyte each time cost page faults and their zeroing, every read.
    static SPAN: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What `read_spans` found: per position, the record's kind and where its
/// payload lies in one buffer, or why it could not be read.
pub struct Spans {
    buf: Vec<u8>,
    found: Vec<io::Result<(u8, Range<usize>)>>,
}

impl Spans {
    /// The kind and payload of the `i`th position's record, if it was read.
    pub fn get(&self, i: usize) -> Option<(u8, &[u8])> {
        match self.found.get(i)? {
            Ok((kind, r)) => Some((*kind, self.buf.get(r.clone())?)),
            Err(_) => None,
        }
    }

    /// Each position's record, copied out (`SegmentLog::read_many`).
    #[cfg(test)]
    pub fn into_records(mut self) -> Vec<io::Result<Record>> {
        let found = std::mem::take(&mut self.found);
        found
            .into_iter()
            .map(|f| {
                f.map(|(kind, r)| Record {
                    kind,
                    payload: self.buf[r].to_vec(),
                })
            })
            .collect()
    }

    /// Adds a record read on its own.
    fn push(&mut self, used: &mut usize, r: io::Result<Record>) {
        self.found.push(r.map(|r| {
            let at = *used;
            let end = at + r.payload.len();
            if self.buf.len() < end {
                self.buf.resize(end, 0);
            }
            self.buf[at..end].copy_from_slice(&r.payload);
            *used = end;
            (r.kind, at..end)
        }));
    }
}

impl Drop for Spans {
    fn drop(&mut self) {
        if self.buf.len() <= SPAN_KEPT {
            let buf = std::mem::take(&mut self.buf);
            SPAN.with(|b| *b.borrow_mut() = buf);
        }
    }
}

/// The head of a record that lies whole in a segment file
/// (`SegmentLog::record_head`).
pub struct RecordHead {
    pub kind: u8,
    /// Its payload's length.
    pub len: usize,
    /// The first bytes of its payload (as many as asked, at most).
    pub head: Vec<u8>,
    /// The segment's file, and where the payload starts in it.
    pub file: Arc<File>,
    pub payload_at: u64,
}

impl SegmentLog {
    /// The kind, length and first `n` bytes of the payload of the record
    /// at `pos`, and where the payload lies in its segment's file, so
    /// that it can be sent from the file as it lies; None if the record
    /// is not whole in a file yet (appended and not written) or cannot be
    /// read. Its CRC is not checked: nothing reads it here.
    pub fn record_head(&self, pos: u64, n: usize) -> Option<RecordHead> {
        let (base, file, seg_end) = {
            let inner = self.inner.lock();
            if pos >= inner.written {
                return None;
            }
            let next = inner
                .segments
                .range(pos + 1..)
                .next()
                .map_or(inner.written, |(&b, _)| b);
            let (&base, file) = inner.segments.range(..=pos).next_back()?;
            (base, Arc::clone(file), next.min(inner.written))
        };
        let at = pos - base + MAGIC.len() as u64;
        let mut buf = vec![0u8; HEADER + n];
        let got = read_full_at(&file, &mut buf, at).ok()?;
        let h = buf.get(..HEADER)?;
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        if pos + (HEADER + len) as u64 > seg_end {
            return None;
        }
        let kind = h[8];
        buf.truncate(got.min(HEADER + len));
        buf.drain(..HEADER);
        Some(RecordHead {
            kind,
            len,
            head: buf,
            file,
            payload_at: at + HEADER as u64,
        })
    }

    /// The records at `positions` (ascending), each as `read` gives it:
    /// the records of one segment that lie within `SPAN_BYTES` of the
    /// first of them are read with one pread. `ends` gives, per position,
    /// how far past it the record reaches at least (its header and the
    /// part of its payload wanted); a record that reaches further than
    /// what was read, or fails its checksum there, is read on its own.
    pub fn read_spans(&self, positions: &[u64], ends: &[u64]) -> Spans {
        let mut spans = Spans {
            buf: SPAN.with(|b| std::mem::take(&mut *b.borrow_mut())),
            found: Vec::with_capacity(positions.len()),
        };
        // The buffer keeps its length between reads (no zeroing); `used`
        // is how much of it this read filled.
        let mut used = 0;
        let mut i = 0;
        while i < positions.len() {
            let first = positions[i];
            let seg = {
                let inner = self.inner.lock();
                (first < inner.written)
                    .then(|| {
                        let mut after = inner.segments.range(first + 1..);
                        let next = after.next().map_or(inner.written, |(&b, _)| b);
                        inner
                            .segments
                            .range(..=first)
                            .next_back()
                            .map(|(&base, f)| (base, Arc::clone(f), next.min(inner.written)))
                    })
                    .flatten()
            };
            let Some((base, file, seg_end)) = seg else {
                spans.push(&mut used, self.read(first));
                i += 1;
                continue;
            };
            let mut j = i;
            let mut end = first;
            while j < positions.len() && positions[j] < seg_end && positions[j] - first < SPAN_BYTES
            {
                end = end.max(ends[j].min(seg_end));
                j += 1;
            }
            let want = (end - first) as usize;
            let at = used;
            if spans.buf.len() < at + want {
                spans.buf.resize(at + want, 0);
            }
            let from = first - base + MAGIC.len() as u64;
            match read_full_at(&file, &mut spans.buf[at..at + want], from) {
                Ok(mut n) => {
                    // The last record may reach past what is wanted of it
                    // (a batch of messages read for its first few): the
                    // rest of it is read on, into the same buffer, rather
                    // than the whole of it again on its own.
                    let last = (positions[j - 1] - first) as usize;
                    if let Some(h) = spans.buf[at..at + n].get(last..last + HEADER) {
                        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
                        let rec_end = last + HEADER + len;
                        if rec_end > n && first + rec_end as u64 <= seg_end {
                            if spans.buf.len() < at + rec_end {
                                spans.buf.resize(at + rec_end, 0);
                            }
                            let rest = &mut spans.buf[at + n..at + rec_end];
                            if let Ok(k) = read_full_at(&file, rest, from + n as u64) {
                                n += k;
                            }
                        }
                    }
                    used = at + n;
                    for &pos in &positions[i..j] {
                        let rel = at + (pos - first) as usize;
                        match spans.buf[..at + n].get(rel..).and_then(whole) {
                            Some((kind, len)) => spans
                                .found
                                .push(Ok((kind, rel + HEADER..rel + HEADER + len))),
                            None => spans.push(&mut used, read_at(&file, base, pos)),
                        }
                    }
                }
                Err(_) => {
                    for &pos in &positions[i..j] {
                        spans.push(&mut used, self.read(pos));
                    }
                }
            }
            i = j;
        }
        spans
    }
}
