//! basic.*: publish (after assembly), consume / cancel, get, ack / nack /
//! reject, qos and recover.

use std::sync::Arc;

use amq_protocol::protocol::{basic as b, AMQPClass};
use amq_protocol::types::ShortString;
use bytes::BufMut;

use super::status::bump;
use super::Channel;
use crate::access::Access;
use crate::amqp::assembler::Publish;
use crate::amqp::codec::{self, FRAME_METHOD};
use crate::amqp::context::ConnCtx;
use crate::amqp::error::{code, ProtocolError, Result};
use crate::amqp::reply_to;
use crate::message::Message;
use crate::queue::stream::{tracking, Filter, ReadSpec, Start};
use crate::queue::Consumer;
use crate::queue::{ConsumeError, Queue, Settle};
use crate::vhost::routing::{Admitted, DedupMode, Routed};
use crate::wire::props::Field;

impl Channel {
    /// A whole message arrived: route it (errors such as a missing
    /// exchange surface now, in a transaction too), then enqueue it, or in
    /// a transaction keep it with its routes until commit, as RabbitMQ does.
    pub(super) fn publish(
        &mut self,
        publish: Publish,
        mut msg: Message,
        ctx: &mut ConnCtx,
    ) -> Result<()> {
        // Write on the exchange, then (RabbitMQ's check_user_id_header) the
        // user_id property must be the user's own.
        ctx.authz
            .check_publish(&ctx.broker.users, &publish.exchange)
            .map_err(|e| e.on(60, 40))?;
        // check_publish has just brought the view up to date.
        if ctx.authz.has_topic_permissions() {
            ctx.check_topic(Access::Write, &publish.exchange, &publish.routing_key)
                .map_err(|e| e.on(60, 40))?;
        }
        if let Some(user_id) = msg.short_property(Field::UserId) {
            ctx.authz
                .check_user_id(&ctx.broker.users, user_id)
                .map_err(|e| e.on(60, 40))?;
        }
        // A request that wants its reply by direct reply-to.
        if msg.short_property(Field::ReplyTo) == Some(reply_to::PSEUDO_QUEUE.as_bytes()) {
            let Some(r) = &self.reply else {
                return Err(ProtocolError::precondition_failed(
                    "fast reply consumer does not exist",
                )
                .on(60, 40));
            };
            msg = msg.with_short_property(Field::ReplyTo, r.address().as_bytes());
        }
        // A reply: straight to the requester's consumer, if it is there
        // (even in a transaction: replies are not queued, as in RabbitMQ).
        if publish.exchange.is_empty() && msg.routing_key().starts_with(reply_to::PREFIX.as_bytes())
        {
            ctx.node.reply_to.deliver(msg.routing_key(), &msg);
            if let Some(c) = self.confirms.as_mut() {
                let seq = c.next_seq();
                c.push(seq, 0, false);
            }
            return Ok(());
        }
        let msg = Arc::new(msg);
        // A transaction asks the exchange's deduplication cache at commit.
        self.scratch.dedup = match self.tx {
            Some(_) => DedupMode::Defer,
            None => DedupMode::Check,
        };
        let routed = ctx
            .vhost
            .route(&msg, &mut self.scratch, &mut self.routes)
            .map_err(|e| ProtocolError::from(e).on(60, 40))?;
        let hold = match routed {
            Routed::Queues => None,
            Routed::Hold(delay_ms) => Some(delay_ms),
            Routed::Duplicate { durable } => {
                self.routes.clear();
                self.duplicate(durable, ctx);
                return Ok(());
            }
        };
        let msg = match crate::vhost::routing::strip_bcc(&msg) {
            Some(stripped) => Arc::new(stripped),
            None => msg,
        };
        if let Some(tx) = self.tx.as_mut() {
            // Held or routed at commit, as decided now.
            let routes = std::mem::take(&mut self.routes);
            let dedup = self.scratch.take_deferred();
            tx.publishes.push((publish, msg, routes, hold, dedup));
            return Ok(());
        }
        let admitted = self.scratch.take_admitted();
        if let Some(delay_ms) = hold {
            return self.hold(&publish, &msg, delay_ms, ctx, admitted);
        }
        let mut routes = std::mem::take(&mut self.routes);
        self.deliver_routed(&publish, &msg, &mut routes, ctx, admitted);
        // Hand the (now empty) buffer back for the next publish.
        self.routes = routes;
        Ok(())
    }

    /// Enqueues a routed message on its queues (draining `routes`), sends
    /// basic.return if it was mandatory and went nowhere, and tracks its
    /// confirm. Returns whether it was written to the store. A key its
    /// exchange remembered (`admitted`) is taken back if the publisher is
    /// nacked or the message returned.
    pub(super) fn deliver_routed(
        &mut self,
        publish: &Publish,
        msg: &Arc<Message>,
        routes: &mut Vec<Arc<Queue>>,
        ctx: &ConnCtx,
        admitted: Option<Admitted>,
    ) -> bool {
        let seq = self.confirms.as_mut().map(|c| c.next_seq());
        let p = &self.status.published;
        bump(&p.received, 1);
        p.sizes.observe(msg.body().len() as u64);
        if seq.is_some() {
            bump(&p.received_confirm, 1);
        }
        let unroutable = routes.is_empty();
        match (unroutable, publish.mandatory) {
            (false, _) => bump(&p.routed, 1),
            (true, true) => {
                bump(&p.returned, 1);
                self.send_return(msg, ctx);
            }
            (true, false) => bump(&p.dropped, 1),
        }
        let mut stored = false;
        let mut failed = false;
        for q in routes.drain(..) {
            match q.push(msg) {
                Ok(p) => {
                    stored |= p.stored;
                    // x-overflow reject-publish: the publisher is told.
                    failed |= p.rejected;
                }
                Err(e) => {
                    tracing::error!(queue = q.name(), "cannot store message: {e}");
                    failed = true;
                }
            }
        }
        // Nacked, or returned as unroutable: its publisher will send it
        // again, and that is not a duplicate.
        let returned = unroutable && publish.mandatory;
        if let (true, Some(a)) = (failed || returned, admitted) {
            a.forget();
        }
        if let (Some(c), Some(seq)) = (self.confirms.as_mut(), seq) {
            let ticket = if stored { ctx.broker.store.ticket() } else { 0 };
            c.push(seq, ticket, failed);
        }
        stored
    }

    /// The exchange's deduplication cache dropped the message: it is
    /// confirmed as any other (once the commit that holds its original's
    /// entry is durable, for a `durable` cache), never returned.
    pub(super) fn duplicate(&mut self, durable: bool, ctx: &ConnCtx) {
        let p = &self.status.published;
        bump(&p.received, 1);
        if let Some(c) = self.confirms.as_mut() {
            bump(&p.received_confirm, 1);
            let seq = c.next_seq();
            let ticket = if durable {
                ctx.broker.store.ticket()
            } else {
                0
            };
            c.push(seq, ticket, false);
        }
    }

    /// A delayed-message exchange holds the message: it is stored now and
    /// routed when due. The mandatory rule: basic.return if, at publish
    /// time, the exchange would route it nowhere (then it is not held).
    /// The confirm covers the stored message.
    pub(super) fn hold(
        &mut self,
        publish: &Publish,
        msg: &Arc<Message>,
        delay_ms: u64,
        ctx: &mut ConnCtx,
        admitted: Option<Admitted>,
    ) -> Result<()> {
        let unroutable = self.routes.is_empty();
        self.routes.clear();
        let seq = self.confirms.as_mut().map(|c| c.next_seq());
        if unroutable && publish.mandatory {
            if let Some(a) = admitted {
                a.forget();
            }
            self.send_return(msg, ctx);
            if let (Some(c), Some(seq)) = (self.confirms.as_mut(), seq) {
                c.push(seq, 0, false);
            }
            return Ok(());
        }
        let held = ctx.vhost.hold(msg, delay_ms);
        if let Err(e) = &held {
            tracing::error!("cannot store a delayed message: {e}");
            if let Some(a) = admitted {
                a.forget();
            }
        }
        if let (Some(c), Some(seq)) = (self.confirms.as_mut(), seq) {
            let ticket = if msg.persistent() {
                ctx.broker.store.ticket()
            } else {
                0
            };
            c.push(seq, ticket, held.is_err());
        }
        Ok(())
    }

    fn send_return(&self, msg: &Message, ctx: &ConnCtx) {
        let frame_max = ctx.frame_max;
        ctx.outbox.send(|out| {
            let at = codec::begin_frame(out, FRAME_METHOD, self.id);
            out.put_u16(60);
            out.put_u16(50);
            out.put_u16(code::NO_ROUTE);
            codec::put_short_str(out, b"NO_ROUTE");
            codec::put_short_str(out, msg.exchange());
            codec::put_short_str(out, msg.routing_key());
            codec::end_frame(out, at);
            codec::put_content(out, self.id, msg.properties(), msg.body(), frame_max);
        });
    }

    pub(super) fn basic_qos(&mut self, m: b::Qos, ctx: &mut ConnCtx) -> Result<()> {
        if m.global {
            self.global_prefetch = m.prefetch_count as u32;
            self.delivery.set_global_prefetch(m.prefetch_count as u32);
            // More credit may let queues deliver.
            self.unpark_consumers();
        } else {
            self.prefetch = m.prefetch_count as u32;
        }
        ctx.send(self.id, AMQPClass::Basic(b::AMQPMethod::QosOk(b::QosOk {})));
        Ok(())
    }

    pub(super) fn basic_consume(&mut self, m: b::Consume, ctx: &mut ConnCtx) -> Result<()> {
        let tag = if m.consumer_tag.as_str().is_empty() {
            format!("amq.ctag-{}", crate::util::random_name())
        } else {
            m.consumer_tag.as_str().to_string()
        };
        if m.queue.as_str() == reply_to::PSEUDO_QUEUE {
            return self.reply_consume(tag, m.no_ack, m.nowait, ctx);
        }
        // A consumer whose queue was deleted was cancelled by the server:
        // its tag is free again.
        self.consumers.retain(|_, (_, q)| !q.is_deleted());
        let max = ctx.broker.config.consumer_max_per_channel;
        if max != 0 && self.consumers.len() as u64 >= max {
            return Err(ProtocolError::not_allowed(format!(
                "reached maximum ({max}) of consumers per channel"
            )));
        }
        if self.consumers.contains_key(&tag) {
            return Err(ProtocolError::not_allowed(format!(
                "attempt to reuse consumer tag '{tag}'"
            )));
        }
        let name = self.queue_name(m.queue.as_str())?;
        ctx.check(Access::Read, "queue", &name)?;
        let queue = ctx.vhost.queue_for(&name, ctx.id)?;
        let spec = match queue.stream() {
            Some(_) => self.stream_read(&m, &tag, &name, ctx)?,
            None => ReadSpec::default(),
        };
        let priority = match m.arguments.inner().get("x-priority") {
            None => 0,
            Some(v) => crate::wire::value::int(v)
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| ProtocolError::precondition_failed("invalid x-priority argument"))?,
        };
        // Precedence: the consumer's own, the queue's, the broker's.
        let timeout_ms = match m.arguments.inner().get("x-consumer-timeout") {
            None => queue
                .consumer_timeout()
                .unwrap_or(ctx.broker.config.consumer_timeout),
            Some(v) => crate::wire::value::int(v)
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| {
                    ProtocolError::precondition_failed("invalid x-consumer-timeout argument")
                })?,
        };
        let consumer = Arc::new(Consumer::new(
            tag.clone(),
            Arc::clone(&self.delivery) as Arc<dyn crate::queue::Sink>,
            m.no_ack,
            m.exclusive,
            self.prefetch,
            priority,
            timeout_ms,
        ));
        queue
            .add_reader(Arc::clone(&consumer), spec)
            .map_err(|e| match e {
                ConsumeError::Store(e) => ProtocolError::internal(format!("store: {e}")),
                ConsumeError::NameTaken => ProtocolError::precondition_failed(format!(
                    "a consumer tagged '{tag}' whose offset is tracked already reads {}",
                    ctx.vhost.describe("queue", &name)
                )),
                ConsumeError::ExclusiveHeld | ConsumeError::InUse => {
                    ProtocolError::access_refused(format!(
                        "queue '{name}' in vhost '{}' in exclusive use",
                        ctx.vhost.name
                    ))
                }
                ConsumeError::Deleted => ProtocolError::not_found(format!(
                    "no queue '{name}' in vhost '{}'",
                    ctx.vhost.name
                )),
            })?;
        self.consumers
            .insert(tag.clone(), (consumer, Arc::clone(&queue)));
        if !m.nowait {
            ctx.send(
                self.id,
                AMQPClass::Basic(b::AMQPMethod::ConsumeOk(b::ConsumeOk {
                    consumer_tag: ShortString::from(tag),
                })),
            );
        }
        // Deliveries start after consume-ok.
        queue.dispatch();
        Ok(())
    }

    /// How consumer `tag` of stream `name` reads it (where it starts, its
    /// filter, whether its offset is tracked); refuses what a stream's
    /// consumer may not be, as RabbitMQ does (in its order): one without
    /// a prefetch, one with automatic acks, one on a channel with a
    /// global prefetch.
    fn stream_read(
        &self,
        m: &b::Consume,
        tag: &str,
        name: &str,
        ctx: &ConnCtx,
    ) -> Result<ReadSpec> {
        let subject = format!("queue '{name}' in vhost '{}'", ctx.vhost.name);
        if self.prefetch == 0 {
            return Err(ProtocolError::precondition_failed(format!(
                "consumer prefetch count is not set for '{subject}'"
            )));
        }
        if m.no_ack {
            return Err(ProtocolError::not_implemented(format!(
                "automatic acknowledgement not supported by stream queues {subject}"
            )));
        }
        if self.global_prefetch != 0 {
            return Err(ProtocolError::not_implemented(format!(
                "{subject} does not support global qos"
            )));
        }
        let args = m.arguments.inner();
        let start = Start::parse(args.get("x-stream-offset"), crate::util::now_ms())
            .map_err(ProtocolError::precondition_failed)?;
        let filter = Filter::parse(&m.arguments).map_err(ProtocolError::precondition_failed)?;
        let tracked = tracking::asked(args.get(tracking::ARGUMENT))
            .map_err(ProtocolError::precondition_failed)?;
        // A tag the server made up is never asked for again: nothing
        // would resume from what is tracked under it.
        if tracked && m.consumer_tag.as_str().is_empty() {
            return Err(ProtocolError::precondition_failed(format!(
                "{} needs a consumer tag chosen by the client",
                tracking::ARGUMENT
            )));
        }
        // Names starting with a NUL are the stream protocol's (its stored
        // offsets and publisher sequences): not for a consumer tag.
        if tracked && m.consumer_tag.as_str().starts_with('\0') {
            return Err(ProtocolError::precondition_failed(format!(
                "{} needs a consumer tag that does not start with a NUL",
                tracking::ARGUMENT
            )));
        }
        Ok(ReadSpec {
            start,
            filter,
            track: tracked.then(|| tag.to_string()),
        })
    }

    /// Takes consumer `tag` off its queue (which goes if it is auto-delete
    /// and that was its last consumer).
    pub(super) fn drop_consumer(&mut self, tag: &str, ctx: &mut ConnCtx) -> Result<()> {
        if let Some((consumer, queue)) = self.consumers.remove(tag) {
            let left = queue.remove_consumer(&consumer);
            if left == 0 && queue.config.auto_delete && !queue.is_deleted() {
                ctx.vhost.remove_queue(&queue)?;
            }
        }
        Ok(())
    }

    /// Deliveries past their consumer timeout (consumer_timeout.rs) are
    /// requeued, redelivered; each consumer that had one is cancelled with
    /// a server-sent basic.cancel and the channel stays open. A client
    /// that does not take basic.cancel gets RabbitMQ's 406 channel close.
    pub fn expire_deliveries(&mut self, now: u64, ctx: &mut ConnCtx) {
        if self.is_closed() || self.is_closing() {
            return;
        }
        let mut expired = Vec::new();
        self.delivery.take_expired(now, &mut expired);
        if expired.is_empty() {
            return;
        }
        let first = expired
            .iter()
            .find_map(|u| u.consumer.as_ref().map(|c| c.timeout_ms));
        if let (Some(timeout), false) = (first, self.delivery.cancel_notify) {
            self.settle.append(&mut expired);
            let e = ProtocolError::precondition_failed(format!(
                "delivery acknowledgement on channel {} timed out. Timeout value used: {timeout} ms. \
                 This timeout value can be configured, see consumers doc guide to learn more",
                self.id
            ));
            self.close_with(e, ctx);
            return;
        }
        // Cancelled first, so the requeued messages do not go straight back.
        for u in &expired {
            let Some(c) = &u.consumer else { continue };
            if self
                .consumers
                .get(&c.tag)
                .is_some_and(|(k, _)| Arc::ptr_eq(k, c))
            {
                tracing::info!(channel = self.id, consumer = %c.tag, "delivery timed out: cancelling its consumer");
                if let Err(e) = self.drop_consumer(&c.tag, ctx) {
                    tracing::warn!("cannot delete the auto-delete queue: {e}");
                }
                self.delivery.send_cancel(&c.tag);
            }
        }
        self.settle.append(&mut expired);
        self.settle.sort_by_key(|u| u.tag);
        self.settle_taken(Settle::Requeue);
    }

    /// basic.consume from the direct reply-to pseudo-queue.
    fn reply_consume(
        &mut self,
        tag: String,
        no_ack: bool,
        nowait: bool,
        ctx: &mut ConnCtx,
    ) -> Result<()> {
        if !no_ack {
            return Err(ProtocolError::precondition_failed(
                "reply consumer cannot acknowledge",
            ));
        }
        if self.reply.is_some() {
            return Err(ProtocolError::precondition_failed(
                "reply consumer already set",
            ));
        }
        if self.consumers.contains_key(&tag) {
            return Err(ProtocolError::not_allowed(format!(
                "attempt to reuse consumer tag '{tag}'"
            )));
        }
        let r = ctx
            .node
            .reply_to
            .register(tag.clone(), Arc::clone(&self.delivery));
        self.reply = Some(r);
        if !nowait {
            ctx.send(
                self.id,
                AMQPClass::Basic(b::AMQPMethod::ConsumeOk(b::ConsumeOk {
                    consumer_tag: ShortString::from(tag),
                })),
            );
        }
        Ok(())
    }

    pub(super) fn basic_cancel(&mut self, m: b::Cancel, ctx: &mut ConnCtx) -> Result<()> {
        let tag = m.consumer_tag.as_str();
        if self.reply.as_ref().is_some_and(|r| r.tag == tag) {
            if let Some(r) = self.reply.take() {
                ctx.node.reply_to.unregister(&r);
            }
        }
        self.drop_consumer(tag, ctx)?;
        if !m.nowait {
            ctx.send(
                self.id,
                AMQPClass::Basic(b::AMQPMethod::CancelOk(b::CancelOk {
                    consumer_tag: m.consumer_tag,
                })),
            );
        }
        Ok(())
    }

    pub(super) fn basic_get(&mut self, m: b::Get, ctx: &mut ConnCtx) -> Result<()> {
        let name = self.queue_name(m.queue.as_str())?;
        ctx.check(Access::Read, "queue", &name)?;
        let queue = ctx.vhost.queue_for(&name, ctx.id)?;
        if queue.stream().is_some() {
            return Err(ProtocolError::not_implemented(format!(
                "basic.get not supported by stream queues queue '{name}' in vhost '{}'",
                ctx.vhost.name
            )));
        }
        let timeout_ms = queue
            .consumer_timeout()
            .unwrap_or(ctx.broker.config.consumer_timeout);
        if !queue.get(self.delivery.as_ref(), m.no_ack, timeout_ms) {
            bump(&self.status.published.get_empty, 1);
            ctx.send(
                self.id,
                AMQPClass::Basic(b::AMQPMethod::GetEmpty(b::GetEmpty {})),
            );
        }
        Ok(())
    }

    pub(super) fn basic_ack(&mut self, tag: u64, multiple: bool) -> Result<()> {
        let before = self.settle.len();
        // In a transaction the credit the ack frees is held until commit.
        let held = self.tx.is_some();
        self.delivery.take(tag, multiple, held, &mut self.settle)?;
        bump(
            &self.status.published.acked,
            (self.settle.len() - before) as u64,
        );
        if let Some(tx) = self.tx.as_mut() {
            tx.acks.append(&mut self.settle);
            return Ok(());
        }
        self.settle_taken(Settle::Ack);
        Ok(())
    }

    pub(super) fn basic_nack(&mut self, tag: u64, multiple: bool, requeue: bool) -> Result<()> {
        let held = self.tx.is_some();
        self.delivery.take(tag, multiple, held, &mut self.settle)?;
        if let Some(tx) = self.tx.as_mut() {
            if requeue {
                tx.requeues.append(&mut self.settle);
            } else {
                tx.rejects.append(&mut self.settle);
            }
            return Ok(());
        }
        let how = if requeue {
            Settle::Requeue
        } else {
            Settle::Reject
        };
        self.settle_taken(how);
        Ok(())
    }

    pub(super) fn basic_recover(
        &mut self,
        requeue: bool,
        reply: bool,
        ctx: &mut ConnCtx,
    ) -> Result<()> {
        if !requeue {
            return Err(ProtocolError::not_implemented("requeue=false"));
        }
        // recover-ok first: clients drop deliveries that precede it.
        if reply {
            ctx.send(
                self.id,
                AMQPClass::Basic(b::AMQPMethod::RecoverOk(b::RecoverOk {})),
            );
        }
        self.delivery.take_all(&mut self.settle);
        self.settle_taken(Settle::Requeue);
        Ok(())
    }
}
