//! How messages leave a queue: settling what a channel hands back (ack,
//! requeue, reject), purge, and dead-lettering what left without an ack.
//! Messages that leave under the lock are collected in `State::dead` and
//! dead-lettered by `finish` once the lock is released (`dead_letter.rs`
//! builds the copies).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::dead_letter::{self, Reason};
use super::{now_ms, Entry, Host, Queue, State, Unacked};
use crate::store;

/// How many queues a message may be dead-lettered through in one go.
const MAX_DEAD_LETTER_HOPS: u32 = 16;

/// How deliveries taken back from a channel are settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// basic.ack: the message is done.
    Ack,
    /// nack/reject with requeue, recover, or a closed channel: back in line.
    Requeue,
    /// nack/reject without requeue: dead-lettered (or dropped).
    Reject,
}

impl Queue {
    /// Settles a delivery that needed no ack (called with the lock held by
    /// the dispatcher, so it must not lock).
    pub fn settle_delivered(&self, entry: Entry) {
        self.forget(entry);
    }

    pub(super) fn forget(&self, entry: Entry) {
        if entry.stored && !self.deleted.load(Ordering::Relaxed) {
            if let Err(e) = self.unstore(entry.seq) {
                tracing::warn!(queue = %self.config.name, "cannot remove acked message: {e}");
            }
        }
    }

    /// Removes a stored message: free if it was not written yet.
    pub(super) fn unstore(&self, seq: u64) -> store::Result<()> {
        if self.unwritten.cancel(seq) {
            return Ok(());
        }
        self.store.remove_message(self.page_id, seq)
    }

    /// Settles deliveries taken back from a channel, then delivers into the
    /// credit they freed.
    pub fn settle(self: &Arc<Self>, taken: impl Iterator<Item = Unacked>, how: Settle) {
        if let Some(s) = &self.stream {
            return s.settle(self, taken, how);
        }
        let mut st = self.state.lock();
        // A deleted queue's messages are gone: not dead-lettered (as in
        // RabbitMQ), not requeued.
        let deleted = self.deleted.load(Ordering::Relaxed);
        for u in taken {
            // The credit it held is free: a parked consumer may take more.
            if let Some(c) = &u.consumer {
                if c.parked.load(Ordering::Relaxed) {
                    st.consumers.unpark(c.id);
                }
                st.consumers.settled(c.id);
            }
            let mut entry = u.entry;
            st.unacked = st.unacked.saturating_sub(1);
            st.unacked_bytes = st.unacked_bytes.saturating_sub(entry.msg.body().len());
            match how {
                Settle::Ack => {
                    st.stats.counters.ack += 1;
                    self.forget(entry);
                }
                _ if deleted => {}
                Settle::Reject => {
                    st.dead.push((entry, Reason::Rejected));
                }
                Settle::Requeue => {
                    entry.redelivered = true;
                    entry.returned = entry.returned.saturating_add(1);
                    if let Some(limit) = st.live.delivery_limit {
                        // A poison message cannot loop forever: past the
                        // limit it is dead-lettered (reason delivery_limit);
                        // below it, it carries x-delivery-count.
                        if entry.returned as u64 > limit {
                            st.dead.push((entry, Reason::DeliveryLimit));
                            continue;
                        }
                        entry.msg = Arc::new(entry.msg.with_header(
                            "x-delivery-count",
                            amq_protocol::types::AMQPValue::LongLongInt(entry.returned as i64),
                        ));
                    }
                    let (deadline, seq) = (entry.deadline, entry.seq);
                    st.ready.insert_sorted(entry);
                    // Its deadline left the heap when it was delivered.
                    if deadline != 0 {
                        self.schedule(&mut st, deadline, seq);
                    }
                }
            }
        }
        if deleted && how != Settle::Ack {
            return;
        }
        self.dispatch_locked(&mut st);
        self.finish(st);
    }

    /// Drops every ready message; returns how many.
    pub fn purge(&self) -> store::Result<u32> {
        // A stream is not purged (as in RabbitMQ): it answers 0.
        if self.stream.is_some() {
            return Ok(0);
        }
        let mut st = self.state.lock();
        let n = st.ready.len() as u32;
        let (entries, tail) = st.ready.clear();
        for entry in entries {
            if entry.stored {
                self.unstore(entry.seq)?;
            }
        }
        if let Some(from) = tail {
            self.store.purge_from(self.page_id, from)?;
        }
        Ok(n)
    }

    /// Settles deliveries taken from one channel, grouped by queue.
    pub fn settle_all(unacked: &mut Vec<Unacked>, how: Settle) {
        let mut drain = unacked.drain(..).peekable();
        while let Some(first) = drain.next() {
            let q = Arc::clone(&first.queue);
            let rest = std::iter::from_fn(|| drain.next_if(|u| Arc::ptr_eq(&u.queue, &q)));
            let run = std::iter::once(first).chain(rest);
            q.settle(run, how);
        }
    }

    /// Releases the lock, then dead-letters what was collected under it.
    pub(super) fn finish(&self, mut st: parking_lot::MutexGuard<'_, State>) {
        if st.dead.is_empty() {
            return;
        }
        let dead = std::mem::take(&mut st.dead);
        // Where they go, as the arguments in force say now.
        let target = (!dead.is_empty())
            .then(|| st.live.dead_letter_exchange.clone())
            .flatten()
            .map(|x| (x, st.live.dead_letter_routing_key.clone()));
        drop(st);
        self.dead_letter_all(dead, target);
    }

    /// Sends messages to the dead-letter exchange `to` names (exchange and
    /// routing key, if any) and
    /// removes them from this queue: the new copies are written first, so a
    /// crash in between can duplicate a message, never lose it.
    pub(super) fn dead_letter_all(
        &self,
        dead: Vec<(Entry, Reason)>,
        to: Option<(String, Option<String>)>,
    ) {
        // Dead-lettering pushes into other queues, which may dead-letter in
        // turn (length limits, TTL 0): bound the depth so no chain of
        // queues can recurse without end; past it the message is dropped.
        thread_local!(static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
        let depth = DEPTH.with(|d| d.get());
        let target = if depth < MAX_DEAD_LETTER_HOPS {
            to.as_ref()
                .zip(self.host.upgrade())
                .map(|((exchange, routing_key), host)| DeadLetterTarget {
                    exchange,
                    routing_key: routing_key.as_deref(),
                    host,
                })
        } else {
            tracing::warn!(queue = self.name(), "dead-letter chain too long: dropping");
            None
        };
        DEPTH.with(|d| d.set(depth + 1));
        self.dead_letter_each(dead, target);
        DEPTH.with(|d| d.set(depth));
    }

    fn dead_letter_each(&self, dead: Vec<(Entry, Reason)>, target: Option<DeadLetterTarget<'_>>) {
        let now_secs = now_ms() / 1000;
        for (entry, reason) in dead {
            // The copies and the removal commit together (a failover in
            // between would keep both).
            let _group = self.store.group();
            if let Some(t) = &target {
                let msg = Arc::new(dead_letter::dead_letter(
                    &entry.msg,
                    self.name(),
                    reason,
                    t.exchange,
                    t.routing_key,
                    now_secs,
                ));
                t.host.dead_letter(&msg);
            }
            self.forget(entry);
        }
    }
}

/// Where dead-lettered messages go.
struct DeadLetterTarget<'a> {
    exchange: &'a str,
    routing_key: Option<&'a str>,
    host: Arc<dyn Host>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use amq_protocol::types::AMQPValue;

    use super::Settle;
    use crate::queue::testing::{consumer, push, queue, TestHost, TestSink};

    #[test]
    fn a_requeued_message_goes_back_to_its_place_flagged_redelivered() {
        let host = Arc::new(TestHost::default());
        let q = queue(&[], &host);
        let sink = Arc::new(TestSink::default());
        let c = consumer(&sink, "a", 2, 0);
        q.add_consumer(Arc::clone(&c)).unwrap();
        push(&q, 4);
        q.remove_consumer(&c);
        sink.settle(&[2], Settle::Requeue);
        sink.settle(&[1], Settle::Requeue);
        let other = Arc::new(TestSink::default());
        q.add_consumer(consumer(&other, "b", 0, 0)).unwrap();
        q.dispatch();
        let seen = other.seen.lock().clone();
        let got: Vec<(u64, bool)> = seen.iter().map(|d| (d.1, d.2)).collect();
        assert_eq!(got, [(1, true), (2, true), (3, false), (4, false)]);
    }

    #[test]
    fn acked_messages_are_gone_and_rejected_ones_dead_lettered() {
        let host = Arc::new(TestHost::default());
        let dlx = AMQPValue::LongString("dlx".into());
        let q = queue(&[("x-dead-letter-exchange", dlx)], &host);
        let sink = Arc::new(TestSink::default());
        q.add_consumer(consumer(&sink, "a", 0, 0)).unwrap();
        push(&q, 2);
        sink.settle(&[1], Settle::Ack);
        sink.settle(&[2], Settle::Reject);
        assert_eq!(q.message_count(), 0);
        assert!(sink.unacked.lock().is_empty());
        let dead = host.dead.lock();
        assert_eq!(dead.len(), 1, "only the rejected one");
        assert_eq!(dead[0].exchange(), b"dlx");
    }

    #[test]
    fn past_the_delivery_limit_a_requeue_dead_letters() {
        let host = Arc::new(TestHost::default());
        let q = queue(
            &[
                ("x-delivery-limit", AMQPValue::LongInt(1)),
                ("x-dead-letter-exchange", AMQPValue::LongString("".into())),
            ],
            &host,
        );
        let sink = Arc::new(TestSink::default());
        q.add_consumer(consumer(&sink, "a", 0, 0)).unwrap();
        push(&q, 1);
        sink.settle(&[1], Settle::Requeue);
        assert_eq!(sink.seen.lock().len(), 2, "redelivered once");
        assert!(host.dead.lock().is_empty());
        sink.settle(&[1], Settle::Requeue);
        assert_eq!(sink.seen.lock().len(), 2);
        assert_eq!(host.dead.lock().len(), 1);
    }

    #[test]
    fn purge_drops_ready_messages_but_not_unacked_ones() {
        let host = Arc::new(TestHost::default());
        let q = queue(&[], &host);
        let sink = Arc::new(TestSink::default());
        let c = consumer(&sink, "a", 1, 0);
        q.add_consumer(Arc::clone(&c)).unwrap();
        push(&q, 3);
        assert_eq!(q.purge().unwrap(), 2);
        q.remove_consumer(&c);
        sink.settle(&[1], Settle::Requeue);
        assert_eq!(q.message_count(), 1);
    }
}
