//! Puts a cluster member holds back from the log (`MessageLog::hold_puts`).
//! A member's Raft log is the durable copy of what it applied until a
//! checkpoint commits the message log (store/raft/checkpoint.rs), so a put
//! need not reach the message log before that commit. A message removed
//! before it (a consumer that keeps up acks within milliseconds) is then
//! never written, and its removal writes no ack record either.
//!
//! Held puts are written in the order they came: by a commit, before any
//! read of the log (which then sees them as if written at once), and once
//! they pin more than `MAX_BYTES` or number more than `MAX_PUTS`. A
//! checkpoint's commit may leave the puts of the last interval held
//! (`MessageLog::commit_older`): each is a generation, and a put is kept
//! back for one whole interval at least.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::message::Message;

/// Bytes of messages held at the most. A member's message is a slice of
/// its Raft entry's batch and keeps the whole batch in memory: what is
/// pinned is bounded by the entries applied in two checkpoint intervals,
/// not by this.
const MAX_BYTES: usize = 16 << 20;
/// Puts held at the most, with those taken back in generations not ended.
const MAX_PUTS: usize = 128 * 1024;

/// One put held back: `MessageLog::put`'s arguments.
pub(super) struct HeldPut {
    pub queue: u64,
    pub seq: u64,
    pub msg: Message,
    pub paged: bool,
    pub deadline: u64,
    pub time: u64,
}

/// The puts held back, in the order they came.
#[derive(Default)]
pub(super) struct Held {
    /// In order, with the generation each came in; None where a put was
    /// taken back.
    puts: VecDeque<(u64, Option<HeldPut>)>,
    /// How many puts left the front of `puts`: `at` counts from the first.
    gone: usize,
    /// Where each held message is in `puts` (plus `gone`).
    at: FxHashMap<(u64, u64), usize>,
    bytes: usize,
    generation: u64,
    /// The highest seq held of each queue since none was held (it may
    /// name one taken back or written since: an upper bound).
    highest: FxHashMap<u64, u64>,
}

impl Held {
    /// Holds `put`; a message held already is replaced (applied again).
    pub fn hold(&mut self, put: HeldPut) {
        let key = (put.queue, put.seq);
        let top = self.highest.entry(put.queue).or_insert(put.seq);
        *top = (*top).max(put.seq);
        self.bytes += put.msg.backing().len();
        let i = self.gone + self.puts.len();
        self.puts.push_back((self.generation, Some(put)));
        if let Some(old) = self.at.insert(key, i) {
            self.forget(old);
        }
    }

    /// Starts a new generation; returns the one that ends.
    pub fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation - 1
    }

    /// Takes back the put of message `seq` of `queue`; whether one was held.
    pub fn take(&mut self, queue: u64, seq: u64) -> bool {
        match self.at.remove(&(queue, seq)) {
            Some(i) => {
                self.forget(i);
                true
            }
            None => false,
        }
    }

    fn forget(&mut self, i: usize) {
        let slot = self.puts.get_mut(i - self.gone);
        if let Some(p) = slot.and_then(|(_, p)| p.take()) {
            self.bytes -= p.msg.backing().len();
        }
    }

    /// The put of message `seq` of `queue`, if it is held.
    pub fn get(&self, queue: u64, seq: u64) -> Option<&HeldPut> {
        let i = *self.at.get(&(queue, seq))?;
        self.puts.get(i.checked_sub(self.gone)?)?.1.as_ref()
    }

    /// Whether a put of `queue` at `seq` or after may be held.
    pub fn may_hold_from(&self, queue: u64, seq: u64) -> bool {
        self.highest.get(&queue).is_some_and(|&top| top >= seq)
    }

    /// Whether no put is held.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Whether the puts held should be written now (those taken back
    /// count until their generation ends).
    pub fn is_full(&self) -> bool {
        self.bytes >= MAX_BYTES || self.puts.len() >= MAX_PUTS
    }

    /// The bytes of the messages held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Every put held, in order, and holds none.
    pub fn take_all(&mut self) -> Vec<HeldPut> {
        self.take_before(u64::MAX)
    }

    /// The puts held in generations before `generation`, in order.
    pub fn take_before(&mut self, generation: u64) -> Vec<HeldPut> {
        let mut out = Vec::new();
        while let Some((g, _)) = self.puts.front() {
            if *g >= generation {
                break;
            }
            let Some((_, put)) = self.puts.pop_front() else {
                break;
            };
            self.gone += 1;
            if let Some(p) = put {
                self.at.remove(&(p.queue, p.seq));
                self.bytes -= p.msg.backing().len();
                out.push(p);
            }
        }
        if self.at.is_empty() {
            self.highest.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Meta;

    fn put(queue: u64, seq: u64) -> HeldPut {
        HeldPut {
            queue,
            seq,
            msg: Message::new(b"", b"q", &[0x10, 0, 2], b"body", Meta::default()),
            paged: false,
            deadline: 0,
            time: seq,
        }
    }

    #[test]
    fn held_in_order_taken_back_and_replaced() {
        let mut h = Held::default();
        assert!(h.is_empty());
        h.hold(put(1, 1));
        h.hold(put(1, 2));
        h.hold(put(2, 1));
        let one = h.bytes() / 3;
        assert_eq!(h.get(1, 2).map(|p| p.seq), Some(2));
        assert!(h.may_hold_from(1, 2) && !h.may_hold_from(1, 3) && !h.may_hold_from(3, 0));
        assert!(h.take(1, 2));
        assert!(!h.take(1, 2), "taken once");
        assert!(h.get(1, 2).is_none());
        assert_eq!(h.bytes(), 2 * one);
        // Applied again: the later one stands, once.
        let mut again = put(1, 1);
        again.time = 99;
        h.hold(again);
        assert_eq!(h.bytes(), 2 * one);
        let all: Vec<(u64, u64, u64)> = h
            .take_all()
            .into_iter()
            .map(|p| (p.queue, p.seq, p.time))
            .collect();
        assert_eq!(all, [(2, 1, 1), (1, 1, 99)]);
        assert!(h.is_empty());
        assert_eq!(h.bytes(), 0);
    }

    #[test]
    fn older_generations_are_taken_and_the_last_stays() {
        let mut h = Held::default();
        h.hold(put(1, 1));
        h.hold(put(1, 2));
        assert_eq!(h.next_generation(), 0);
        h.hold(put(1, 3));
        h.hold(put(1, 4));
        assert!(h.take(1, 1));
        let older: Vec<u64> = h.take_before(1).into_iter().map(|p| p.seq).collect();
        assert_eq!(older, [2]);
        // What stays is still found by its key.
        assert_eq!(h.get(1, 4).map(|p| p.seq), Some(4));
        assert!(h.get(1, 2).is_none());
        assert!(h.take(1, 3));
        assert!(!h.is_empty());
        let rest: Vec<u64> = h.take_all().into_iter().map(|p| p.seq).collect();
        assert_eq!(rest, [4]);
        assert!(h.is_empty());
    }
}
