//! Non-durable queues' place in the store. Such a queue keeps its
//! messages in memory up to the same bound as a durable queue's, and pages
//! the rest out as transient messages (queue/ready.rs): each page goes to
//! the message log under an id given here, never to sled's definitions.
//!
//! Local ids are given per process from `LOCAL_QUEUE_IDS` up, above every
//! durable queue's id. What is stored under one never leaves this node (a
//! cluster stages it on its leader only, raft/journal.rs `submit_paged`)
//! and nothing of it is synced for its own sake: a paged transient record
//! is dropped at the next open of the log, as RabbitMQ drops transient
//! messages at a restart. Removing one touches this node's copy only,
//! never the journal.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Result, Store};

/// The first local queue id.
pub const LOCAL_QUEUE_IDS: u64 = 1 << 63;

/// A new id for a non-durable queue's paged messages, unique in this
/// process.
pub fn local_queue_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(LOCAL_QUEUE_IDS);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Whether `queue_id` is a non-durable queue's (`local_queue_id`).
pub fn is_local(queue_id: u64) -> bool {
    queue_id >= LOCAL_QUEUE_IDS
}

impl Store {
    /// Forgets paged message `seq` of local queue `queue_id`.
    pub(super) fn remove_local(&self, queue_id: u64, seq: u64) -> Result<()> {
        // In the log on a single node; staged only on a cluster's leader.
        if let Some(log) = &self.applier.log {
            log.remove(queue_id, seq)?;
        }
        self.applier.unstage(queue_id, seq)
    }

    /// Forgets the paged messages of local queue `queue_id` from `from` on
    /// (a purge, or the queue was deleted).
    pub(super) fn purge_local(&self, queue_id: u64, from: u64) -> Result<()> {
        if let Some(log) = &self.applier.log {
            log.purge_from(queue_id, from)?;
        }
        self.applier.unstage_from(queue_id, from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, Meta};

    fn msg(body: &[u8]) -> Message {
        // Persistent: a non-durable queue pages it as transient all the same.
        let meta = Meta::default().with_delivery_mode(2);
        Message::new(b"", b"q", &[0x10, 0, 2], body, meta)
    }

    fn log_bytes(store: &Store) -> u64 {
        store.applier.log.as_ref().map_or(0, |l| l.live_bytes())
    }

    /// A non-durable queue's paged messages are read back, acked and
    /// purged on this node, and none, persistent or not, outlives a
    /// restart (nothing would ever ack it there).
    #[test]
    fn a_local_queues_pages_are_acked_purged_and_dropped_at_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (local_queue_id(), local_queue_id());
        assert!(is_local(a) && b > a && !is_local(LOCAL_QUEUE_IDS - 1));
        {
            let store = Store::open(dir.path(), 1 << 20).unwrap();
            for seq in 1..=3 {
                store.put_paged(a, seq, &msg(b"one"), 0).unwrap();
                store.put_paged(b, seq, &msg(b"two"), 0).unwrap();
            }
            let read = store.load_range(a, 1, 10).unwrap();
            let seqs: Vec<u64> = read.iter().map(|(s, _)| *s).collect();
            assert_eq!(seqs, [1, 2, 3]);
            assert_eq!(read[0].1.body(), b"one");
            store.remove_message(a, 1).unwrap();
            store.purge_from(b, 2).unwrap();
            let left = |q| -> Vec<u64> {
                let read = store.load_range(q, 0, 10).unwrap();
                read.into_iter().map(|(s, _)| s).collect()
            };
            assert_eq!((left(a), left(b)), (vec![2, 3], vec![1]));
            store.purge_from(a, 0).unwrap();
            assert!(left(a).is_empty());
            assert!(log_bytes(&store) > 0, "queue b's first is still there");
            store.flush_now().unwrap();
        }
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        assert!(store.load_range(b, 0, 10).unwrap().is_empty());
        assert_eq!(log_bytes(&store), 0, "nothing left in the log's index");
    }
}
