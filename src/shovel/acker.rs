//! on-confirm's acks: the destination's confirms are taken in publish
//! order, and the source is acked only for what the destination
//! confirmed. A run of positive confirms is acked with one `multiple` ack
//! of the newest (when no confirm is waiting, or every `batch`): every
//! earlier delivery of the source channel was confirmed by then, since
//! deliveries are published, and confirmed, in their order. A negative
//! confirm is nacked at the source, requeued, after the acks before it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lapin::options::{BasicAckOptions, BasicNackOptions};
use tokio::sync::mpsc::{self, error::TryRecvError};

/// A source delivery and the destination's confirm of its copy.
pub type Pending = (lapin::Acker, lapin::PublisherConfirm);

/// An ack or nack at the source: lapin says false when its channel had
/// closed first, and then the source requeues the message instead.
pub fn settled(r: lapin::Result<bool>) -> Result<(), String> {
    match r {
        Ok(true) => Ok(()),
        Ok(false) => Err("source: the channel closed before the ack".into()),
        Err(e) => Err(format!("source: ack: {e}")),
    }
}

/// The newest confirmed delivery not yet acked, and how many it stands
/// for.
#[derive(Default)]
struct Held {
    newest: Option<lapin::Acker>,
    count: u64,
}

impl Held {
    /// Acks everything held with one `multiple` ack.
    async fn flush(&mut self, forwarded: &AtomicU64) -> Result<(), String> {
        if let Some(acker) = self.newest.take() {
            let multiple = BasicAckOptions { multiple: true };
            settled(acker.ack(multiple).await)?;
            forwarded.fetch_add(std::mem::take(&mut self.count), Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Acks at the source as `pending` is confirmed, holding at most `batch`
/// acks back. Ok(true) once `target` deliveries are settled (the
/// shovel's `src-delete-after`); Ok(false) when the run stops sending;
/// Err when the source or the destination failed.
pub async fn run(
    mut pending: mpsc::Receiver<Pending>,
    target: Option<u64>,
    batch: u64,
    forwarded: Arc<AtomicU64>,
) -> Result<bool, String> {
    let mut held = Held::default();
    let mut done = 0u64;
    loop {
        let next = match pending.try_recv() {
            Ok(p) => Some(p),
            Err(TryRecvError::Empty) => {
                // Nothing more confirmed yet: ack what is held before
                // waiting.
                held.flush(&forwarded).await?;
                pending.recv().await
            }
            Err(TryRecvError::Disconnected) => None,
        };
        let Some((acker, confirm)) = next else {
            held.flush(&forwarded).await?;
            return Ok(false);
        };
        let confirmed = match confirm.await {
            Ok(c) => c.is_ack(),
            Err(e) => {
                // What was confirmed before is acked still.
                let _ = held.flush(&forwarded).await;
                return Err(format!("destination: {e}"));
            }
        };
        if confirmed {
            held.newest = Some(acker);
            held.count += 1;
            if held.count >= batch {
                held.flush(&forwarded).await?;
            }
        } else {
            // Refused at the destination: back to the source queue.
            held.flush(&forwarded).await?;
            let requeue = BasicNackOptions {
                requeue: true,
                ..Default::default()
            };
            settled(acker.nack(requeue).await)?;
        }
        // A nack counts toward `src-delete-after` too, as in RabbitMQ 3.
        done += 1;
        if target == Some(done) {
            held.flush(&forwarded).await?;
            return Ok(true);
        }
    }
}
