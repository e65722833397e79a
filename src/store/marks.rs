//! Delivery marks: per durable queue, the highest sequence ever delivered,
//! so that recovery can flag messages that were handed out before a crash
//! as redelivered. A delivery only raises an atomic in memory; the marks
//! that moved are written to the store before every group-commit flush and
//! every 100 ms otherwise, so the delivery path does no store write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::Result;

const KEY_PREFIX: &[u8] = b"d";

/// The marks of every durable queue, and what was last written for each.
#[derive(Default)]
pub struct Marks {
    live: RwLock<HashMap<u64, Arc<AtomicU64>>>,
    written: Mutex<HashMap<u64, u64>>,
}

fn key(queue_id: u64) -> Vec<u8> {
    let mut k = KEY_PREFIX.to_vec();
    k.extend_from_slice(&queue_id.to_be_bytes());
    k
}

impl Marks {
    /// Registers queue `queue_id`, whose stored mark is `initial`; returns
    /// the atomic its deliveries raise.
    pub fn register(&self, queue_id: u64, initial: u64) -> Arc<AtomicU64> {
        let mark = Arc::new(AtomicU64::new(initial));
        self.written.lock().insert(queue_id, initial);
        self.live.write().insert(queue_id, Arc::clone(&mark));
        mark
    }

    /// Forgets a deleted queue and its stored mark.
    pub fn forget(&self, tree: &sled::Tree, queue_id: u64) -> Result<()> {
        self.live.write().remove(&queue_id);
        self.written.lock().remove(&queue_id);
        tree.remove(key(queue_id))?;
        Ok(())
    }

    /// Writes the marks that moved since the last call (flusher thread).
    pub fn write(&self, tree: &sled::Tree) -> Result<()> {
        let live = self.live.read();
        let mut written = self.written.lock();
        for (&id, mark) in live.iter() {
            let now = mark.load(Ordering::Relaxed);
            let last = written.entry(id).or_insert(0);
            if now > *last {
                tree.insert(key(id), &now.to_be_bytes())?;
                *last = now;
            }
        }
        Ok(())
    }

    /// The stored mark of queue `queue_id` (0 = none).
    pub fn stored(tree: &sled::Tree, queue_id: u64) -> Result<u64> {
        Ok(tree
            .get(key(queue_id))?
            .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0))
    }
}
