//! Delivery after commit, for a queue whose store applies operations only
//! once they are committed (a cluster's leader): a message the cluster
//! replicates (every message a durable queue keeps) is handed out,
//! delivered or returned by `basic.get`, only once the commit that covers
//! its write is reached, as RabbitMQ's quorum queues deliver only
//! committed messages. A consumer then never sees a message the cluster
//! may not hold, and never acks one whose publisher got no confirm.
//!
//! The window of uncommitted messages is short (one commit, a few
//! milliseconds), so it is kept beside the ready list rather than in each
//! entry: (sequence, commit number) pairs in sequence order, dropped as
//! commits pass them. A single node (which applies at once) keeps none.

use std::collections::VecDeque;

/// A queue's kept messages whose commit has not been reached yet.
#[derive(Default)]
pub struct Uncommitted {
    /// (sequence, the commit number that covers its write), in sequence
    /// order: sequence numbers and commit numbers both only grow.
    window: VecDeque<(u64, u64)>,
}

impl Uncommitted {
    /// Message `seq` is covered by commit `ticket`.
    pub fn add(&mut self, seq: u64, ticket: u64) {
        self.window.push_back((seq, ticket));
    }

    /// The commit message `seq` waits for, if `committed` has not reached
    /// it; forgets every message `committed` covers.
    pub fn waits_for(&mut self, seq: u64, committed: u64) -> Option<u64> {
        while self.window.front().is_some_and(|&(_, t)| t <= committed) {
            self.window.pop_front();
        }
        let at = self.window.binary_search_by_key(&seq, |&(s, _)| s).ok()?;
        Some(self.window[at].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_waits_until_its_commit_is_reached() {
        let mut u = Uncommitted::default();
        u.add(1, 5);
        u.add(2, 5);
        u.add(4, 6);
        assert_eq!(u.waits_for(1, 4), Some(5));
        // Sequence 3 was not kept (a transient message): it never waits.
        assert_eq!(u.waits_for(3, 4), None);
        assert_eq!(u.waits_for(2, 5), None);
        assert_eq!(u.waits_for(4, 5), Some(6));
        assert_eq!(u.waits_for(4, 6), None);
        assert!(u.window.is_empty());
    }
}
