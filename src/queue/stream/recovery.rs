//! A stream's start, and seeks by time into what it read back. The
//! message log's index already knows each message's offset and body size
//! (`Store::message_meta`), so a start reads no message for them: it
//! reads the two ends of each retention segment (the first's time is a
//! mark, the newest's is the segment's age) and the newest `TAIL_BYTES`
//! back into memory. A 10 GB stream of 1 KiB messages started in 12 s
//! when every message was read; now its start reads about 300 messages.
//!
//! What was read back has one mark per segment, not per second; a reader
//! that starts at a time before `exact_from` finds its offset by a binary
//! search of the stored times between the two marks around it (`seek`),
//! a few reads, outside the stream's lock.

use std::collections::VecDeque;

use super::{limits, seq_of, Queue, Start, Stream, TAIL_BYTES};
use crate::store;

impl Stream {
    /// Takes back what the log holds of the stream (a start).
    pub fn recover(&self, queue: &Queue) -> store::Result<u64> {
        let (store, id) = (&queue.store, queue.config.store_id);
        let Some(meta) = store.message_meta(id, 0) else {
            return self.recover_reading(queue);
        };
        let mut log = self.log.lock();
        log.limits = limits(&queue.args);
        let segment_bytes = log.limits.segment_bytes;
        let mut first = None;
        // The newest messages' offsets and sizes, about TAIL_BYTES of them.
        let mut newest: VecDeque<(u64, u64)> = VecDeque::new();
        let mut newest_bytes = 0;
        for m in meta {
            let (seq, len, _) = m?;
            let offset = seq.saturating_sub(1);
            first.get_or_insert(offset);
            let bytes = u64::from(len);
            log.next = offset + 1;
            log.bytes += bytes;
            log.segments.append(offset, bytes, 0, segment_bytes);
            newest.push_back((offset, bytes));
            newest_bytes += bytes;
            while newest_bytes > TAIL_BYTES as u64 && newest.len() > 1 {
                if let Some((_, b)) = newest.pop_front() {
                    newest_bytes -= b;
                }
            }
        }
        log.first = first.unwrap_or(log.next);
        let tail_from = newest.front().map_or(log.next, |&(o, _)| o);
        for (from, last) in log.segments.spans(log.next) {
            if let Some(m) = store.message_from(id, seq_of(from))? {
                log.mark(m.seq.saturating_sub(1), m.time);
            }
            if let Some(m) = store.message_from(id, seq_of(last))? {
                log.segments.stored_at(from, m.time);
            }
        }
        for item in store.messages_from(id, seq_of(tail_from)) {
            let m = item?;
            log.mark(m.seq.saturating_sub(1), m.time);
            log.keep_in_tail(m.message, m.time);
        }
        log.exact_from = log.next;
        *self.removed.lock() = log.first;
        Ok(log.next - log.first)
    }

    /// A start that reads every message back (a store that cannot tell
    /// the sizes without reading: the tests' sled stores).
    fn recover_reading(&self, queue: &Queue) -> store::Result<u64> {
        let mut log = self.log.lock();
        log.limits = limits(&queue.args);
        let segment_bytes = log.limits.segment_bytes;
        let mut first = None;
        for item in queue.store.messages(queue.config.store_id) {
            let m = item?;
            let offset = m.seq.saturating_sub(1);
            first.get_or_insert(offset);
            let bytes = m.message.body().len() as u64;
            log.next = offset + 1;
            log.bytes += bytes;
            log.mark(offset, m.time);
            log.segments.append(offset, bytes, m.time, segment_bytes);
            log.keep_in_tail(m.message, m.time);
        }
        log.first = first.unwrap_or(log.next);
        *self.removed.lock() = log.first;
        Ok(log.next - log.first)
    }

    /// `start` as an offset where the marks alone cannot place it (a
    /// time before `exact_from`); else as it is.
    pub(super) fn seek(&self, queue: &Queue, start: Start) -> store::Result<Start> {
        let Start::Time(ms) = start else {
            return Ok(start);
        };
        let ((lo, hi), exact_from) = {
            let log = self.log.lock();
            (log.time_bounds(ms), log.exact_from)
        };
        if lo >= exact_from {
            return Ok(start);
        }
        // The first offset in [lo, end) stored in `second` or later; the
        // answer stays within [a, b].
        let second = ms / 1000;
        let end = hi.min(exact_from).max(lo);
        let (mut a, mut b) = (lo, end);
        while a < b {
            let mid = a + (b - a) / 2;
            match queue
                .store
                .message_from(queue.config.store_id, seq_of(mid))?
            {
                Some(m) if m.time / 1000 < second => a = m.seq.saturating_sub(1).max(mid) + 1,
                _ => b = mid,
            }
        }
        let found = a.min(b);
        Ok(Start::Offset(if found < end { found } else { hi }))
    }
}
