//! `Ring`: the keys a deduplication cache remembers. Entries are numbered
//! in the order they were added; entry `seq` lives in slot `seq % size`
//! and is forgotten when entry `seq + size` takes its slot (or when its
//! expiry passes), so the cache, in memory and on disk
//! (store/dedup.rs), never holds more than `size` entries.

use std::collections::{HashMap, VecDeque};

use crate::store::dedup::Entry;

/// A message's key: 16 bytes of a digest of its deduplication value.
pub type Key = [u8; 16];

/// The expiry of a forgotten entry: long past.
const FORGOTTEN: u64 = 1;

/// The remembered keys.
pub struct Ring {
    size: u64,
    /// The number the next entry gets.
    next: u64,
    /// (key, seq) in seq order: the live window.
    order: VecDeque<(Key, u64)>,
    /// Key to its newest (seq, expiry in ms since the epoch, 0: never).
    keys: HashMap<Key, (u64, u64)>,
}

impl Ring {
    /// An empty ring of `size` (at least 1) slots.
    pub fn new(size: u64) -> Ring {
        Ring {
            size: size.max(1),
            next: 0,
            order: VecDeque::new(),
            keys: HashMap::new(),
        }
    }

    /// A ring holding what was stored of it (`entries`, in any order), as
    /// of `now`: expired entries are left out.
    pub fn restore(size: u64, mut entries: Vec<Entry>, now: u64) -> Ring {
        let mut r = Ring::new(size);
        entries.sort_by_key(|e| e.seq);
        if let Some(last) = entries.last() {
            r.next = last.seq + 1;
        }
        for e in entries {
            if e.seq + r.size < r.next || (e.expires != 0 && e.expires <= now) {
                continue;
            }
            r.order.push_back((e.key, e.seq));
            r.keys.insert(e.key, (e.seq, e.expires));
        }
        r
    }

    /// Whether `key` is remembered and not expired at `now`.
    pub fn holds(&self, key: &Key, now: u64) -> bool {
        self.keys
            .get(key)
            .is_some_and(|&(_, expires)| expires == 0 || expires > now)
    }

    /// Remembers `key` until `expires` (0: until the size pushes it out);
    /// the entry to store.
    pub fn insert(&mut self, key: Key, expires: u64) -> Entry {
        let seq = self.next;
        self.next += 1;
        while let Some(&(old, old_seq)) = self.order.front() {
            if old_seq + self.size > seq {
                break;
            }
            self.order.pop_front();
            if self.keys.get(&old).is_some_and(|&(s, _)| s == old_seq) {
                self.keys.remove(&old);
            }
        }
        self.order.push_back((key, seq));
        self.keys.insert(key, (seq, expires));
        Entry {
            slot: seq % self.size,
            seq,
            expires,
            key,
        }
    }

    /// Forgets entry `seq` of `key` if it is still that key's newest; the
    /// entry to store in its place (the same slot, expired).
    pub fn forget(&mut self, key: &Key, seq: u64) -> Option<Entry> {
        if self.keys.get(key).is_none_or(|&(s, _)| s != seq) {
            return None;
        }
        self.keys.remove(key);
        Some(Entry {
            slot: seq % self.size,
            seq,
            expires: FORGOTTEN,
            key: *key,
        })
    }

    /// Entries remembered (expired ones included until they are pushed
    /// out).
    pub fn len(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: u8) -> Key {
        [n; 16]
    }

    #[test]
    fn the_oldest_entry_goes_when_the_ring_is_full() {
        let mut r = Ring::new(2);
        r.insert(k(1), 0);
        r.insert(k(2), 0);
        assert!(r.holds(&k(1), 5) && r.holds(&k(2), 5));
        let e = r.insert(k(3), 0);
        assert_eq!((e.slot, e.seq), (0, 2));
        assert!(!r.holds(&k(1), 5));
        assert!(r.holds(&k(2), 5) && r.holds(&k(3), 5));
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn a_forgotten_entry_stays_forgotten_when_restored() {
        let mut r = Ring::new(4);
        let a = r.insert(k(1), 0);
        let b = r.insert(k(2), 0);
        let gone = r.forget(&k(1), a.seq).unwrap();
        assert!(!r.holds(&k(1), 5));
        assert_eq!(r.forget(&k(1), a.seq), None, "once");
        let back = Ring::restore(4, vec![gone, b], 5);
        assert!(!back.holds(&k(1), 5) && back.holds(&k(2), 5));
    }

    #[test]
    fn an_entry_expires() {
        let mut r = Ring::new(10);
        r.insert(k(1), 100);
        assert!(r.holds(&k(1), 99));
        assert!(!r.holds(&k(1), 100));
        // Added again after it expired: the new entry counts, and the
        // old one going does not take it along.
        r.insert(k(1), 0);
        assert!(r.holds(&k(1), 1000));
    }

    #[test]
    fn a_restored_ring_is_the_one_stored() {
        let mut r = Ring::new(3);
        let mut stored = vec![None; 3];
        for (n, expires) in [(1, 0), (2, 50), (3, 0), (4, 0)] {
            let e = r.insert(k(n), expires);
            stored[e.slot as usize] = Some(e);
        }
        let entries: Vec<Entry> = stored.into_iter().flatten().collect();
        let back = Ring::restore(3, entries, 60);
        assert!(!back.holds(&k(1), 60), "pushed out");
        assert!(!back.holds(&k(2), 60), "expired");
        assert!(back.holds(&k(3), 60) && back.holds(&k(4), 60));
        let mut back = back;
        let e = back.insert(k(5), 0);
        assert_eq!(e.seq, 4);
        // 5 took 2's slot; 3 goes with the next one.
        back.insert(k(6), 0);
        assert!(!back.holds(&k(3), 60) && back.holds(&k(4), 60));
    }
}
