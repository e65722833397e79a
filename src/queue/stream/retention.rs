//! A stream's retention: its offsets in segments of about
//! `x-stream-max-segment-size-bytes` of bodies each, and whole segments
//! dropped, oldest first, while the stream holds more than
//! `x-max-length-bytes` or a segment's newest message is older than
//! `x-max-age` (the lower of argument and policy, as RabbitMQ takes them).
//! The segment being appended to is never dropped. Retention runs when a
//! segment fills and once a second besides, so a stream nobody publishes
//! to still loses what aged out (RabbitMQ's runs only as segments roll
//! over).
//!
//! Segments are logical: the stream's messages share the node's message
//! log, so dropping one writes a removal per message, and the log gives
//! the space back as its own segments die (store/msglog).

use std::collections::VecDeque;

/// The segment size when none is set: the message log's own segment
/// size, so a dropped segment frees about one log segment, and what a
/// limit lets through past it is at most that (RabbitMQ's 500 MB default
/// suits its files of one stream each).
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// The limits in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_bytes: Option<u64>,
    pub max_age_ms: Option<u64>,
    pub segment_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_bytes: None,
            max_age_ms: None,
            segment_bytes: SEGMENT_BYTES,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Segment {
    /// Its first offset.
    first: u64,
    /// Body bytes in it.
    bytes: u64,
    /// When its newest message was stored, ms since the epoch.
    newest_ms: u64,
}

/// A stream's segments, oldest first.
#[derive(Debug, Default)]
pub struct Segments {
    segments: VecDeque<Segment>,
}

impl Segments {
    /// How many there are.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Each segment's first and last offset, oldest first, in a stream
    /// whose next offset is `next`.
    pub fn spans(&self, next: u64) -> Vec<(u64, u64)> {
        let starts: Vec<u64> = self.segments.iter().map(|s| s.first).collect();
        let ends = starts.iter().skip(1).copied().chain(std::iter::once(next));
        starts
            .iter()
            .zip(ends)
            .filter(|&(&from, to)| to > from)
            .map(|(&from, to)| (from, to - 1))
            .collect()
    }

    /// The segment that starts at `first` holds a message stored at
    /// `time_ms` (a start: its newest, read back).
    pub fn stored_at(&mut self, first: u64, time_ms: u64) {
        if let Some(s) = self.segments.iter_mut().find(|s| s.first == first) {
            s.newest_ms = s.newest_ms.max(time_ms);
        }
    }

    /// Counts a message appended at `offset`; true when it started a new
    /// segment after a full one.
    pub fn append(&mut self, offset: u64, bytes: u64, time_ms: u64, segment_bytes: u64) -> bool {
        match self.segments.back_mut() {
            Some(s) if s.bytes < segment_bytes => {
                s.bytes += bytes;
                s.newest_ms = s.newest_ms.max(time_ms);
                false
            }
            last => {
                let rolled = last.is_some();
                self.segments.push_back(Segment {
                    first: offset,
                    bytes,
                    newest_ms: time_ms,
                });
                rolled
            }
        }
    }

    /// Drops the oldest segments `limits` do not keep, at `now_ms`, from
    /// a stream of `total` body bytes; the first offset kept and the bytes
    /// dropped, if any were.
    pub fn retain(&mut self, total: u64, limits: &Limits, now_ms: u64) -> Option<(u64, u64)> {
        let mut dropped = 0;
        while self.segments.len() > 1 {
            let Some(oldest) = self.segments.front() else {
                break;
            };
            let too_big = limits.max_bytes.is_some_and(|max| total - dropped > max);
            let too_old = limits
                .max_age_ms
                .is_some_and(|age| oldest.newest_ms.saturating_add(age) < now_ms);
            if !(too_big || too_old) {
                break;
            }
            dropped += oldest.bytes;
            self.segments.pop_front();
        }
        if dropped == 0 {
            return None;
        }
        self.segments.front().map(|s| (s.first, dropped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_bytes: Option<u64>, max_age_ms: Option<u64>) -> Limits {
        Limits {
            max_bytes,
            max_age_ms,
            segment_bytes: 100,
        }
    }

    /// Ten segments of ten 10-byte messages, the n-th stored at n s.
    fn filled() -> Segments {
        let mut s = Segments::default();
        for offset in 0..100u64 {
            let rolled = s.append(offset, 10, (offset / 10) * 1000, 100);
            assert_eq!(rolled, offset > 0 && offset % 10 == 0, "offset {offset}");
        }
        assert_eq!(s.segments.len(), 10);
        s
    }

    #[test]
    fn size_drops_whole_segments_oldest_first() {
        let mut s = filled();
        assert_eq!(s.retain(1000, &limits(Some(1000), None), 0), None);
        assert_eq!(s.retain(1000, &limits(Some(950), None), 0), Some((10, 100)));
        assert_eq!(s.retain(900, &limits(Some(250), None), 0), Some((80, 700)));
        // The segment being appended to stays, whatever the limit.
        assert_eq!(s.retain(200, &limits(Some(0), None), 0), Some((90, 100)));
        assert_eq!(s.segments.len(), 1);
        assert_eq!(s.retain(100, &limits(Some(0), None), 0), None);
    }

    #[test]
    fn age_drops_segments_whose_newest_message_is_older() {
        let mut s = filled();
        // At 5.5 s with a 2 s age: segments whose newest is before 3.5 s.
        assert_eq!(
            s.retain(1000, &limits(None, Some(2000)), 5500),
            Some((40, 400))
        );
        assert_eq!(s.retain(600, &limits(None, Some(2000)), 5500), None);
        // Everything aged out but the last segment.
        assert_eq!(
            s.retain(600, &limits(None, Some(1)), 60_000),
            Some((90, 500))
        );
    }
}
