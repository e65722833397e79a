//! Message bodies: a monotonic send timestamp in bytes 0..8 and a magic tag in bytes 8..16.
//!
//! A message published with a delay (--delay) carries it in the same 16 bytes: bytes 8..12 are a
//! shorter tag and bytes 12..16 the delay in milliseconds (u32, as x-delay itself is capped at
//! 2^32-1 ms), so the consumer can tell how late the message came and bodies stay 16 B.
//!
//! The clock is `CLOCK_MONOTONIC`, which every process on the machine shares, so a consumer can
//! time messages published by this process or by another `warren-perf` run (for example the
//! pre-fill of a backlog, where the figure is the time the message spent queued).

/// Smallest body we send: room for the timestamp and the tag.
pub const MIN_SIZE: usize = 16;

const MAGIC: [u8; 8] = *b"wrnperf1";
/// The tag of a body that also carries its delay.
const MAGIC_DELAYED: [u8; 4] = *b"wrnD";

/// What a consumer reads back from a body written by `warren-perf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Publish time, nanoseconds on the monotonic clock.
    pub sent_ns: u64,
    /// The x-delay the message was published with, if any (ms).
    pub delay_ms: Option<u32>,
}

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

/// Writes the current time and the message's delay into a body made by [`template`].
pub fn stamp_delayed(body: &mut [u8], delay_ms: u32) {
    stamp(body);
    body[8..12].copy_from_slice(&MAGIC_DELAYED);
    body[12..16].copy_from_slice(&delay_ms.to_le_bytes());
}

/// The send timestamp (and delay) of a body written by `warren-perf`, if it carries one.
pub fn read_stamp(body: &[u8]) -> Option<Stamp> {
    if body.len() < MIN_SIZE {
        return None;
    }
    let word = |r: std::ops::Range<usize>| {
        let mut b = [0u8; 8];
        b[..r.len()].copy_from_slice(&body[r]);
        u64::from_le_bytes(b)
    };
    let delay_ms = if body[8..16] == MAGIC {
        None
    } else if body[8..12] == MAGIC_DELAYED {
        Some(word(12..16) as u32)
    } else {
        return None;
    };
    Some(Stamp {
        sent_ns: word(0..8),
        delay_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_bodies_still_carry_a_timestamp() {
        let mut body = template(1);
        assert_eq!(body.len(), MIN_SIZE);
        stamp(&mut body);
        let st = read_stamp(&body).unwrap();
        assert!(st.sent_ns <= now_ns());
        assert_eq!(st.delay_ms, None);
    }

    #[test]
    fn delayed_bodies_carry_their_delay() {
        let mut body = template(16);
        stamp_delayed(&mut body, 90_000);
        assert_eq!(body.len(), MIN_SIZE);
        let st = read_stamp(&body).unwrap();
        assert!(st.sent_ns <= now_ns() && st.sent_ns > 0);
        assert_eq!(st.delay_ms, Some(90_000));
    }

    #[test]
    fn foreign_bodies_are_not_timed() {
        assert_eq!(read_stamp(b"hello"), None);
        assert_eq!(read_stamp(&[0u8; 32]), None);
    }
}
