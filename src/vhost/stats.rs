//! Exchange message counters (RabbitMQ's publish_in and publish_out) and
//! the `Tally` a channel counts them in. A publish adds to its channel's
//! tally (two plain additions); the tally folds into the exchange's
//! atomics when the channel publishes to another exchange, once per read
//! batch (the connection's loop calls `flush`), and when it is dropped:
//! no shared write per message. Also the node's queue churn counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::rates::Rates;

/// An exchange's counters and their rates.
#[derive(Debug, Default)]
pub struct ExchangeStats {
    /// Messages published to the exchange.
    publish_in: AtomicU64,
    /// Copies it routed to queues.
    publish_out: AtomicU64,
    rates: Mutex<Rates<2>>,
}

impl ExchangeStats {
    fn add(&self, published: u64, routed: u64) {
        self.publish_in.fetch_add(published, Ordering::Relaxed);
        self.publish_out.fetch_add(routed, Ordering::Relaxed);
    }

    /// [publish_in, publish_out].
    pub fn counters(&self) -> [u64; 2] {
        [
            self.publish_in.load(Ordering::Relaxed),
            self.publish_out.load(Ordering::Relaxed),
        ]
    }

    /// Their rates, per second, between the last two samples.
    pub fn rates(&self) -> [f64; 2] {
        *self.rates.lock().per_sec()
    }

    /// Takes a sample (the management sampler, every few seconds).
    pub fn sample(&self, now_ms: u64) {
        let now = self.counters();
        self.rates.lock().sample(now_ms, now);
    }
}

/// Queues declared, created and deleted, node-wide (one per node, shared
/// by its vhosts; rabbitmq_prometheus's queues_*_total and the overview's
/// churn rates).
#[derive(Debug, Default)]
pub struct QueueChurn {
    declared: AtomicU64,
    created: AtomicU64,
    deleted: AtomicU64,
}

impl QueueChurn {
    pub(super) fn declared(&self) {
        self.declared.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn created(&self) {
        self.created.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn deleted(&self, n: u64) {
        self.deleted.fetch_add(n, Ordering::Relaxed);
    }

    /// [declared, created, deleted].
    pub fn counters(&self) -> [u64; 3] {
        [&self.declared, &self.created, &self.deleted].map(|c| c.load(Ordering::Relaxed))
    }
}

/// What one channel published to the exchange it used last, not yet added
/// to the exchange's counters.
#[derive(Debug, Default)]
pub struct Tally {
    target: Option<Arc<ExchangeStats>>,
    published: u64,
    routed: u64,
}

impl Tally {
    /// One message published to the exchange counted by `stats`, routed to
    /// `routed` queues.
    pub fn count(&mut self, stats: &Arc<ExchangeStats>, routed: usize) {
        if !self.target.as_ref().is_some_and(|t| Arc::ptr_eq(t, stats)) {
            self.flush();
            self.target = Some(Arc::clone(stats));
        }
        self.published += 1;
        self.routed += routed as u64;
    }

    /// Adds what was counted to the exchange.
    pub fn flush(&mut self) {
        if self.published == 0 {
            return;
        }
        if let Some(t) = &self.target {
            t.add(self.published, self.routed);
        }
        self.published = 0;
        self.routed = 0;
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_reaches_the_exchange_on_flush_on_a_switch_and_on_drop() {
        let a = Arc::new(ExchangeStats::default());
        let b = Arc::new(ExchangeStats::default());
        let mut t = Tally::default();
        t.count(&a, 2);
        t.count(&a, 0);
        assert_eq!(a.counters(), [0, 0], "not before a flush");
        t.flush();
        assert_eq!(a.counters(), [2, 2]);
        t.count(&a, 1);
        t.count(&b, 3);
        assert_eq!(a.counters(), [3, 3], "switching exchanges flushes");
        drop(t);
        assert_eq!(b.counters(), [1, 3]);
    }
}
