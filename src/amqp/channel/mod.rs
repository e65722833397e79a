//! One channel: its state machine (open, closing, closed), the dispatch of
//! incoming frames to one handler per method, and what it owns (consumers,
//! publish assembly, confirm and transaction state). Handlers live in
//! `basic.rs`, `queue.rs`, `exchange.rs` and `tx.rs`.
//!
//! A soft error closes only this channel: `channel.close` goes out and every
//! frame but close / close-ok is dropped until the client answers. A hard
//! error is returned to the connection, which closes.

mod basic;
mod exchange;
mod queue;
mod status;
mod tx;

use std::collections::HashMap;
use std::sync::Arc;

use amq_protocol::protocol::{
    access, basic as b, channel, confirm, exchange as x, queue as q, tx as t, AMQPClass,
};
use amq_protocol::types::ShortString;
use bytes::Bytes;
use tracing::warn;

use super::assembler::{self, Assembler, Step};
use super::codec::{self, Frame};
use super::context::ConnCtx;
use super::delivery::ChannelDelivery;
use super::error::truncate;
use super::error::{ProtocolError, Result};
use super::reply_to::ReplyConsumer;
use crate::queue::{Consumer, Unacked};
use crate::queue::{Queue, Settle};
use crate::vhost::routing::RouteScratch;

pub use tx::{Confirms, Tx};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// We sent channel.close; waiting for close-ok.
    Closing,
    /// Done; the connection forgets the channel.
    Closed,
}

/// A channel of a connection.
pub struct Channel {
    id: u16,
    state: State,
    delivery: Arc<ChannelDelivery>,
    assembler: Assembler,
    consumers: HashMap<String, (Arc<Consumer>, Arc<Queue>)>,
    /// basic.qos prefetch for consumers created from now on.
    prefetch: u32,
    /// basic.qos global prefetch (shared by the channel's consumers).
    global_prefetch: u32,
    confirms: Option<Confirms>,
    tx: Option<Tx>,
    /// The last queue this channel declared, for methods that name "".
    last_queue: Option<String>,
    routes: Vec<Arc<Queue>>,
    scratch: RouteScratch,
    settle: Vec<Unacked>,
    /// The direct reply-to consumer (reply_to.rs), if there is one.
    reply: Option<Arc<ReplyConsumer>>,
    /// What the management API shows of it.
    status: Arc<status::Status>,
    /// Counts this channel against its user's max-channels and shows it
    /// with its connection.
    _slot: crate::broker::connections::ChannelSlot,
}

impl Channel {
    /// Opens channel `id` and answers channel.open-ok.
    /// Its status (`Status`) is shown once registered by `slot`.
    pub fn open(
        id: u16,
        ctx: &ConnCtx,
        delivery: Arc<ChannelDelivery>,
        status: Arc<status::Status>,
        slot: crate::broker::connections::ChannelSlot,
    ) -> Channel {
        ctx.send(
            id,
            AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})),
        );
        ctx.node.consumer_timeouts.watch(&delivery);
        Channel {
            id,
            state: State::Open,
            delivery,
            assembler: Assembler::default(),
            consumers: HashMap::new(),
            prefetch: 0,
            global_prefetch: 0,
            confirms: None,
            tx: None,
            last_queue: None,
            routes: Vec::new(),
            scratch: RouteScratch::default(),
            settle: Vec::new(),
            reply: None,
            status,
            _slot: slot,
        }
    }

    /// Adds the exchange counts this channel kept to the exchanges.
    pub fn flush_stats(&mut self) {
        self.scratch.flush_stats();
    }

    /// A new channel's delivery side and status, for `open` (the status
    /// is registered with the connection first).
    pub fn parts(id: u16, ctx: &ConnCtx) -> (Arc<ChannelDelivery>, Arc<status::Status>) {
        let delivery = Arc::new(ChannelDelivery::new(
            id,
            ctx.id,
            Arc::clone(&ctx.outbox),
            ctx.frame_max,
            ctx.caps.consumer_cancel_notify,
        ));
        let status = Arc::new(status::Status::new(id, Arc::clone(&delivery)));
        (delivery, status)
    }

    /// Stores what the API shows of the channel's settings.
    fn show_status(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.status;
        s.prefetch.store(self.prefetch, Relaxed);
        s.global_prefetch.store(self.global_prefetch, Relaxed);
        s.consumers.store(self.consumers.len() as u32, Relaxed);
        s.confirm.store(self.confirms.is_some(), Relaxed);
        s.transactional.store(self.tx.is_some(), Relaxed);
    }

    /// Whether the connection can forget this channel.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Whether we closed it and wait for close-ok.
    fn is_closing(&self) -> bool {
        self.state == State::Closing
    }

    /// Handles one frame. Soft errors are dealt with here (channel.close);
    /// hard ones are returned.
    pub async fn handle(&mut self, frame: Frame, ctx: &mut ConnCtx) -> Result<()> {
        if self.state == State::Closing {
            if let Frame::Method { payload, .. } = &frame {
                match codec::method_ids(payload) {
                    Some((20, 40)) => {
                        ctx.send(
                            self.id,
                            AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                        );
                        self.state = State::Closed;
                    }
                    Some((20, 41)) => self.state = State::Closed,
                    _ => {}
                }
            }
            return Ok(());
        }
        let r = match frame {
            Frame::Method { payload, .. } => {
                let publish = codec::method_ids(&payload) == Some((60, 40));
                let r = self.method(payload, ctx).await;
                if !publish {
                    self.show_status();
                }
                r
            }
            Frame::Header { payload, .. } => self.content_header(&payload, None, ctx),
            Frame::Body { payload, .. } => self.content_body(payload, None, ctx),
            Frame::Heartbeat { .. } => Ok(()),
            Frame::Publish {
                raw,
                header_at,
                body_at,
                ..
            } => {
                // The same steps as for the three frames one by one, with
                // the buffer they share, so the message keeps it.
                let (method, header, body) = codec::publish_payloads(&raw, header_at, body_at);
                let mut r = self.method(method, ctx).await;
                if r.is_ok() {
                    r = self.content_header(&header, Some(&raw), ctx);
                }
                if let (Ok(()), Some(body)) = (&r, body) {
                    r = self.content_body(body, Some(&raw), ctx);
                }
                r
            }
        };
        match r {
            Err(e) if !e.hard => {
                self.close_with(e, ctx);
                Ok(())
            }
            other => other,
        }
    }

    fn content_header(
        &mut self,
        payload: &Bytes,
        span: Option<&Bytes>,
        ctx: &mut ConnCtx,
    ) -> Result<()> {
        let max = ctx.broker.config.max_message_size;
        match self.assembler.header(payload, max, span) {
            Ok(Step::Done(p, m)) => self.publish(p, m, ctx),
            Ok(Step::More) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn content_body(
        &mut self,
        payload: Bytes,
        span: Option<&Bytes>,
        ctx: &mut ConnCtx,
    ) -> Result<()> {
        match self.assembler.body(payload, span) {
            Ok(Step::Done(p, m)) => self.publish(p, m, ctx),
            Ok(Step::More) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Closes the channel from our side with a soft error.
    fn close_with(&mut self, e: ProtocolError, ctx: &mut ConnCtx) {
        warn!(
            channel = self.id,
            code = e.code,
            class = e.class_id,
            method = e.method_id,
            "closing channel: {}",
            e.text
        );
        self.release(ctx);
        ctx.send(
            self.id,
            AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
                reply_code: e.code,
                reply_text: ShortString::from(truncate(&e.text)),
                class_id: e.class_id,
                method_id: e.method_id,
            })),
        );
        self.assembler = Assembler::default();
        self.state = State::Closing;
    }

    async fn method(&mut self, payload: bytes::Bytes, ctx: &mut ConnCtx) -> Result<()> {
        let (class_id, method_id) = codec::method_ids(&payload).unwrap_or((0, 0));
        if self.assembler.is_busy() {
            return Err(self.assembler.interrupted());
        }
        // The hot path: basic.publish, parsed by hand without allocating.
        if (class_id, method_id) == (60, 40) {
            let p = assembler::parse_publish(&payload).ok_or_else(|| {
                ProtocolError::frame_error(format!(
                    "cannot decode {}",
                    codec::erlang_binary(payload.get(4..).unwrap_or_default())
                ))
                .on(60, 40)
            })?;
            if p.immediate {
                return Err(ProtocolError::not_implemented("immediate=true").on(60, 40));
            }
            ctx.published = true;
            self.assembler.start(p);
            return Ok(());
        }
        // amq-protocol drops basic.qos prefetch-size; RabbitMQ refuses non-zero.
        if (class_id, method_id) == (60, 10) {
            let size = crate::wire::FieldReader::new(&payload[4..])
                .u32()
                .unwrap_or(0);
            if size != 0 {
                return Err(
                    ProtocolError::not_implemented(format!("prefetch_size!=0 ({size})")).on(60, 10),
                );
            }
        }
        let method = codec::parse_method(&payload)?;
        self.dispatch(method, ctx)
            .await
            .map_err(|e| e.on(class_id, method_id))
    }

    async fn dispatch(&mut self, method: AMQPClass, ctx: &mut ConnCtx) -> Result<()> {
        match method {
            AMQPClass::Basic(m) => match m {
                b::AMQPMethod::Ack(m) => self.basic_ack(m.delivery_tag, m.multiple),
                b::AMQPMethod::Nack(m) => self.basic_nack(m.delivery_tag, m.multiple, m.requeue),
                b::AMQPMethod::Reject(m) => self.basic_nack(m.delivery_tag, false, m.requeue),
                b::AMQPMethod::Qos(m) => self.basic_qos(m, ctx),
                b::AMQPMethod::Consume(m) => self.basic_consume(m, ctx),
                b::AMQPMethod::Cancel(m) => self.basic_cancel(m, ctx),
                b::AMQPMethod::Get(m) => self.basic_get(m, ctx),
                b::AMQPMethod::Recover(m) => self.basic_recover(m.requeue, true, ctx),
                b::AMQPMethod::RecoverAsync(m) => self.basic_recover(m.requeue, false, ctx),
                _ => Err(ProtocolError::command_invalid(
                    "method not allowed from a client",
                )),
            },
            AMQPClass::Queue(m) => match m {
                q::AMQPMethod::Declare(m) => self.queue_declare(m, ctx).await,
                q::AMQPMethod::Bind(m) => self.queue_bind(m, ctx).await,
                q::AMQPMethod::Unbind(m) => self.queue_unbind(m, ctx).await,
                q::AMQPMethod::Purge(m) => self.queue_purge(m, ctx),
                q::AMQPMethod::Delete(m) => self.queue_delete(m, ctx).await,
                _ => Err(ProtocolError::command_invalid(
                    "method not allowed from a client",
                )),
            },
            AMQPClass::Exchange(m) => match m {
                x::AMQPMethod::Declare(m) => self.exchange_declare(m, ctx).await,
                x::AMQPMethod::Delete(m) => self.exchange_delete(m, ctx).await,
                x::AMQPMethod::Bind(m) => self.exchange_bind(m, ctx).await,
                x::AMQPMethod::Unbind(m) => self.exchange_unbind(m, ctx).await,
                _ => Err(ProtocolError::command_invalid(
                    "method not allowed from a client",
                )),
            },
            AMQPClass::Channel(m) => match m {
                channel::AMQPMethod::Open(_) => {
                    Err(ProtocolError::channel_error("second 'channel.open' seen"))
                }
                channel::AMQPMethod::Close(_) => {
                    self.release(ctx);
                    ctx.send(
                        self.id,
                        AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                    );
                    self.state = State::Closed;
                    Ok(())
                }
                channel::AMQPMethod::CloseOk(_) => Ok(()),
                channel::AMQPMethod::Flow(f) if f.active => {
                    ctx.send(
                        self.id,
                        AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk {
                            active: true,
                        })),
                    );
                    Ok(())
                }
                channel::AMQPMethod::Flow(_) => Err(ProtocolError::not_implemented("active=false")),
                channel::AMQPMethod::FlowOk(_) => Ok(()),
                _ => Err(ProtocolError::command_invalid(
                    "method not allowed from a client",
                )),
            },
            AMQPClass::Tx(m) => match m {
                t::AMQPMethod::Select(_) => self.tx_select(ctx),
                t::AMQPMethod::Commit(_) => self.tx_commit(ctx).await,
                t::AMQPMethod::Rollback(_) => self.tx_rollback(ctx),
                _ => Err(ProtocolError::command_invalid(
                    "method not allowed from a client",
                )),
            },
            AMQPClass::Confirm(confirm::AMQPMethod::Select(m)) => {
                self.confirm_select(m.nowait, ctx)
            }
            AMQPClass::Access(access::AMQPMethod::Request(_)) => {
                ctx.send(
                    self.id,
                    AMQPClass::Access(access::AMQPMethod::RequestOk(access::RequestOk {})),
                );
                Ok(())
            }
            AMQPClass::Connection(_) => Err(ProtocolError::command_invalid(
                "connection method on a channel",
            )),
            _ => Err(ProtocolError::command_invalid(
                "method not allowed from a client",
            )),
        }
    }

    /// Settles deliveries taken from the unacked list. With a per-channel
    /// prefetch the credit they free is shared, so every queue this channel
    /// consumes from may now deliver, not only theirs.
    fn settle_taken(&mut self, how: Settle) {
        Queue::settle_all(&mut self.settle, how);
        if self.global_prefetch != 0 {
            self.unpark_consumers();
        }
    }

    /// The channel's prefetch freed up (or grew): its consumers parked for
    /// want of credit may take deliveries again.
    fn unpark_consumers(&self) {
        for (c, q) in self.consumers.values() {
            q.unpark(c);
        }
    }

    /// "" means the last queue declared on this channel (AMQP 0-9-1).
    fn queue_name(&self, name: &str) -> Result<String> {
        if !name.is_empty() {
            return Ok(name.to_string());
        }
        self.last_queue
            .clone()
            .ok_or_else(|| ProtocolError::not_found("no previously declared queue"))
    }

    /// Stops deliveries, cancels consumers and requeues everything unacked
    /// (channel or connection closing).
    pub fn release(&mut self, ctx: &mut ConnCtx) {
        self.delivery.close();
        if let Some(r) = self.reply.take() {
            ctx.node.reply_to.unregister(&r);
        }
        // No confirms go out on a closed channel.
        self.confirms = None;
        if let Some(tx) = self.tx.as_mut() {
            let mut pending = tx.acks_pending();
            self.delivery.release_held(&pending);
            self.settle.append(&mut pending);
        }
        self.delivery.take_all(&mut self.settle);
        self.settle.sort_by_key(|u| u.tag);
        // Requeued while the consumers are still registered (a closed
        // channel takes no deliveries), so that the consumer that takes
        // over, with a single active consumer, gets them first and in
        // their original order, then what was waiting behind them.
        Queue::settle_all(&mut self.settle, Settle::Requeue);
        for (_, (consumer, queue)) in self.consumers.drain() {
            let left = queue.remove_consumer(&consumer);
            if left == 0 && queue.config.auto_delete && !queue.is_deleted() {
                let _ = ctx.vhost.remove_queue(&queue);
            }
        }
    }
}
