//! Rates of plain counters, as the management API shows them
//! (`*_details.rate`): the change per second between the last two samples.
//! The owner of the counters keeps one `Rates` beside them and a sampler
//! calls `sample` every few seconds; it is fixed-size, so an idle object
//! costs the same as a busy one.

/// The last sample of `N` counters and the rates since the one before.
#[derive(Debug, Clone, Copy)]
pub struct Rates<const N: usize> {
    last: [u64; N],
    last_ms: u64,
    per_sec: [f64; N],
}

impl<const N: usize> Default for Rates<N> {
    fn default() -> Self {
        Rates {
            last: [0; N],
            last_ms: 0,
            per_sec: [0.0; N],
        }
    }
}

impl<const N: usize> Rates<N> {
    /// Takes a sample of `now` at `now_ms`. A counter that went back (its
    /// owner was replaced) shows 0 until the next sample.
    pub fn sample(&mut self, now_ms: u64, now: [u64; N]) {
        if self.last_ms != 0 && now_ms > self.last_ms {
            let secs = (now_ms - self.last_ms) as f64 / 1000.0;
            for (rate, (n, last)) in self.per_sec.iter_mut().zip(now.iter().zip(self.last)) {
                *rate = n.saturating_sub(last) as f64 / secs;
            }
        }
        self.last = now;
        self.last_ms = now_ms;
    }

    /// Per second, in the counters' order.
    pub fn per_sec(&self) -> &[f64; N] {
        &self.per_sec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_the_change_per_second_between_the_last_two_samples() {
        let mut r = Rates::<2>::default();
        r.sample(1_000, [0, 100]);
        assert_eq!(r.per_sec(), &[0.0, 0.0]);
        r.sample(6_000, [50, 100]);
        assert_eq!(r.per_sec(), &[10.0, 0.0]);
        r.sample(11_000, [40, 200]);
        assert_eq!(r.per_sec(), &[0.0, 20.0]);
    }
}
