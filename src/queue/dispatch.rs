//! Handing messages out: delivery to consumers (by priority, round-robin
//! within one, single active consumer; see consumers.rs for the rings),
//! `basic.get`, consumers joining and leaving, and the delivered marks a
//! durable queue keeps on the way (store/delivered.rs).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::dead_letter::Reason;
use super::{now_ms, ConsumeError, Consumer, Queue, Sink, State};

impl Queue {
    /// Delivers ready messages to consumers with credit.
    pub fn dispatch(self: &Arc<Self>) {
        if let Some(s) = &self.stream {
            return s.dispatch(self);
        }
        let mut st = self.state.lock();
        self.dispatch_locked(&mut st);
        self.finish(st);
    }

    /// Delivers ready messages to the consumers that can take them (see
    /// consumers.rs: by priority, round-robin within one; with a single
    /// active consumer only to the first subscribed). A consumer that
    /// refuses is parked until what it lacks comes back, so no consumer
    /// is asked twice for nothing.
    pub(super) fn dispatch_locked(self: &Arc<Self>, st: &mut State) {
        // A leader that cannot show a live majority hands nothing out
        // that another member may be handing out too (store/lease.rs).
        if self.after_commit && !self.store.may_deliver() {
            if st.ready.len() > 0 {
                self.dispatch_when_leased();
            }
            return;
        }
        let pager = self.pager();
        let sac = self.args.single_active_consumer;
        let committed = self.after_commit.then(|| self.store.committed_now());
        let State {
            consumers,
            ready,
            unacked,
            unacked_bytes,
            dead,
            stats,
            uncommitted,
            ..
        } = st;
        while let Some(consumer) = consumers.next(sac) {
            let Some(entry) = ready.pop_front(Some(&pager)) else {
                break;
            };
            // A consumer never receives an expired message.
            if entry.deadline != 0 && entry.expired(now_ms()) {
                dead.push((entry, Reason::Expired));
                continue;
            }
            // Nor one the cluster may not hold yet (commit.rs).
            if let Some(ticket) = committed
                .filter(|_| entry.stored)
                .and_then(|c| uncommitted.waits_for(entry.seq, c))
            {
                ready.push_front(entry);
                self.dispatch_at_commit(ticket);
                break;
            }
            let (seq, stored, no_ack) = (entry.seq, entry.stored, consumer.no_ack);
            let (redelivered, size) = (entry.redelivered, entry.msg.body().len());
            if stored {
                self.before_delivery(seq);
            }
            match consumer.sink.try_deliver(consumer, self, entry) {
                Ok(()) => {
                    if stored {
                        self.delivered(seq);
                    }
                    let c = &mut stats.counters;
                    if no_ack {
                        c.deliver_no_ack += 1;
                    } else {
                        c.deliver += 1;
                        *unacked += 1;
                        *unacked_bytes += size;
                    }
                    c.redeliver += redelivered as u64;
                    consumers.delivered(sac);
                }
                Err((back, why)) => {
                    ready.push_front(back);
                    consumers.park_next(sac, why);
                }
            }
        }
    }

    /// Dispatches again once commit `ticket` is reached: the head waits
    /// for it (commit.rs). One waiting task per queue at a time.
    pub(super) fn dispatch_at_commit(self: &Arc<Self>, ticket: u64) {
        if self.commit_wait.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Off the runtime (no caller does this): the next event
            // dispatches.
            self.commit_wait.store(false, Ordering::Release);
            return;
        };
        let mut committed = self.store.flushed();
        let queue = Arc::downgrade(self);
        runtime.spawn(async move {
            // Closed: the store's committer stopped (the term ended).
            let reached = committed.wait_for(|&c| c >= ticket).await.is_ok();
            if let Some(q) = queue.upgrade() {
                q.commit_wait.store(false, Ordering::Release);
                if reached {
                    q.dispatch();
                }
            }
        });
    }

    /// Dispatches again once the leadership lease holds (polled: it is
    /// renewed within a heartbeat, or the node stops leading and the
    /// queue goes with its broker). One waiting task per queue at a time.
    pub(super) fn dispatch_when_leased(self: &Arc<Self>) {
        if self.lease_wait.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.lease_wait.store(false, Ordering::Release);
            return;
        };
        let queue = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let Some(q) = queue.upgrade() else { return };
                if q.store.may_deliver() {
                    q.lease_wait.store(false, Ordering::Release);
                    q.dispatch();
                    return;
                }
            }
        });
    }

    /// The outbox at `at` drained: its consumers may take deliveries again.
    pub fn outbox_drained(self: &Arc<Self>, at: usize) {
        if let Some(s) = &self.stream {
            return s.outbox_drained(self, at);
        }
        let mut st = self.state.lock();
        st.consumers.unpark_outbox(at);
        self.dispatch_locked(&mut st);
        self.finish(st);
    }

    /// `consumer` may have credit again (its channel's prefetch freed up):
    /// back among the ready ones, and deliver. The parked flag is read
    /// under the lock: a dispatcher that found the channel out of credit
    /// may be about to park the consumer, and must not miss this.
    pub fn unpark(self: &Arc<Self>, consumer: &Consumer) {
        if let Some(s) = &self.stream {
            return s.unpark(self, consumer);
        }
        let mut st = self.state.lock();
        st.consumers.unpark(consumer.id);
        self.dispatch_locked(&mut st);
        self.finish(st);
    }

    /// Before a stored message goes out: a stop from now on must bring it
    /// back redelivered (the store writes a reservation ahead of it when
    /// needed, see store/delivered.rs).
    pub(super) fn before_delivery(&self, seq: u64) {
        if let Some((_, mark)) = &self.mark {
            self.store.before_delivery(self.config.store_id, mark, seq);
        }
    }

    /// After a stored message went out (exact on a clean stop).
    pub(super) fn delivered(&self, seq: u64) {
        if let Some((_, mark)) = &self.mark {
            mark.delivered_now(seq);
        }
    }

    /// `basic.get`: hands the head message to `channel`. Returns false when
    /// the queue is empty.
    /// `timeout_ms` is how long the delivery may stay unacked (0 = forever).
    pub fn get(self: &Arc<Self>, sink: &dyn Sink, no_ack: bool, timeout_ms: u64) -> bool {
        // A stream has no head to take (the channel refuses basic.get on
        // one before it gets here).
        if self.stream.is_some() {
            return false;
        }
        self.touch();
        let mut st = self.state.lock();
        let pager = self.pager();
        let entry = loop {
            match st.ready.pop_front(Some(&pager)) {
                None => {
                    self.finish(st);
                    return false;
                }
                Some(e) if e.deadline != 0 && e.expired(now_ms()) => {
                    st.dead.push((e, Reason::Expired))
                }
                Some(e) => break e,
            }
        };
        // Not committed yet (commit.rs), or no lease (store/lease.rs): as
        // if the queue were empty.
        if self.after_commit && entry.stored && !self.store.may_deliver() {
            st.ready.push_front(entry);
            self.finish(st);
            return false;
        }
        if self.after_commit && entry.stored {
            let committed = self.store.committed_now();
            if st.uncommitted.waits_for(entry.seq, committed).is_some() {
                st.ready.push_front(entry);
                self.finish(st);
                return false;
            }
        }
        let (seq, stored) = (entry.seq, entry.stored);
        if stored {
            self.before_delivery(seq);
            self.delivered(seq);
        }
        let c = &mut st.stats.counters;
        c.redeliver += entry.redelivered as u64;
        if no_ack {
            c.get_no_ack += 1;
        } else {
            c.get += 1;
        }
        let remaining = st.ready.len() as u32;
        let size = entry.msg.body().len();
        match sink.deliver_get(self, entry, remaining, no_ack, timeout_ms) {
            Some(entry) => self.forget(entry),
            None => {
                st.unacked += 1;
                st.unacked_bytes += size;
            }
        }
        self.finish(st);
        true
    }

    /// Adds a consumer. Fails if an exclusive consumer holds the queue, or
    /// if an exclusive one is asked for while others exist. Delivers
    /// nothing: the caller sends consume-ok first, then calls `dispatch`.
    pub fn add_consumer(self: &Arc<Self>, consumer: Arc<Consumer>) -> Result<(), ConsumeError> {
        self.add_reader(consumer, super::stream::ReadSpec::default())
    }

    /// Adds a consumer; a stream's reads as `spec` says (a queue's
    /// ignores it).
    pub fn add_reader(
        self: &Arc<Self>,
        consumer: Arc<Consumer>,
        spec: super::stream::ReadSpec,
    ) -> Result<(), ConsumeError> {
        self.touch();
        if let Some(s) = &self.stream {
            return match s.add_reader(self, consumer, spec) {
                Ok(super::stream::Attach::Added) => Ok(()),
                Ok(super::stream::Attach::Deleted) => Err(ConsumeError::Deleted),
                Ok(super::stream::Attach::NameTaken) => Err(ConsumeError::NameTaken),
                Err(e) => Err(ConsumeError::Store(e.to_string())),
            };
        }
        let mut st = self.state.lock();
        if self.deleted.load(Ordering::Relaxed) {
            return Err(ConsumeError::Deleted);
        }
        if st.consumers.exclusive_held() {
            return Err(ConsumeError::ExclusiveHeld);
        }
        if consumer.exclusive && !st.consumers.is_empty() {
            return Err(ConsumeError::InUse);
        }
        st.consumers.add(consumer);
        Ok(())
    }

    /// Removes a consumer; returns how many remain.
    pub fn remove_consumer(self: &Arc<Self>, consumer: &Consumer) -> usize {
        self.touch();
        if let Some(s) = &self.stream {
            return s.remove_reader(self, consumer.id);
        }
        let mut st = self.state.lock();
        if self.args.single_active_consumer {
            st.consumers.remove_active(consumer.id);
        } else {
            st.consumers.remove(consumer.id);
        }
        let left = st.consumers.len();
        // With a single active consumer, the next one takes over now, or
        // once what the one that left holds is settled.
        self.dispatch_locked(&mut st);
        self.finish(st);
        left
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use amq_protocol::types::AMQPValue;

    use crate::queue::testing::{consumer, push, queue, TestHost, TestSink};
    use crate::queue::Settle;

    #[test]
    fn consumers_of_one_priority_take_turns_in_order() {
        let host = Arc::new(TestHost::default());
        let q = queue(&[], &host);
        let sink = Arc::new(TestSink::default());
        q.add_consumer(consumer(&sink, "a", 0, 0)).unwrap();
        q.add_consumer(consumer(&sink, "b", 0, 0)).unwrap();
        push(&q, 4);
        let seen = sink.seen.lock().clone();
        let order: Vec<(&str, u64)> = seen.iter().map(|(t, s, _)| (t.as_str(), *s)).collect();
        assert_eq!(order, [("a", 1), ("b", 2), ("a", 3), ("b", 4)]);
    }

    #[test]
    fn a_higher_priority_consumer_goes_first_while_it_has_credit() {
        let host = Arc::new(TestHost::default());
        let q = queue(&[], &host);
        let sink = Arc::new(TestSink::default());
        q.add_consumer(consumer(&sink, "low", 0, 0)).unwrap();
        q.add_consumer(consumer(&sink, "high", 2, 5)).unwrap();
        push(&q, 4);
        assert_eq!(sink.tags(), ["high", "high", "low", "low"]);
        // An ack gives "high" its credit back: it takes the next one.
        sink.settle(&[1], Settle::Ack);
        push(&q, 1);
        assert_eq!(sink.tags().last().map(String::as_str), Some("high"));
    }

    #[test]
    fn out_of_credit_waits_for_an_ack_then_delivers() {
        let host = Arc::new(TestHost::default());
        let q = queue(&[], &host);
        let sink = Arc::new(TestSink::default());
        q.add_consumer(consumer(&sink, "a", 1, 0)).unwrap();
        push(&q, 3);
        assert_eq!(sink.seen.lock().len(), 1);
        assert_eq!(q.message_count(), 2);
        sink.settle(&[1], Settle::Ack);
        assert_eq!(sink.seen.lock().last().map(|d| d.1), Some(2));
        assert_eq!(q.message_count(), 1);
    }

    #[test]
    fn a_single_active_consumer_has_the_queue_until_it_leaves() {
        let host = Arc::new(TestHost::default());
        let q = queue(
            &[("x-single-active-consumer", AMQPValue::Boolean(true))],
            &host,
        );
        let sink = Arc::new(TestSink::default());
        let first = consumer(&sink, "first", 0, 0);
        q.add_consumer(Arc::clone(&first)).unwrap();
        q.add_consumer(consumer(&sink, "second", 0, 9)).unwrap();
        push(&q, 2);
        assert_eq!(sink.tags(), ["first", "first"]);
        sink.settle(&[1, 2], Settle::Ack);
        q.remove_consumer(&first);
        push(&q, 1);
        assert_eq!(sink.tags().last().map(String::as_str), Some("second"));
    }

    /// The seqs `tag` was handed, with their redelivered flags.
    fn seen_by(sink: &TestSink, tag: &str) -> Vec<(u64, bool)> {
        let seen = sink.seen.lock();
        seen.iter()
            .filter(|(t, _, _)| t == tag)
            .map(|&(_, seq, redelivered)| (seq, redelivered))
            .collect()
    }

    /// RabbitMQ's order when the active consumer is cancelled holding
    /// a delivery and then closes (what pika's channel.close does): the
    /// next one gets the requeued delivery first, then the rest.
    #[test]
    fn a_single_active_consumer_that_leaves_holding_hands_over_once_settled() {
        let host = Arc::new(TestHost::default());
        let sac = [("x-single-active-consumer", AMQPValue::Boolean(true))];
        for how in [Settle::Requeue, Settle::Ack] {
            let q = queue(&sac, &host);
            let sink = Arc::new(TestSink::default());
            let first = consumer(&sink, "first", 1, 0);
            q.add_consumer(Arc::clone(&first)).unwrap();
            q.add_consumer(consumer(&sink, "second", 0, 0)).unwrap();
            push(&q, 5);
            assert_eq!(seen_by(&sink, "first"), [(1, false)]);
            // Cancelled holding 1: nothing goes to "second" yet, even
            // what is published meanwhile.
            q.remove_consumer(&first);
            push(&q, 1);
            assert_eq!(seen_by(&sink, "second"), []);
            sink.settle(&[1], how);
            let expect: Vec<(u64, bool)> = match how {
                Settle::Requeue => vec![(1, true), (2, false), (3, false), (4, false)],
                _ => vec![(2, false), (3, false), (4, false)],
            };
            let got = seen_by(&sink, "second");
            assert_eq!(got[..expect.len()], expect[..], "{how:?}");
            assert_eq!(got.len(), expect.len() + 2, "{how:?}");
        }
    }

    #[test]
    fn a_single_active_consumer_that_leaves_with_nothing_unacked_hands_over_at_once() {
        let host = Arc::new(TestHost::default());
        let q = queue(
            &[("x-single-active-consumer", AMQPValue::Boolean(true))],
            &host,
        );
        let sink = Arc::new(TestSink::default());
        let first = consumer(&sink, "first", 0, 0);
        q.add_consumer(Arc::clone(&first)).unwrap();
        q.add_consumer(consumer(&sink, "second", 0, 0)).unwrap();
        q.remove_consumer(&first);
        push(&q, 2);
        assert_eq!(seen_by(&sink, "second"), [(1, false), (2, false)]);
    }

    /// Without a single active consumer a cancel hands nothing over: the
    /// others go on at once.
    #[test]
    fn a_cancelled_consumer_holding_deliveries_does_not_hold_others_up() {
        let host = Arc::new(TestHost::default());
        let q = queue(&[], &host);
        let sink = Arc::new(TestSink::default());
        let first = consumer(&sink, "first", 1, 0);
        q.add_consumer(Arc::clone(&first)).unwrap();
        push(&q, 1);
        q.add_consumer(consumer(&sink, "second", 0, 0)).unwrap();
        q.remove_consumer(&first);
        push(&q, 1);
        assert_eq!(seen_by(&sink, "second"), [(2, false)]);
    }

    #[test]
    fn get_takes_the_head_and_says_when_empty() {
        let host = Arc::new(TestHost::default());
        let q = queue(&[], &host);
        let sink = TestSink::default();
        push(&q, 2);
        assert!(q.get(&sink, true, 0));
        assert!(q.get(&sink, false, 0));
        assert!(!q.get(&sink, true, 0));
        let seqs: Vec<u64> = sink.seen.lock().iter().map(|d| d.1).collect();
        assert_eq!(seqs, [1, 2]);
    }
}
