//! The holding side of delayed-message exchanges: `hold` puts a message in
//! the store keyed by its due time; one scheduler task per broker sleeps
//! until the earliest due time (or until an earlier message arrives), hands
//! what is due to its `Release` (the broker, which routes it through the
//! exchange), removes the held record, and sleeps again. Nothing is kept in
//! memory per held message. It knows the store and messages, nothing above.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use crate::message::Message;
use crate::store::{self, Store};
use crate::util::now_ms;

/// Messages released per store read.
const BATCH: usize = 512;

/// Where due messages go.
pub trait Release: Send + Sync {
    /// The store that holds them.
    fn store(&self) -> &Store;
    /// Routes `msg`, held `delay_ms` for a delayed exchange of `vhost`,
    /// now that it is due. Its held record is removed after this returns,
    /// so copies it stores are written before the original goes.
    fn release(&self, vhost: &str, delay_ms: u64, msg: Message);
}

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
        vhost: &str,
        msg: &Message,
        delay_ms: u64,
    ) -> store::Result<()> {
        let due = now_ms().saturating_add(delay_ms);
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        store.put_delayed(due, seq, vhost, delay_ms, msg)?;
        if due < self.sleeping_until.load(Ordering::Relaxed) {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Runs the release loop until `owner` goes away.
    pub fn start(self: &Arc<Self>, owner: Weak<dyn Release>) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let Some(r) = owner.upgrade() else { return };
                let released = match this.release_due(r.as_ref()) {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!("releasing delayed messages failed: {e}");
                        0
                    }
                };
                let next = r.store().next_delayed().ok().flatten().unwrap_or(u64::MAX);
                drop(r);
                if released == BATCH {
                    continue;
                }
                this.sleeping_until.store(next, Ordering::Relaxed);
                // Never sleep long: the owner may have gone away.
                let wait = next.saturating_sub(now_ms()).clamp(1, 1000);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    _ = this.wake.notified() => {}
                }
            }
        });
    }

    /// Hands the messages that are due to `r`; returns how many.
    fn release_due(&self, r: &dyn Release) -> store::Result<usize> {
        let due = r.store().due_delayed(now_ms(), BATCH)?;
        let n = due.len();
        for m in due {
            // The copies are stored (unflushed) before the held record goes,
            // and commit with its removal (a cluster); a single node's crash
            // in between can duplicate, never lose.
            let _group = r.store().group();
            r.release(&m.vhost, m.delay_ms, m.message);
            r.store().remove_delayed(&m.key)?;
        }
        Ok(n)
    }
}
