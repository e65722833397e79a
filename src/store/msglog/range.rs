//! Range reads: a queue's or a stream's messages from a sequence number
//! on, in order, the records holding them read together
//! (`SegmentLog::read_spans`). `visit_range_within` hands each message
//! out as its record's bytes where the read left them, so a stream's
//! reader copies a body once, into the frame it sends, and decodes
//! nothing it does not need to.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

use super::index::Loc;
use super::record::{self, CHUNK_HEAD_MAX};
use super::{MessageLog, RECORD_HEADER};
use crate::message::{amqp10, Message};
use crate::store::messages::{decode_record, record_parts, stored_record};
use crate::store::{Error, Result};

/// A CHUNK record's entries are named where they lie in the file only
/// from this many bytes on: sending a smaller one from the file (a read
/// of its head and a `sendfile` of its own) cost more than reading it
/// with its neighbours and copying it (100 messages of 16 bytes a
/// record: 0.18 us of broker CPU a delivery against 0.13).
const CHUNK_SENT_MIN: u64 = 16 << 10;

/// One message of a range read (or, asked for, a run of them).
pub enum Found<'a> {
    /// Its message record (store/messages.rs), where the read left it.
    Record(&'a [u8]),
    /// A stream batch's message (an entry of a CHUNK record): its AMQP 1.0
    /// bytes, its routing key, and when it was stored, where the read
    /// left them.
    Entry {
        body: &'a [u8],
        route: &'a [u8],
        time: u64,
    },
    /// The message, read another way (held back, or moved while read),
    /// and when it was stored (ms since the epoch; 0: not recorded).
    Message(Arc<Message>, u64),
    /// A whole CHUNK record's messages, from the first the call names on,
    /// not read: where their entries lie in a segment file.
    Chunk(StoredChunk),
}

/// A CHUNK record's entries as they lie in a segment file: what a stream
/// protocol reader sends from the file (chunk.rs).
#[derive(Clone)]
pub struct StoredChunk {
    pub file: Arc<File>,
    /// Where the entries start in the file, and their bytes.
    pub at: u64,
    pub len: u64,
    /// Their CRC-32 (a Deliver frame's chunk header names it).
    pub crc: u32,
    pub count: u32,
    /// When its messages were stored (ms since the epoch).
    pub time: u64,
}

impl Found<'_> {
    /// The message, decoded from its record if need be, and when it was
    /// stored (ms since the epoch; 0: not recorded).
    pub fn into_message(self) -> Result<(Arc<Message>, u64)> {
        Ok(match self {
            Found::Record(r) => {
                let d = decode_record(Bytes::copy_from_slice(r))?;
                (Arc::new(d.message), d.time)
            }
            Found::Entry { body, route, time } => {
                let r = stored_record(time, (b"", route), amqp10::STORED_PROPS, body);
                (Arc::new(decode_record(r)?.message), time)
            }
            Found::Message(m, time) => (m, time),
            Found::Chunk(_) => return Err(Error::Corrupt("a chunk read as one message".into())),
        })
    }

    /// The bytes of its bodies (a chunk's: of its entries).
    pub fn body_len(&self) -> Result<u64> {
        match self {
            Found::Record(r) => record_parts(r)
                .map(|(_, body)| body.len() as u64)
                .ok_or_else(|| Error::Corrupt("message record".into())),
            Found::Entry { body, .. } => Ok(body.len() as u64),
            Found::Message(m, _) => Ok(m.body().len() as u64),
            Found::Chunk(c) => Ok(c.len),
        }
    }
}

impl MessageLog {
    /// Up to `n` messages of `queue` from `from` on, in order.
    pub fn range(&self, queue: u64, from: u64, n: usize) -> Result<Vec<(u64, Arc<Message>)>> {
        self.range_within(queue, from, n, u64::MAX)
    }

    /// The same, and no more than about `max_bytes` of bodies (at least
    /// one message): the index knows each body's length before a read.
    pub fn range_within(
        &self,
        queue: u64,
        from: u64,
        n: usize,
        max_bytes: u64,
    ) -> Result<Vec<(u64, Arc<Message>)>> {
        let mut out = Vec::new();
        self.visit_range_within(queue, from, n, max_bytes, false, |seq, found| {
            out.push((seq, found.into_message()?.0));
            Ok(())
        })?;
        Ok(out)
    }

    /// Calls `f` with each of the messages `range_within` reads, in
    /// order; stops at the first error `f` returns. With `chunks`, the
    /// messages of a CHUNK record it reads all of, from its first on,
    /// that lies whole in a segment file (and holds `CHUNK_SENT_MIN`
    /// bytes at least) go to `f` as one `Found::Chunk`, not read (`f` is
    /// given its first seq).
    pub fn visit_range_within(
        &self,
        queue: u64,
        from: u64,
        n: usize,
        max_bytes: u64,
        chunks: bool,
        mut f: impl FnMut(u64, Found<'_>) -> Result<()>,
    ) -> Result<()> {
        if let Some(held) = self.held_from(queue, from, n, max_bytes) {
            for (seq, m, time) in held {
                f(seq, Found::Message(m, time))?;
            }
            return Ok(());
        }
        let mut locs = self.released()?.index.range(queue, from, n);
        let fit = crate::store::within_bytes(
            locs.iter().map(|(_, loc)| u64::from(loc.body_len)),
            max_bytes,
        );
        locs.truncate(fit);
        if !chunks {
            return self.visit_read(queue, &locs, &mut f);
        }
        // Runs of messages in one record; a CHUNK's whole run goes as it
        // lies, the others are read together.
        let mut unread = 0;
        let mut i = 0;
        while i < locs.len() {
            let body = locs[i].1.body;
            let run = locs[i..]
                .iter()
                .take_while(|(_, l)| l.body == body && l.rec == body)
                .count()
                .max(1);
            let bytes: u64 = locs[i..i + run]
                .iter()
                .map(|(_, l)| 4 + u64::from(l.body_len))
                .sum();
            if run > 1 && bytes >= CHUNK_SENT_MIN {
                if let Some(c) = self.stored_chunk(&locs[i..i + run]) {
                    self.visit_read(queue, &locs[unread..i], &mut f)?;
                    f(locs[i].0, Found::Chunk(c))?;
                    unread = i + run;
                }
            }
            i += run;
        }
        self.visit_read(queue, &locs[unread..], &mut f)
    }

    /// The CHUNK record the messages `run` (consecutive, all in the
    /// record at `run[0]`'s position) are the whole of, as it lies in its
    /// segment file; None if they are not that, or it is not in a file.
    fn stored_chunk(&self, run: &[(u64, Loc)]) -> Option<StoredChunk> {
        let (first, loc) = *run.first()?;
        let h = self.log.record_head(loc.body, CHUNK_HEAD_MAX)?;
        if h.kind != record::CHUNK {
            return None;
        }
        let (head, _) = record::chunk_head(&h.head)?;
        let whole = head.first_seq == first
            && head.count as usize == run.len()
            && run.last().map(|(seq, _)| *seq) == Some(first + run.len() as u64 - 1);
        whole.then(|| StoredChunk {
            at: h.payload_at + head.entries_at as u64,
            len: (h.len - head.entries_at) as u64,
            file: h.file,
            crc: head.crc,
            count: head.count,
            time: head.time,
        })
    }

    /// Calls `f` with the messages at `locs`, their records read together
    /// (neighbours in a segment share a read). A message's bytes are in
    /// the record its `body` names (a REF's deadline, in the record `rec`
    /// names, is nothing to a range read).
    fn visit_read(
        &self,
        queue: u64,
        locs: &[(u64, Loc)],
        f: &mut impl FnMut(u64, Found<'_>) -> Result<()>,
    ) -> Result<()> {
        if locs.is_empty() {
            return Ok(());
        }
        let mut bodies: Vec<(u64, u64)> = locs
            .iter()
            .map(|(_, l)| {
                (
                    l.body,
                    l.body + RECORD_HEADER + u64::from(l.at) + u64::from(l.len),
                )
            })
            .collect();
        bodies.sort_unstable();
        bodies.dedup_by(|b, a| {
            let same = a.0 == b.0;
            if same {
                a.1 = a.1.max(b.1);
            }
            same
        });
        let (positions, ends): (Vec<u64>, Vec<u64>) = bodies.into_iter().unzip();
        let spans = self.log.read_spans(&positions, &ends);
        for &(seq, loc) in locs {
            let (at, end) = (loc.at as usize, loc.at as usize + loc.len as usize);
            let found = positions
                .binary_search(&loc.body)
                .ok()
                .and_then(|i| spans.get(i))
                .and_then(|(kind, payload)| match kind {
                    record::CHUNK => {
                        let (head, route) = record::chunk_head(payload)?;
                        Some(Found::Entry {
                            body: payload.get(at..end)?,
                            route,
                            time: head.time,
                        })
                    }
                    _ => payload.get(at..end).map(Found::Record),
                });
            match found {
                Some(found) => f(seq, found)?,
                // One that cannot be read that way is read as before,
                // which also finds one that compaction moved.
                None => {
                    if let Some(d) = self.read_current(queue, seq, loc, &mut None)? {
                        f(seq, Found::Message(Arc::new(d.message), d.time))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Messages `from`, `from + 1`, ... of `queue` while they are held
    /// back and nothing of the queue from `from` on is in the log: a
    /// stream's newest messages, read by a member's reader at the tail
    /// (server/follow_reads) without writing what is held; nothing if
    /// nothing of the queue from `from` on is held or in the log. None
    /// where it cannot tell without writing what is held.
    fn held_from(
        &self,
        queue: u64,
        from: u64,
        n: usize,
        max_bytes: u64,
    ) -> Option<Vec<(u64, Arc<Message>, u64)>> {
        let st = self.state.lock();
        if !st.index.range(queue, from, 1).is_empty() {
            return None;
        }
        if !st.held.may_hold_from(queue, from) {
            return Some(Vec::new());
        }
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for seq in from.. {
            let Some(p) = st.held.get(queue, seq) else {
                break;
            };
            bytes += p.msg.body().len() as u64;
            if out.len() == n || (!out.is_empty() && bytes > max_bytes) {
                break;
            }
            out.push((seq, Arc::new(p.msg.clone()), p.time));
        }
        (!out.is_empty()).then_some(out)
    }
}
