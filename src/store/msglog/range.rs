//! Range reads: a queue's or a stream's messages from a sequence number
//! on, in order, the records holding them read together
//! (`SegmentLog::read_spans`). `visit_range_within` hands each message
//! out as its record's bytes where the read left them, so a stream's
//! reader copies a body once, into the frame it sends, and decodes
//! nothing it does not need to.

use std::sync::Arc;

use bytes::Bytes;

use super::{MessageLog, RECORD_HEADER};
use crate::message::Message;
use crate::store::messages::decode_record;
use crate::store::Result;

/// One message of a range read.
pub enum Found<'a> {
    /// Its message record (store/messages.rs), where the read left it.
    Record(&'a [u8]),
    /// The message, read another way (held back, or moved while read),
    /// and when it was stored (ms since the epoch; 0: not recorded).
    Message(Arc<Message>, u64),
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
            Found::Message(m, time) => (m, time),
        })
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
        self.visit_range_within(queue, from, n, max_bytes, |seq, found| {
            out.push((seq, found.into_message()?.0));
            Ok(())
        })?;
        Ok(out)
    }

    /// Calls `f` with each of the messages `range_within` reads, in
    /// order; stops at the first error `f` returns.
    pub fn visit_range_within(
        &self,
        queue: u64,
        from: u64,
        n: usize,
        max_bytes: u64,
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
        // The records holding them, read together (neighbours in a
        // segment share a read). A message's bytes are in the record its
        // `body` names (a REF's deadline, in the record `rec` names, is
        // nothing to a range read).
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
        for (seq, loc) in locs {
            let (at, end) = (loc.at as usize, loc.at as usize + loc.len as usize);
            let record = positions
                .binary_search(&loc.body)
                .ok()
                .and_then(|i| spans.get(i))
                .and_then(|(_, payload)| payload.get(at..end));
            match record {
                Some(r) => f(seq, Found::Record(r))?,
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
