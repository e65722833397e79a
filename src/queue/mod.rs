//! A queue: its ready messages (FIFO by sequence number, or by priority),
//! its consumers, and what it has handed out. One mutex guards the state
//! and is held only for the O(1) work of one push, delivery or ack;
//! delivery runs on whichever task makes progress possible (a publisher's
//! connection, an ack, a writer that drained), so there is no hop through
//! a queue task.
//!
//! A persistent message of a durable queue is handed to the store's next
//! group commit, not written on the way in (unwritten.rs): one acked before
//! that commit is never written at all. One about to be paged out of
//! memory, or a copy whose original is removed right after (dead-lettering,
//! a delayed release), is written at once. Acks remove what was written.
//!
//! This file holds the queue's state and push; the rest of what a queue
//! does lives beside it: `dispatch.rs` (delivery and get), `settle.rs` (ack,
//! requeue, reject, purge, dead-lettering), `limits.rs` (TTL deadlines and
//! length limits), `expiry.rs` (the timers), `ready.rs` (the ready list
//! and paging), `consumers.rs` (the consumer rings).
//!
//! What a queue needs from the layers above it, it names here as traits
//! the layers above implement: `Sink` (where a consumer's deliveries go:
//! an AMQP channel) and `Host` (the vhost: dead-letter routing, x-expires).

pub mod args;
mod commit;
mod consumer;
mod consumers;
pub mod dead_letter;
mod dispatch;
mod entry;
mod expiry;
mod host;
pub mod kind;
mod limits;
mod policy;
mod ready;
mod settle;
pub mod stats;
pub mod stream;
#[cfg(test)]
mod testing;
mod transfer;
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
pub use settle::Settle;

use crate::dedup::Admit;
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

/// What queue federation asks of a queue (`Queue::demand`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// Messages ready.
    pub ready: usize,
    /// A consumer of priority 0 or more is subscribed.
    pub consumed: bool,
    /// One of them could take a message now.
    pub idle: bool,
}

/// A queue.
pub struct Queue {
    pub config: QueueConfig,
    /// What its x-arguments say (the arguments in force, with its
    /// policies, are in its state: `State::live`).
    pub args: QueueArgs,
    store: Arc<Store>,
    /// Where its messages past the memory bound go in the store: its
    /// store id if durable, else a local id (store/local.rs).
    page_id: u64,
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
    /// Whether the x-expires watcher runs.
    expires_watched: AtomicBool,
    state: Mutex<State>,
    /// Persistent messages waiting for the next flush to be written.
    unwritten: unwritten::Unwritten,
    /// Kept messages are handed out only once committed (commit.rs: a
    /// cluster's leader).
    after_commit: bool,
    /// A task waits for the commit the head message needs.
    commit_wait: AtomicBool,
    /// A task waits for the leadership lease to hold again.
    lease_wait: AtomicBool,
    /// A stream's log and readers (x-queue-type=stream): its messages
    /// and consumers are there, not in `state`.
    stream: Option<stream::Stream>,
    /// Its deduplication cache (`x-message-deduplication`), set once by
    /// its vhost, which opens it.
    dedup: std::sync::OnceLock<Arc<crate::dedup::Dedup>>,
}

struct State {
    /// The arguments in force: the x-arguments merged with the queue's
    /// policy and operator policy (policy.rs).
    live: QueueArgs,
    /// The names of the policy and operator policy that apply, and the
    /// definition they make together.
    policy: Option<String>,
    operator_policy: Option<String>,
    effective: serde_json::Map<String, serde_json::Value>,
    /// Message counters for the API (stats.rs).
    stats: stats::Stats,
    /// Depth and counters over the last minutes, kept while they change.
    history: crate::history::Sparse<{ stats::HISTORY.len() }>,
    ready: Ready,
    next_seq: u64,
    consumers: Consumers,
    /// Deliveries handed out and not yet settled, and their bytes.
    unacked: usize,
    unacked_bytes: usize,
    /// Deadlines of messages with a TTL: (deadline ms, seq).
    expiry: BinaryHeap<Reverse<(u64, u64)>>,
    /// Due deadlines of paged-out messages that memory had no room to
    /// read back yet (expiry.rs `expire_due`).
    expiry_deferred: BinaryHeap<Reverse<(u64, u64)>>,
    /// Whether the expiry timer task runs.
    timer_running: bool,
    /// Messages to dead-letter once the lock is released.
    dead: Vec<(Entry, Reason)>,
    /// Kept messages not committed yet (commit.rs).
    uncommitted: commit::Uncommitted,
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    /// The message was written to the store (the confirm waits for a flush).
    pub stored: bool,
    /// A length limit with x-overflow reject-publish refused it.
    pub rejected: bool,
}

impl Queue {
    /// A new, empty queue of `vhost`.
    pub fn new(config: QueueConfig, store: Arc<Store>, host: Weak<dyn Host>) -> Arc<Queue> {
        let mark = (config.store_id != 0).then(|| store.delivery_mark(config.store_id));
        let args = QueueArgs::from_table(&config.arguments);
        let ready = Ready::with_max_priority(args.max_priority.unwrap_or(0));
        let live = args.clone();
        let after_commit = config.store_id != 0 && store.delivers_after_commit();
        let stream = (args.kind == kind::Kind::Stream).then(|| stream::Stream::new(&args));
        let page_id = match config.store_id {
            0 => store::local_queue_id(),
            id => id,
        };
        let q = Arc::new(Queue {
            config,
            args,
            store,
            page_id,
            host,
            timer: Arc::new(tokio::sync::Notify::new()),
            last_used: AtomicU64::new(now_ms()),
            mark,
            deleted: AtomicBool::new(false),
            expires_watched: AtomicBool::new(false),
            state: Mutex::new(State {
                live,
                policy: None,
                operator_policy: None,
                effective: Default::default(),
                stats: Default::default(),
                history: Default::default(),
                ready,
                next_seq: 1,
                consumers: Consumers::default(),
                unacked: 0,
                unacked_bytes: 0,
                expiry: BinaryHeap::new(),
                expiry_deferred: BinaryHeap::new(),
                timer_running: false,
                dead: Vec::new(),
                uncommitted: Default::default(),
            }),
            unwritten: Default::default(),
            after_commit,
            commit_wait: AtomicBool::new(false),
            lease_wait: AtomicBool::new(false),
            stream,
            dedup: Default::default(),
        });
        if q.args.expires.is_some() {
            expiry::watch_unused(&q);
        }
        if q.stream.is_some() {
            stream::watch_retention(&q);
        }
        q
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether messages of this queue are kept in the store: a durable
    /// queue's persistent ones, and every one of a quorum queue.
    fn keeps(&self, msg: &Message) -> bool {
        self.config.store_id != 0 && (msg.persistent() || self.args.kind == kind::Kind::Quorum)
    }

    /// Where this queue pages messages out of memory: every queue does
    /// (a non-durable one's go as transient messages, store/local.rs).
    fn pager(&self) -> Pager<'_> {
        Pager {
            store: &self.store,
            queue_id: self.page_id,
        }
    }

    /// Loads the messages a durable queue had at the last stop.
    pub fn recover(self: &Arc<Self>) -> store::Result<usize> {
        if let Some(s) = &self.stream {
            return s.recover(self).map(|n| n as usize);
        }
        // Every message at or below it may have been delivered before the
        // stop (exactly those after a clean stop).
        let delivered = self.mark.as_ref().map_or(0, |(start, _)| *start);
        let mut st = self.state.lock();
        let mut rest = None;
        for item in self.store.messages(self.config.store_id) {
            let m = item?;
            st.next_seq = st.next_seq.max(m.seq + 1);
            // The deadline was stored with the message, so its TTL kept
            // running while the broker was down; records written before
            // deadlines were stored start their TTL again.
            let deadline = match m.deadline {
                0 => self.deadline_for(&st.live, &m.message),
                d => d,
            };
            st.ready.push_recovered(Entry {
                msg: m.message,
                seq: m.seq,
                redelivered: m.seq <= delivered,
                stored: true,
                deadline,
                enqueued: crate::util::coarse_wall_secs(),
                returned: 0,
            });
            if st.ready.paged_out().0 > 0 {
                // Past the memory bound: the rest stays in the store, and
                // the store may tell it without reading it.
                rest = self.store.message_meta(self.config.store_id, m.seq + 1);
                if rest.is_some() {
                    break;
                }
            }
        }
        for item in rest.into_iter().flatten() {
            let (seq, body_len, deadline) = item?;
            st.next_seq = st.next_seq.max(seq + 1);
            // A deadline of 0: the message had no expiration when it was
            // stored (it is stored with its deadline since 2941949,
            // 2026-11-29: an older record's expiration is not seen here),
            // but the queue may have a message-ttl now.
            let deadline = match deadline {
                0 => self.queue_ttl_deadline(&st.live),
                d => d,
            };
            let now = crate::util::coarse_wall_secs();
            st.ready
                .push_recovered_tail(seq, body_len as usize, deadline, now);
        }
        // Those left in the store past the memory bound keep their flag
        // when read back (a cluster's new leader flags every one).
        if let Some(last) = st.next_seq.checked_sub(1) {
            st.ready.redelivered_through(last.min(delivered));
        }
        let deadlines: Vec<(u64, u64)> = st.ready.deadlines().collect();
        for (deadline, seq) in deadlines {
            self.schedule(&mut st, deadline, seq);
        }
        // New messages must sort after everything ever delivered, or the
        // next recovery would take them for redeliveries (a new leader
        // takes every recovered message as delivered: nothing to skip).
        if let Some(next) = delivered.checked_add(1) {
            st.next_seq = st.next_seq.max(next);
        }
        Ok(st.ready.len())
    }

    /// Enqueues a published message and delivers what it can; applies the
    /// length limit (x-max-length / x-max-length-bytes with x-overflow).
    /// A persistent message of a durable queue is written to the store by
    /// the next flush (the confirm waits for it), unless it leaves first.
    pub fn push(self: &Arc<Self>, msg: &Arc<Message>) -> store::Result<Pushed> {
        self.push_with(msg, false, true)
    }

    /// Like `push`, but writes to the store at once: for a copy whose
    /// original is removed from the store right after (a delayed
    /// message's release), which must not reach disk first.
    pub fn push_written(self: &Arc<Self>, msg: &Arc<Message>) -> store::Result<Pushed> {
        self.push_with(msg, true, true)
    }

    /// Like `push_written`, for a dead-lettered copy: the same message
    /// moving on, so deduplication lets it in (a retry loop through a
    /// dead-letter exchange brings a message back to the queue it left).
    pub fn push_dead_lettered(self: &Arc<Self>, msg: &Arc<Message>) -> store::Result<Pushed> {
        self.push_with(msg, true, false)
    }

    /// Its deduplication cache, once (its vhost opens it).
    pub fn set_dedup(&self, dedup: Arc<crate::dedup::Dedup>) {
        let _ = self.dedup.set(dedup);
    }

    /// Its deduplication cache, if it has one.
    pub fn dedup(&self) -> Option<&Arc<crate::dedup::Dedup>> {
        self.dedup.get()
    }

    fn push_with(
        self: &Arc<Self>,
        msg: &Arc<Message>,
        write_now: bool,
        dedup: bool,
    ) -> store::Result<Pushed> {
        let admitted = match (dedup, self.dedup.get()) {
            (true, Some(d)) => match d.admit(msg) {
                // Dropped; a durable cache's confirm waits for the commit
                // that holds the original's entry.
                Admit::Duplicate => {
                    return Ok(Pushed {
                        stored: d.durable(),
                        rejected: false,
                    })
                }
                Admit::New(t) => Some((d, t)),
                Admit::Pass => None,
            },
            _ => None,
        };
        let pushed = self.push_kept(msg, write_now);
        // Refused after all: its publisher's retry is not a duplicate.
        if let Some((d, t)) = admitted {
            if !matches!(
                pushed,
                Ok(Pushed {
                    rejected: false,
                    ..
                })
            ) {
                d.forget(t);
            }
        }
        pushed
    }

    /// `push_with` once deduplication let the message in.
    fn push_kept(self: &Arc<Self>, msg: &Arc<Message>, write_now: bool) -> store::Result<Pushed> {
        if let Some(s) = &self.stream {
            return Ok(Pushed {
                stored: s.push(self, msg)?,
                rejected: false,
            });
        }
        let mut st = self.state.lock();
        if self.deleted.load(Ordering::Relaxed) {
            return Ok(Pushed {
                stored: false,
                rejected: false,
            });
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let deadline = self.deadline_for(&st.live, msg);
        let entry = Entry {
            msg: Arc::clone(msg),
            seq,
            redelivered: false,
            stored: false,
            deadline,
            enqueued: crate::util::coarse_wall_secs(),
            returned: 0,
        };
        st.stats.counters.publish += 1;
        let overflow = st.live.overflow;
        if overflow != Overflow::DropHead && self.full_for(&st, 0, msg.body().len()) {
            if overflow == Overflow::RejectPublishDlx {
                st.dead.push((entry, Reason::MaxLen));
                self.finish(st);
            }
            return Ok(Pushed {
                stored: false,
                rejected: true,
            });
        }
        let stored = self.keeps(msg);
        if stored && st.ready.pages_next() {
            // About to be paged out: readable from the store at once, so
            // that the head reads it back even before it is committed (a
            // cluster's leader stages it).
            self.store
                .put_message_paged_out(self.config.store_id, seq, msg, deadline)?;
        } else if stored && write_now {
            self.store
                .put_message(self.config.store_id, seq, msg, deadline)?;
        } else if stored && self.unwritten.add(seq, deadline, msg) {
            let holder: Weak<Queue> = Arc::downgrade(self);
            self.store.defer(holder);
        }
        if stored && self.after_commit {
            // Taken after the write (or its registration): the commit
            // that covers it.
            let ticket = self.store.ticket();
            st.uncommitted.add(seq, ticket);
        }
        let entry = Entry { stored, ..entry };
        st.ready.push_back(entry, Some(&self.pager()))?;
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

    /// Notes a use (basic.get, consume, redeclare) for x-expires.
    pub fn touch(&self) {
        self.last_used.store(now_ms(), Ordering::Relaxed);
    }

    /// Ready messages.
    pub fn message_count(&self) -> u32 {
        if let Some(s) = &self.stream {
            return u32::try_from(s.extent().messages()).unwrap_or(u32::MAX);
        }
        self.state.lock().ready.len() as u32
    }

    /// What queue federation asks of the queue: its ready messages, and
    /// whether a consumer of priority 0 or more is subscribed, and whether
    /// one could take a message now (a federation link consumes at
    /// priority -1, so links never pull for each other). None for a
    /// stream.
    pub fn demand(&self) -> Option<Demand> {
        if self.stream.is_some() {
            return None;
        }
        let state = self.state.lock();
        Some(Demand {
            ready: state.ready.len(),
            consumed: state.consumers.any_from(0),
            idle: state.consumers.any_ready_from(0),
        })
    }

    /// Active consumers.
    pub fn consumer_count(&self) -> u32 {
        if let Some(s) = &self.stream {
            return s.readers() as u32;
        }
        self.state.lock().consumers.len() as u32
    }

    /// A stream's log and readers, if it is one.
    pub fn stream(&self) -> Option<&stream::Stream> {
        self.stream.as_ref()
    }

    /// Marks the queue deleted, cancels its consumers (telling clients that
    /// asked to be told) and drops its messages. Returns the ready count.
    pub fn delete(&self) -> Deleted {
        let mut st = self.state.lock();
        self.deleted.store(true, Ordering::Relaxed);
        self.unwritten.close();
        if let Some(d) = self.dedup.get() {
            d.close();
        }
        let count = st.ready.len() as u32;
        st.ready.clear();
        if self.config.store_id == 0 {
            // What it paged out, delivered or not (a durable queue's go
            // with its definition, vhost/queues.rs).
            if let Err(e) = self.store.purge_from(self.page_id, 0) {
                tracing::warn!(queue = %self.config.name, "cannot drop paged messages: {e}");
            }
        }
        st.expiry.clear();
        st.expiry_deferred.clear();
        self.timer.notify_one();
        let mut consumers = st.consumers.drain();
        if let Some(s) = &self.stream {
            consumers.extend(s.delete());
        }
        Deleted { count, consumers }
    }

    /// Whether the queue was deleted.
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Relaxed)
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumeError {
    /// Another consumer has exclusive access.
    ExclusiveHeld,
    /// Exclusive access asked while other consumers exist.
    InUse,
    /// The queue was deleted meanwhile.
    Deleted,
    /// What the store keeps for it could not be read (a stream's tracked
    /// offset).
    Store(String),
    /// A stream reader whose offset is tracked under this consumer tag
    /// is attached already.
    NameTaken,
}

impl store::DeferredWrites for Queue {
    fn write_deferred(&self) -> store::Result<()> {
        self.unwritten.write(&self.store, self.config.store_id)?;
        match &self.stream {
            Some(s) => s.write_tracked(&self.store, self.config.store_id),
            None => Ok(()),
        }
    }
}
