//! The leadership lease a replicated journal serves under: a leader hands
//! out what the cluster replicates (deliveries, `basic.get`) only while it
//! has shown a live majority recently enough that no other member can have
//! been elected (cluster/mod.rs renews it from its watchdog's probes). A
//! check on the way out, not only a periodic one: a leader paused and
//! resumed (SIGSTOP, a long GC-like stall) may run its queues, or write
//! deliveries buffered before the pause, before its watchdog runs, and
//! must not deliver what a newer leader already delivered (queues check
//! it at dispatch, connections' writers before each write).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Valid until a monotonic instant; none at first.
pub struct Lease {
    epoch: Instant,
    /// Microseconds from `epoch` until which the lease holds (0: none).
    until_us: AtomicU64,
}

impl Default for Lease {
    fn default() -> Lease {
        Lease {
            epoch: Instant::now(),
            until_us: AtomicU64::new(0),
        }
    }
}

impl Lease {
    /// Holds the lease until `until` (never shortens it; `end` does).
    pub fn hold_until(&self, until: Instant) {
        let us = until.saturating_duration_since(self.epoch).as_micros() as u64;
        self.until_us.fetch_max(us, Ordering::AcqRel);
    }

    /// Ends it (this node stopped leading).
    pub fn end(&self) {
        self.until_us.store(0, Ordering::Release);
    }

    /// Whether it holds now.
    pub fn holds(&self) -> bool {
        let now = self.epoch.elapsed().as_micros() as u64;
        now < self.until_us.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn holds_until_its_instant_or_its_end() {
        let l = Lease::default();
        assert!(!l.holds());
        l.hold_until(Instant::now() + Duration::from_secs(60));
        assert!(l.holds());
        // An older confirmation does not shorten it.
        l.hold_until(Instant::now());
        assert!(l.holds());
        l.end();
        assert!(!l.holds());
        l.hold_until(Instant::now() - Duration::from_millis(1));
        assert!(!l.holds());
    }
}
