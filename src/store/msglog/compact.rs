//! Compaction: the oldest segment's live messages copied to the log's
//! end, so that the segment, and the dead ones after it, can go.
//!
//! Only the oldest segments are ever removed (mod.rs), so one message
//! that stays (a slow consumer's) would otherwise keep every segment
//! written after it. Once the log holds more than twice the live bytes
//! plus two segments, each commit copies a bounded step of the oldest
//! segment (`STEP` bytes of its records read): every message whose
//! record is there and still live is written again as a PUT at the end,
//! and the index points at the copy. When the whole segment is done,
//! nothing in it is live, and the commits after remove it with the dead
//! segments behind it. The copies are synced before the segment goes (the
//! removal is decided before a sync, mod.rs).
//!
//! At most twice the live bytes (and two segments) are kept, and each
//! byte copied frees at least one: the classic cleaning bound of a log.
//! A fan-out's shared body is copied once per queue still holding it.

use super::record::{self, Rec, PUT_MESSAGE_AT};
use std::collections::HashMap;

use bytes::{Bytes, BytesMut};

use super::summary::Entry;
use super::{Error, MessageLog, Result, State};
use crate::store::messages::decode_record;

/// Bytes of records read from the oldest segment per commit.
const STEP: usize = 1 << 20;

impl MessageLog {
    /// Whether the log holds enough dead bytes to compact.
    pub(super) fn compaction_due(&self) -> bool {
        if self.state.lock().compact_failed {
            return false;
        }
        let first = self.log.segments().first().copied().unwrap_or(0);
        if first >= self.log.active() {
            return false;
        }
        let live = self.state.lock().index.live_bytes();
        self.log.size() > live * 2 + self.segment_bytes * 2
    }

    /// One step of compaction of the oldest segment, if it is due (or
    /// under way). A record it cannot read (damaged) stops compaction
    /// until the next open rather than failing every commit; the error is
    /// logged. The open reads only the last segment and those without a
    /// summary, so damage in an older one stops compaction again.
    pub(super) fn compact_step(&self) -> Result<()> {
        if self.state.lock().compact_failed {
            return Ok(());
        }
        if let Err(e) = self.try_compact_step() {
            tracing::error!("message log compaction stopped until the next start: {e}");
            let mut st = self.state.lock();
            st.compact_failed = true;
            st.compact = None;
        }
        Ok(())
    }

    fn try_compact_step(&self) -> Result<()> {
        let segments = self.log.segments();
        let (Some(&front), Some(&end)) = (segments.first(), segments.get(1)) else {
            return Ok(());
        };
        let cursor = self.state.lock().compact.filter(|&c| c >= front && c < end);
        let from = match cursor {
            Some(c) => c,
            None if self.compaction_due() => front,
            None => return Ok(()),
        };
        // Read outside the lock: this step's records, and the bodies its
        // REFs name that an earlier step read.
        let mut batch: Vec<(u64, u8, Bytes)> = Vec::new();
        let mut read = 0;
        let mut next = from;
        self.log.scan(from, |pos, r| {
            if pos >= end {
                return false;
            }
            read += r.payload.len() + 9;
            next = pos + r.payload.len() as u64 + 9;
            batch.push((pos, r.kind, Bytes::from(r.payload)));
            read < STEP
        })?;
        let mut bodies: HashMap<u64, Bytes> =
            batch.iter().map(|(p, _, b)| (*p, b.clone())).collect();
        for (_, kind, payload) in &batch {
            if let Some(Rec::Ref { body, .. }) = record::parse(*kind, payload) {
                if let std::collections::hash_map::Entry::Vacant(v) = bodies.entry(body) {
                    v.insert(Bytes::from(self.log.read(body)?.payload));
                }
            }
        }
        let mut st = self.state.lock();
        let mut buf = BytesMut::new();
        for (pos, kind, payload) in &batch {
            let Some(rec) = record::parse(*kind, payload) else {
                continue;
            };
            match rec {
                Rec::Put { queue, seq } => {
                    if st.index.get(queue, seq).is_some_and(|l| l.rec == *pos) {
                        self.relocate(&mut st, queue, seq, payload)?;
                    }
                }
                Rec::Ref {
                    queue,
                    seq,
                    deadline,
                    paged,
                    body,
                    len,
                } => {
                    if st.index.get(queue, seq).is_none_or(|l| l.rec != *pos) {
                        continue;
                    }
                    let at = PUT_MESSAGE_AT as usize;
                    let message = bodies
                        .get(&body)
                        .and_then(|b| b.get(at..at + len as usize).map(|m| b.slice_ref(m)))
                        .ok_or_else(|| {
                            Error::Corrupt(format!("the reference at {pos} names no message"))
                        })?;
                    let d = decode_record(message)?;
                    record::put(queue, seq, &d.message, paged, deadline, d.time, &mut buf);
                    self.relocate(&mut st, queue, seq, &buf)?;
                }
                Rec::Move { to, moves, .. } => {
                    for m in moves {
                        if st.index.get(to, m.to_seq).is_none_or(|l| l.rec != *pos) {
                            continue;
                        }
                        let (at, len) = (m.at as usize, m.len as usize);
                        // A CHUNK's entry is its message's bytes only.
                        let chunked = match *kind {
                            record::CHUNK => {
                                Some(record::chunk_message(payload, at, len).ok_or_else(|| {
                                    Error::Corrupt(format!("the chunk at {pos} does not parse"))
                                })?)
                            }
                            _ => None,
                        };
                        let message = chunked.as_deref().unwrap_or(&payload[at..at + len]);
                        record::put_encoded(to, m.to_seq, message, &mut buf);
                        self.relocate(&mut st, to, m.to_seq, &buf)?;
                    }
                }
                // Kills of what lies in this segment or before it: they go
                // with it.
                Rec::Ack { .. } | Rec::Purge { .. } => {}
            }
        }
        st.compact = (next < end).then_some(next);
        Ok(())
    }

    /// Writes message `seq` of `queue` again at the end, as the PUT
    /// `payload`, and points the index at it.
    fn relocate(&self, st: &mut State, queue: u64, seq: u64, payload: &[u8]) -> Result<()> {
        let e = Entry::of(record::PUT, payload)
            .ok_or_else(|| Error::Corrupt(format!("message {seq} of queue {queue}: no record")))?;
        let pos = self.append(st, record::PUT, payload, &e)?;
        // A paged transient message moves too: it is read back until the
        // next open drops it.
        super::open::insert_entry(&mut st.index, pos, &e)
    }
}
