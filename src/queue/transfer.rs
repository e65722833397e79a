//! Moving ready messages from one queue to another (the management UI's
//! move, a dead-letter queue back to its source): exactly once across a
//! crash. Each batch is one store operation (`Op::MoveMessages`) that
//! puts the messages in the destination and removes them from the source
//! in one atomic write; until it is applied, the store still has them in
//! the source, where a restart finds them.
//!
//! The two queues' locks are never held together: a batch is taken from
//! the source under its lock, then put in the destination under its own,
//! or given back to the source's head if the destination cannot take it
//! (deleted, full with a reject overflow, or the store refused). A message
//! of the source not yet written (it waits for the next flush,
//! unwritten.rs) is written first, so no commit in between can confirm its
//! publisher while it is stored nowhere.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::args::Overflow;
use super::dead_letter::Reason;
use super::{now_ms, Entry, Queue};
use crate::store::{self, Moved};

/// Messages moved per store operation, at most.
pub const MOVE_BATCH: usize = 1024;
/// Body bytes moved per store operation, at most (but one message).
const MOVE_BATCH_BYTES: usize = 4 << 20;

impl Queue {
    /// Moves up to `max` ready messages, head first, to `to`; returns how
    /// many moved. Stops early when `to` takes no more (deleted, or full
    /// with x-overflow reject-publish). Expired messages on the way are
    /// dead-lettered as a get would.
    pub fn move_to(self: &Arc<Self>, to: &Arc<Queue>, max: usize) -> store::Result<usize> {
        // A stream is appended to by publishing and read by offset: it
        // neither gives nor takes moved messages (the API refuses first).
        if Arc::ptr_eq(self, to) || self.stream.is_some() || to.stream.is_some() {
            return Ok(0);
        }
        let mut moved = 0;
        while moved < max {
            let taken = self.take_for_move((max - moved).min(MOVE_BATCH))?;
            if taken.is_empty() {
                break;
            }
            let n = taken.len();
            let (accepted, refused) = to.receive_moved(self, taken);
            moved += accepted;
            if !refused.is_empty() {
                self.give_back(refused);
            }
            if accepted < n {
                break;
            }
        }
        Ok(moved)
    }

    /// Takes up to `n` ready messages from the head (and about
    /// `MOVE_BATCH_BYTES`), each with a record in the store if this queue
    /// keeps it.
    fn take_for_move(self: &Arc<Self>, n: usize) -> store::Result<Vec<Entry>> {
        let mut st = self.state.lock();
        let pager = self.pager();
        let now = now_ms();
        let mut taken = Vec::with_capacity(n.min(MOVE_BATCH));
        let mut bytes = 0;
        while taken.len() < n && bytes < MOVE_BATCH_BYTES {
            let Some(e) = st.ready.pop_front(Some(&pager)) else {
                break;
            };
            if e.deadline != 0 && e.expired(now) {
                st.dead.push((e, Reason::Expired));
                continue;
            }
            bytes += e.msg.body().len();
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
                    break;
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
            // Back where they were: nothing moved.
            for e in taken {
                st.ready.insert_sorted(e);
            }
            self.finish(st);
            return Err(err);
        }
        self.finish(st);
        Ok(taken)
    }

    /// Puts messages taken from `from` at the tail, with one store
    /// operation; returns how many it took and the ones it gave back.
    fn receive_moved(
        self: &Arc<Self>,
        from: &Arc<Queue>,
        taken: Vec<Entry>,
    ) -> (usize, Vec<Entry>) {
        let mut st = self.state.lock();
        if self.deleted.load(Ordering::Relaxed) {
            return (0, taken);
        }
        let mut entries = Vec::with_capacity(taken.len());
        let mut refused = Vec::new();
        let mut more = 0;
        for e in taken {
            // A reject overflow refuses what does not fit; drop-head makes
            // room instead (after the push).
            let fits = st.live.overflow == Overflow::DropHead
                || !self.full_for(&st, entries.len() as u64, more + e.msg.body().len());
            if !refused.is_empty() || !fits {
                refused.push(e);
                continue;
            }
            more += e.msg.body().len();
            let had = e.stored && from.keeps(&e.msg);
            let seq = st.next_seq + entries.len() as u64;
            let deadline = self.deadline_for(&st.live, &e.msg);
            let moved = Entry {
                seq,
                deadline,
                stored: self.keeps(&e.msg),
                enqueued: crate::util::coarse_wall_secs(),
                ..e.clone()
            };
            entries.push((e, had, moved));
        }
        let moves: Vec<Moved<'_>> = entries
            .iter()
            .filter(|(_, _, e)| e.stored)
            .map(|(source, had, e)| Moved {
                from_seq: if *had { source.seq } else { 0 },
                to_seq: e.seq,
                deadline: e.deadline,
                time: crate::util::record_ms(),
                message: &e.msg,
            })
            .collect();
        let removes: Vec<u64> = entries
            .iter()
            .filter(|(_, had, e)| *had && !e.stored)
            .map(|(source, _, _)| source.seq)
            .collect();
        if !moves.is_empty() || !removes.is_empty() {
            if let Err(err) = self.store.move_messages(
                from.config.store_id,
                self.config.store_id,
                &moves,
                &removes,
            ) {
                tracing::warn!(queue = %self.config.name, "cannot move messages here: {err}");
                drop(moves);
                let mut back: Vec<Entry> = entries
                    .into_iter()
                    .map(|(source, had, _)| Entry {
                        stored: had,
                        ..source
                    })
                    .collect();
                back.extend(refused);
                return (0, back);
            }
        }
        drop(moves);
        st.next_seq += entries.len() as u64;
        let accepted = entries.len();
        let pager = self.pager();
        // Handed out here only once the move is committed (commit.rs).
        let ticket = self.after_commit.then(|| self.store.ticket());
        for (_, _, e) in entries {
            let (seq, deadline) = (e.seq, e.deadline);
            if let Some(t) = ticket.filter(|_| e.stored) {
                st.uncommitted.add(seq, t);
            }
            st.stats.counters.publish += 1;
            if let Err(err) = st.ready.push_back(e, Some(&pager)) {
                tracing::warn!(queue = %self.config.name, "cannot page a moved message out: {err}");
                continue;
            }
            if deadline != 0 {
                self.schedule(&mut st, deadline, seq);
            }
        }
        self.dispatch_locked(&mut st);
        self.drop_over_limit(&mut st);
        self.finish(st);
        (accepted, refused)
    }

    /// Puts back messages `take_for_move` took (their records never left).
    fn give_back(self: &Arc<Self>, entries: Vec<Entry>) {
        let mut st = self.state.lock();
        if self.deleted.load(Ordering::Relaxed) {
            return;
        }
        for e in entries {
            st.ready.insert_sorted(e);
        }
        self.dispatch_locked(&mut st);
        self.finish(st);
    }
}
