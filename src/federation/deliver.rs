//! What both kinds of link do with a batch of upstream deliveries once
//! each is made into a message for here: publish them here, then settle
//! the batch upstream as the ack mode says. With on-confirm, what is
//! acked upstream is exactly what is durable here: if a message is
//! refused here (a full queue that rejects publishes, say), the ones
//! before it are acked, it is nacked back to the upstream queue, and the
//! run ends (the channel's close gives the rest back), so nothing is
//! published twice and nothing is lost.

use std::sync::Arc;
use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};

use super::link::{failed, stopped, Context, Ended};
use super::LinkSpec;
use crate::message::Message;
use crate::shovel::spec::AckMode;

/// A batch's messages for here: each with the index of its delivery, and
/// which deliveries were rejected upstream already (their tags are no
/// longer the upstream's to ack).
#[derive(Default)]
pub(super) struct Built {
    msgs: Vec<Arc<Message>>,
    from: Vec<usize>,
    rejected: Vec<usize>,
}

impl Built {
    pub(super) fn with_capacity(n: usize) -> Built {
        Built {
            msgs: Vec::with_capacity(n),
            from: Vec::with_capacity(n),
            rejected: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, delivery: usize, msg: Message) {
        self.msgs.push(Arc::new(msg));
        self.from.push(delivery);
    }

    /// Delivery `delivery` was rejected upstream (`refuse`).
    pub(super) fn rejected(&mut self, delivery: usize) {
        self.rejected.push(delivery);
    }

    /// The last delivery before `end` that is still the upstream's to
    /// settle: a `multiple` ack of it settles every earlier one too.
    fn last_before(&self, end: usize) -> Option<usize> {
        (0..end).rev().find(|i| !self.rejected.contains(i))
    }
}

/// Rejects delivery `d` upstream without requeueing (a message that cannot
/// be one here: its properties do not read); the upstream dead-letters
/// it if it is set to, as a broker does with a message a client rejects.
pub(super) async fn refuse(spec: &LinkSpec, d: &Delivery, why: &str) -> Result<(), Ended> {
    tracing::warn!(vhost = %spec.vhost, name = %spec.object.name, upstream = %spec.upstream.name,
        "federation: a message from upstream rejected: {why}");
    if spec.upstream.ack_mode == AckMode::NoAck {
        return Ok(());
    }
    settle(d.acker.reject(BasicRejectOptions { requeue: false }).await)
}

/// Publishes `built` here and settles `batch` upstream.
pub(super) async fn deliver(
    spec: &LinkSpec,
    ctx: &Context,
    batch: &[Delivery],
    built: Built,
) -> Result<(), Ended> {
    let Some(last) = built.last_before(batch.len()).map(|i| &batch[i]) else {
        // Nothing left to settle (every delivery was rejected).
        return Ok(());
    };
    // A resource alarm holds a link as it holds publishers: nothing is
    // acked meanwhile, and the upstream keeps the rest.
    while ctx.down.blocked() {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stopped(&ctx.stop) => return Err(Ended::Stopped),
        }
    }
    let published = match built.msgs.is_empty() {
        true => None,
        false => Some(ctx.down.publish(&spec.vhost, &built.msgs)),
    };
    let mode = spec.upstream.ack_mode;
    let (good, refused) = match &published {
        Some(p) => match &p.error {
            Some(e) => (built.from.get(p.done).copied(), Some(e.clone())),
            None => (None, None),
        },
        None => (None, None),
    };
    if mode == AckMode::OnConfirm {
        if let Some(p) = published {
            if let Err(e) = p.synced.await {
                let back = BasicNackOptions {
                    multiple: true,
                    requeue: true,
                };
                let _ = last.acker.nack(back).await;
                return Err(failed(format!("downstream: {e}")));
            }
        }
    }
    let all = BasicAckOptions { multiple: true };
    match (refused, good) {
        (None, _) => match mode {
            AckMode::NoAck => Ok(()),
            _ => settle(last.acker.ack(all).await),
        },
        (Some(e), Some(at)) => {
            if mode != AckMode::NoAck {
                if let Some(before) = built.last_before(at) {
                    settle(batch[before].acker.ack(all).await)?;
                }
                let back = BasicNackOptions {
                    multiple: false,
                    requeue: true,
                };
                let _ = batch[at].acker.nack(back).await;
            }
            Err(failed(format!("downstream: {e}")))
        }
        (Some(e), None) => Err(failed(format!("downstream: {e}"))),
    }
}

/// An ack upstream: lapin says false when the channel had closed first
/// (the upstream then gives the messages back).
pub(super) fn settle(r: lapin::Result<bool>) -> Result<(), Ended> {
    match r {
        Ok(true) => Ok(()),
        Ok(false) => Err(Ended::Failed(
            "error",
            "upstream: the channel closed before the ack".into(),
        )),
        Err(e) => Err(failed(format!("upstream: ack: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::Built;

    #[test]
    fn a_rejected_delivery_is_not_the_one_acked() {
        let mut b = Built::with_capacity(4);
        assert_eq!(b.last_before(4), Some(3));
        b.rejected(3);
        b.rejected(1);
        assert_eq!(b.last_before(4), Some(2));
        assert_eq!(b.last_before(2), Some(0));
        b.rejected(0);
        assert_eq!(b.last_before(2), None);
    }
}
