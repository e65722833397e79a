//! The free-disk alarm, as RabbitMQ's `disk_free_limit`: a task reads the
//! free space of the data directory's filesystem and raises the alarm
//! while it is under the limit (mod.rs says what that does). It reads
//! more often the nearer the limit is: as RabbitMQ's disk monitor, the
//! next read comes when a fast writer (250 MB/s) could have used the
//! space left above the limit, but at least every 10 s and at most every
//! 100 ms. The store is the last line: a write that fails for lack of
//! space is never confirmed (store/sync.rs).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Alarms, Resource};

/// The shortest and the longest wait between two reads.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const MAX_INTERVAL: Duration = Duration::from_secs(10);
/// The write rate assumed when spacing reads: bytes per second.
const FAST_RATE: u64 = 250_000_000;

/// The node's free-disk alarm.
pub struct DiskAlarm {
    dir: PathBuf,
    /// Free bytes under which the alarm is raised.
    limit: AtomicU64,
    /// Free bytes at the last read.
    free: AtomicU64,
    alarms: Arc<Alarms>,
    /// Wakes the task for a read now (a new limit).
    wake: Arc<Notify>,
}

impl DiskAlarm {
    /// An alarm on the filesystem that holds `dir`, at `limit` free
    /// bytes; reads once now, and fails if the free space cannot be read
    /// (an alarm that cannot read would never go off).
    pub fn new(dir: &Path, limit: u64, alarms: Arc<Alarms>) -> Result<Arc<DiskAlarm>, String> {
        let free = disk_free(dir).map_err(|e| {
            format!(
                "cannot read the free space of {}, needed by the free-disk alarm: {e}",
                dir.display()
            )
        })?;
        let alarm = Arc::new(DiskAlarm {
            dir: dir.to_path_buf(),
            limit: AtomicU64::new(limit),
            free: AtomicU64::new(free),
            alarms,
            wake: Arc::new(Notify::new()),
        });
        alarm.update(free);
        Ok(alarm)
    }

    /// Reads until the alarm is dropped.
    pub fn start(self: &Arc<Self>) {
        let weak: Weak<DiskAlarm> = Arc::downgrade(self);
        let wake = Arc::clone(&self.wake);
        tokio::spawn(async move {
            loop {
                let Some(wait) = weak.upgrade().map(|alarm| alarm.check()) else {
                    return;
                };
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = wake.notified() => {}
                }
            }
        });
    }

    /// The limit, free bytes.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Free bytes at the last read.
    pub fn free(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// Free bytes now (for what shows it: the API, metrics), else at the
    /// last read.
    pub fn free_now(&self) -> u64 {
        disk_free(&self.dir).unwrap_or_else(|_| self.free())
    }

    /// Changes the limit and reads again at once.
    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
        self.check();
        self.wake.notify_one();
    }

    /// Whether the alarm is raised now.
    pub fn is_raised(&self) -> bool {
        self.alarms.is_raised(Resource::Disk)
    }

    /// Reads the free space, raises or clears the alarm, and says when to
    /// read next.
    fn check(&self) -> Duration {
        match disk_free(&self.dir) {
            Ok(free) => {
                self.free.store(free, Ordering::Relaxed);
                self.update(free);
                interval(free, self.limit())
            }
            Err(e) => {
                // Unknown is treated as low: publishers wait rather than
                // fill a disk nobody can see.
                if self.alarms.set(Resource::Disk, true) {
                    tracing::error!(
                        dir = %self.dir.display(),
                        "free-disk alarm raised: cannot read the free space: {e}"
                    );
                }
                MIN_INTERVAL
            }
        }
    }

    fn update(&self, free: u64) {
        let limit = self.limit();
        let low = free < limit;
        if !self.alarms.set(Resource::Disk, low) {
            return;
        }
        if low {
            tracing::warn!(
                free,
                limit,
                dir = %self.dir.display(),
                "free-disk alarm raised: blocking publishers"
            );
        } else {
            tracing::info!(free, limit, "free-disk alarm cleared");
        }
    }
}

/// The wait before the next read, `free` bytes being free.
fn interval(free: u64, limit: u64) -> Duration {
    let above = free.saturating_sub(limit);
    Duration::from_millis(above.saturating_mul(1000) / FAST_RATE).clamp(MIN_INTERVAL, MAX_INTERVAL)
}

/// Free bytes, for unprivileged users, on the filesystem that holds `dir`.
pub fn disk_free(dir: &Path) -> std::io::Result<u64> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs fills the struct it is given from a valid C path.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(path.as_ptr(), &mut st) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn raised_under_the_limit_and_cleared_above() {
        let dir = tempfile::tempdir().unwrap();
        let alarms = Alarms::new();
        let alarm = DiskAlarm::new(dir.path(), 0, Arc::clone(&alarms)).unwrap();
        assert!(!alarm.is_raised() && alarm.free() > 0);
        alarm.set_limit(u64::MAX);
        assert!(alarm.is_raised() && alarms.is_raised(Resource::Disk));
        alarm.set_limit(0);
        assert!(!alarm.is_raised());
    }

    #[test]
    fn an_unreadable_directory_is_refused() {
        let e = DiskAlarm::new(Path::new("/no/such/dir"), 0, Alarms::new());
        assert!(e.is_err());
    }

    #[test]
    fn reads_come_sooner_near_the_limit() {
        assert_eq!(interval(100 << 20, 99 << 20), MIN_INTERVAL, "1 MiB above");
        assert_eq!(interval(0, 50_000_000), MIN_INTERVAL, "under the limit");
        assert_eq!(interval(1_050_000_000, 50_000_000), Duration::from_secs(4));
        assert_eq!(interval(u64::MAX, 0), MAX_INTERVAL);
    }
}
