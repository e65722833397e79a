//! `Ready`: a queue's ready messages, in sequence order, with a bound on
//! what stays in memory. Past the bound, a queue keeps only a *tail*
//! descriptor (first sequence, count, bytes) and leaves the messages in
//! the store, whose keys are in queue order; they are read back in batches
//! as the head drains. So a backlog of millions costs disk, not RAM, and
//! memory stays flat. Every queue pages: a durable one under its store
//! id, a non-durable one under a local id (store/local.rs), its messages
//! as transient ones that a restart drops.
//!
//! Invariant: every message in memory has a smaller sequence than every
//! message in the tail, so order is the sequence order throughout.
//!
//! A priority queue (x-max-priority) orders by priority, then sequence, and
//! keeps everything in memory.
//!
//! A message that expires in the middle is replaced by a tombstone (same
//! sequence, no body) instead of being shifted out, so expiry costs
//! O(log n) however long the queue; tombstones are skipped on the way out.

use std::collections::VecDeque;
use std::sync::Arc;

use super::Entry;
use crate::message::Message;
use crate::store::{self, Store};

/// Bodies kept in memory per queue before paging to the store.
const MEM_BYTES: usize = 16 << 20;
/// Messages kept in memory per queue before paging to the store.
const MEM_COUNT: usize = 64 * 1024;
/// Messages read back from the store at a time.
const REFILL: usize = 2048;
/// Tombstones behind a live head are swept out past this many.
const COMPACT_AT: usize = 1024;

/// The part of the queue that lives only in the store.
#[derive(Debug, Default, Clone, Copy)]
struct Tail {
    first_seq: u64,
    count: usize,
    bytes: usize,
}

/// Where paged messages go: the store and the queue's key prefix.
pub struct Pager<'a> {
    pub store: &'a Store,
    pub queue_id: u64,
}

/// Ready messages of one queue.
#[derive(Default)]
pub struct Ready {
    mem: VecDeque<Entry>,
    mem_bytes: usize,
    tail: Tail,
    /// Deadlines (TTL) of messages in the stored tail, by sequence.
    tail_deadlines: std::collections::HashMap<u64, u64>,
    /// When tail messages entered the queue: (first sequence, seconds),
    /// one run per second of arrivals.
    tail_times: VecDeque<(u64, u32)>,
    /// A message-ttl set after tail messages arrived: applied to each as
    /// it is read back (from when it entered the queue).
    tail_ttl: Option<u64>,
    /// x-max-priority (0: a plain FIFO queue).
    max_priority: u8,
    /// Tombstones in `mem` (expired in place).
    tombstones: usize,
    /// Messages up to this sequence were recovered as possibly delivered
    /// (queue/mod.rs `recover`): those read back from the stored tail keep
    /// the redelivered flag.
    redelivered_through: Option<u64>,
}

/// The shared empty message a tombstone points at.
fn empty_message() -> Arc<Message> {
    thread_local! {
        static EMPTY: Arc<Message> = Arc::new(Message::new(
            b"",
            b"",
            &[0, 0],
            &[],
            crate::message::Meta::default(),
        ));
    }
    EMPTY.with(Arc::clone)
}

/// The deadline of a message that entered its queue at `enqueued` (s)
/// under a message-ttl of `ttl` ms (never 0, which means none).
fn ttl_deadline(enqueued: u32, ttl: u64) -> u64 {
    (enqueued as u64 * 1000)
        .saturating_add(ttl)
        .clamp(1, TOMBSTONE - 1)
}

/// The earlier of two deadlines, where 0 is none.
fn earlier(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

/// The deadline that marks a tombstone.
const TOMBSTONE: u64 = u64::MAX;

impl Entry {
    fn is_tombstone(&self) -> bool {
        self.deadline == TOMBSTONE
    }
}

impl Ready {
    /// Ready messages of a queue with x-max-priority `max` (0 = none).
    pub fn with_max_priority(max: u8) -> Ready {
        Ready {
            max_priority: max,
            ..Ready::default()
        }
    }

    /// Delivery order: higher priority first, then sequence.
    fn rank(&self, e: &Entry) -> (u8, u64) {
        if self.max_priority == 0 {
            return (0, e.seq);
        }
        (u8::MAX - e.msg.meta.priority.min(self.max_priority), e.seq)
    }

    /// Messages ready, in memory and in the store.
    pub fn len(&self) -> usize {
        self.mem.len() - self.tombstones + self.tail.count
    }

    /// Body bytes of ready messages, in memory and in the store.
    pub fn bytes(&self) -> usize {
        self.mem_bytes + self.tail.bytes
    }

    /// Ready messages held in memory, and their body bytes.
    pub fn in_memory(&self) -> (usize, usize) {
        (self.mem.len() - self.tombstones, self.mem_bytes)
    }

    /// Ready messages only in the store (paged out), and their body bytes.
    pub fn paged_out(&self) -> (usize, usize) {
        (self.tail.count, self.tail.bytes)
    }

    /// About how many bytes of memory it holds: its entries, the messages
    /// they point at (counted in full, though a message routed to several
    /// queues is shared) and what it keeps of the paged-out tail.
    pub fn memory(&self) -> usize {
        let (n, bytes) = self.in_memory();
        self.mem.capacity() * std::mem::size_of::<Entry>()
            + n * Message::OVERHEAD
            + bytes
            + self.tail_deadlines.capacity() * (std::mem::size_of::<(u64, u64)>() + 1)
            + self.tail_times.capacity() * std::mem::size_of::<(u64, u32)>()
    }

    /// (deadline, seq) of every ready message with a TTL, and of the
    /// stored tail's head under a message-ttl set after it was paged (so a
    /// rebuilt expiry heap still reads the tail back for it).
    pub fn deadlines(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.mem
            .iter()
            .filter(|e| e.deadline != 0 && !e.is_tombstone())
            .map(|e| (e.deadline, e.seq))
            .chain(self.tail_deadlines.iter().map(|(s, d)| (*d, *s)))
            .chain(self.head_of_tail_deadline())
    }

    /// Removes the in-memory message with sequence `seq` (its TTL ran out).
    /// One in the stored tail is read back first (`read_through`).
    pub fn remove(&mut self, seq: u64) -> Option<Entry> {
        let at = if self.max_priority == 0 {
            self.mem.binary_search_by_key(&seq, |e| e.seq).ok()?
        } else {
            self.mem.iter().position(|e| e.seq == seq)?
        };
        let slot = self.mem.get_mut(at)?;
        if slot.is_tombstone() {
            return None;
        }
        let tombstone = Entry {
            msg: empty_message(),
            seq,
            redelivered: false,
            stored: false,
            deadline: TOMBSTONE,
            enqueued: 0,
            returned: 0,
        };
        let e = std::mem::replace(slot, tombstone);
        self.tombstones += 1;
        self.mem_bytes -= e.msg.body().len();
        // Tombstones at the head go at once: in a queue nobody consumes,
        // nothing else pops them, and memory full of them left no room
        // to read the paged tail back, so its messages never expired.
        while self.mem.front().is_some_and(Entry::is_tombstone) {
            self.mem.pop_front();
            self.tombstones -= 1;
        }
        // Those behind a live head go once they are half of memory (each
        // sweep pays for the tombstones made since the last), so a head
        // that never expires cannot pile them up without bound.
        if self.tombstones > COMPACT_AT && 2 * self.tombstones > self.mem.len() {
            self.mem.retain(|e| !e.is_tombstone());
            self.tombstones = 0;
        }
        Some(e)
    }

    /// Whether memory has room to read more of the stored tail back for
    /// expiry: live messages (not tombstones) under twice the bound.
    pub fn has_room(&self) -> bool {
        self.mem_bytes < 2 * MEM_BYTES && self.mem.len() - self.tombstones < 2 * MEM_COUNT
    }

    fn over_bound(&self) -> bool {
        self.mem_bytes >= MEM_BYTES || self.mem.len() >= MEM_COUNT
    }

    /// Whether a message appended now with a pager goes to the store only.
    pub fn pages_next(&self) -> bool {
        self.max_priority == 0 && (self.tail.count > 0 || self.over_bound())
    }

    /// Appends a new message. With a pager, past the memory bound the
    /// message goes to the store only (written there now if it was not).
    pub fn push_back(&mut self, entry: Entry, pager: Option<&Pager<'_>>) -> store::Result<()> {
        if self.max_priority != 0 {
            self.insert_sorted(entry);
            return Ok(());
        }
        if let Some(p) = pager {
            if self.pages_next() {
                if !entry.stored {
                    p.store
                        .put_paged(p.queue_id, entry.seq, &entry.msg, entry.deadline)?;
                }
                if entry.deadline != 0 {
                    self.tail_deadlines.insert(entry.seq, entry.deadline);
                }
                self.add_to_tail(entry.seq, entry.msg.body().len(), entry.enqueued);
                return Ok(());
            }
        }
        self.mem_bytes += entry.msg.body().len();
        self.mem.push_back(entry);
        Ok(())
    }

    /// Accounts for a message that is already in the store (recovery):
    /// kept in memory while under the bound, else left in the tail.
    pub fn push_recovered(&mut self, entry: Entry) {
        if self.max_priority != 0 {
            self.insert_sorted(entry);
            return;
        }
        if self.tail.count > 0 || self.over_bound() {
            if entry.deadline != 0 {
                self.tail_deadlines.insert(entry.seq, entry.deadline);
            }
            self.add_to_tail(entry.seq, entry.msg.body().len(), entry.enqueued);
        } else {
            self.mem_bytes += entry.msg.body().len();
            self.mem.push_back(entry);
        }
    }

    /// A recovered message left in the store, known by its seq, body
    /// length and deadline only: the tail began (`paged_out`), so it goes
    /// after it, and is read back as the head drains.
    pub fn push_recovered_tail(&mut self, seq: u64, body_len: usize, deadline: u64, enqueued: u32) {
        if deadline != 0 {
            self.tail_deadlines.insert(seq, deadline);
        }
        self.add_to_tail(seq, body_len, enqueued);
    }

    /// Messages up to `seq` were recovered as possibly delivered: they
    /// come back from the stored tail flagged redelivered.
    pub fn redelivered_through(&mut self, seq: u64) {
        self.redelivered_through = Some(seq);
    }

    fn add_to_tail(&mut self, seq: u64, bytes: usize, enqueued: u32) {
        if self.tail.count == 0 {
            self.tail.first_seq = seq;
        }
        if self.tail_times.back().is_none_or(|&(_, t)| t != enqueued) {
            self.tail_times.push_back((seq, enqueued));
        }
        self.tail.count += 1;
        self.tail.bytes += bytes;
    }

    /// Takes the head message, reading the next batch from the store when
    /// memory has run dry.
    pub fn pop_front(&mut self, pager: Option<&Pager<'_>>) -> Option<Entry> {
        loop {
            if self.mem.is_empty() && self.tail.count > 0 {
                if let Some(p) = pager {
                    self.refill(p);
                }
            }
            let e = self.mem.pop_front()?;
            if e.is_tombstone() {
                self.tombstones -= 1;
                continue;
            }
            self.mem_bytes -= e.msg.body().len();
            return Some(e);
        }
    }

    /// Reads the next batch of the stored tail into memory; false if it
    /// read nothing.
    fn refill(&mut self, p: &Pager<'_>) -> bool {
        match p.store.load_range(p.queue_id, self.tail.first_seq, REFILL) {
            Ok(batch) => {
                let read = !batch.is_empty();
                for (seq, msg) in batch {
                    self.tail.count = self.tail.count.saturating_sub(1);
                    self.tail.bytes = self.tail.bytes.saturating_sub(msg.body().len());
                    self.tail.first_seq = seq + 1;
                    self.mem_bytes += msg.body().len();
                    while self.tail_times.get(1).is_some_and(|&(s, _)| s <= seq) {
                        self.tail_times.pop_front();
                    }
                    let enqueued = self.tail_times.front().map_or(0, |&(_, t)| t);
                    let mut deadline = self.tail_deadlines.remove(&seq).unwrap_or(0);
                    if let Some(ttl) = self.tail_ttl.filter(|_| enqueued != 0) {
                        deadline = earlier(deadline, ttl_deadline(enqueued, ttl));
                    }
                    self.mem.push_back(Entry {
                        msg,
                        seq,
                        redelivered: self.redelivered_through.is_some_and(|r| seq <= r),
                        stored: true,
                        deadline,
                        enqueued,
                        returned: 0,
                    });
                }
                if !read {
                    // The store has fewer than we counted: forget the rest.
                    self.tail = Tail::default();
                }
                if self.tail.count == 0 {
                    self.tail_times.clear();
                    self.tail_ttl = None;
                }
                read
            }
            Err(e) => {
                tracing::error!(queue_id = p.queue_id, "cannot read paged messages: {e}");
                false
            }
        }
    }

    /// Whether message `seq` is in the stored tail.
    pub fn in_tail(&self, seq: u64) -> bool {
        self.tail.count > 0 && seq >= self.tail.first_seq
    }

    /// A TTL ran out at `seq`, in the stored tail: reads the next batch of
    /// the tail's head into memory, toward it, while memory has room
    /// (`has_room`; without it the caller keeps the deadline aside and
    /// tries again once consumers or expiry make room); the caller comes
    /// back while `seq` is still in the tail, within its bounded pass.
    /// Returns, if it read anything, the (deadline, seq) of what it read
    /// that has a deadline, and of the tail's new head where a message-ttl
    /// set after paging gives one, for the expiry heap. Without it a queue
    /// nobody consumes kept every message paged out past its TTL for good.
    pub fn read_through(&mut self, seq: u64, p: &Pager<'_>) -> Option<Vec<(u64, u64)>> {
        let from = self.mem.len();
        if !(self.in_tail(seq) && self.has_room() && self.refill(p)) {
            return None;
        }
        let mut due: Vec<(u64, u64)> = self
            .mem
            .range(from..)
            .filter(|e| e.deadline != 0)
            .map(|e| (e.deadline, e.seq))
            .collect();
        due.extend(self.head_of_tail_deadline());
        Some(due)
    }

    /// When the tail's head runs out under a message-ttl set after it was
    /// paged (its messages get their deadlines only when read back).
    fn head_of_tail_deadline(&self) -> Option<(u64, u64)> {
        let ttl = self.tail_ttl.filter(|_| self.tail.count > 0)?;
        let &(_, enqueued) = self.tail_times.front().filter(|(_, t)| *t != 0)?;
        Some((ttl_deadline(enqueued, ttl), self.tail.first_seq))
    }

    /// Puts a message back at the head (a delivery that did not happen).
    pub fn push_front(&mut self, entry: Entry) {
        self.mem_bytes += entry.msg.body().len();
        self.mem.push_front(entry);
    }

    /// Puts a requeued message back at its place by sequence. Requeued
    /// messages were in memory before, so they sort before the tail.
    pub fn insert_sorted(&mut self, entry: Entry) {
        self.mem_bytes += entry.msg.body().len();
        let rank = self.rank(&entry);
        let at = self.mem.partition_point(|e| self.rank(e) < rank);
        self.mem.insert(at, entry);
    }

    /// A message-ttl of `ttl` ms now applies: every ready message that
    /// entered the queue longer ago than that expires, the others by then
    /// (earlier deadlines stay). Returns the (deadline, seq) of in-memory
    /// messages whose deadline moved, for the expiry heap; messages in the
    /// stored tail get theirs as they are read back (and the tail's head
    /// one, so the expiry timer reads them back: `read_through`).
    pub fn retime(&mut self, ttl: u64) -> Vec<(u64, u64)> {
        let mut moved = Vec::new();
        for e in self.mem.iter_mut() {
            // 0: when it arrived is not known (never from a push or a
            // recovery, which both record it); leave it be.
            if e.is_tombstone() || e.enqueued == 0 {
                continue;
            }
            let d = earlier(e.deadline, ttl_deadline(e.enqueued, ttl));
            if d != e.deadline {
                e.deadline = d;
                moved.push((d, e.seq));
            }
        }
        if self.tail.count > 0 {
            self.tail_ttl = Some(self.tail_ttl.map_or(ttl, |t| t.min(ttl)));
        }
        moved.extend(self.head_of_tail_deadline());
        moved
    }

    /// Removes every ready message: returns the in-memory ones and the
    /// first sequence of the stored tail, if there is one.
    pub fn clear(&mut self) -> (Vec<Entry>, Option<u64>) {
        let tail = (self.tail.count > 0).then_some(self.tail.first_seq);
        self.tail = Tail::default();
        self.tail_deadlines.clear();
        self.tail_times.clear();
        self.tail_ttl = None;
        self.mem_bytes = 0;
        self.tombstones = 0;
        (
            self.mem.drain(..).filter(|e| !e.is_tombstone()).collect(),
            tail,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, Meta};
    use std::sync::Arc;

    fn entry(seq: u64, persistent: bool) -> Entry {
        let msg = Message::new(
            b"",
            b"q",
            if persistent { &[0x10, 0, 2] } else { &[0, 0] },
            &seq.to_be_bytes(),
            Meta::default().with_delivery_mode(if persistent { 2 } else { 0 }),
        );
        Entry {
            msg: Arc::new(msg),
            seq,
            redelivered: false,
            stored: false,
            deadline: 0,
            enqueued: 0,
            returned: 0,
        }
    }

    #[test]
    fn a_later_ttl_counts_from_when_each_message_arrived_in_memory_and_in_the_tail() {
        let store = Store::temporary().unwrap();
        let pager = Pager {
            store: &store,
            queue_id: 4,
        };
        let mut r = Ready::default();
        let n = MEM_COUNT as u64 + 10;
        for seq in 1..=n {
            // Arrived at second 100 + seq / 1000; one early deadline.
            let e = Entry {
                enqueued: 100 + (seq / 1000) as u32,
                deadline: if seq == 2 { 5 } else { 0 },
                ..entry(seq, true)
            };
            r.push_back(e, Some(&pager)).unwrap();
        }
        let moved = r.retime(1000);
        assert_eq!(
            moved.len(),
            MEM_COUNT,
            "all in memory but the earlier one, and the tail's head"
        );
        assert!(moved.contains(&(101_000, 1)));
        let head = MEM_COUNT as u64 + 1;
        let arrived = 100 + (head / 1000) as u32;
        assert!(moved.contains(&(ttl_deadline(arrived, 1000), head)));
        let first = r.pop_front(Some(&pager)).unwrap();
        assert_eq!(first.deadline, 101_000);
        assert_eq!(
            r.pop_front(Some(&pager)).unwrap().deadline,
            5,
            "an earlier deadline stays"
        );
        for _ in 3..=MEM_COUNT as u64 {
            r.pop_front(Some(&pager)).unwrap();
        }
        // The tail, read back: each from its own arrival.
        let e = r.pop_front(Some(&pager)).unwrap();
        assert_eq!(e.seq, MEM_COUNT as u64 + 1);
        assert_eq!(e.enqueued, 100 + (e.seq / 1000) as u32);
        assert_eq!(e.deadline, e.enqueued as u64 * 1000 + 1000);
    }

    #[test]
    fn a_deadline_in_the_tail_reads_the_tail_back_through_it() {
        let store = Store::temporary().unwrap();
        let pager = Pager {
            store: &store,
            queue_id: 5,
        };
        let mut r = Ready::default();
        let n = MEM_COUNT as u64 + 10;
        for seq in 1..=n {
            let e = Entry {
                deadline: 1000 + seq,
                ..entry(seq, true)
            };
            r.push_back(e, Some(&pager)).unwrap();
        }
        let deep = MEM_COUNT as u64 + 5;
        assert!(r.in_tail(deep) && r.remove(deep).is_none());
        // One batch (REFILL) holds the whole tail here.
        let read = r.read_through(deep, &pager).expect("read");
        assert_eq!(read.len(), 10, "the whole tail, with its deadlines");
        assert!(read.contains(&(1000 + deep, deep)));
        assert!(!r.in_tail(deep));
        assert_eq!(r.remove(deep).map(|e| e.seq), Some(deep));
        assert_eq!(r.len(), n as usize - 1);
    }

    #[test]
    fn pages_past_the_bound_and_reads_back_in_order() {
        let store = Store::temporary().unwrap();
        let pager = Pager {
            store: &store,
            queue_id: 9,
        };
        let mut r = Ready::default();
        let n = MEM_COUNT as u64 + 5000;
        for seq in 1..=n {
            r.push_back(entry(seq, seq % 2 == 0), Some(&pager)).unwrap();
        }
        assert_eq!(r.len() as u64, n);
        assert_eq!(r.mem.len(), MEM_COUNT);
        // A requeued head message goes back before everything else.
        let first = r.pop_front(Some(&pager)).unwrap();
        assert_eq!(first.seq, 1);
        r.insert_sorted(first);
        for seq in 1..=n {
            let e = r.pop_front(Some(&pager)).unwrap();
            assert_eq!(e.seq, seq);
            assert_eq!(e.msg.body(), &seq.to_be_bytes());
        }
        assert!(r.pop_front(Some(&pager)).is_none());
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn without_a_pager_everything_stays_in_memory() {
        let mut r = Ready::default();
        for seq in 1..=(MEM_COUNT as u64 + 10) {
            r.push_back(entry(seq, false), None).unwrap();
        }
        assert_eq!(r.mem.len(), MEM_COUNT + 10);
        let (all, tail) = r.clear();
        assert_eq!(all.len(), MEM_COUNT + 10);
        assert_eq!(tail, None);
    }
}

#[cfg(test)]
mod priority_tests {
    use super::*;
    use crate::message::{Message, Meta};
    use std::sync::Arc;

    fn entry(seq: u64, priority: u8) -> Entry {
        let msg = Message::new(
            b"",
            b"",
            &[0, 0],
            &[],
            Meta::default().with_priority(priority),
        );
        Entry {
            msg: Arc::new(msg),
            seq,
            redelivered: false,
            stored: false,
            deadline: 0,
            enqueued: 0,
            returned: 0,
        }
    }

    #[test]
    fn higher_priority_first_then_fifo() {
        let mut r = Ready::with_max_priority(5);
        for (seq, p) in [(1, 0), (2, 5), (3, 9), (4, 1), (5, 5)] {
            r.push_back(entry(seq, p), None).unwrap();
        }
        let order: Vec<u64> = std::iter::from_fn(|| r.pop_front(None))
            .map(|e| e.seq)
            .collect();
        // 9 is capped at 5, so it is a 5 that came third.
        assert_eq!(order, vec![2, 3, 5, 4, 1]);
    }
}

#[cfg(test)]
mod expiry_tests {
    use super::*;
    use crate::message::{Message, Meta};

    fn entry(seq: u64) -> Entry {
        let msg = Message::new(b"", b"", &[0, 0], &[1u8; 10], Meta::default());
        Entry {
            msg: Arc::new(msg),
            seq,
            redelivered: false,
            stored: false,
            deadline: seq,
            enqueued: 0,
            returned: 0,
        }
    }

    #[test]
    fn expired_messages_leave_tombstones_that_are_skipped() {
        let mut r = Ready::default();
        for seq in 1..=10 {
            r.push_back(entry(seq), None).unwrap();
        }
        assert_eq!(r.remove(4).map(|e| e.seq), Some(4));
        assert_eq!(r.remove(7).map(|e| e.seq), Some(7));
        assert!(r.remove(7).is_none(), "already gone");
        assert_eq!(r.len(), 8);
        assert_eq!(r.bytes(), 80);
        assert!(r.deadlines().all(|(_, s)| s != 4 && s != 7));
        let first = r.pop_front(None).unwrap();
        r.insert_sorted(first);
        let order: Vec<u64> = std::iter::from_fn(|| r.pop_front(None))
            .map(|e| e.seq)
            .collect();
        assert_eq!(order, vec![1, 2, 3, 5, 6, 8, 9, 10]);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn messages_expired_at_the_head_leave_no_tombstones() {
        let mut r = Ready::default();
        for seq in 1..=10 {
            r.push_back(entry(seq), None).unwrap();
        }
        assert!(r.remove(2).is_some());
        assert_eq!(r.mem.len(), 10, "a tombstone behind a live head stays");
        assert!(r.remove(1).is_some());
        assert_eq!(r.mem.len(), 8, "the head's tombstones go with it");
        for seq in 3..=10 {
            assert!(r.remove(seq).is_some());
        }
        assert!(r.mem.is_empty(), "room to read a paged tail back");
        assert_eq!((r.tombstones, r.len()), (0, 0));
    }

    #[test]
    fn tombstones_behind_a_live_head_are_swept_and_leave_room() {
        let mut r = Ready::default();
        let n = 2 * MEM_COUNT as u64;
        for seq in 1..=n {
            r.push_back(entry(seq), None).unwrap();
        }
        assert!(!r.has_room(), "twice the bound of live messages");
        for seq in 2..=n {
            assert!(r.remove(seq).is_some());
        }
        assert!(r.has_room(), "tombstones take no room");
        assert!(
            r.mem.len() <= 2 * COMPACT_AT + 1,
            "swept: {} entries left for one live message",
            r.mem.len()
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r.pop_front(None).map(|e| e.seq), Some(1));
        assert!(r.pop_front(None).is_none());
    }
}
