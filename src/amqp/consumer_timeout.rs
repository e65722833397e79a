//! Consumer timeout, better than RabbitMQ's: a delivery unacked for longer
//! than its timeout (`consumer_timeout`, or `x-consumer-timeout` on the
//! queue or on basic.consume, in that order of precedence reversed) is
//! requeued, redelivered, and its consumer gets a server-sent basic.cancel
//! while the channel stays open (RabbitMQ closes the whole channel with
//! 406, which is what a client without consumer_cancel_notify still gets).
//! A basic.get delivery that times out is requeued silently; a late ack,
//! nack or reject of a timed-out tag is ignored.
//!
//! Deadlines are stamped with a coarse monotonic clock (a few ms, no
//! syscall). One task per broker looks at every channel with deliveries
//! once a second (RabbitMQ: once a minute) and wakes the connection whose
//! channel has one past its deadline; the connection's reader, which owns
//! its channels, then does the requeueing and cancelling.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::delivery::ChannelDelivery;
use crate::util::coarse_now_ms;

/// How often deadlines are looked at.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The channels whose deliveries may time out.
#[derive(Default)]
pub struct Sweeper {
    channels: Mutex<Vec<Weak<ChannelDelivery>>>,
}

impl Sweeper {
    /// Watches a channel's deliveries (until it is dropped).
    pub fn watch(&self, channel: &Arc<ChannelDelivery>) {
        self.channels.lock().push(Arc::downgrade(channel));
    }

    /// Wakes the connections with a delivery past its deadline; forgets
    /// channels that are gone.
    pub fn sweep(&self) {
        let now = coarse_now_ms();
        let mut due = Vec::new();
        self.channels.lock().retain(|w| match w.upgrade() {
            Some(ch) => {
                if ch.has_expired(now) {
                    due.push(ch);
                }
                true
            }
            None => false,
        });
        for ch in due {
            ch.outbox.wake_reader();
        }
    }

    /// Sweeps every `CHECK_EVERY` while `owner` lives.
    pub fn start<T: Send + Sync + 'static>(self: &Arc<Self>, owner: Weak<T>) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                if owner.strong_count() == 0 {
                    return;
                }
                this.sweep();
            }
        });
    }
}
