//! `Unwritten`: a durable queue's persistent messages that are not in the
//! store yet. They are written by the flusher just before the next group
//! commit (store/deferred.rs), unless they are acked or otherwise leave
//! the queue first; then they are never written at all.
//!
//! The list has its own lock, taken after the queue's state lock when both
//! are held; the flusher takes only this one, and writes while holding it,
//! so a message is either still here (and its removal is free) or already
//! in the store (and removed there): never removed before it was written.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::message::Message;
use crate::store::{self, Store};

#[derive(Default)]
struct List {
    /// (sequence, expiry deadline, message) in sequence order; None: gone
    /// before written.
    msgs: VecDeque<(u64, u64, Option<Arc<Message>>)>,
    /// Registered with the store for the next flush.
    registered: bool,
    /// The queue was deleted: nothing more is written.
    closed: bool,
}

/// Messages waiting for the next flush.
#[derive(Default)]
pub struct Unwritten {
    list: Mutex<List>,
}

impl Unwritten {
    /// Adds message `seq` (sequences only grow). Returns true if the holder
    /// must now register with the store for the next flush.
    pub fn add(&self, seq: u64, deadline: u64, msg: &Arc<Message>) -> bool {
        let mut l = self.list.lock();
        l.msgs.push_back((seq, deadline, Some(Arc::clone(msg))));
        !std::mem::replace(&mut l.registered, true)
    }

    /// Whether message `seq` waits here to be written.
    pub fn pending(&self, seq: u64) -> bool {
        let l = self.list.lock();
        l.msgs
            .binary_search_by_key(&seq, |(s, _, _)| *s)
            .is_ok_and(|at| l.msgs[at].2.is_some())
    }

    /// Forgets message `seq` if it was not written yet; false if it was
    /// (then it is the store's to remove).
    pub fn cancel(&self, seq: u64) -> bool {
        let mut l = self.list.lock();
        match l.msgs.binary_search_by_key(&seq, |(s, _, _)| *s) {
            Ok(at) => {
                l.msgs[at].2 = None;
                true
            }
            Err(_) => false,
        }
    }

    /// Drops everything and writes nothing more (the queue was deleted).
    pub fn close(&self) {
        let mut l = self.list.lock();
        l.msgs.clear();
        l.closed = true;
    }

    /// Writes the waiting messages to the store under `queue_id`. On an
    /// error the unwritten rest stays (and the holder stays registered).
    pub fn write(&self, store: &Store, queue_id: u64) -> store::Result<()> {
        let mut l = self.list.lock();
        while let Some((seq, deadline, msg)) = l.msgs.front() {
            if !l.closed {
                if let Some(msg) = msg {
                    store.put_message(queue_id, *seq, msg, *deadline)?;
                }
            }
            l.msgs.pop_front();
        }
        l.registered = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Meta;

    fn msg() -> Arc<Message> {
        Arc::new(Message::new(
            b"",
            b"q",
            &[0x10, 0, 2],
            b"x",
            Meta::default(),
        ))
    }

    #[test]
    fn writes_only_what_was_not_cancelled() {
        let store = Store::temporary().unwrap();
        let u = Unwritten::default();
        assert!(u.add(1, 0, &msg()), "first add registers");
        assert!(!u.add(2, 0, &msg()), "later adds do not");
        assert!(!u.add(3, 0, &msg()));
        assert!(u.cancel(2));
        u.write(&store, 9).unwrap();
        let seqs: Vec<u64> = store.messages(9).map(|m| m.unwrap().seq).collect();
        assert_eq!(seqs, vec![1, 3]);
        assert!(!u.cancel(1), "written: the store removes it");
        assert!(u.add(4, 0, &msg()), "registers again after a write");
    }

    #[test]
    fn a_closed_list_writes_nothing() {
        let store = Store::temporary().unwrap();
        let u = Unwritten::default();
        u.add(1, 0, &msg());
        u.close();
        u.write(&store, 9).unwrap();
        assert_eq!(store.messages(9).count(), 0);
    }
}
