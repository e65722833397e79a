//! Publisher confirms (confirm.select, the ordered list of outstanding
//! confirms, coalesced basic.ack with `multiple`) and transactions
//! (tx.select / commit / rollback over publishes, acks, nacks, rejects).

use std::collections::VecDeque;
use std::sync::Arc;

use amq_protocol::protocol::{confirm, tx as t, AMQPClass};

use super::Channel;
use crate::amqp::assembler::Publish;
use crate::amqp::codec;
use crate::amqp::context::ConnCtx;
use crate::amqp::error::{ProtocolError, Result};
use crate::dedup::Dedup;
use crate::message::Message;
use crate::queue::Unacked;
use crate::queue::{Queue, Settle};
use crate::vhost::routing::Admitted;

/// Confirm-mode state: publishes not yet confirmed, in order.
#[derive(Debug, Default)]
pub struct Confirms {
    next: u64,
    /// (publish seq, flush ticket it waits for (0 = none), nack).
    pending: VecDeque<(u64, u64, bool)>,
}

impl Confirms {
    /// The sequence number of the next publish.
    pub fn next_seq(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Tracks a publish until its flush (if any) completes.
    pub fn push(&mut self, seq: u64, ticket: u64, nack: bool) {
        self.pending.push_back((seq, ticket, nack));
    }
}

/// A publish buffered in a transaction: the queues it was routed to when it
/// arrived, and the delay if a delayed-message exchange holds it instead.
pub type TxPublish = (
    Publish,
    Arc<Message>,
    Vec<Arc<Queue>>,
    Option<u64>,
    Option<Arc<Dedup>>,
);

/// A transaction's buffered work.
#[derive(Default)]
pub struct Tx {
    /// Publishes, in order.
    pub publishes: Vec<TxPublish>,
    /// Deliveries acked in this transaction.
    pub acks: Vec<Unacked>,
    /// Deliveries rejected / nacked without requeue (dead-lettered at commit).
    pub rejects: Vec<Unacked>,
    /// Deliveries nacked / rejected with requeue.
    pub requeues: Vec<Unacked>,
}

impl Tx {
    /// Everything taken from the unacked list and not yet settled.
    pub fn acks_pending(&mut self) -> Vec<Unacked> {
        let mut all = std::mem::take(&mut self.acks);
        all.append(&mut self.requeues);
        all.append(&mut self.rejects);
        all
    }
}

impl Channel {
    /// Whether confirms wait for a store flush.
    pub fn awaits_flush(&self) -> bool {
        self.confirms
            .as_ref()
            .is_some_and(|c| !c.pending.is_empty())
    }

    /// Sends the confirms that are ready, given the last completed flush:
    /// runs of acks become one basic.ack with `multiple`.
    pub fn send_confirms(&mut self, flushed: u64, ctx: &ConnCtx) {
        let Some(c) = self.confirms.as_mut() else {
            return;
        };
        if c.pending.is_empty() {
            return;
        }
        // Once per read batch, not per message: what the API shows.
        self.status
            .unconfirmed
            .store(c.pending.len() as u32, std::sync::atomic::Ordering::Relaxed);
        let id = self.id;
        let before = c.pending.len();
        ctx.outbox.send(|out| {
            let mut run: Option<(u64, usize)> = None;
            while let Some(&(seq, ticket, nack)) = c.pending.front() {
                if ticket > flushed {
                    break;
                }
                c.pending.pop_front();
                if nack {
                    if let Some((last, n)) = run.take() {
                        codec::put_basic_ack(out, id, last, n > 1);
                    }
                    codec::put_basic_nack(out, id, seq, false);
                } else {
                    run = Some(match run {
                        Some((_, n)) => (seq, n + 1),
                        None => (seq, 1),
                    });
                }
            }
            if let Some((last, n)) = run {
                codec::put_basic_ack(out, id, last, n > 1);
            }
        });
        let confirmed = before - c.pending.len();
        super::status::bump(&self.status.published.confirmed, confirmed as u64);
    }

    pub(super) fn confirm_select(&mut self, nowait: bool, ctx: &mut ConnCtx) -> Result<()> {
        if self.tx.is_some() {
            return Err(ProtocolError::precondition_failed(
                "cannot switch from tx to confirm mode",
            ));
        }
        if self.confirms.is_none() {
            self.confirms = Some(Confirms::default());
        }
        if !nowait {
            ctx.send(
                self.id,
                AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
            );
        }
        Ok(())
    }

    pub(super) fn tx_select(&mut self, ctx: &mut ConnCtx) -> Result<()> {
        if self.confirms.is_some() {
            return Err(ProtocolError::precondition_failed(
                "cannot switch from confirm to tx mode",
            ));
        }
        if self.tx.is_none() {
            self.tx = Some(Tx::default());
        }
        ctx.send(
            self.id,
            AMQPClass::Tx(t::AMQPMethod::SelectOk(t::SelectOk {})),
        );
        Ok(())
    }

    /// Applies the transaction: acks and requeues, then publishes; answers
    /// commit-ok once what it changed in the store (stored publishes, and
    /// the removal of acked or rejected stored messages) is on disk.
    pub(super) async fn tx_commit(&mut self, ctx: &mut ConnCtx) -> Result<()> {
        let Some(tx) = self.tx.as_mut() else {
            return Err(ProtocolError::precondition_failed(
                "channel is not transactional",
            ));
        };
        let mut acks = std::mem::take(&mut tx.acks);
        let mut requeues = std::mem::take(&mut tx.requeues);
        let mut rejects = std::mem::take(&mut tx.rejects);
        let publishes = std::mem::take(&mut tx.publishes);
        // Acks and rejects of stored messages remove records: commit-ok
        // waits until those removals are on disk too, as for publishes.
        let mut stored = acks.iter().chain(&rejects).any(|u| u.entry.stored);
        self.delivery.release_held(&acks);
        self.delivery.release_held(&requeues);
        self.delivery.release_held(&rejects);
        Queue::settle_all(&mut acks, Settle::Ack);
        Queue::settle_all(&mut requeues, Settle::Requeue);
        Queue::settle_all(&mut rejects, Settle::Reject);
        if self.global_prefetch != 0 {
            self.unpark_consumers();
        }
        for (publish, msg, mut routes, hold, dedup) in publishes {
            let admitted = match &dedup {
                Some(d) => match Admitted::ask(d, &msg) {
                    Some(admitted) => admitted,
                    None => {
                        self.duplicate(d.durable(), ctx);
                        stored |= d.durable();
                        continue;
                    }
                },
                None => None,
            };
            match hold {
                Some(delay_ms) => {
                    self.routes = routes;
                    self.hold(&publish, &msg, delay_ms, ctx, admitted)?;
                    stored |= msg.persistent();
                }
                None => stored |= self.deliver_routed(&publish, &msg, &mut routes, ctx, admitted),
            }
        }
        if stored {
            ctx.broker.store.sync().await?;
        }
        ctx.send(
            self.id,
            AMQPClass::Tx(t::AMQPMethod::CommitOk(t::CommitOk {})),
        );
        Ok(())
    }

    /// Discards buffered publishes; buffered acks return to the unacked list.
    pub(super) fn tx_rollback(&mut self, ctx: &mut ConnCtx) -> Result<()> {
        let Some(tx) = self.tx.as_mut() else {
            return Err(ProtocolError::precondition_failed(
                "channel is not transactional",
            ));
        };
        tx.publishes.clear();
        let pending = tx.acks_pending();
        self.delivery.restore(pending);
        ctx.send(
            self.id,
            AMQPClass::Tx(t::AMQPMethod::RollbackOk(t::RollbackOk {})),
        );
        Ok(())
    }
}
