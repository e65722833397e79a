//! The sizes of published message bodies, bucketed as RabbitMQ 4's
//! `rabbitmq_message_size_bytes` histogram buckets them (its Grafana
//! dashboard reads the buckets by these `le` labels). Each channel keeps
//! its own counts, written by its connection task only, and the metrics
//! sum them: a publish touches no shared counter.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the buckets before +Inf, bytes.
const BOUNDS: [u64; 8] = [
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    50_000_000,
    100_000_000,
];

/// How many buckets there are, +Inf included.
pub const BUCKETS: usize = BOUNDS.len() + 1;

/// Each bucket's `le` label, as Prometheus writes these floats.
pub const LE: [&str; BUCKETS] = [
    "100.0", "1000.0", "10000.0", "100000.0", "1e+06", "1e+07", "5e+07", "1e+08", "+Inf",
];

/// Counts per bucket (not cumulative) and the sum of the sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    pub counts: [u64; BUCKETS],
    pub sum: u64,
}

impl Sizes {
    /// Adds `o` in.
    pub fn add(&mut self, o: &Sizes) {
        for (a, b) in self.counts.iter_mut().zip(o.counts) {
            *a += b;
        }
        self.sum += o.sum;
    }

    /// The cumulative counts Prometheus wants: each bucket counts every
    /// size up to its bound; the last is the total.
    pub fn cumulative(&self) -> [u64; BUCKETS] {
        let mut total = 0;
        self.counts.map(|n| {
            total += n;
            total
        })
    }
}

/// One channel's counts, written by its connection task only.
#[derive(Debug, Default)]
pub struct SizeCounters {
    counts: [AtomicU64; BUCKETS],
    sum: AtomicU64,
}

/// Adds to a counter only one task writes (a load and a store).
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl SizeCounters {
    /// Counts a message body of `size` bytes.
    pub fn observe(&self, size: u64) {
        let at = BOUNDS.iter().take_while(|&&b| size > b).count();
        bump(&self.counts[at], 1);
        bump(&self.sum, size);
    }

    /// The counts now.
    pub fn load(&self) -> Sizes {
        Sizes {
            counts: std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed)),
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_fall_in_rabbitmqs_buckets_bounds_included() {
        let c = SizeCounters::default();
        for size in [0, 100, 101, 1_000_000, 1_000_001, 100_000_000, 100_000_001] {
            c.observe(size);
        }
        let s = c.load();
        assert_eq!(s.counts, [2, 1, 0, 0, 1, 1, 0, 1, 1]);
        assert_eq!(s.cumulative(), [2, 3, 3, 3, 4, 5, 5, 6, 7]);
        assert_eq!(s.sum, 202_000_203);
    }
}
