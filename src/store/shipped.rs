//! Message puts a cluster's leader shipped and has not applied yet (a
//! message paged out of its queue's memory before its entry committed,
//! and the copies of a move), readable until they are applied, purged or
//! the term ends. Kept in memory, not in sled: each is there only for
//! its commit's round trip, and what waits for commit is bounded
//! (raft/backlog.rs), while a sled write and removal per message was
//! about a fifth of a 3-node cluster's CPU under publish-only load into
//! a growing backlog. The message is shared, not copied.
//!
//! Paged transient messages, which a leader never ships, stay in sled's
//! `pending` tree (apply.rs): nothing applies them, they live until
//! acked.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::message::Message;

/// Shipped puts by (queue id, seq).
#[derive(Default)]
pub struct Shipped {
    map: Mutex<BTreeMap<(u64, u64), Message>>,
}

impl Shipped {
    /// Keeps message `seq` of `queue` readable until it is applied.
    pub fn put(&self, queue: u64, seq: u64, message: &Message) {
        self.map.lock().insert((queue, seq), message.clone());
    }

    /// Forgets message `seq` of `queue` (applied).
    pub fn remove(&self, queue: u64, seq: u64) {
        self.map.lock().remove(&(queue, seq));
    }

    /// Forgets `queue`'s messages from `from` on.
    pub fn purge_from(&self, queue: u64, from: u64) {
        let mut map = self.map.lock();
        let gone: Vec<(u64, u64)> = map
            .range((queue, from)..=(queue, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            map.remove(&k);
        }
    }

    /// Forgets everything (a term ends).
    pub fn clear(&self) {
        self.map.lock().clear();
    }

    /// Message `seq` of `queue`, if it waits.
    pub fn get(&self, queue: u64, seq: u64) -> Option<Message> {
        self.map.lock().get(&(queue, seq)).cloned()
    }

    /// Up to `n` of `queue`'s waiting messages from `from` on, in order.
    pub fn range(&self, queue: u64, from: u64, n: usize) -> Vec<(u64, Arc<Message>)> {
        self.map
            .lock()
            .range((queue, from)..=(queue, u64::MAX))
            .take(n)
            .map(|(&(_, seq), m)| (seq, Arc::new(m.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Meta;

    #[test]
    fn puts_read_back_until_removed_or_purged() {
        let s = Shipped::default();
        let m = Message::new(b"", b"q", &[0, 0], b"body", Meta::default());
        for seq in 1..=5 {
            s.put(7, seq, &m);
        }
        s.put(8, 1, &m);
        assert_eq!(s.get(7, 3).unwrap().body(), b"body");
        s.remove(7, 3);
        assert!(s.get(7, 3).is_none());
        let seqs = |v: Vec<(u64, Arc<Message>)>| v.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(seqs(s.range(7, 2, 10)), vec![2, 4, 5]);
        assert_eq!(seqs(s.range(7, 0, 2)), vec![1, 2]);
        s.purge_from(7, 4);
        assert_eq!(seqs(s.range(7, 0, 10)), vec![1, 2]);
        assert_eq!(seqs(s.range(8, 0, 10)), vec![1], "another queue's stay");
        s.clear();
        assert!(s.range(8, 0, 10).is_empty());
    }
}
