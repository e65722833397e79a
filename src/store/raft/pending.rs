//! The entry a leader's journal is building: the operations submitted
//! since the last commit round took it, where it may be cut into log
//! entries, and groups of operations kept whole.
//!
//! A group (`Journal::open_group`) is operations that must commit together
//! or not at all: the copy a dead-letter or a delayed release puts in a
//! queue and the removal of the original. They go to the journal one by
//! one, so a commit round could take the entry between them and a
//! failover could then commit the copy without the removal (the message
//! twice, the second time as a new message). The round takes the entry
//! only when no group is open, and cuts it only where no group was open.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use parking_lot::{Condvar, Mutex};

/// Operations (each behind its u32 length) and the offsets after which
/// no group was open.
#[derive(Default)]
pub struct Pending {
    pub ops: BytesMut,
    safe: Vec<usize>,
}

impl Pending {
    /// An operation was appended: its end is a place to cut if no group
    /// is open.
    pub fn appended(&mut self, gate: &Gate) {
        if gate.open.load(Ordering::Acquire) == 0 {
            self.safe.push(self.ops.len());
        }
    }

    /// Takes everything, cut into pieces of at most `max` bytes where no
    /// group was open (a longer run between such places goes whole).
    pub fn take(&mut self, max: usize) -> Vec<Bytes> {
        let ops = std::mem::take(&mut self.ops).freeze();
        let safe = std::mem::take(&mut self.safe);
        cut(ops, &safe, max)
    }
}

fn cut(ops: Bytes, safe: &[usize], max: usize) -> Vec<Bytes> {
    let mut pieces = Vec::new();
    let (mut start, mut last) = (0, 0);
    for &b in safe {
        if b - start > max && last > start {
            pieces.push(ops.slice(start..last));
            start = last;
        }
        last = b;
    }
    if start < ops.len() {
        pieces.push(ops.slice(start..));
    }
    pieces
}

/// Open groups, and the commit round waiting for them to close.
#[derive(Default)]
pub struct Gate {
    /// Groups open now (read without the lock where an estimate will do).
    open: AtomicUsize,
    /// A commit round waits to take the entry: no new group opens.
    taking: Mutex<bool>,
    changed: Condvar,
}

thread_local! {
    /// Groups this thread has open (a dead-letter inside a dead-letter).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

impl Gate {
    /// Opens a group for this thread (nested ones count as one).
    pub fn open(&self) {
        if DEPTH.with(|d| d.replace(d.get() + 1)) > 0 {
            return;
        }
        let mut taking = self.taking.lock();
        while *taking {
            self.changed.wait(&mut taking);
        }
        self.open.fetch_add(1, Ordering::AcqRel);
    }

    /// Closes this thread's group; `pending` is the entry, whose end is
    /// then a place to cut if no other group is open.
    pub fn close(&self, pending: &Mutex<Pending>) {
        let depth = DEPTH.with(|d| {
            let n = d.get().saturating_sub(1);
            d.set(n);
            n
        });
        if depth > 0 {
            return;
        }
        // Locks in the order `when_closed` takes them: the gate, then the
        // entry.
        let _taking = self.taking.lock();
        if self.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            let mut p = pending.lock();
            let end = p.ops.len();
            p.safe.push(end);
            drop(p);
            self.changed.notify_all();
        }
    }

    /// Runs `f` once no group is open, opening none meanwhile.
    pub fn when_closed<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut taking = self.taking.lock();
        *taking = true;
        while self.open.load(Ordering::Acquire) > 0 {
            self.changed.wait(&mut taking);
        }
        let r = f();
        *taking = false;
        self.changed.notify_all();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_only_where_no_group_was_open() {
        let ops = Bytes::from(vec![0u8; 100]);
        // Safe after 10, 20, 30; 30..90 was a group; safe at 90 and 100.
        let pieces = cut(ops, &[10, 20, 30, 90, 100], 25);
        let sizes: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
        assert_eq!(sizes, vec![20, 10, 60, 10]);
        assert!(cut(Bytes::new(), &[], 25).is_empty());
    }

    #[test]
    fn a_group_keeps_its_operations_in_one_piece() {
        let gate = Gate::default();
        let pending = Mutex::new(Pending::default());
        let op = |p: &mut Pending| {
            p.ops.extend_from_slice(&[1u8; 10]);
            p.appended(&gate);
        };
        op(&mut pending.lock());
        gate.open();
        gate.open(); // nested
        op(&mut pending.lock());
        op(&mut pending.lock());
        gate.close(&pending);
        op(&mut pending.lock());
        gate.close(&pending);
        op(&mut pending.lock());
        let pieces = gate.when_closed(|| pending.lock().take(10));
        let sizes: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
        assert_eq!(sizes, vec![10, 30, 10]);
    }

    #[test]
    fn the_round_waits_for_an_open_group() {
        let gate = std::sync::Arc::new(Gate::default());
        let pending = std::sync::Arc::new(Mutex::new(Pending::default()));
        gate.open();
        let (g, p) = (
            std::sync::Arc::clone(&gate),
            std::sync::Arc::clone(&pending),
        );
        let round = std::thread::spawn(move || g.when_closed(|| p.lock().take(1 << 20).len()));
        std::thread::sleep(std::time::Duration::from_millis(50));
        {
            let mut p = pending.lock();
            p.ops.extend_from_slice(&[1u8; 10]);
            p.appended(&gate);
        }
        gate.close(&pending);
        assert_eq!(
            round.join().unwrap(),
            1,
            "the group's operation went with the round"
        );
    }
}
