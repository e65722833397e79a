//! What a queue's arguments limit on the way in: a message's TTL deadline
//! (x-message-ttl and the expiration property) and the length limits
//! (x-max-length, x-max-length-bytes; x-overflow drop-head drops from the
//! front, the reject modes refuse in `Queue::push`).

use super::args::QueueArgs;
use super::dead_letter::Reason;
use super::{now_ms, Queue, State};
use crate::message::Message;

impl Queue {
    /// When a message pushed now expires (0 = never): the smaller of the
    /// queue's message-ttl (in `live`) and the message's expiration.
    pub(super) fn deadline_for(&self, live: &QueueArgs, msg: &Message) -> u64 {
        deadline_after(live.message_ttl, msg.meta.expiration_ms())
    }

    /// The deadline of a message without an expiration of its own.
    pub(super) fn queue_ttl_deadline(&self, live: &QueueArgs) -> u64 {
        deadline_after(live.message_ttl, None)
    }

    /// Whether one more message would break a length limit once `more`
    /// messages are added first, `bytes` being theirs and its body's.
    pub(super) fn full_for(&self, st: &State, more: u64, bytes: usize) -> bool {
        st.live
            .max_length
            .is_some_and(|max| st.ready.len() as u64 + more >= max)
            || st
                .live
                .max_length_bytes
                .is_some_and(|max| (st.ready.bytes() + bytes) as u64 > max)
    }

    /// x-overflow drop-head: drops (dead-letters) the oldest ready messages
    /// until the limits hold.
    pub(super) fn drop_over_limit(&self, st: &mut State) {
        let (max_len, max_bytes) = (st.live.max_length, st.live.max_length_bytes);
        if max_len.is_none() && max_bytes.is_none() {
            return;
        }
        let pager = self.pager();
        while max_len.is_some_and(|max| st.ready.len() as u64 > max)
            || max_bytes.is_some_and(|max| st.ready.bytes() as u64 > max)
        {
            let Some(head) = st.ready.pop_front(Some(&pager)) else {
                break;
            };
            st.dead.push((head, Reason::MaxLen));
        }
    }
}

/// The deadline of a message entering a queue now under the queue's
/// message-ttl and its own expiration (ms; 0: none).
fn deadline_after(queue_ttl: Option<u64>, expiration: Option<u64>) -> u64 {
    let ttl = match (queue_ttl, expiration) {
        (None, None) => return 0,
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
    };
    // u64::MAX marks an expired slot in `Ready`.
    now_ms().saturating_add(ttl).clamp(1, u64::MAX - 1)
}
