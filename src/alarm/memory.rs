//! The memory alarm, as RabbitMQ's `vm_memory_high_watermark`: a task
//! samples the broker's resident memory every 100 ms and raises the alarm
//! while it is above the limit (mod.rs says what that does), instead of
//! the process being killed and every transient message lost with it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Alarms, Resource};

/// How often resident memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The broker's memory alarm.
pub struct MemoryAlarm {
    /// Resident bytes above which the alarm is raised (u64::MAX: never).
    limit: AtomicU64,
    alarms: Arc<Alarms>,
}

impl MemoryAlarm {
    /// An alarm at `limit` resident bytes; `start` begins sampling.
    pub fn new(limit: u64, alarms: Arc<Alarms>) -> Arc<MemoryAlarm> {
        Arc::new(MemoryAlarm {
            limit: AtomicU64::new(limit),
            alarms,
        })
    }

    /// Samples every 100 ms until the alarm is dropped.
    pub fn start(self: &Arc<Self>) {
        let weak: Weak<MemoryAlarm> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(alarm) = weak.upgrade() else { return };
                alarm.check();
            }
        });
    }

    /// The limit in resident bytes.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Changes the limit and re-checks at once.
    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
        self.check();
    }

    /// Whether the alarm is raised now.
    pub fn is_raised(&self) -> bool {
        self.alarms.is_raised(Resource::Memory)
    }

    fn check(&self) {
        let Some(used) = resident_bytes() else { return };
        let limit = self.limit();
        let over = used > limit;
        if !self.alarms.set(Resource::Memory, over) {
            return;
        }
        if over {
            tracing::warn!(
                used_mib = used >> 20,
                limit_mib = limit >> 20,
                "memory alarm raised: blocking publishers"
            );
        } else {
            tracing::info!(used_mib = used >> 20, "memory alarm cleared");
        }
    }
}

/// The limit for a configuration: `limit_mb` if set, else `watermark` (a
/// fraction) of the machine's memory; no limit if that is unknown.
pub fn limit_for(limit_mb: u64, watermark: f64) -> u64 {
    if limit_mb > 0 {
        return limit_mb.saturating_mul(1 << 20);
    }
    match total_memory() {
        Some(total) if watermark > 0.0 => (total as f64 * watermark) as u64,
        _ => u64::MAX,
    }
}

/// This process's resident memory (Linux: /proc/self/statm).
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

/// The machine's memory (Linux: MemTotal in /proc/meminfo).
pub fn total_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert_eq!(limit_for(100, 0.4), 100 << 20);
        if let Some(total) = total_memory() {
            let l = limit_for(0, 0.5);
            assert!(l > 0 && l < total);
        }
        assert_eq!(limit_for(0, 0.0), u64::MAX);
    }

    #[tokio::test]
    async fn raised_above_the_limit_and_cleared_below() {
        let alarm = MemoryAlarm::new(u64::MAX, Alarms::new());
        alarm.set_limit(1);
        assert!(alarm.is_raised());
        alarm.set_limit(u64::MAX);
        assert!(!alarm.is_raised());
    }
}
