//! What the management API shows of a channel: the settings the channel
//! changes now and then (prefetch, consumers, confirm and tx modes,
//! unconfirmed publishes), stored after each method that may change them
//! (never per message), and its unacked deliveries, read from the
//! delivery side when asked.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::amqp::delivery::ChannelDelivery;
use crate::broker::connections::{ChannelSnapshot, ChannelView, MessageCounters};
use crate::broker::message_sizes::SizeCounters;
use crate::rates::Rates;

/// Adds one to a counter only its channel's connection task writes (a
/// load and a store, no read-modify-write).
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// The publishing side's counters, written by the connection task.
#[derive(Default)]
pub struct Published {
    pub received: AtomicU64,
    pub received_confirm: AtomicU64,
    pub routed: AtomicU64,
    pub dropped: AtomicU64,
    pub returned: AtomicU64,
    pub confirmed: AtomicU64,
    pub get_empty: AtomicU64,
    pub acked: AtomicU64,
    /// The sizes of the bodies received.
    pub sizes: SizeCounters,
}

/// A channel's shown state.
pub struct Status {
    pub number: u16,
    delivery: Arc<ChannelDelivery>,
    pub prefetch: AtomicU32,
    pub global_prefetch: AtomicU32,
    pub consumers: AtomicU32,
    pub unconfirmed: AtomicU32,
    pub confirm: AtomicBool,
    pub transactional: AtomicBool,
    /// Message counters of the publishing side.
    pub published: Published,
    /// All the counters' rates, sampled every few seconds.
    rates: parking_lot::Mutex<Rates<{ MessageCounters::LEN }>>,
}

impl Status {
    pub fn new(number: u16, delivery: Arc<ChannelDelivery>) -> Status {
        Status {
            number,
            delivery,
            prefetch: AtomicU32::new(0),
            global_prefetch: AtomicU32::new(0),
            consumers: AtomicU32::new(0),
            unconfirmed: AtomicU32::new(0),
            confirm: AtomicBool::new(false),
            transactional: AtomicBool::new(false),
            published: Published::default(),
            rates: parking_lot::Mutex::new(Rates::default()),
        }
    }

    fn counters(&self) -> MessageCounters {
        let p = &self.published;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut counters = self.delivery.counters();
        counters.add(&MessageCounters {
            received: n(&p.received),
            received_confirm: n(&p.received_confirm),
            routed: n(&p.routed),
            unroutable_dropped: n(&p.dropped),
            unroutable_returned: n(&p.returned),
            confirmed: n(&p.confirmed),
            get_empty: n(&p.get_empty),
            acknowledged: n(&p.acked),
            ..MessageCounters::default()
        });
        counters
    }
}

impl ChannelView for Status {
    fn snapshot(&self) -> ChannelSnapshot {
        let get = |a: &AtomicU32| a.load(Ordering::Relaxed);
        ChannelSnapshot {
            counters: self.counters(),
            sizes: self.published.sizes.load(),
            rates: *self.rates.lock().per_sec(),
            number: self.number,
            prefetch: get(&self.prefetch),
            global_prefetch: get(&self.global_prefetch),
            consumers: get(&self.consumers),
            unacked: self.delivery.unacked_count() as u32,
            unconfirmed: get(&self.unconfirmed),
            confirm: self.confirm.load(Ordering::Relaxed),
            transactional: self.transactional.load(Ordering::Relaxed),
        }
    }

    fn sample(&self, now_ms: u64) {
        let now = self.counters().values();
        self.rates.lock().sample(now_ms, now);
    }
}
