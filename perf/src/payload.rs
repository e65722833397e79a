//! Message bodies: a monotonic send timestamp in bytes 0..8 and a magic tag in bytes 8..16.
//!
//! The clock is `CLOCK_MONOTONIC`, which every process on the machine shares, so a consumer can
//! time messages published by this process or by another `warren-perf` run (for example the
//! pre-fill of a backlog, where the figure is the time the message spent queued).

/// Smallest body we send: room for the timestamp and the tag.
pub const MIN_SIZE: usize = 16;

const MAGIC: [u8; 8] = *b"wrnperf1";

/// Nanoseconds on the machine's monotonic clock.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// A body of `size` bytes (at least [`MIN_SIZE`]) with the tag in place and no timestamp yet.
pub fn template(size: usize) -> Vec<u8> {
    let mut body = vec![0u8; size.max(MIN_SIZE)];
    body[8..16].copy_from_slice(&MAGIC);
    body
}

/// Writes the current time into a body made by [`template`].
pub fn stamp(body: &mut [u8]) {
    body[0..8].copy_from_slice(&now_ns().to_le_bytes());
}

/// The send timestamp of a body written by `warren-perf`, if it carries one.
pub fn read_stamp(body: &[u8]) -> Option<u64> {
    if body.len() < MIN_SIZE || body[8..16] != MAGIC {
        return None;
    }
    let mut ts = [0u8; 8];
    ts.copy_from_slice(&body[0..8]);
    Some(u64::from_le_bytes(ts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_bodies_still_carry_a_timestamp() {
        let mut body = template(1);
        assert_eq!(body.len(), MIN_SIZE);
        stamp(&mut body);
        let ts = read_stamp(&body).unwrap();
        assert!(ts <= now_ns());
    }

    #[test]
    fn foreign_bodies_are_not_timed() {
        assert_eq!(read_stamp(b"hello"), None);
        assert_eq!(read_stamp(&[0u8; 32]), None);
    }
}
