//! A queue: its ready messages (FIFO by sequence number), its consumers
//! (round-robin), and what it has handed out. One mutex guards the state and
//! is held only for the O(1) work of one push, delivery or ack; delivery runs
//! on whichever task makes progress possible (a publisher's connection, an
//! ack, a writer that drained), so there is no hop through a queue task.
//!
//! Persistent messages of a durable queue are written to the store on the
//! way in and removed on ack; the store's group commit makes them durable.
//!
//! Messages that leave without being acked (rejected, expired, dropped by a
//! length limit) are collected while the lock is held and dead-lettered
//! after it is released (`dead_letter.rs` builds them, `expiry.rs` times
//! TTLs and x-expires).

pub mod args;
mod consumer;
mod consumers;
pub mod dead_letter;
mod entry;
mod expiry;
mod host;
mod ready;
mod unwritten;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use amq_protocol::types::FieldTable;
use parking_lot::Mutex;

pub use crate::util::now_ms;
use args::{Overflow, QueueArgs};
pub use consumer::{Consumer, Sink, Unacked};
use consumers::Consumers;
pub use consumers::Refused;
use dead_letter::Reason;
pub use entry::Entry;
pub use host::Host;
use ready::{Pager, Ready};

use crate::message::Message;
use crate::store::{self, Store};

/// A queue's identity and settings, fixed at declare.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    pub name: String,
    pub vhost: String,
    pub durable: bool,
    /// Owning connection id for exclusive queues.
    pub exclusive_owner: Option<u64>,
    pub auto_delete: bool,
    pub arguments: FieldTable,
    /// Key prefix of its messages in the store (0 for transient queues).
    pub store_id: u64,
}

/// A queue.
pub struct Queue {
    pub config: QueueConfig,
    /// The x-arguments it acts on.
    pub args: QueueArgs,
    store: Arc<Store>,
    /// Its vhost, for dead-lettering and x-expires.
    host: Weak<dyn Host>,
    /// Wakes the expiry timer when an earlier deadline arrives.
    timer: Arc<tokio::sync::Notify>,
    /// Last time it was used (ms since the epoch), for x-expires.
    last_used: AtomicU64,
    /// Durable queues: how far deliveries went, and what the last stop
    /// left (store/delivered.rs).
    mark: Option<(u64, Arc<store::Mark>)>,
    deleted: AtomicBool,
    state: Mutex<State>,
    /// Persistent messages waiting for the next flush to be written.
    unwritten: unwritten::Unwritten,
}

struct State {
    ready: Ready,
    next_seq: u64,
    consumers: Consumers,
    /// Deliveries handed out and not yet settled.
    unacked: usize,
    /// Deadlines of messages with a TTL: (deadline ms, seq).
    expiry: BinaryHeap<Reverse<(u64, u64)>>,
    /// Whether the expiry timer task runs.
    timer_running: bool,
    /// Messages to dead-letter once the lock is released.
    dead: Vec<(Entry, Reason)>,
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    /// The message was written to the store (the confirm waits for a flush).
    pub stored: bool,
    /// A length limit with x-overflow reject-publish refused it.
    pub rejected: bool,
}

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
    /// A new, empty queue of `vhost`.
    pub fn new(config: QueueConfig, store: Arc<Store>, host: Weak<dyn Host>) -> Arc<Queue> {
        let mark = (config.store_id != 0).then(|| store.delivery_mark(config.store_id));
        let args = QueueArgs::from_table(&config.arguments);
        let ready = Ready::with_max_priority(args.max_priority.unwrap_or(0));
        let q = Arc::new(Queue {
            config,
            args,
            store,
            host,
            timer: Arc::new(tokio::sync::Notify::new()),
            last_used: AtomicU64::new(now_ms()),
            mark,
            deleted: AtomicBool::new(false),
            state: Mutex::new(State {
                ready,
                next_seq: 1,
                consumers: Consumers::default(),
                unacked: 0,
                expiry: BinaryHeap::new(),
                timer_running: false,
                dead: Vec::new(),
            }),
            unwritten: Default::default(),
        });
        if let Some(ms) = q.args.expires {
            expiry::watch_unused(&q, ms);
        }
        q
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether messages of this queue are kept in the store.
    fn keeps(&self, msg: &Message) -> bool {
        self.config.store_id != 0 && msg.persistent()
    }

    /// Where this queue pages messages out of memory (durable queues only).
    fn pager(&self) -> Option<Pager<'_>> {
        (self.config.store_id != 0).then(|| Pager {
            store: &self.store,
            queue_id: self.config.store_id,
        })
    }

    /// Loads the messages a durable queue had at the last stop.
    pub fn recover(self: &Arc<Self>) -> store::Result<usize> {
        // Every message at or below it may have been delivered before the
        // stop (exactly those after a clean stop).
        let delivered = self.mark.as_ref().map_or(0, |(start, _)| *start);
        let mut st = self.state.lock();
        for item in self.store.messages(self.config.store_id) {
            let m = item?;
            st.next_seq = st.next_seq.max(m.seq + 1);
            // The deadline was stored with the message, so its TTL kept
            // running while the broker was down; records written before
            // deadlines were stored start their TTL again.
            let deadline = match m.deadline {
                0 => self.deadline_for(&m.message),
                d => d,
            };
            st.ready.push_recovered(Entry {
                msg: m.message,
                seq: m.seq,
                redelivered: m.seq <= delivered,
                stored: true,
                deadline,
                returned: 0,
            });
        }
        let deadlines: Vec<(u64, u64)> = st.ready.deadlines().collect();
        for (deadline, seq) in deadlines {
            self.schedule(&mut st, deadline, seq);
        }
        // New messages must sort after everything ever delivered, or the
        // next recovery would take them for redeliveries.
        st.next_seq = st.next_seq.max(delivered + 1);
        Ok(st.ready.len())
    }

    /// Enqueues a published message and delivers what it can; applies the
    /// length limit (x-max-length / x-max-length-bytes with x-overflow).
    /// A persistent message of a durable queue is written to the store by
    /// the next flush (the confirm waits for it), unless it leaves first.
    pub fn push(self: &Arc<Self>, msg: &Arc<Message>) -> store::Result<Pushed> {
        self.push_with(msg, false)
    }

    /// Like `push`, but writes to the store at once: for a copy whose
    /// original is removed from the store right after (dead-lettering, a
    /// delayed message's release), which must not reach disk first.
    pub fn push_written(self: &Arc<Self>, msg: &Arc<Message>) -> store::Result<Pushed> {
        self.push_with(msg, true)
    }

    fn push_with(self: &Arc<Self>, msg: &Arc<Message>, write_now: bool) -> store::Result<Pushed> {
        let mut st = self.state.lock();
        if self.deleted.load(Ordering::Relaxed) {
            return Ok(Pushed {
                stored: false,
                rejected: false,
            });
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let deadline = self.deadline_for(msg);
        let entry = Entry {
            msg: Arc::clone(msg),
            seq,
            redelivered: false,
            stored: false,
            deadline,
            returned: 0,
        };
        if self.args.overflow != Overflow::DropHead && self.full_for(&st, msg.body().len()) {
            if self.args.overflow == Overflow::RejectPublishDlx {
                st.dead.push((entry, Reason::MaxLen));
                self.finish(st);
            }
            return Ok(Pushed {
                stored: false,
                rejected: true,
            });
        }
        let stored = self.keeps(msg);
        // A message about to be paged out must be in the store already.
        if stored && (write_now || st.ready.pages_next()) {
            self.store
                .put_message(self.config.store_id, seq, msg, deadline)?;
        } else if stored && self.unwritten.add(seq, deadline, msg) {
            let holder: Weak<Queue> = Arc::downgrade(self);
            self.store.defer(holder);
        }
        let entry = Entry { stored, ..entry };
        st.ready.push_back(entry, self.pager().as_ref())?;
        if deadline != 0 {
            self.schedule(&mut st, deadline, seq);
        }
        self.dispatch_locked(&mut st);
        self.drop_over_limit(&mut st);
        self.finish(st);
        Ok(Pushed {
            stored,
            rejected: false,
        })
    }

    /// When a message pushed now expires (0 = never): the smaller of the
    /// queue's x-message-ttl and the message's expiration.
    fn deadline_for(&self, msg: &Message) -> u64 {
        let ttl = match (self.args.message_ttl, msg.meta.expiration_ms()) {
            (None, None) => return 0,
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
        };
        // u64::MAX marks an expired slot in `Ready`.
        now_ms().saturating_add(ttl).clamp(1, u64::MAX - 1)
    }

    /// Whether one more message of `bytes` would break a length limit.
    fn full_for(&self, st: &State, bytes: usize) -> bool {
        self.args
            .max_length
            .is_some_and(|max| st.ready.len() as u64 >= max)
            || self
                .args
                .max_length_bytes
                .is_some_and(|max| (st.ready.bytes() + bytes) as u64 > max)
    }

    /// x-overflow drop-head: drops (dead-letters) the oldest ready messages
    /// until the limits hold.
    fn drop_over_limit(&self, st: &mut State) {
        if self.args.max_length.is_none() && self.args.max_length_bytes.is_none() {
            return;
        }
        let pager = self.pager();
        while self
            .args
            .max_length
            .is_some_and(|max| st.ready.len() as u64 > max)
            || self
                .args
                .max_length_bytes
                .is_some_and(|max| st.ready.bytes() as u64 > max)
        {
            let Some(head) = st.ready.pop_front(pager.as_ref()) else {
                break;
            };
            st.dead.push((head, Reason::MaxLen));
        }
    }

    /// Records a deadline and makes sure the expiry timer will see it.
    fn schedule(self: &Arc<Self>, st: &mut State, deadline: u64, seq: u64) {
        // Deadlines of messages consumed before they expired stay in the
        // heap until due; when they far outnumber the ready messages,
        // rebuild it from what is actually waiting.
        if st.expiry.len() > 2 * st.ready.len() + 1024 {
            st.expiry = st.ready.deadlines().map(Reverse).collect();
        }
        let earliest = st.expiry.peek().map(|Reverse((d, _))| *d);
        st.expiry.push(Reverse((deadline, seq)));
        if !st.timer_running {
            st.timer_running = true;
            expiry::start_timer(self);
        } else if earliest.is_none_or(|e| deadline < e) {
            self.timer.notify_one();
        }
    }

    /// Removes the messages whose TTL ran out by `now`; returns the next
    /// deadline (expiry timer).
    fn expire_due(self: &Arc<Self>, now: u64) -> Option<u64> {
        let mut st = self.state.lock();
        // Bounded work per pass, so the lock is never held for long; the
        // timer comes straight back for the rest.
        let mut budget = 10_000;
        while let Some(&Reverse((deadline, seq))) = st.expiry.peek() {
            if deadline > now || budget == 0 {
                break;
            }
            budget -= 1;
            st.expiry.pop();
            if let Some(entry) = st.ready.remove(seq) {
                st.dead.push((entry, Reason::Expired));
            }
        }
        let next = st.expiry.peek().map(|Reverse((d, _))| *d);
        if next.is_none() {
            st.timer_running = false;
        }
        self.finish(st);
        next
    }

    /// Releases the lock, then dead-letters what was collected under it.
    fn finish(&self, mut st: parking_lot::MutexGuard<'_, State>) {
        if st.dead.is_empty() {
            return;
        }
        let dead = std::mem::take(&mut st.dead);
        drop(st);
        self.dead_letter_all(dead);
    }

    /// Sends messages to the dead-letter exchange (if there is one) and
    /// removes them from this queue: the new copies are written first, so a
    /// crash in between can duplicate a message, never lose it.
    fn dead_letter_all(&self, dead: Vec<(Entry, Reason)>) {
        // Dead-lettering pushes into other queues, which may dead-letter in
        // turn (length limits, TTL 0): bound the depth so no chain of
        // queues can recurse without end; past it the message is dropped.
        thread_local!(static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
        let depth = DEPTH.with(|d| d.get());
        let target = if depth < MAX_DEAD_LETTER_HOPS {
            self.args
                .dead_letter_exchange
                .as_deref()
                .zip(self.host.upgrade())
        } else {
            tracing::warn!(queue = self.name(), "dead-letter chain too long: dropping");
            None
        };
        DEPTH.with(|d| d.set(depth + 1));
        self.dead_letter_each(dead, target);
        DEPTH.with(|d| d.set(depth));
    }

    fn dead_letter_each(&self, dead: Vec<(Entry, Reason)>, target: Option<(&str, Arc<dyn Host>)>) {
        let now_secs = now_ms() / 1000;
        for (entry, reason) in dead {
            if let Some((dlx, host)) = &target {
                let dlrk = self.args.dead_letter_routing_key.as_deref();
                let msg = Arc::new(dead_letter::dead_letter(
                    &entry.msg,
                    self.name(),
                    reason,
                    dlx,
                    dlrk,
                    now_secs,
                ));
                host.dead_letter(&msg);
            }
            self.forget(entry);
        }
    }

    /// Delivers ready messages to consumers with credit.
    pub fn dispatch(self: &Arc<Self>) {
        let mut st = self.state.lock();
        self.dispatch_locked(&mut st);
        self.finish(st);
    }

    /// Delivers ready messages to the consumers that can take them (see
    /// consumers.rs: by priority, round-robin within one; with a single
    /// active consumer only to the first subscribed). A consumer that
    /// refuses is parked until what it lacks comes back, so no consumer
    /// is asked twice for nothing.
    fn dispatch_locked(self: &Arc<Self>, st: &mut State) {
        let pager = self.pager();
        let sac = self.args.single_active_consumer;
        let State {
            consumers,
            ready,
            unacked,
            dead,
            ..
        } = st;
        while let Some(consumer) = consumers.next(sac) {
            let Some(entry) = ready.pop_front(pager.as_ref()) else {
                break;
            };
            // A consumer never receives an expired message.
            if entry.deadline != 0 && entry.expired(now_ms()) {
                dead.push((entry, Reason::Expired));
                continue;
            }
            let (seq, stored, no_ack) = (entry.seq, entry.stored, consumer.no_ack);
            if stored {
                self.before_delivery(seq);
            }
            match consumer.sink.try_deliver(consumer, self, entry) {
                Ok(()) => {
                    if stored {
                        self.delivered(seq);
                    }
                    if !no_ack {
                        *unacked += 1;
                    }
                    consumers.delivered(sac);
                }
                Err((back, why)) => {
                    ready.push_front(back);
                    consumers.park_next(sac, why);
                }
            }
        }
    }

    /// The outbox at `at` drained: its consumers may take deliveries again.
    pub fn outbox_drained(self: &Arc<Self>, at: usize) {
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
        let mut st = self.state.lock();
        st.consumers.unpark(consumer.id);
        self.dispatch_locked(&mut st);
        self.finish(st);
    }

    /// Before a stored message goes out: a stop from now on must bring it
    /// back redelivered (the store writes a reservation ahead of it when
    /// needed, see store/delivered.rs).
    fn before_delivery(&self, seq: u64) {
        if let Some((_, mark)) = &self.mark {
            self.store.before_delivery(self.config.store_id, mark, seq);
        }
    }

    /// After a stored message went out (exact on a clean stop).
    fn delivered(&self, seq: u64) {
        if let Some((_, mark)) = &self.mark {
            mark.delivered_now(seq);
        }
    }

    /// `basic.get`: hands the head message to `channel`. Returns false when
    /// the queue is empty.
    /// `timeout_ms` is how long the delivery may stay unacked (0 = forever).
    pub fn get(self: &Arc<Self>, sink: &dyn Sink, no_ack: bool, timeout_ms: u64) -> bool {
        self.touch();
        let mut st = self.state.lock();
        let pager = self.pager();
        let entry = loop {
            match st.ready.pop_front(pager.as_ref()) {
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
        let (seq, stored) = (entry.seq, entry.stored);
        if stored {
            self.before_delivery(seq);
            self.delivered(seq);
        }
        let remaining = st.ready.len() as u32;
        match sink.deliver_get(self, entry, remaining, no_ack, timeout_ms) {
            Some(entry) => self.forget(entry),
            None => st.unacked += 1,
        }
        self.finish(st);
        true
    }

    /// Notes a use (basic.get, consume, redeclare) for x-expires.
    pub fn touch(&self) {
        self.last_used.store(now_ms(), Ordering::Relaxed);
    }

    /// Settles a delivery that needed no ack (called with the lock held by
    /// the dispatcher, so it must not lock).
    pub fn settle_delivered(&self, entry: Entry) {
        self.forget(entry);
    }

    fn forget(&self, entry: Entry) {
        if entry.stored && !self.deleted.load(Ordering::Relaxed) {
            if let Err(e) = self.unstore(entry.seq) {
                tracing::warn!(queue = %self.config.name, "cannot remove acked message: {e}");
            }
        }
    }

    /// Removes a stored message: free if it was not written yet.
    fn unstore(&self, seq: u64) -> store::Result<()> {
        if self.unwritten.cancel(seq) {
            return Ok(());
        }
        self.store.remove_message(self.config.store_id, seq)
    }

    /// Settles deliveries taken back from a channel, then delivers into the
    /// credit they freed.
    pub fn settle(self: &Arc<Self>, taken: impl Iterator<Item = Unacked>, how: Settle) {
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
            }
            let mut entry = u.entry;
            match how {
                Settle::Ack => {
                    st.unacked = st.unacked.saturating_sub(1);
                    self.forget(entry);
                }
                _ if deleted => {}
                Settle::Reject => {
                    st.unacked = st.unacked.saturating_sub(1);
                    st.dead.push((entry, Reason::Rejected));
                }
                Settle::Requeue => {
                    st.unacked = st.unacked.saturating_sub(1);
                    entry.redelivered = true;
                    entry.returned = entry.returned.saturating_add(1);
                    if let Some(limit) = self.args.delivery_limit {
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

    /// Adds a consumer. Fails if an exclusive consumer holds the queue, or
    /// if an exclusive one is asked for while others exist. Delivers
    /// nothing: the caller sends consume-ok first, then calls `dispatch`.
    pub fn add_consumer(self: &Arc<Self>, consumer: Arc<Consumer>) -> Result<(), ConsumeError> {
        self.touch();
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
        let mut st = self.state.lock();
        st.consumers.remove(consumer.id);
        let left = st.consumers.len();
        // With a single active consumer, the next one takes over now.
        self.dispatch_locked(&mut st);
        self.finish(st);
        left
    }

    /// Ready messages.
    pub fn message_count(&self) -> u32 {
        self.state.lock().ready.len() as u32
    }

    /// Active consumers.
    pub fn consumer_count(&self) -> u32 {
        self.state.lock().consumers.len() as u32
    }

    /// Drops every ready message; returns how many.
    pub fn purge(&self) -> store::Result<u32> {
        let mut st = self.state.lock();
        let n = st.ready.len() as u32;
        let (entries, tail) = st.ready.clear();
        for entry in entries {
            if entry.stored {
                self.unstore(entry.seq)?;
            }
        }
        if let Some(from) = tail {
            self.store.purge_from(self.config.store_id, from)?;
        }
        Ok(n)
    }

    /// Marks the queue deleted, cancels its consumers (telling clients that
    /// asked to be told) and drops its messages. Returns the ready count.
    pub fn delete(&self) -> Deleted {
        let mut st = self.state.lock();
        self.deleted.store(true, Ordering::Relaxed);
        self.unwritten.close();
        let count = st.ready.len() as u32;
        st.ready.clear();
        st.expiry.clear();
        self.timer.notify_one();
        Deleted {
            count,
            consumers: st.consumers.drain(),
        }
    }

    /// Whether the queue was deleted.
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Relaxed)
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
}

/// A deleted queue's message count, and its consumers, who are sent
/// basic.cancel when this is dropped: a handler that deletes a queue keeps
/// it until its own reply (delete-ok) is out, so that reply comes first.
pub struct Deleted {
    pub count: u32,
    consumers: Vec<Arc<Consumer>>,
}

impl Drop for Deleted {
    fn drop(&mut self) {
        for c in self.consumers.drain(..) {
            c.sink.cancelled(&c.tag);
        }
    }
}

/// Why a consumer could not be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeError {
    /// Another consumer has exclusive access.
    ExclusiveHeld,
    /// Exclusive access asked while other consumers exist.
    InUse,
    /// The queue was deleted meanwhile.
    Deleted,
}

impl store::DeferredWrites for Queue {
    fn write_deferred(&self) -> store::Result<()> {
        self.unwritten.write(&self.store, self.config.store_id)
    }
}
