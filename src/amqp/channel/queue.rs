//! queue.*: declare, bind, unbind, purge, delete.

use std::sync::Arc;

use amq_protocol::protocol::{queue as q, AMQPClass};
use amq_protocol::types::ShortString;

use super::Channel;
use crate::access::Access;
use crate::amqp::context::ConnCtx;
use crate::amqp::error::Result;
use crate::vhost::QueueSpec;

impl Channel {
    pub(super) async fn queue_declare(&mut self, m: q::Declare, ctx: &mut ConnCtx) -> Result<()> {
        let version = ctx.broker.store.defs_version();
        let server_named = m.queue.as_str().is_empty() && !m.passive;
        let name = if server_named {
            format!("amq.gen-{}", crate::util::random_name())
        } else {
            self.queue_name(m.queue.as_str())?
        };
        // The direct reply-to pseudo-queue, and reply-to names of live
        // requesters: there, with no messages and one consumer.
        if name == crate::amqp::reply_to::PSEUDO_QUEUE
            || (name.starts_with(crate::amqp::reply_to::PREFIX)
                && ctx.node.reply_to.lookup(name.as_bytes()).is_some())
        {
            if !m.nowait {
                ctx.send(
                    self.id,
                    AMQPClass::Queue(q::AMQPMethod::DeclareOk(q::DeclareOk {
                        queue: ShortString::from(name),
                        message_count: 0,
                        consumer_count: 1,
                    })),
                );
            }
            return Ok(());
        }
        if name.starts_with(crate::amqp::reply_to::PREFIX) {
            return Err(crate::amqp::error::ProtocolError::not_found(format!(
                "no {}",
                ctx.vhost.describe("queue", &name)
            )));
        }
        // RabbitMQ checks configure after the reserved prefix (which the
        // vhost refuses) and, for a new queue with a dead-letter exchange,
        // read on the queue and write on that exchange. A passive declare
        // needs nothing.
        if !m.passive && (server_named || !name.starts_with("amq.")) {
            ctx.check(Access::Configure, "queue", &name)?;
            let dlx = m
                .arguments
                .inner()
                .get("x-dead-letter-exchange")
                .and_then(crate::wire::value::text);
            if let Some(dlx) = dlx.filter(|_| ctx.vhost.queue(&name).is_none()) {
                ctx.check(Access::Read, "queue", &name)?;
                ctx.check(Access::Write, "exchange", &dlx)?;
            }
        }
        let spec = QueueSpec {
            name: name.clone(),
            durable: m.durable,
            exclusive: m.exclusive,
            auto_delete: m.auto_delete,
            arguments: m.arguments,
            server_named,
        };
        let queue = ctx.vhost.declare_queue(&spec, m.passive, ctx.id)?;
        if queue.config.exclusive_owner == Some(ctx.id)
            && !ctx.exclusive_queues.iter().any(|e| Arc::ptr_eq(e, &queue))
        {
            ctx.exclusive_queues.push(Arc::clone(&queue));
        }
        ctx.sync_declared(version, queue.config.durable).await?;
        self.last_queue = Some(name.clone());
        if !m.nowait {
            ctx.send(
                self.id,
                AMQPClass::Queue(q::AMQPMethod::DeclareOk(q::DeclareOk {
                    queue: ShortString::from(name),
                    message_count: queue.message_count(),
                    consumer_count: queue.consumer_count(),
                })),
            );
        }
        Ok(())
    }

    pub(super) async fn queue_bind(&mut self, m: q::Bind, ctx: &mut ConnCtx) -> Result<()> {
        let version = ctx.broker.store.defs_version();
        let name = self.queue_name(m.queue.as_str())?;
        // Empty queue and key: the key is the queue's name (AMQP 0-9-1).
        let key = if m.queue.as_str().is_empty() && m.routing_key.as_str().is_empty() {
            name.clone()
        } else {
            m.routing_key.as_str().to_string()
        };
        bind_access(ctx, &name, m.exchange.as_str(), &key)?;
        let dest = ctx.vhost.destination(&name, false, ctx.id)?;
        ctx.vhost
            .bind(m.exchange.as_str(), dest, &key, &m.arguments)?;
        ctx.sync_definitions(version).await?;
        if !m.nowait {
            ctx.send(
                self.id,
                AMQPClass::Queue(q::AMQPMethod::BindOk(q::BindOk {})),
            );
        }
        Ok(())
    }

    pub(super) async fn queue_unbind(&mut self, m: q::Unbind, ctx: &mut ConnCtx) -> Result<()> {
        let version = ctx.broker.store.defs_version();
        let name = self.queue_name(m.queue.as_str())?;
        bind_access(ctx, &name, m.exchange.as_str(), m.routing_key.as_str())?;
        ctx.vhost.unbind(
            m.exchange.as_str(),
            &name,
            false,
            m.routing_key.as_str(),
            &m.arguments,
            ctx.id,
        )?;
        ctx.sync_definitions(version).await?;
        ctx.send(
            self.id,
            AMQPClass::Queue(q::AMQPMethod::UnbindOk(q::UnbindOk {})),
        );
        Ok(())
    }

    pub(super) fn queue_purge(&mut self, m: q::Purge, ctx: &mut ConnCtx) -> Result<()> {
        let name = self.queue_name(m.queue.as_str())?;
        ctx.check(Access::Read, "queue", &name)?;
        let queue = ctx.vhost.queue_for(&name, ctx.id)?;
        let n = queue.purge()?;
        if !m.nowait {
            ctx.send(
                self.id,
                AMQPClass::Queue(q::AMQPMethod::PurgeOk(q::PurgeOk { message_count: n })),
            );
        }
        Ok(())
    }

    pub(super) async fn queue_delete(&mut self, m: q::Delete, ctx: &mut ConnCtx) -> Result<()> {
        let version = ctx.broker.store.defs_version();
        let name = self.queue_name(m.queue.as_str())?;
        ctx.check(Access::Configure, "queue", &name)?;
        let deleted = ctx
            .vhost
            .delete_queue(&name, m.if_unused, m.if_empty, ctx.id)?;
        ctx.exclusive_queues.retain(|q| q.name() != name);
        ctx.sync_definitions(version).await?;
        if !m.nowait {
            let message_count = deleted.as_ref().map_or(0, |d| d.count);
            ctx.send(
                self.id,
                AMQPClass::Queue(q::AMQPMethod::DeleteOk(q::DeleteOk { message_count })),
            );
        }
        // Consumers hear basic.cancel after delete-ok, as the drop says.
        drop(deleted);
        Ok(())
    }
}

/// What binding queue `queue` to `exchange` (or unbinding it) needs, in
/// RabbitMQ's order: write on the queue, then read on the exchange (the
/// default exchange is refused by the vhost in between).
fn bind_access(ctx: &mut ConnCtx, queue: &str, exchange: &str, routing_key: &str) -> Result<()> {
    ctx.check(Access::Write, "queue", queue)?;
    if !exchange.is_empty() {
        ctx.check(Access::Read, "exchange", exchange)?;
        ctx.check_topic(Access::Read, exchange.as_bytes(), routing_key.as_bytes())?;
    }
    Ok(())
}
