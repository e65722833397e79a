//! Moving ready messages from one queue to another (the management UI's
//! move, a dead-letter queue back to its source): exactly once across a
//! crash. The store moves each message in one atomic write (re-keyed to
//! the destination, `Op::MoveMessages`); until that write, the store
//! still has it in the source, where a restart finds it.
//!
//! The two queues' locks are never held together: the messages are taken
//! from the source under its lock, then put in the destination under its
//! own. A message of the source not yet written (it waits for the next
//! flush, unwritten.rs) is written first, so no commit in between can
//! confirm its publisher while it is in neither place.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::dead_letter::Reason;
use super::{now_ms, Entry, Queue};
use crate::store;

/// Messages moved per store operation.
pub const MOVE_BATCH: usize = 1024;

impl Queue {
    /// Moves up to `max` ready messages, head first, to `to` (in the same
    /// vhost), in batches of `MOVE_BATCH`; returns how many moved.
    /// Expired messages on the way are dead-lettered as a get would.
    pub fn move_to(self: &Arc<Self>, to: &Arc<Queue>, max: usize) -> store::Result<usize> {
        if Arc::ptr_eq(self, to) {
            return Ok(0);
        }
        let mut moved = 0;
        while moved < max {
            let taken = self.take_for_move((max - moved).min(MOVE_BATCH))?;
            if taken.is_empty() {
                break;
            }
            moved += taken.len();
            to.receive_moved(self, taken)?;
        }
        Ok(moved)
    }

    /// Takes up to `n` ready messages from the head, each with a record in
    /// the store if this queue keeps it.
    fn take_for_move(self: &Arc<Self>, n: usize) -> store::Result<Vec<Entry>> {
        let mut st = self.state.lock();
        let pager = self.pager();
        let now = now_ms();
        let mut taken = Vec::with_capacity(n);
        while taken.len() < n {
            let Some(e) = st.ready.pop_front(pager.as_ref()) else {
                break;
            };
            if e.deadline != 0 && e.expired(now) {
                st.dead.push((e, Reason::Expired));
                continue;
            }
            taken.push(e);
        }
        let mut failed = None;
        for e in &taken {
            if !e.stored {
                continue;
            }
            if !self.keeps(&e.msg) {
                // A transient message paged out: its record goes, the
                // message travels in memory.
                if let Err(err) = self.unstore(e.seq) {
                    failed = Some(err);
                }
                continue;
            }
            // Written before it leaves the flush's list: a commit may come
            // between the two, and must find it somewhere.
            if self.unwritten.pending(e.seq) {
                if let Err(err) =
                    self.store
                        .put_message(self.config.store_id, e.seq, &e.msg, e.deadline)
                {
                    failed = Some(err);
                    break;
                }
                self.unwritten.cancel(e.seq);
            }
        }
        if let Some(err) = failed {
            // Back where they were, in order: nothing moved.
            for e in taken.into_iter().rev() {
                st.ready.push_front(e);
            }
            self.finish(st);
            return Err(err);
        }
        self.finish(st);
        Ok(taken)
    }

    /// Puts messages taken from `from` at the tail, moving their records
    /// in one store operation.
    fn receive_moved(self: &Arc<Self>, from: &Arc<Queue>, taken: Vec<Entry>) -> store::Result<()> {
        let mut st = self.state.lock();
        if self.deleted.load(Ordering::Relaxed) {
            drop(st);
            // Back to the source's head, in order: their records never left.
            let mut back = from.state.lock();
            for e in taken.into_iter().rev() {
                back.ready.push_front(e);
            }
            from.dispatch_locked(&mut back);
            return Ok(());
        }
        let mut moves = Vec::with_capacity(taken.len());
        let mut removes = Vec::new();
        let mut entries = Vec::with_capacity(taken.len());
        for e in taken {
            let seq = st.next_seq;
            st.next_seq += 1;
            let deadline = self.deadline_for(&st.live, &e.msg);
            let had = e.stored && from.keeps(&e.msg);
            let keeps = self.keeps(&e.msg);
            match (had, keeps) {
                (true, true) => moves.push((e.seq, seq, deadline)),
                (true, false) => removes.push(e.seq),
                (false, true) => {
                    self.store
                        .put_message(self.config.store_id, seq, &e.msg, deadline)?
                }
                (false, false) => {}
            }
            entries.push(Entry {
                seq,
                deadline,
                stored: keeps,
                enqueued: crate::util::coarse_wall_secs(),
                ..e
            });
        }
        if !moves.is_empty() || !removes.is_empty() {
            self.store.move_messages(
                from.config.store_id,
                self.config.store_id,
                &moves,
                &removes,
            )?;
        }
        let pager = self.pager();
        for e in entries {
            let (seq, deadline) = (e.seq, e.deadline);
            st.stats.counters.publish += 1;
            st.ready.push_back(e, pager.as_ref())?;
            if deadline != 0 {
                self.schedule(&mut st, deadline, seq);
            }
        }
        self.dispatch_locked(&mut st);
        self.drop_over_limit(&mut st);
        self.finish(st);
        Ok(())
    }
}
