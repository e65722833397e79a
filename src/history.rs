//! The last ten minutes of a few values (depths and running totals), as
//! the management API's `samples` show them for charts: `lengths_age` and
//! `msg_rates_age` ask for them. The sampler records every few seconds.
//! `Sparse` keeps a ring only while the values change, so an object that
//! has been still for the whole window holds just its last sample.

use std::collections::VecDeque;

/// How far back a history reaches.
pub const KEEP_MS: u64 = 600_000;

/// One sample: when (ms since the epoch) and the values.
pub type Sample<const N: usize> = (u64, [u64; N]);

/// The samples of the last `KEEP_MS`, oldest first.
#[derive(Debug, Clone, Default)]
pub struct History<const N: usize> {
    samples: VecDeque<Sample<N>>,
}

impl<const N: usize> History<N> {
    /// Records `values` at `at`; drops what is older than the window.
    pub fn push(&mut self, at: u64, values: [u64; N]) {
        if self.samples.back().is_some_and(|(t, _)| *t >= at) {
            return;
        }
        self.samples.push_back((at, values));
        while self.samples.front().is_some_and(|(t, _)| *t + KEEP_MS < at) {
            self.samples.pop_front();
        }
    }

    /// Value `i`'s change per second between the last two samples.
    pub fn rate(&self, i: usize) -> f64 {
        let n = self.samples.len();
        if n < 2 || i >= N {
            return 0.0;
        }
        let (a, b) = (self.samples[n - 2], self.samples[n - 1]);
        let secs = b.0.saturating_sub(a.0) as f64 / 1000.0;
        if secs <= 0.0 {
            return 0.0;
        }
        (b.1[i] as f64 - a.1[i] as f64) / secs
    }

    /// Whether the whole window holds one value.
    fn still(&self) -> bool {
        let full = match (self.samples.front(), self.samples.back()) {
            (Some(a), Some(b)) => b.0 - a.0 >= KEEP_MS,
            _ => false,
        };
        full && self.samples.iter().all(|s| s.1 == self.samples[0].1)
    }

    /// The samples of the last `age_ms` before `now`, one per `incr_ms`
    /// (at least every sample), newest first.
    pub fn select(&self, now: u64, age_ms: u64, incr_ms: u64) -> Vec<Sample<N>> {
        let from = now.saturating_sub(age_ms.min(KEEP_MS));
        let mut out: Vec<Sample<N>> = Vec::new();
        for s in self.samples.iter().rev().take_while(|s| s.0 >= from) {
            if out
                .last()
                .is_none_or(|l| l.0 >= s.0.saturating_add(incr_ms))
            {
                out.push(*s);
            }
        }
        out
    }
}

/// A history kept only while its values change.
#[derive(Debug, Clone)]
pub struct Sparse<const N: usize> {
    last: Sample<N>,
    ring: Option<Box<History<N>>>,
}

impl<const N: usize> Default for Sparse<N> {
    fn default() -> Self {
        Sparse {
            last: (0, [0; N]),
            ring: None,
        }
    }
}

impl<const N: usize> Sparse<N> {
    /// Records `values` at `at`.
    pub fn record(&mut self, at: u64, values: [u64; N]) {
        match &mut self.ring {
            Some(ring) => {
                ring.push(at, values);
                if ring.still() {
                    self.ring = None;
                }
            }
            None if self.last.0 != 0 && values != self.last.1 => {
                let mut ring = History::default();
                ring.push(self.last.0, self.last.1);
                ring.push(at, values);
                self.ring = Some(Box::new(ring));
            }
            None => {}
        }
        self.last = (at, values);
    }

    /// As `History::select`; a still object's two ends of the window at
    /// its last values (a flat line).
    pub fn select(&self, now: u64, age_ms: u64, incr_ms: u64) -> Vec<Sample<N>> {
        match &self.ring {
            Some(ring) => ring.select(now, age_ms, incr_ms),
            None if self.last.0 != 0 => {
                let from = now.saturating_sub(age_ms.min(KEEP_MS));
                vec![(now, self.last.1), (from, self.last.1)]
            }
            None => Vec::new(),
        }
    }

    /// Value `i`'s change per second between the last two samples (0 for
    /// a still object): a depth's rate, negative while it shrinks.
    pub fn rate(&self, i: usize) -> f64 {
        self.ring.as_ref().map_or(0.0, |r| r.rate(i))
    }

    /// Whether it keeps a ring now.
    pub fn is_kept(&self) -> bool {
        self.ring.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_keeps_the_window_and_selects_newest_first() {
        let mut h = History::<1>::default();
        for i in 0..200u64 {
            h.push(1_000 + i * 5_000, [i]);
        }
        let now = 1_000 + 199 * 5_000;
        let all = h.select(now, KEEP_MS, 5_000);
        assert_eq!(all.len(), 121);
        assert_eq!(all[0], (now, [199]));
        let sparse = h.select(now, 60_000, 10_000);
        assert_eq!(sparse.len(), 7);
        assert_eq!(sparse[1].1, [197]);
    }

    #[test]
    fn a_still_object_drops_its_ring_and_a_changing_one_makes_one() {
        let mut s = Sparse::<1>::default();
        s.record(5_000, [3]);
        s.record(10_000, [3]);
        assert!(!s.is_kept());
        assert_eq!(
            s.select(10_000, 60_000, 5_000),
            vec![(10_000, [3]), (0, [3])]
        );
        assert_eq!(s.rate(0), 0.0);
        s.record(15_000, [4]);
        assert!(s.is_kept());
        assert_eq!(s.rate(0), 0.2);
        assert_eq!(s.select(15_000, 60_000, 5_000).len(), 2);
        let mut t = 15_000;
        while s.is_kept() {
            t += 5_000;
            s.record(t, [4]);
            assert!(t < 15_000 + 2 * KEEP_MS);
        }
        assert_eq!(s.select(t, 60_000, 5_000)[0], (t, [4]));
    }
}
