//! The message log's index, in memory: where each stored message of each
//! queue lies, and how many live messages each segment holds. Built by
//! reading the log at open, kept by every write after.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::slots::{Slots, Unpackable};

/// Where a stored message lies in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// The record that put it in its queue (a PUT, a REF or a MOVE).
    pub rec: u64,
    /// The record that holds its bytes: the same but for a REF, whose
    /// PUT is in the same segment.
    pub body: u64,
    /// Where the message lies in that record's payload, and its length.
    pub at: u32,
    pub len: u32,
    /// The message's body length, and whether it has a deadline: what a
    /// queue's recovery needs of the messages it leaves in the log.
    pub body_len: u32,
    pub timed: bool,
}

/// What one segment holds that is still wanted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// Live messages whose record is in it.
    pub entries: u64,
}

/// Every queue's stored messages, and every segment's live count.
#[derive(Default)]
pub struct Index {
    queues: FxHashMap<u64, Slots>,
    /// Every segment by its first position.
    segs: BTreeMap<u64, Seg>,
    live_bytes: u64,
}

impl Index {
    /// Notes a segment (appends reached it, or the open found it).
    pub fn segment(&mut self, base: u64) {
        self.segs.entry(base).or_default();
    }

    fn count(&mut self, loc: &Loc, add: bool) {
        let len = u64::from(loc.len);
        let Some((_, seg)) = self.segs.range_mut(..=loc.rec).next_back() else {
            return;
        };
        if add {
            seg.entries += 1;
            self.live_bytes += len;
        } else {
            seg.entries = seg.entries.saturating_sub(1);
            self.live_bytes = self.live_bytes.saturating_sub(len);
        }
    }

    /// Message `seq` of `queue` is at `loc` (a put, or a copy that moved
    /// it: the last record wins). Refused if `loc` cannot be kept (a
    /// message longer than `slots::MAX_LEN`, which puts check for first).
    pub fn insert(&mut self, queue: u64, seq: u64, loc: Loc) -> Result<(), Unpackable> {
        let old = self.queues.entry(queue).or_default().insert(seq, &loc);
        let old = match old {
            Ok(old) => old,
            Err(e) => {
                if self.queues.get(&queue).is_some_and(Slots::is_empty) {
                    self.queues.remove(&queue);
                }
                return Err(e);
            }
        };
        if let Some(old) = old {
            self.count(&old, false);
        }
        self.count(&loc, true);
        Ok(())
    }

    /// Inserts messages of `queue` as `insert` does, each at its `Loc`,
    /// all in the record at `rec` (one MOVE's), in ascending seq order
    /// for speed (any order is right). Refused at the first that cannot
    /// be kept; those before it stay.
    pub fn insert_run(
        &mut self,
        queue: u64,
        rec: u64,
        run: &[(u64, Loc)],
    ) -> Result<(), Unpackable> {
        let Index {
            queues,
            segs,
            live_bytes,
        } = self;
        let mut gone = Vec::new();
        let slots = queues.entry(queue).or_default();
        let done = slots.insert_run(run, |old| gone.push(old));
        if slots.is_empty() {
            queues.remove(&queue);
        }
        // Those before a refused one are kept.
        let kept = match done {
            Ok(()) => run,
            Err((n, _)) => &run[..n],
        };
        let added = kept.len() as u64;
        let bytes: u64 = kept.iter().map(|(_, l)| u64::from(l.len)).sum();
        // As `count` does for each: all are in the record at `rec`.
        if let Some((_, seg)) = segs.range_mut(..=rec).next_back() {
            seg.entries += added;
            *live_bytes += bytes;
        }
        for old in gone {
            self.count(&old, false);
        }
        done.map_err(|(_, e)| e)
    }

    /// Forgets message `seq` of `queue`; whether it was stored.
    pub fn remove(&mut self, queue: u64, seq: u64) -> bool {
        let Some(q) = self.queues.get_mut(&queue) else {
            return false;
        };
        let Some(old) = q.remove(seq) else {
            return false;
        };
        if q.is_empty() {
            self.queues.remove(&queue);
        }
        self.count(&old, false);
        true
    }

    /// Forgets every message of `queue` from `from` on; how many went.
    /// The segments' counts are taken down a run at a time: a deleted
    /// stream's millions of messages lie in order, segment after segment.
    pub fn remove_from(&mut self, queue: u64, from: u64) -> usize {
        let Some(mut q) = self.queues.remove(&queue) else {
            return 0;
        };
        let mut n = 0;
        // The segment of the run (its base and the next one's), and what
        // the run took from it.
        let mut run: Option<(u64, u64)> = None;
        let (mut entries, mut bytes) = (0u64, 0u64);
        let segs = &mut self.segs;
        let settle = |segs: &mut BTreeMap<u64, Seg>, base: u64, entries: u64, bytes: u64| {
            if let Some(seg) = segs.get_mut(&base) {
                seg.entries = seg.entries.saturating_sub(entries);
            }
            bytes
        };
        let mut freed = 0u64;
        q.remove_from(from, |loc| {
            n += 1;
            let inside = run.is_some_and(|(base, next)| loc.rec >= base && loc.rec < next);
            if !inside {
                if let Some((base, _)) = run {
                    freed += settle(segs, base, entries, bytes);
                }
                (entries, bytes) = (0, 0);
                run = segs.range(..=loc.rec).next_back().map(|(&base, _)| {
                    let next = segs
                        .range(loc.rec + 1..)
                        .next()
                        .map_or(u64::MAX, |(&b, _)| b);
                    (base, next)
                });
            }
            if run.is_some() {
                entries += 1;
                bytes += u64::from(loc.len);
            }
        });
        if let Some((base, _)) = run {
            freed += settle(segs, base, entries, bytes);
        }
        self.live_bytes = self.live_bytes.saturating_sub(freed);
        if !q.is_empty() {
            self.queues.insert(queue, q);
        }
        n
    }

    /// Where message `seq` of `queue` lies.
    pub fn get(&self, queue: u64, seq: u64) -> Option<Loc> {
        self.queues.get(&queue)?.get(seq)
    }

    /// The first and the last stored message of `queue`.
    pub fn bounds(&self, queue: u64) -> Option<(u64, u64)> {
        self.queues.get(&queue)?.bounds()
    }

    /// Up to `n` messages of `queue` from `from` on, in order.
    pub fn range(&self, queue: u64, from: u64, n: usize) -> Vec<(u64, Loc)> {
        let mut out = Vec::new();
        if let Some(q) = self.queues.get(&queue) {
            q.range(from, n, &mut out);
        }
        out
    }

    /// The queues with stored messages.
    pub fn queue_ids(&self) -> Vec<u64> {
        self.queues.keys().copied().collect()
    }

    /// The first position still wanted: the first segment holding a live
    /// message, or `active`'s (the segment appends go to) if none does.
    /// What lies below it is dead.
    pub fn wanted_from(&self, active: u64) -> u64 {
        self.segs
            .range(..active)
            .find(|(_, s)| s.entries > 0)
            .map_or(active, |(b, _)| *b)
    }

    /// Forgets the segments that begin below `pos` (removed).
    pub fn forget_below(&mut self, pos: u64) {
        self.segs = self.segs.split_off(&pos);
    }

    /// The bytes of every live message.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(rec: u64) -> Loc {
        Loc {
            rec,
            body: rec,
            at: 0,
            len: 10,
            body_len: 4,
            timed: false,
        }
    }

    /// A run inserted at once counts as its messages inserted one by one,
    /// replacements included.
    #[test]
    fn a_run_counts_as_its_messages_one_by_one() {
        let build = || {
            let mut ix = Index::default();
            for base in [0, 1000, 2000] {
                ix.segment(base);
            }
            for seq in 1..=10u64 {
                ix.insert(7, seq, loc(seq)).unwrap();
            }
            ix
        };
        // Seqs 6..=25 in one record of the second segment: five replace.
        let run = || (6..=25u64).map(|seq| (seq, loc(1500)));
        let mut one_by_one = build();
        for (seq, l) in run() {
            one_by_one.insert(7, seq, l).unwrap();
        }
        let mut at_once = build();
        at_once
            .insert_run(7, 1500, &run().collect::<Vec<_>>())
            .unwrap();
        assert_eq!(at_once.segs, one_by_one.segs);
        assert_eq!(at_once.live_bytes(), one_by_one.live_bytes());
        assert_eq!(at_once.range(7, 0, 100), one_by_one.range(7, 0, 100));
        assert_eq!(at_once.live_bytes(), 25 * 10);
    }

    /// Removing a run takes each segment's count down by what it held,
    /// as removing one at a time does.
    #[test]
    fn a_removed_run_leaves_each_segment_its_count() {
        let build = || {
            let mut ix = Index::default();
            for base in [0, 1000, 2000, 3000] {
                ix.segment(base);
            }
            for seq in 1..=40u64 {
                // Ten messages a segment, the queue's and another's mixed.
                ix.insert(7, seq, loc((seq - 1) / 10 * 1000 + seq)).unwrap();
                ix.insert(8, seq, loc((seq - 1) / 10 * 1000 + 500 + seq))
                    .unwrap();
            }
            ix
        };
        let mut one_by_one = build();
        for seq in 15..=40 {
            assert!(one_by_one.remove(7, seq));
        }
        let mut run = build();
        assert_eq!(run.remove_from(7, 15), 26);
        assert_eq!(run.segs, one_by_one.segs);
        assert_eq!(run.live_bytes(), one_by_one.live_bytes());
        assert_eq!(run.live_bytes(), (14 + 40) * 10);
        assert_eq!(run.range(7, 0, 100).len(), 14);
    }
}
