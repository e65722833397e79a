//! The holding side of delayed-message exchanges: `hold` puts a message in
//! the store keyed by its due time; one scheduler task per broker sleeps
//! until the earliest due time (or until an earlier message arrives),
//! releases what is due through the exchange's routing, and sleeps again.
//! Nothing is kept in memory per held message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use crate::broker::Broker;
use crate::message::Message;
use crate::queue::now_ms;
use crate::store::{self, Store};

use crate::vhost::routing::RouteScratch;
use crate::vhost::VHost;

/// Messages released per store read.
const BATCH: usize = 512;

/// Holds and releases delayed messages.
pub struct Scheduler {
    wake: Notify,
    next_seq: AtomicU64,
    /// The earliest due time the task sleeps towards (u64::MAX: none).
    sleeping_until: AtomicU64,
}

impl Scheduler {
    /// A scheduler; `last_seq` is the highest sequence in use. It keeps no
    /// handle on the store, so a stopped broker closes its data dir at once.
    pub fn new(last_seq: u64) -> Arc<Scheduler> {
        Arc::new(Scheduler {
            wake: Notify::new(),
            next_seq: AtomicU64::new(last_seq + 1),
            sleeping_until: AtomicU64::new(0),
        })
    }

    /// Holds `msg` (published to a delayed exchange of `vhost`) for
    /// `delay_ms`. The write is durable after the next group commit.
    pub fn hold(
        &self,
        store: &Store,
        vhost: &VHost,
        msg: &Message,
        delay_ms: u64,
    ) -> store::Result<()> {
        let due = now_ms().saturating_add(delay_ms);
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        store.put_delayed(due, seq, &vhost.name, delay_ms, msg)?;
        if let Some(x) = vhost.exchange(&msg.exchange_str()) {
            x.held.fetch_add(1, Ordering::Relaxed);
        }
        if due < self.sleeping_until.load(Ordering::Relaxed) {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Runs the release loop until the broker goes away.
    pub fn start(self: &Arc<Self>, broker: Weak<Broker>) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let Some(b) = broker.upgrade() else { return };
                let released = match this.release_due(&b) {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!("releasing delayed messages failed: {e}");
                        0
                    }
                };
                let next = b.store.next_delayed().ok().flatten().unwrap_or(u64::MAX);
                drop(b);
                if released == BATCH {
                    continue;
                }
                this.sleeping_until.store(next, Ordering::Relaxed);
                // Never sleep long: the broker may have gone away.
                let wait = next.saturating_sub(now_ms()).clamp(1, 1000);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    _ = this.wake.notified() => {}
                }
            }
        });
    }

    /// Routes the messages that are due; returns how many.
    fn release_due(&self, broker: &Broker) -> store::Result<usize> {
        let due = broker.store.due_delayed(now_ms(), BATCH)?;
        let n = due.len();
        let mut scratch = RouteScratch::default();
        let mut routes = Vec::new();
        for m in due {
            if let Some(vhost) = broker.vhost(&m.vhost) {
                let exchange = vhost.exchange(&m.message.exchange_str());
                let mut msg = m.message;
                if let Some(x) = &exchange {
                    let _ = x
                        .held
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
                    if let Some(plugin) = &x.plugin {
                        for (name, value) in plugin.released(m.delay_ms) {
                            msg = msg.with_header(name, value);
                        }
                    }
                }
                // A deleted exchange: the message is dropped, as in RabbitMQ.
                if exchange.is_some()
                    && vhost
                        .route_released(&msg, &mut scratch, &mut routes)
                        .is_ok()
                {
                    let msg = Arc::new(msg);
                    for q in routes.drain(..) {
                        if let Err(e) = q.push_written(&msg) {
                            tracing::error!(
                                queue = q.name(),
                                "cannot enqueue a released delayed message: {e}"
                            );
                        }
                    }
                }
                routes.clear();
            }
            // The copies are stored (unflushed) before the held record goes:
            // a crash in between can duplicate, never lose.
            broker.store.remove_delayed(&m.key)?;
        }
        Ok(n)
    }
}
