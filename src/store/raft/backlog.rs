//! Backpressure on the leader's journal. Everything submitted waits in
//! the entry being built (pending.rs) and then in flight until a majority
//! has it; a commit round carries what piled up during the one before, so
//! with links or followers slower than the publishers the pile has no
//! bound but memory. The backlog counts those bytes: past `HIGH` it is
//! raised and connections that publish stop reading from their sockets
//! (amqp/connection.rs, as RabbitMQ's credit flow does), until the commit
//! rounds bring it under `LOW`. Consumers' acks and every other
//! connection go on; a raised backlog only slows publishers down to what
//! the cluster commits.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::watch;

/// Bytes waiting for commit above which publishers wait.
pub const HIGH: usize = 32 << 20;
/// Bytes waiting under which they go on.
pub const LOW: usize = 16 << 20;

/// The bytes a journal holds uncommitted, and whether publishers wait.
pub struct Backlog {
    /// Shipped in the commit round under way.
    in_flight: AtomicUsize,
    /// Mirrors `raised` for a check without its lock.
    up: AtomicBool,
    raised: watch::Sender<bool>,
}

impl Default for Backlog {
    fn default() -> Self {
        Backlog {
            in_flight: AtomicUsize::new(0),
            up: AtomicBool::new(false),
            raised: watch::channel(false).0,
        }
    }
}

impl Backlog {
    /// After an operation was added to the entry being built, which now
    /// holds `pending` bytes: raises the backlog if the bytes waiting are
    /// past `HIGH`. True if it was raised by this call.
    pub fn added(&self, pending: usize) -> bool {
        if self.up.load(Ordering::Relaxed) {
            return false;
        }
        if pending + self.in_flight.load(Ordering::Relaxed) <= HIGH {
            return false;
        }
        if self.up.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.raised.send_replace(true);
        true
    }

    /// A commit round took `bytes` from the entry being built.
    pub fn shipping(&self, bytes: usize) {
        self.in_flight.store(bytes, Ordering::Relaxed);
    }

    /// The round ended (committed or not) and `pending` bytes wait for the
    /// next: lowers the backlog once they are under `LOW`. True while it
    /// stays raised (the caller runs another round at once).
    pub fn shipped(&self, pending: usize) -> bool {
        self.in_flight.store(0, Ordering::Relaxed);
        if !self.up.load(Ordering::Acquire) {
            return false;
        }
        if pending >= LOW {
            return true;
        }
        self.lower();
        false
    }

    /// Lets publishers go on (also when the journal closes: its
    /// connections are closed, and none may wait on it meanwhile).
    pub fn lower(&self) {
        if self.up.swap(false, Ordering::AcqRel) {
            self.raised.send_replace(false);
        }
    }

    /// Whether publishers wait now.
    pub fn is_raised(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Watches whether publishers wait.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.raised.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_past_high_and_lowered_under_low() {
        let b = Backlog::default();
        let rx = b.subscribe();
        assert!(!b.added(HIGH));
        b.shipping(HIGH / 2);
        assert!(b.added(HIGH / 2 + 1));
        assert!(*rx.borrow());
        assert!(!b.added(HIGH * 2), "raised once");
        // A round brought it down, but not under LOW: still raised.
        assert!(b.shipped(LOW));
        assert!(b.is_raised());
        assert!(!b.shipped(LOW - 1));
        assert!(!*rx.borrow());
        b.lower();
        assert!(!b.is_raised());
    }
}
