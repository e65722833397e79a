//! Timers of a queue: message TTL (every message is removed at its
//! deadline wherever it sits in the queue, not only at the head as in
//! RabbitMQ; a message paged out of memory is read back for it, from the
//! head of the stored tail, when memory has room: ready.rs `read_through`)
//! and x-expires (the queue goes after it was unused that long).
//! Each is one tokio task holding only a weak reference, so a deleted queue
//! takes its timers with it.

use std::cmp::Reverse;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::dead_letter::Reason;
use super::{now_ms, Queue, State};

/// Starts the TTL timer: it sleeps until the earliest deadline (or until
/// an earlier one arrives), removes what is due and dead-letters it.
pub(super) fn start_timer(queue: &Arc<Queue>) {
    let weak: Weak<Queue> = Arc::downgrade(queue);
    let wake = Arc::clone(&queue.timer);
    tokio::spawn(async move {
        loop {
            let next = {
                let Some(q) = weak.upgrade() else { return };
                if q.is_deleted() {
                    return;
                }
                let Some(next) = q.expire_due(now_ms()) else {
                    return;
                };
                next
            };
            // Sleep without holding the queue (a stopped broker must be
            // able to drop it); woken early by an earlier deadline or by the
            // queue's deletion, and at least once a second to notice a
            // queue that went away.
            let wait = Duration::from_millis(next.saturating_sub(now_ms()).clamp(1, 1000));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = wake.notified() => {}
            }
        }
    });
}

/// x-expires (or a policy's expires): deletes the queue once it has had
/// no consumer and no use (get, consume, redeclare) for that long. One
/// watcher per queue; it reads the limit in force each time it wakes, and
/// ends when there is none.
pub(super) fn watch_unused(queue: &Arc<Queue>) {
    if queue
        .expires_watched
        .swap(true, std::sync::atomic::Ordering::AcqRel)
    {
        return;
    }
    let weak: Weak<Queue> = Arc::downgrade(queue);
    tokio::spawn(async move {
        let mut wait = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(wait.max(1))).await;
            let Some(q) = weak.upgrade() else { return };
            let ms = {
                // The flag is cleared under the lock apply_policy takes,
                // so a policy setting expires now starts a new watcher.
                let st = q.state.lock();
                let Some(ms) = st.live.expires else {
                    q.expires_watched
                        .store(false, std::sync::atomic::Ordering::Release);
                    return;
                };
                ms
            };
            if q.is_deleted() {
                return;
            }
            let idle_since = q.last_used.load(std::sync::atomic::Ordering::Relaxed);
            let now = now_ms();
            if q.consumer_count() > 0 {
                wait = ms.min(1000);
                continue;
            }
            if now.saturating_sub(idle_since) >= ms {
                if let Some(host) = q.host.upgrade() {
                    tracing::info!(
                        queue = q.name(),
                        "deleting queue unused for {ms} ms (x-expires)"
                    );
                    host.expire(&q);
                }
                return;
            }
            // At most a second, so a lowered limit is seen soon.
            wait = (ms - now.saturating_sub(idle_since)).min(1000);
        }
    });
}

impl Queue {
    /// Records a deadline and makes sure the expiry timer will see it.
    pub(super) fn schedule(self: &Arc<Self>, st: &mut State, deadline: u64, seq: u64) {
        // Deadlines of messages consumed before they expired stay in the
        // heap until due; when they far outnumber the ready messages,
        // rebuild it from what is actually waiting.
        if st.expiry.len() + st.expiry_deferred.len() > 2 * st.ready.len() + 1024 {
            st.expiry = st.ready.deadlines().map(Reverse).collect();
            st.expiry_deferred.clear();
        }
        let earliest = st.expiry.peek().map(|Reverse((d, _))| *d);
        st.expiry.push(Reverse((deadline, seq)));
        if !st.timer_running {
            st.timer_running = true;
            start_timer(self);
        } else if earliest.is_none_or(|e| deadline < e) {
            self.timer.notify_one();
        }
    }

    /// Removes the messages whose TTL ran out by `now`; returns the next
    /// deadline (expiry timer).
    pub(super) fn expire_due(self: &Arc<Self>, now: u64) -> Option<u64> {
        let mut st = self.state.lock();
        // Bounded work per pass, so the lock is never held for long; the
        // timer comes straight back for the rest.
        let mut budget: usize = 10_000;
        // Deadlines set aside for want of room come back once there is.
        while budget > 0 && st.ready.has_room() {
            let Some(due) = st.expiry_deferred.pop() else {
                break;
            };
            budget -= 1;
            st.expiry.push(due);
        }
        while let Some(&Reverse((deadline, seq))) = st.expiry.peek() {
            if deadline > now || budget == 0 {
                break;
            }
            budget -= 1;
            st.expiry.pop();
            if st.ready.in_tail(seq) {
                if !st.ready.has_room() {
                    // Memory holds twice its bound of live messages: the
                    // message waits in the store until consumers or expiry
                    // make room (checked at least once a second below).
                    st.expiry_deferred.push(Reverse((deadline, seq)));
                    continue;
                }
                // Paged out: read the tail's head back toward it, a batch
                // per turn; what is read is due in turn (some already are).
                let read = st.ready.read_through(seq, &self.pager());
                if let Some(read) = read {
                    budget = budget.saturating_sub(read.len());
                    st.expiry.extend(read.into_iter().map(Reverse));
                    if st.ready.in_tail(seq) {
                        st.expiry.push(Reverse((deadline, seq)));
                        continue;
                    }
                }
            }
            if let Some(entry) = st.ready.remove(seq) {
                st.dead.push((entry, Reason::Expired));
            }
        }
        let mut next = st.expiry.peek().map(|Reverse((d, _))| *d);
        if !st.expiry_deferred.is_empty() {
            next = Some(next.map_or(now + 1000, |d| d.min(now + 1000)));
        }
        if next.is_none() {
            st.timer_running = false;
        }
        self.finish(st);
        next
    }
}
