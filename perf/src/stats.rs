//! Counters shared by the tasks, the latency histogram and the process's CPU time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Counters and events shared by every producer, consumer and callback of a run.
///
/// Everything runs on one thread, so the atomics are uncontended and cheap; they are atomics only
/// because amqprs wants `Send` callbacks and tasks.
pub struct Shared {
    pub published: AtomicU64,
    pub confirmed: AtomicU64,
    pub nacked: AtomicU64,
    pub consumed: AtomicU64,
    /// Set when the run should end (time is up, or a target count was reached).
    pub stop: AtomicBool,
    /// Total to consume across all consumers before stopping (0 = no target).
    pub consume_target: AtomicU64,
    /// Record the time every this many published messages (0 = never).
    pub progress_every: u64,
    /// (published count, seconds since start) at each progress mark.
    pub progress: Mutex<Vec<(u64, f64)>>,
    /// Errors reported asynchronously by the broker (channel or connection closed).
    pub errors: Mutex<Vec<String>>,
    /// Number of connection.blocked notifications received.
    pub blocked: AtomicU64,
    /// Latency (or, for delayed messages, lateness) of what was consumed since the last
    /// progress line.
    pub window: Mutex<Histogram>,
    start: Mutex<Option<Instant>>,
}

impl Shared {
    pub fn new(progress_every: u64) -> Self {
        Shared {
            published: AtomicU64::new(0),
            confirmed: AtomicU64::new(0),
            nacked: AtomicU64::new(0),
            consumed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            consume_target: AtomicU64::new(0),
            progress_every,
            progress: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
            blocked: AtomicU64::new(0),
            window: Mutex::new(Histogram::default()),
            start: Mutex::new(None),
        }
    }

    pub fn set_start(&self, at: Instant) {
        if let Ok(mut s) = self.start.lock() {
            *s = Some(at);
        }
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn error(&self, msg: String) {
        eprintln!("warren-perf: {msg}");
        if let Ok(mut e) = self.errors.lock() {
            e.push(msg);
        }
    }

    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Counts one published message and records a progress mark when one is due.
    pub fn count_published(&self) {
        let n = self.published.fetch_add(1, Ordering::Relaxed) + 1;
        if self.progress_every > 0 && n.is_multiple_of(self.progress_every) {
            let start = self.start.lock().ok().and_then(|s| *s);
            if let Some(start) = start {
                let secs = start.elapsed().as_secs_f64();
                let prev = self
                    .progress
                    .lock()
                    .ok()
                    .and_then(|p| p.last().copied())
                    .unwrap_or((0, 0.0));
                let rate = (n - prev.0) as f64 / (secs - prev.1).max(1e-9);
                eprintln!(
                    "warren-perf: published {n} at {secs:.1} s ({rate:.0} msg/s since last mark)"
                );
                if let Ok(mut p) = self.progress.lock() {
                    p.push((n, secs));
                }
            }
        }
    }

    /// Counts one consumed message; returns true when the consume target has been reached.
    pub fn count_consumed(&self) -> bool {
        let n = self.consumed.fetch_add(1, Ordering::Relaxed) + 1;
        let target = self.consume_target.load(Ordering::Relaxed);
        target > 0 && n >= target
    }

    /// Records one consumed message's latency or lateness for the next progress line.
    pub fn record_window(&self, ns: u64) {
        if let Ok(mut w) = self.window.lock() {
            w.record(ns);
        }
    }

    /// What was recorded since the last call.
    pub fn take_window(&self) -> Histogram {
        self.window
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default()
    }

    pub fn consume_target_reached(&self) -> bool {
        let target = self.consume_target.load(Ordering::Relaxed);
        target > 0 && self.consumed.load(Ordering::Relaxed) >= target
    }
}

/// Sub-buckets per power of two: 2^6 = 64, so a recorded value is off by at most 1/128.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;

/// A log-linear histogram of nanosecond values (HdrHistogram-like, about 1% precision).
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; ((64 - SUB_BITS as usize) + 1) * SUB as usize],
            total: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }
}

fn bucket(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    let sub = (v >> shift) & (SUB - 1);
    (((shift + 1) as u64) << SUB_BITS | sub) as usize
}

/// The middle of the values that fall in bucket `i`.
fn value_of(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let shift = (i >> SUB_BITS) - 1;
    let sub = i & (SUB - 1);
    let low = (SUB + sub) << shift;
    low + ((1u64 << shift) >> 1)
}

impl Histogram {
    pub fn record(&mut self, v: u64) {
        self.counts[bucket(v)] += 1;
        self.total += 1;
        self.sum += v as u128;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn min(&self) -> u64 {
        if self.total == 0 {
            0
        } else {
            self.min
        }
    }

    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The value at quantile `q` (0..=1), clamped to the recorded min and max.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return value_of(i).clamp(self.min, self.max);
            }
        }
        self.max
    }
}

/// User + system CPU time of this process, in microseconds (getrusage).
pub fn cpu_time_us() -> u64 {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_SELF is always accepted.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return 0;
    }
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_precise() {
        let mut last = 0;
        for v in (0..2_000_000u64).step_by(7).chain([u64::MAX / 2, u64::MAX]) {
            let b = bucket(v);
            assert!(b >= last, "bucket order at {v}");
            last = b;
            let back = value_of(b);
            let err = (back as f64 - v as f64).abs() / (v.max(1) as f64);
            assert!(err <= 1.0 / 64.0, "value {v} -> {back}");
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.02, "{p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.02, "{p99}");
        assert_eq!(h.quantile(1.0), 1_000_000);
        assert_eq!(h.count(), 1000);
    }
}
