//! Deferred writes. A holder of messages that must reach the store before
//! the next group commit (a durable queue, see queue/unwritten.rs) keeps
//! them itself and registers here; the flusher asks every registered
//! holder to write just before each flush. A message acked (or otherwise
//! gone) before that is never written, and its removal costs nothing: with
//! a consumer keeping up, most persistent messages never touch sled, as in
//! RabbitMQ's message store. The publisher's confirm still waits for the
//! flush, so a confirm always means "on disk or already consumed".

use std::sync::Weak;

use parking_lot::Mutex;

/// Something with writes to make before the next flush.
pub trait DeferredWrites: Send + Sync {
    /// Writes what is pending; `Err` leaves the rest pending and holds the
    /// flush's confirms back.
    fn write_deferred(&self) -> super::Result<()>;
}

/// The holders registered since the last flush.
#[derive(Default)]
pub struct Registry {
    holders: Mutex<Vec<Weak<dyn DeferredWrites>>>,
}

impl Registry {
    /// Registers a holder (once per flush: the holder keeps track).
    pub fn register(&self, holder: Weak<dyn DeferredWrites>) {
        self.holders.lock().push(holder);
    }

    /// Asks every registered holder to write; true if all did. One that
    /// failed stays registered for the next flush.
    pub fn write_all(&self) -> bool {
        let holders = std::mem::take(&mut *self.holders.lock());
        let mut ok = true;
        for weak in holders {
            let Some(h) = weak.upgrade() else { continue };
            if let Err(e) = h.write_deferred() {
                tracing::error!("deferred store write failed: {e}");
                self.register(weak);
                ok = false;
            }
        }
        ok
    }
}
