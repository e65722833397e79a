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

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Milliseconds on a coarse monotonic clock (CLOCK_MONOTONIC_COARSE: read
/// without a syscall, a few milliseconds of resolution).
pub fn coarse_now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Seconds since the epoch on the coarse wall clock
/// (CLOCK_REALTIME_COARSE: read without a syscall), as a u32 (good until
/// 2106): when a message entered its queue.
pub fn coarse_wall_secs() -> u32 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    u32::try_from(ts.tv_sec).unwrap_or(u32::MAX)
}
