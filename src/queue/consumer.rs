//! A consumer as its queue sees it, and what the queue hands out: the
//! `Consumer` record (tag, flags, prefetch, the credit it holds), the
//! `Sink` its deliveries go to (an AMQP channel implements it), and
//! `Unacked`, a delivery waiting for its ack, which the channel keeps and
//! hands back to `Queue::settle`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::{Entry, Queue, Refused};

/// Where a consumer's deliveries go: its channel. Called with the queue's
/// lock held; it must not call back into the queue.
pub trait Sink: Send + Sync {
    /// Delivers `entry` to `consumer` if it can take it; otherwise hands
    /// the entry back with the reason.
    fn try_deliver(
        &self,
        consumer: &Arc<Consumer>,
        queue: &Arc<Queue>,
        entry: Entry,
    ) -> Result<(), (Entry, Refused)>;

    /// basic.get: hands `entry` over, recording it as unacked unless
    /// `no_ack` (then it comes back, for the queue to settle). The delivery
    /// may stay unacked `timeout_ms` (0 = forever).
    fn deliver_get(
        &self,
        queue: &Arc<Queue>,
        entry: Entry,
        message_count: u32,
        no_ack: bool,
        timeout_ms: u64,
    ) -> Option<Entry>;

    /// The server cancelled consumer `tag` (its queue was deleted).
    fn cancelled(&self, tag: &str);

    /// The connection id and channel number the deliveries go to, if it is
    /// a channel (the management API shows consumers with them).
    fn owner(&self) -> Option<(u64, u16)> {
        None
    }
}

/// One consumer (`basic.consume`).
pub struct Consumer {
    /// Unique for the broker's life, growing: a queue orders consumers by it.
    pub id: u64,
    /// Whether its queue parked it (see consumers.rs).
    pub parked: AtomicBool,
    /// Bumped by its queue whenever it leaves or rejoins the ready ring
    /// (see consumers.rs).
    pub generation: AtomicU32,
    /// The consumer tag.
    pub tag: String,
    /// Where its deliveries go.
    pub sink: Arc<dyn Sink>,
    /// Deliveries need no ack.
    pub no_ack: bool,
    /// Asked for exclusive access to the queue.
    pub exclusive: bool,
    /// Per-consumer prefetch (0 = unlimited), fixed when it was created.
    pub prefetch: u32,
    /// `x-priority` consumer argument.
    pub priority: i32,
    /// How long a delivery may stay unacked, ms (0 = forever).
    pub timeout_ms: u64,
    /// Deliveries not yet acked.
    unacked: AtomicU32,
}

impl Consumer {
    /// A consumer whose deliveries go to `sink`.
    pub fn new(
        tag: String,
        sink: Arc<dyn Sink>,
        no_ack: bool,
        exclusive: bool,
        prefetch: u32,
        priority: i32,
        timeout_ms: u64,
    ) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Consumer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            parked: Default::default(),
            generation: AtomicU32::new(0),
            tag,
            sink,
            no_ack,
            exclusive,
            prefetch,
            priority,
            timeout_ms,
            unacked: AtomicU32::new(0),
        }
    }

    /// Deliveries it holds unacked (its prefetch credit used).
    pub fn unacked(&self) -> u32 {
        self.unacked.load(Ordering::Relaxed)
    }

    /// A delivery to it now holds credit.
    pub fn take_credit(&self) {
        self.unacked.fetch_add(1, Ordering::Relaxed);
    }

    /// A delivery to it was settled: its credit is free.
    pub fn give_credit(&self) {
        self.unacked.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A delivery waiting for its ack, as the channel keeps it.
pub struct Unacked {
    /// Its delivery tag on the channel.
    pub tag: u64,
    pub queue: Arc<Queue>,
    pub entry: Entry,
    /// None for `basic.get`.
    pub consumer: Option<Arc<Consumer>>,
    /// When it times out (the channel's clock, ms); 0 = never.
    pub deadline: u64,
}
