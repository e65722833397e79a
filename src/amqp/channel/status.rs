//! What the management API shows of a channel: the settings the channel
//! changes now and then (prefetch, consumers, confirm and tx modes,
//! unconfirmed publishes), stored after each method that may change them
//! (never per message), and its unacked deliveries, read from the
//! delivery side when asked.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use crate::amqp::delivery::ChannelDelivery;
use crate::broker::connections::{ChannelSnapshot, ChannelView};

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
        }
    }
}

impl ChannelView for Status {
    fn snapshot(&self) -> ChannelSnapshot {
        let get = |a: &AtomicU32| a.load(Ordering::Relaxed);
        ChannelSnapshot {
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
}
