//! Server-side offset tracking over AMQP (beyond RabbitMQ, whose AMQP
//! stream consumers must track their offsets themselves; LavinMQ's
//! argument): a consumer with `x-stream-automatic-offset-tracking` true
//! and a consumer tag of its own resumes, the next time a consumer with
//! that tag attaches, where its acks left off.
//!
//! What is kept per (stream, tag) is the offset to read next: the
//! lowest offset delivered to the reader and not acked yet, or, with
//! none outstanding, its cursor. So the tracked offset never runs ahead
//! of the acks (LavinMQ's issue #1171): a message delivered and not
//! acked, or requeued, is read again on resume (a reject without requeue
//! counts as done; at most 65,536 requeued ones are remembered). It is
//! written through the journal (`Op::TrackOffset`) before the next
//! group commit, as is a reader's place when it goes; a crash loses at
//! most the acks of the last ~100 ms, which come back as redeliveries,
//! never as gaps. The first attach starts where x-stream-offset says
//! (RabbitMQ's default, next; not LavinMQ's first, its issue #1293). A
//! second reader tracked under a tag already reading is refused (each
//! would write its place over the other's).

use std::collections::{HashMap, VecDeque};

use amq_protocol::types::AMQPValue;

/// Offsets a tracked reader keeps outstanding at the most.
const MAX_OUTSTANDING: usize = 65_536;

/// The consumer argument that turns tracking on.
pub const ARGUMENT: &str = "x-stream-automatic-offset-tracking";

/// One tracked reader's acks.
#[derive(Debug)]
pub struct Tracked {
    /// The consumer tag it is tracked under.
    pub name: String,
    /// Offsets delivered and not acked, ascending.
    outstanding: VecDeque<u64>,
    /// The offset last written (None: not written since attach).
    written: Option<u64>,
}

impl Tracked {
    pub fn new(name: String) -> Tracked {
        Tracked {
            name,
            outstanding: VecDeque::new(),
            written: None,
        }
    }

    /// Offset `offset` went out to the reader. Requeued deliveries stay
    /// outstanding (read again on resume), up to `MAX_OUTSTANDING`: past
    /// that the oldest is let go, as if acked, so a reader that requeues
    /// forever costs bounded memory.
    pub fn delivered(&mut self, offset: u64) {
        if self.outstanding.len() >= MAX_OUTSTANDING {
            self.outstanding.pop_front();
        }
        self.outstanding.push_back(offset);
    }

    /// Offset `offset` was acked.
    pub fn acked(&mut self, offset: u64) {
        // Acks come mostly in order: the front, else a search.
        if self.outstanding.front() == Some(&offset) {
            self.outstanding.pop_front();
        } else if let Ok(at) = self.outstanding.binary_search(&offset) {
            self.outstanding.remove(at);
        }
    }

    /// The offset a resume starts at, for a reader whose cursor is
    /// `cursor`.
    pub fn resume_at(&self, cursor: u64) -> u64 {
        self.outstanding.front().copied().unwrap_or(cursor)
    }

    /// The offset to write now, if it moved since the last write (which
    /// this records).
    pub fn to_write(&mut self, cursor: u64) -> Option<u64> {
        let at = self.resume_at(cursor);
        if self.written == Some(at) {
            return None;
        }
        self.written = Some(at);
        Some(at)
    }
}

/// A stream's tracked offsets in memory: those moved since the last
/// write, and the last written of every name (read before the store's:
/// a write takes a commit to be seen there, and a reader that comes back
/// meanwhile must not start from an older place, or from its first
/// attach's).
#[derive(Debug, Default)]
pub struct Tracks {
    moved: HashMap<String, u64>,
    written: HashMap<String, u64>,
}

impl Tracks {
    /// Reader `name` resumes at `offset` now.
    pub fn moved(&mut self, name: &str, offset: u64) {
        match self.moved.get_mut(name) {
            Some(at) => *at = offset,
            None => {
                self.moved.insert(name.to_string(), offset);
            }
        }
    }

    /// Where reader `name` resumes, if it moved since the start.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.moved
            .get(name)
            .or_else(|| self.written.get(name))
            .copied()
    }

    /// The offsets to write, now counted as written.
    pub fn take_moved(&mut self) -> Vec<(String, u64)> {
        let moved: Vec<(String, u64)> = self.moved.drain().collect();
        for (name, offset) in &moved {
            match self.written.get_mut(name) {
                Some(at) => *at = *offset,
                None => {
                    self.written.insert(name.clone(), *offset);
                }
            }
        }
        moved
    }
}

/// Whether a consumer's arguments ask for tracking: a boolean (or the
/// strings "true" and "false"); an error otherwise.
pub fn asked(value: Option<&AMQPValue>) -> Result<bool, String> {
    match value {
        None => Ok(false),
        Some(AMQPValue::Boolean(b)) => Ok(*b),
        Some(v) => match crate::wire::value::text(v).as_deref() {
            Some("true") => Ok(true),
            Some("false") => Ok(false),
            _ => Err(format!(
                "invalid {ARGUMENT} of type {}: a boolean is expected",
                crate::wire::type_name(v)
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_never_passes_an_unacked_delivery() {
        let mut t = Tracked::new("c".into());
        assert_eq!(t.to_write(5), Some(5));
        assert_eq!(t.to_write(5), None);
        for o in 5..10 {
            t.delivered(o);
        }
        // Out of order: 7 acked first, 5 is still out.
        t.acked(7);
        assert_eq!(t.resume_at(10), 5);
        assert_eq!(t.to_write(10), None);
        t.acked(5);
        t.acked(6);
        assert_eq!(t.to_write(10), Some(8));
        t.acked(8);
        t.acked(9);
        assert_eq!(t.resume_at(10), 10);
        assert_eq!(t.to_write(12), Some(12));
    }

    #[test]
    fn a_place_being_written_is_still_known() {
        let mut t = Tracks::default();
        t.moved("a", 5);
        t.moved("a", 7);
        assert_eq!(t.take_moved(), [("a".to_string(), 7)]);
        // Written, not visible in the store until its commit: known here.
        assert_eq!(t.get("a"), Some(7));
        assert!(t.take_moved().is_empty());
        t.moved("a", 9);
        assert_eq!(t.get("a"), Some(9));
        assert_eq!(t.get("b"), None);
    }

    #[test]
    fn the_argument() {
        assert_eq!(asked(None), Ok(false));
        assert_eq!(asked(Some(&AMQPValue::Boolean(true))), Ok(true));
        assert_eq!(
            asked(Some(&AMQPValue::LongString("false".into()))),
            Ok(false)
        );
        assert!(asked(Some(&AMQPValue::LongLongInt(1))).is_err());
    }
}
