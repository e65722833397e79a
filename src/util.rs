//! Small helpers with no better home.

use rand::Rng;

/// 22 random URL-safe characters, as in RabbitMQ's `amq.gen-...` names.
pub fn random_name() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut rng = rand::thread_rng();
    (0..22)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The UTC calendar date and time of `secs` since the epoch: (year,
/// month, day, hour, minute, second), by Howard Hinnant's civil-from-days.
pub fn civil(secs: i64) -> (i64, i64, i64, i64, i64, i64) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem / 3600, rem / 60 % 60, rem % 60)
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Milliseconds on a coarse monotonic clock (CLOCK_MONOTONIC_COARSE: read
/// without a syscall, a few milliseconds of resolution).
pub fn coarse_now_ms() -> u64 {
    clock_ms(libc::CLOCK_MONOTONIC_COARSE)
}

/// Milliseconds since the epoch: the time a message record was stored.
/// The coarse wall clock (CLOCK_REALTIME_COARSE, about 7 ns against 28
/// for the precise one here) lags the true time by up to a tick (4 ms
/// here), so within two ticks of a second's end it may still name the
/// second before; there the precise clock is read. A reader that starts
/// at a time (second precision) thus never misses a message that
/// arrived after the time it took.
pub fn record_ms() -> u64 {
    let coarse = clock_ms(libc::CLOCK_REALTIME_COARSE);
    if coarse % 1000 + 2 * coarse_tick_ms() < 1000 {
        coarse
    } else {
        clock_ms(libc::CLOCK_REALTIME)
    }
}

/// The coarse wall clock's resolution in whole milliseconds (at least 1).
fn coarse_tick_ms() -> u64 {
    static TICK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICK.get_or_init(|| {
        let mut res = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_getres writes the timespec it is given.
        let ok = unsafe { libc::clock_getres(libc::CLOCK_REALTIME_COARSE, &mut res) } == 0;
        let ns = if ok {
            res.tv_sec as u64 * 1_000_000_000 + res.tv_nsec as u64
        } else {
            // An unknown resolution: the precise clock near every second's end.
            100_000_000
        };
        ns.div_ceil(1_000_000).clamp(1, 250)
    })
}

/// Clock `id` in milliseconds.
fn clock_ms(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Seconds since the epoch, as a u32 (good until 2106): when a message
/// entered its queue. Read on every push, so it is a load of a value a
/// background thread refreshes ten times a second, not a clock call.
pub fn coarse_wall_secs() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SECS: AtomicU32 = AtomicU32::new(0);
    static TICKER: std::sync::Once = std::sync::Once::new();
    fn now() -> u32 {
        u32::try_from(now_ms() / 1000).unwrap_or(u32::MAX)
    }
    TICKER.call_once(|| {
        SECS.store(now(), Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name("wall-clock".into())
            .spawn(|| loop {
                std::thread::sleep(std::time::Duration::from_millis(100));
                SECS.store(now(), Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the wall-clock thread: {e}");
        }
    });
    SECS.load(Ordering::Relaxed)
}

/// Connections open per client address, for caps on a listener: `take`
/// hands out a slot while the address holds fewer than `max`; dropping it
/// gives it back.
#[derive(Default)]
pub struct PerSource(parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection's slot of its address (`PerSource::take`).
pub struct SourceSlot {
    sources: std::sync::Arc<PerSource>,
    ip: std::net::IpAddr,
}

impl PerSource {
    pub fn take(
        self: &std::sync::Arc<Self>,
        ip: std::net::IpAddr,
        max: usize,
    ) -> Option<SourceSlot> {
        let mut open = self.0.lock();
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            sources: std::sync::Arc::clone(self),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.sources.0.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// `sendfile(2)`: writes up to `len` bytes of file `from` at `at` to
/// socket `to` in the kernel; how many it wrote.
pub fn sendfile(
    to: std::os::fd::RawFd,
    from: std::os::fd::RawFd,
    at: u64,
    len: usize,
) -> std::io::Result<usize> {
    let mut offset = libc::off_t::try_from(at)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "offset too large"))?;
    // SAFETY: sendfile reads only the descriptors and the offset it is
    // given, which lives through the call.
    let n = unsafe { libc::sendfile(to, from, &mut offset, len) };
    match n {
        -1 => Err(std::io::Error::last_os_error()),
        n => Ok(n as usize),
    }
}

#[cfg(test)]
mod tests {
    /// Across second boundaries, a record's time never names a second
    /// before the precise clock's reading taken just before it.
    #[test]
    fn a_record_time_is_never_in_an_earlier_second() {
        for _ in 0..3 {
            // Spin from 30 ms before a second's end to 30 ms after it.
            let to_end = 1000 - super::now_ms() % 1000;
            std::thread::sleep(std::time::Duration::from_millis(to_end.saturating_sub(30)));
            let until = super::now_ms() + 60;
            loop {
                let before = super::now_ms();
                let stamped = super::record_ms();
                assert!(
                    stamped / 1000 >= before / 1000,
                    "stamped {stamped} after reading {before}"
                );
                if before >= until {
                    break;
                }
            }
        }
    }
}
