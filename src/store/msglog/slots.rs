//! One queue's part of the index: where each of its stored messages lies,
//! its body's length and whether it has a deadline, packed into 24 bytes
//! a message (against about 45 in a `BTreeMap<u64, Loc>`): 5M messages
//! take about 120 MB, twice that at the most before sweeps.
//!
//! The seqs are kept in chunks of up to `CHUNK` slots, sorted, each chunk
//! keyed by a seq at or below its first (its first when it was made) and
//! its slots holding the seq as an offset from it. A message goes by marking its slot dead; a chunk is swept once
//! more than half of it is dead (so the usual ack at the head costs no
//! shifting), merged into the chunk before it once small, and dropped once
//! nothing in it is live. Memory stays within about twice the live slots,
//! plus a small cost per chunk.
//!
//! A `Loc` packs because of how the log writes: a PUT's message is at a
//! fixed place in its own record; a REF's body is a PUT of the same
//! segment (a u32 back); a MOVE's messages lie at an offset of its own
//! payload (a u32). The length keeps the kind in its two top bits.
//!
//! A stream protocol batch (a CHUNK record) is one chunk of its own, a
//! `Run`: its messages lie one after the other in one record, each behind
//! a 4-byte length, so each costs only where it starts (4 bytes) and the
//! record's place is kept once. A run is written when its batch lands
//! above every seq the queue has a slot for (a gone message's too, until
//! its chunk is swept: each chunk's slots stay below the next one's key);
//! anything that would change one of its messages but the first (a put
//! over it, a removal inside it) first turns it into slots.

use std::collections::BTreeMap;

use super::index::Loc;
use super::record::{chunk_next_at, PUT_MESSAGE_AT};

/// Slots per chunk, at the most.
const CHUNK: usize = 1024;
/// A chunk with fewer live slots than this is merged into the one before.
const SMALL: usize = CHUNK / 8;

/// The longest message a slot can say (the kind takes two bits).
pub const MAX_LEN: u32 = (1 << 30) - 1;

const KIND_SHIFT: u32 = 30;
/// A slot whose message went.
const DEAD: u32 = 0;
/// At `PUT_MESSAGE_AT` of its own record.
const OWN: u32 = 1;
/// At `PUT_MESSAGE_AT` of a record `aux` bytes before its own.
const BACK: u32 = 2;
/// At `aux` of its own record.
const AT: u32 = 3;
/// In `body`: the message has a deadline.
const TIMED: u32 = 1 << 31;

#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Slot {
    off: u32,
    rec_lo: u32,
    rec_hi: u32,
    /// The message's length, and the kind in the two top bits.
    len_kind: u32,
    aux: u32,
    /// The body's length, and `TIMED`.
    body: u32,
}

impl Slot {
    fn pack(off: u32, loc: &Loc) -> Option<Slot> {
        if loc.len > MAX_LEN || loc.body_len >= TIMED {
            return None;
        }
        let (kind, aux) = if loc.body == loc.rec {
            if loc.at == PUT_MESSAGE_AT {
                (OWN, 0)
            } else {
                (AT, loc.at)
            }
        } else if loc.at == PUT_MESSAGE_AT && loc.body < loc.rec {
            (BACK, u32::try_from(loc.rec - loc.body).ok()?)
        } else {
            return None;
        };
        Some(Slot {
            off,
            rec_lo: loc.rec as u32,
            rec_hi: (loc.rec >> 32) as u32,
            len_kind: loc.len | (kind << KIND_SHIFT),
            aux,
            body: loc.body_len | if loc.timed { TIMED } else { 0 },
        })
    }

    fn kind(&self) -> u32 {
        self.len_kind >> KIND_SHIFT
    }

    fn live(&self) -> bool {
        self.kind() != DEAD
    }

    fn loc(&self) -> Loc {
        let rec = u64::from(self.rec_lo) | (u64::from(self.rec_hi) << 32);
        let len = self.len_kind & MAX_LEN;
        let (body, at) = match self.kind() {
            BACK => (rec - u64::from(self.aux), PUT_MESSAGE_AT),
            AT => (rec, self.aux),
            _ => (rec, PUT_MESSAGE_AT),
        };
        Loc {
            rec,
            body,
            at,
            len,
            body_len: self.body & !TIMED,
            timed: self.body & TIMED != 0,
        }
    }
}

#[derive(Default)]
struct Chunk {
    slots: Vec<Slot>,
    live: usize,
}

impl Chunk {
    fn find(&self, off: u32) -> Result<usize, usize> {
        self.slots.binary_search_by_key(&off, |s| s.off)
    }

    /// Drops the dead slots.
    fn sweep(&mut self) {
        self.slots.retain(Slot::live);
    }
}

/// The messages of one record at consecutive seqs from the run's key,
/// each right after the one before and its 4-byte length (a CHUNK's
/// entries): `Loc { rec, body: rec, at, len, body_len: len, timed: false }`.
struct Run {
    rec: u64,
    /// Where each message starts in the record.
    ats: Box<[u32]>,
    /// The last message's length.
    last_len: u32,
    /// Messages gone from the front.
    skip: usize,
}

impl Run {
    /// `run` as a run, if it is one: two messages at least, consecutive
    /// seqs, each right after the one before in one record, with no
    /// deadline and nothing beside its body.
    fn of(run: &[(u64, Loc)]) -> Option<Run> {
        let (first, last) = (run.first()?, run.last()?);
        if run.len() < 2 {
            return None;
        }
        let rec = first.1.rec;
        let fits = |(_, l): &(u64, Loc)| {
            l.rec == rec && l.body == rec && !l.timed && l.len == l.body_len && l.len <= MAX_LEN
        };
        let packed = run.iter().all(fits)
            && run.windows(2).all(|w| {
                let (a, b) = (&w[0], &w[1]);
                a.0.checked_add(1) == Some(b.0) && chunk_next_at(a.1.at, a.1.len) == Some(b.1.at)
            });
        packed.then(|| Run {
            rec,
            ats: run.iter().map(|(_, l)| l.at).collect(),
            last_len: last.1.len,
            skip: 0,
        })
    }

    fn len(&self) -> usize {
        self.ats.len()
    }

    fn live(&self) -> usize {
        self.ats.len() - self.skip
    }

    /// Message `k` from the run's key.
    fn loc(&self, k: usize) -> Loc {
        let at = self.ats[k];
        let len = match self.ats.get(k + 1) {
            // The length before the next entry's bytes (`chunk_next_at`).
            Some(next) => next - at - 4,
            None => self.last_len,
        };
        Loc {
            rec: self.rec,
            body: self.rec,
            at,
            len,
            body_len: len,
            timed: false,
        }
    }

    /// Keeps the first `n` messages (`skip` < `n` < `len`).
    fn truncate(&mut self, n: usize) {
        self.last_len = self.loc(n - 1).len;
        self.ats = self.ats[..n].into();
    }
}

/// A chunk of slots, or a run.
enum Part {
    Slots(Chunk),
    Run(Run),
}

impl Part {
    #[cfg(test)]
    fn live(&self) -> usize {
        match self {
            Part::Slots(c) => c.live,
            Part::Run(r) => r.live(),
        }
    }

    /// Its live messages from offset `from` on, in order (at most `n`
    /// of them pushed onto `out`, each seq `base` + its offset); false
    /// once `out` holds `n`.
    fn range(&self, base: u64, from: u64, n: usize, out: &mut Vec<(u64, Loc)>) -> bool {
        match self {
            Part::Slots(chunk) => {
                let at = u32::try_from(from).map_or(chunk.slots.len(), |skip| {
                    chunk.find(skip).unwrap_or_else(|i| i)
                });
                for s in chunk.slots[at..].iter().filter(|s| s.live()) {
                    if out.len() >= n {
                        return false;
                    }
                    out.push((base + u64::from(s.off), s.loc()));
                }
            }
            Part::Run(r) => {
                let at = usize::try_from(from).map_or(r.len(), |f| f.max(r.skip));
                for k in at..r.len() {
                    if out.len() >= n {
                        return false;
                    }
                    out.push((base + k as u64, r.loc(k)));
                }
            }
        }
        true
    }

    /// Calls `f` with each live message's `Loc`, in order.
    fn each(&self, mut f: impl FnMut(&Loc)) {
        match self {
            Part::Slots(c) => c
                .slots
                .iter()
                .filter(|s| s.live())
                .for_each(|s| f(&s.loc())),
            Part::Run(r) => (r.skip..r.len()).for_each(|k| f(&r.loc(k))),
        }
    }

    /// The offsets of its first and last live message.
    fn ends(&self) -> Option<(u64, u64)> {
        match self {
            Part::Slots(c) => {
                let first = c.slots.iter().find(|s| s.live())?.off;
                let last = c.slots.iter().rev().find(|s| s.live())?.off;
                Some((u64::from(first), u64::from(last)))
            }
            Part::Run(r) => (r.live() > 0).then(|| (r.skip as u64, r.len() as u64 - 1)),
        }
    }
}

/// One queue's stored messages: seq to `Loc`.
#[derive(Default)]
pub struct Slots {
    chunks: BTreeMap<u64, Part>,
}

/// A `Loc` too long to keep (see `MAX_LEN`).
#[derive(Debug)]
pub struct Unpackable;

impl Slots {
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Message `seq` is at `loc`; where it was before, if it was stored.
    pub fn insert(&mut self, seq: u64, loc: &Loc) -> Result<Option<Loc>, Unpackable> {
        let Some((&base, part)) = self.chunks.range_mut(..=seq).next_back() else {
            return self.start(seq, loc).map(|()| None);
        };
        let chunk = match part {
            Part::Slots(chunk) => chunk,
            // Past a run's end: a chunk of its own.
            Part::Run(r) if seq - base >= r.len() as u64 => {
                return self.start(seq, loc).map(|()| None);
            }
            Part::Run(_) => {
                self.unpack(base);
                return self.insert(seq, loc);
            }
        };
        let Ok(off) = u32::try_from(seq - base) else {
            return self.start(seq, loc).map(|()| None);
        };
        let slot = Slot::pack(off, loc).ok_or(Unpackable)?;
        match chunk.find(off) {
            Ok(i) => {
                let old = std::mem::replace(&mut chunk.slots[i], slot);
                if old.live() {
                    return Ok(Some(old.loc()));
                }
                chunk.live += 1;
                Ok(None)
            }
            Err(i) if chunk.slots.len() < CHUNK => {
                chunk.slots.insert(i, slot);
                chunk.live += 1;
                Ok(None)
            }
            Err(_) if chunk.live < chunk.slots.len() => {
                chunk.sweep();
                let (Ok(i) | Err(i)) = chunk.find(off);
                chunk.slots.insert(i, slot);
                chunk.live += 1;
                Ok(None)
            }
            Err(i) if i == chunk.slots.len() => self.start(seq, loc).map(|()| None),
            Err(i) => {
                // Full and no dead slot: the upper half becomes a chunk of
                // its own, and the slot goes into whichever half it falls.
                let upper = chunk.slots.split_off(CHUNK / 2);
                let shift = upper[0].off;
                let mut moved = Chunk {
                    live: upper.len(),
                    slots: upper,
                };
                for s in &mut moved.slots {
                    s.off -= shift;
                }
                chunk.live -= moved.live;
                if i <= CHUNK / 2 {
                    chunk.slots.insert(i, slot);
                    chunk.live += 1;
                } else {
                    let mut s = slot;
                    s.off -= shift;
                    moved.slots.insert(i - CHUNK / 2, s);
                    moved.live += 1;
                }
                self.chunks
                    .insert(base + u64::from(shift), Part::Slots(moved));
                Ok(None)
            }
        }
    }

    /// Inserts each of `run` (in seq order) as `insert` does, `on_old`
    /// told of each it replaced; on a message it cannot keep, how many
    /// went in before it. A record's messages that make a `Run` and lie
    /// above every slot (`top`) go in as one. Otherwise a seq above every
    /// one stored goes on the end of the last chunk while it has room,
    /// with no lookup: a batch's messages, in order, cost one lookup, not
    /// one each.
    pub fn insert_run(
        &mut self,
        run: &[(u64, Loc)],
        mut on_old: impl FnMut(Loc),
    ) -> Result<(), (usize, Unpackable)> {
        if let Some(&(first, _)) = run.first() {
            if self.top().is_none_or(|top| top < first) {
                if let Some(packed) = Run::of(run) {
                    self.chunks.insert(first, Part::Run(packed));
                    return Ok(());
                }
            }
        }
        let mut last = self.chunks.last_entry();
        for (done, &(seq, loc)) in run.iter().enumerate() {
            if let Some(e) = last.as_mut() {
                let base = *e.key();
                if let Part::Slots(chunk) = e.get_mut() {
                    let off = seq.checked_sub(base).and_then(|o| u32::try_from(o).ok());
                    if let Some(off) = off.filter(|&off| {
                        chunk.slots.len() < CHUNK && chunk.slots.last().is_none_or(|s| s.off < off)
                    }) {
                        let slot = Slot::pack(off, &loc).ok_or((done, Unpackable))?;
                        chunk.slots.push(slot);
                        chunk.live += 1;
                        continue;
                    }
                }
            }
            if let Some(old) = self.insert(seq, &loc).map_err(|e| (done, e))? {
                on_old(old);
            }
            last = self.chunks.last_entry();
        }
        Ok(())
    }

    /// The highest seq any chunk holds a slot for, gone or not: a run
    /// starts above it, so every chunk's slots stay below the next
    /// chunk's key.
    fn top(&self) -> Option<u64> {
        let (&base, part) = self.chunks.last_key_value()?;
        Some(match part {
            Part::Slots(c) => base + u64::from(c.slots.last().map_or(0, |s| s.off)),
            Part::Run(r) => base + r.len() as u64 - 1,
        })
    }

    /// The last stored message's seq.
    fn last(&self) -> Option<u64> {
        self.chunks
            .iter()
            .rev()
            .find_map(|(&base, part)| Some(base + part.ends()?.1))
    }

    /// A new chunk holding `seq` alone.
    fn start(&mut self, seq: u64, loc: &Loc) -> Result<(), Unpackable> {
        let slot = Slot::pack(0, loc).ok_or(Unpackable)?;
        let mut slots = Vec::with_capacity(4);
        slots.push(slot);
        self.chunks
            .insert(seq, Part::Slots(Chunk { slots, live: 1 }));
        Ok(())
    }

    /// Turns the run at `base` into chunks of slots (a run's messages
    /// always pack: `Run::of`).
    fn unpack(&mut self, base: u64) {
        let Some(Part::Run(r)) = self.chunks.remove(&base) else {
            return;
        };
        let mut k = r.skip;
        while k < r.len() {
            let end = (k + CHUNK).min(r.len());
            let slots: Vec<Slot> = (k..end)
                .filter_map(|i| Slot::pack((i - k) as u32, &r.loc(i)))
                .collect();
            let live = slots.len();
            self.chunks
                .insert(base + k as u64, Part::Slots(Chunk { slots, live }));
            k = end;
        }
    }

    /// Forgets message `seq`; where it was, if it was stored.
    pub fn remove(&mut self, seq: u64) -> Option<Loc> {
        let (&base, part) = self.chunks.range_mut(..=seq).next_back()?;
        let chunk = match part {
            Part::Slots(chunk) => chunk,
            Part::Run(r) => {
                let k = usize::try_from(seq - base).ok().filter(|&k| k < r.len())?;
                if k < r.skip {
                    return None;
                }
                if k > r.skip {
                    self.unpack(base);
                    return self.remove(seq);
                }
                // The first: the usual way a stream's head goes.
                let loc = r.loc(k);
                r.skip += 1;
                if r.live() == 0 {
                    self.chunks.remove(&base);
                }
                return Some(loc);
            }
        };
        let off = u32::try_from(seq - base).ok()?;
        let i = chunk.find(off).ok()?;
        let slot = &mut chunk.slots[i];
        if !slot.live() {
            return None;
        }
        let loc = slot.loc();
        slot.len_kind = DEAD;
        chunk.live -= 1;
        if chunk.live == 0 {
            self.chunks.remove(&base);
        } else if chunk.live * 2 < chunk.slots.len() {
            chunk.sweep();
            chunk.slots.shrink_to(chunk.live.max(4));
            if chunk.live < SMALL {
                self.merge_back(base);
            }
        }
        Some(loc)
    }

    /// Moves the chunk at `base` into the one before it, if that has room
    /// and every offset still fits (neither is a run).
    fn merge_back(&mut self, base: u64) {
        let Some((&prev, Part::Slots(before))) = self.chunks.range(..base).next_back() else {
            return;
        };
        let Some(Part::Slots(this)) = self.chunks.get(&base) else {
            return;
        };
        let last = base + u64::from(this.slots.last().map_or(0, |s| s.off));
        if before.slots.len() + this.slots.len() > CHUNK || last - prev > u64::from(u32::MAX) {
            return;
        }
        let Some(Part::Slots(this)) = self.chunks.remove(&base) else {
            return;
        };
        let Some(Part::Slots(before)) = self.chunks.get_mut(&prev) else {
            return;
        };
        let shift = (base - prev) as u32;
        before.slots.extend(this.slots.iter().map(|s| Slot {
            off: s.off + shift,
            ..*s
        }));
        before.live += this.live;
    }

    /// Forgets every message from `from` on, telling `gone` where each
    /// was, in seq order.
    pub fn remove_from(&mut self, from: u64, mut gone: impl FnMut(&Loc)) {
        if let Some((&base, part)) = self.chunks.range_mut(..from).next_back() {
            let left = match part {
                Part::Slots(chunk) => {
                    // An offset too large for a slot: every slot is below `from`.
                    let at = u32::try_from(from - base).map_or(chunk.slots.len(), |cut| {
                        chunk.find(cut).unwrap_or_else(|i| i)
                    });
                    for s in chunk.slots.drain(at..).filter(Slot::live) {
                        chunk.live -= 1;
                        gone(&s.loc());
                    }
                    chunk.live
                }
                Part::Run(r) => {
                    let cut = usize::try_from(from - base).map_or(r.len(), |c| c.min(r.len()));
                    (cut.max(r.skip)..r.len()).for_each(|k| gone(&r.loc(k)));
                    if cut > r.skip && cut < r.len() {
                        r.truncate(cut);
                    }
                    cut.saturating_sub(r.skip)
                }
            };
            if left == 0 {
                self.chunks.remove(&base);
            }
        }
        for (_, part) in self.chunks.split_off(&from) {
            part.each(&mut gone);
        }
    }

    /// Where message `seq` lies.
    pub fn get(&self, seq: u64) -> Option<Loc> {
        let (&base, part) = self.chunks.range(..=seq).next_back()?;
        match part {
            Part::Slots(chunk) => {
                let off = u32::try_from(seq - base).ok()?;
                let slot = chunk.slots.get(chunk.find(off).ok()?)?;
                slot.live().then(|| slot.loc())
            }
            Part::Run(r) => {
                let k = usize::try_from(seq - base).ok()?;
                (k >= r.skip && k < r.len()).then(|| r.loc(k))
            }
        }
    }

    /// The first and the last stored message's seq.
    pub fn bounds(&self) -> Option<(u64, u64)> {
        let first = self
            .chunks
            .iter()
            .find_map(|(&base, part)| Some(base + part.ends()?.0))?;
        Some((first, self.last()?))
    }

    /// Up to `n` messages from `from` on, in order, into `out`.
    pub fn range(&self, from: u64, n: usize, out: &mut Vec<(u64, Loc)>) {
        let start = self
            .chunks
            .range(..=from)
            .next_back()
            .map_or(from, |(b, _)| *b);
        for (&base, part) in self.chunks.range(start..) {
            if !part.range(base, from.saturating_sub(base), n, out) {
                return;
            }
        }
    }

    /// Bytes of memory it holds, about (tests).
    #[cfg(test)]
    pub fn memory(&self) -> usize {
        self.chunks
            .values()
            .map(|part| {
                std::mem::size_of::<(u64, Part)>()
                    + match part {
                        Part::Slots(c) => c.slots.capacity() * std::mem::size_of::<Slot>(),
                        Part::Run(r) => r.len() * std::mem::size_of::<u32>(),
                    }
            })
            .sum()
    }

    /// Runs kept (tests).
    #[cfg(test)]
    fn runs(&self) -> usize {
        self.chunks
            .values()
            .filter(|p| matches!(p, Part::Run(_)))
            .count()
    }

    /// Live messages (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.chunks.values().map(Part::live).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(n: u64) -> Loc {
        match n % 3 {
            0 => Loc {
                rec: n << 20,
                body: n << 20,
                at: PUT_MESSAGE_AT,
                len: (n % 5000) as u32,
                body_len: (n % 4000) as u32,
                timed: n.is_multiple_of(2),
            },
            1 => Loc {
                rec: (n << 20) + 77,
                body: n << 20,
                at: PUT_MESSAGE_AT,
                len: 3,
                body_len: 0,
                timed: true,
            },
            _ => Loc {
                rec: n << 36,
                body: n << 36,
                at: 40 + (n % 100) as u32,
                len: MAX_LEN,
                body_len: (1 << 31) - 1,
                timed: false,
            },
        }
    }

    /// `n` messages from `seq` on as a CHUNK record at `rec` holds them:
    /// each right after the one before and its 4-byte length.
    fn entries(rec: u64, seq: u64, n: u64) -> Vec<(u64, Loc)> {
        let mut at = 41;
        (seq..seq + n)
            .map(|seq| {
                let len = (seq.wrapping_mul(2_654_435_761) % 3000) as u32;
                let l = Loc {
                    rec,
                    body: rec,
                    at,
                    len,
                    body_len: len,
                    timed: false,
                };
                at += len + 4;
                (seq, l)
            })
            .collect()
    }

    /// Random inserts, removals, purges and reads against a BTreeMap: seqs
    /// in order, out of order, far apart (past a u32 offset) and again
    /// after they went.
    #[test]
    fn matches_a_map() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut runs = 0;
        for round in 0..20 {
            let mut slots = Slots::default();
            let mut model = BTreeMap::new();
            let mut head = 0u64;
            let mut tail = 0u64;
            for _ in 0..30_000 {
                let r = next();
                match r % 100 {
                    0..=49 => {
                        tail += if r % 1000 == 7 {
                            1 << 33
                        } else {
                            1 + (r >> 40) % 2
                        };
                        let l = loc(r >> 8);
                        assert_eq!(slots.insert(tail, &l).ok(), Some(model.insert(tail, l)));
                    }
                    50..=59 => {
                        let seq = head + (r >> 8) % (tail - head + 1);
                        let l = loc(r >> 12);
                        assert_eq!(slots.insert(seq, &l).ok(), Some(model.insert(seq, l)));
                    }
                    60..=84 => {
                        let seq = model.keys().next().copied().unwrap_or(head);
                        head = seq;
                        assert_eq!(slots.remove(seq), model.remove(&seq));
                    }
                    85..=96 => {
                        let seq = head + (r >> 8) % (tail - head + 1);
                        assert_eq!(slots.remove(seq), model.remove(&seq));
                        assert_eq!(slots.get(seq), None);
                    }
                    97 if round % 2 == 0 => {
                        let from = head + (r >> 8) % (tail - head + 1);
                        let mut gone = Vec::new();
                        slots.remove_from(from, |l| gone.push(*l));
                        let want: Vec<Loc> = model.split_off(&from).into_values().collect();
                        assert_eq!(gone, want);
                    }
                    97 => {
                        // A run: past the end, past the last stored
                        // (over the slots of gone ones), or over what is
                        // stored.
                        let start = match r % 3 {
                            0 => head + (r >> 8) % (tail - head + 1),
                            1 => model.keys().next_back().map_or(tail, |l| l + 1),
                            _ => tail + 1,
                        };
                        let n = 1 + (r >> 20) % 600;
                        let run: Vec<(u64, Loc)> = match (r >> 30) % 3 {
                            0 => (start..start + n)
                                .map(|seq| (seq, loc(r >> 12 ^ seq)))
                                .collect(),
                            // A CHUNK's entries: a run.
                            _ => entries(r >> 8, start, n),
                        };
                        let mut olds = Vec::new();
                        slots.insert_run(&run, |o| olds.push(o)).unwrap();
                        let want: Vec<Loc> = run
                            .into_iter()
                            .filter_map(|(seq, l)| model.insert(seq, l))
                            .collect();
                        assert_eq!(olds, want);
                        tail = tail.max(start + n - 1);
                    }
                    _ => {
                        let from = head + (r >> 8) % (tail - head + 1);
                        let n = 1 + (r >> 32) as usize % 3000;
                        let mut got = Vec::new();
                        slots.range(from, n, &mut got);
                        let want: Vec<(u64, Loc)> =
                            model.range(from..).take(n).map(|(s, l)| (*s, *l)).collect();
                        assert_eq!(got, want);
                        assert_eq!(slots.get(from), model.get(&from).copied());
                    }
                }
                assert_eq!(slots.len(), model.len());
                assert_eq!(slots.is_empty(), model.is_empty());
                let ends = model.keys().next().zip(model.keys().next_back());
                assert_eq!(slots.bounds(), ends.map(|(a, b)| (*a, *b)));
                runs = runs.max(slots.runs());
            }
        }
        assert!(runs > 2, "runs were made: {runs}");
    }

    /// A backlog costs about 24 bytes a message, and acking it at the
    /// head gives the memory back.
    #[test]
    fn a_backlog_is_small() {
        let mut slots = Slots::default();
        let n = 1_000_000u64;
        for seq in 1..=n {
            slots.insert(seq, &loc(seq * 3)).ok();
        }
        let per = slots.memory() as f64 / n as f64;
        assert!(per < 25.0, "{per} bytes a message");
        for seq in 1..=n - 10 {
            assert!(slots.remove(seq).is_some());
        }
        assert!(slots.memory() < 2048, "{}", slots.memory());
        // One message in a thousand left: each keeps at most a small chunk.
        let mut slots = Slots::default();
        for seq in 1..=n {
            slots.insert(seq, &loc(seq * 3)).ok();
        }
        for seq in 1..=n {
            if seq % 1000 != 0 {
                slots.remove(seq);
            }
        }
        assert_eq!(slots.len(), 1000);
        assert!(slots.memory() < 1000 * 100, "{}", slots.memory());
    }

    /// A stream's batches cost about 4 bytes a message, and go as they
    /// came in at the head; changing a message inside one keeps every
    /// other where it was.
    #[test]
    fn a_streams_batches_are_small() {
        let mut slots = Slots::default();
        let (batches, n) = (10_000u64, 100u64);
        for b in 0..batches {
            let run = entries(b << 20, 1 + b * n, n);
            slots
                .insert_run(&run, |_| panic!("nothing replaced"))
                .unwrap();
        }
        let per = slots.memory() as f64 / (batches * n) as f64;
        assert!(per < 5.0, "{per} bytes a message");
        assert_eq!(slots.bounds(), Some((1, batches * n)));
        let want = entries(7 << 20, 701, n);
        assert_eq!(slots.get(750), Some(want[49].1));
        for seq in 1..=batches * n / 2 {
            assert!(slots.remove(seq).is_some());
        }
        assert!(slots.memory() as f64 / (batches * n) as f64 <= per / 2.0 + 0.1);
        // A put over a batch's message, and a removal inside another.
        let other = entries(1, 1, 1)[0].1;
        let before = slots.get(800_001);
        assert_eq!(
            slots.insert(800_050, &other).unwrap(),
            Some(entries(8000 << 20, 800_001, n)[49].1)
        );
        assert_eq!(slots.get(800_050), Some(other));
        assert_eq!(slots.get(800_001), before);
        assert!(slots.remove(900_010).is_some());
        assert_eq!(slots.get(900_010), None);
        assert_eq!(slots.len(), (batches * n / 2) as usize - 1);
        let mut got = Vec::new();
        slots.range(900_001, 20, &mut got);
        let want: Vec<(u64, Loc)> = entries(9000 << 20, 900_001, n)
            .into_iter()
            .filter(|(seq, _)| *seq != 900_010)
            .take(20)
            .collect();
        assert_eq!(got, want);
    }

    /// A batch that lands past the last stored message but over the
    /// slots of gone ones (a chunk sweeps only once half of it is gone)
    /// keeps each seq in one place: later reads, removals and puts there
    /// find it.
    #[test]
    fn a_batch_over_gone_slots_keeps_each_seq_in_one_place() {
        let mut slots = Slots::default();
        let mut model = BTreeMap::new();
        for seq in 100..=109 {
            slots.insert(seq, &loc(seq)).unwrap();
            model.insert(seq, loc(seq));
        }
        for seq in 105..=109 {
            assert_eq!(slots.remove(seq), model.remove(&seq));
        }
        let batch = entries(1 << 30, 105, 10);
        slots
            .insert_run(&batch, |_| panic!("nothing replaced"))
            .unwrap();
        model.extend(batch.iter().copied());
        for seq in 106..=111 {
            assert_eq!(slots.remove(seq), model.remove(&seq));
        }
        for seq in 100..=115 {
            assert_eq!(slots.get(seq), model.get(&seq).copied(), "{seq}");
        }
        let other = loc(7);
        assert_eq!(slots.insert(105, &other).unwrap(), model.insert(105, other));
        let mut got = Vec::new();
        slots.range(0, 100, &mut got);
        let want: Vec<(u64, Loc)> = model.iter().map(|(s, l)| (*s, *l)).collect();
        assert_eq!(got, want);
        assert_eq!(slots.remove(105), model.remove(&105));
        assert_eq!(slots.get(105), None);
        assert_eq!(slots.len(), model.len());
    }

    /// A slot at the largest offset, and `from` past what an offset can
    /// say: nothing below `from` is read or removed.
    #[test]
    fn from_past_the_largest_offset() {
        let mut slots = Slots::default();
        let top = u64::from(u32::MAX);
        slots.insert(10, &loc(3)).ok();
        slots.insert(10 + top, &loc(6)).ok();
        let mut got = Vec::new();
        slots.range(10 + top + 5, 10, &mut got);
        assert!(got.is_empty(), "{got:?}");
        let mut gone = 0;
        slots.remove_from(10 + top + 5, |_| gone += 1);
        assert_eq!(gone, 0);
        assert_eq!(slots.len(), 2);
    }

    #[test]
    fn refuses_what_it_cannot_keep() {
        let mut slots = Slots::default();
        let long = Loc {
            len: MAX_LEN + 1,
            ..loc(3)
        };
        assert!(slots.insert(1, &long).is_err());
        let far = Loc {
            rec: 1 << 40,
            body: 1,
            at: PUT_MESSAGE_AT,
            len: 1,
            body_len: 0,
            timed: false,
        };
        assert!(slots.insert(1, &far).is_err());
        assert!(slots.is_empty());
    }
}
