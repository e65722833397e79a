//! exchange.*: declare, delete, bind, unbind (exchange-to-exchange).

use amq_protocol::protocol::{exchange as x, AMQPClass};

use super::Channel;
use crate::access::Access;
use crate::amqp::context::ConnCtx;
use crate::amqp::error::Result;
use crate::vhost::ExchangeSpec;

impl Channel {
    pub(super) async fn exchange_declare(
        &mut self,
        m: x::Declare,
        ctx: &mut ConnCtx,
    ) -> Result<()> {
        let version = ctx.broker.store.defs_version();
        let spec = ExchangeSpec {
            name: m.exchange.as_str().to_string(),
            kind: m.kind.as_str().to_string(),
            durable: m.durable,
            auto_delete: m.auto_delete,
            internal: m.internal,
            arguments: m.arguments,
        };
        // Configure on the exchange (the default exchange is the vhost's
        // to refuse); for a new one with an alternate exchange, read on it
        // and write on the alternate, as RabbitMQ checks. Passive: nothing.
        if !m.passive && !spec.name.is_empty() {
            ctx.check(Access::Configure, "exchange", &spec.name)?;
            let alternate = spec
                .arguments
                .inner()
                .get("alternate-exchange")
                .and_then(crate::wire::value::text);
            let new = ctx.vhost.exchange(&spec.name).is_none();
            if let Some(ae) = alternate.filter(|_| new && !spec.name.starts_with("amq.")) {
                ctx.check(Access::Read, "exchange", &spec.name)?;
                ctx.check(Access::Write, "exchange", &ae)?;
            }
        }
        ctx.vhost.declare_exchange(&spec, m.passive)?;
        let durable = ctx.vhost.exchange(&spec.name).is_some_and(|x| x.durable);
        ctx.sync_declared(version, durable).await?;
        if !m.nowait {
            ctx.send(
                self.id,
                AMQPClass::Exchange(x::AMQPMethod::DeclareOk(x::DeclareOk {})),
            );
        }
        Ok(())
    }

    pub(super) async fn exchange_delete(&mut self, m: x::Delete, ctx: &mut ConnCtx) -> Result<()> {
        let version = ctx.broker.store.defs_version();
        let name = m.exchange.as_str();
        // The default and amq.* exchanges are the vhost's to refuse first.
        if !name.is_empty() && !name.starts_with("amq.") {
            ctx.check(Access::Configure, "exchange", name)?;
        }
        ctx.vhost.delete_exchange(name, m.if_unused)?;
        ctx.sync_definitions(version).await?;
        if !m.nowait {
            ctx.send(
                self.id,
                AMQPClass::Exchange(x::AMQPMethod::DeleteOk(x::DeleteOk {})),
            );
        }
        Ok(())
    }

    pub(super) async fn exchange_bind(&mut self, m: x::Bind, ctx: &mut ConnCtx) -> Result<()> {
        let version = ctx.broker.store.defs_version();
        e2e_access(
            ctx,
            m.destination.as_str(),
            m.source.as_str(),
            m.routing_key.as_str(),
        )?;
        let dest = ctx
            .vhost
            .destination(m.destination.as_str(), true, ctx.id)?;
        ctx.vhost.bind(
            m.source.as_str(),
            dest,
            m.routing_key.as_str(),
            &m.arguments,
        )?;
        ctx.sync_definitions(version).await?;
        if !m.nowait {
            ctx.send(
                self.id,
                AMQPClass::Exchange(x::AMQPMethod::BindOk(x::BindOk {})),
            );
        }
        Ok(())
    }

    pub(super) async fn exchange_unbind(&mut self, m: x::Unbind, ctx: &mut ConnCtx) -> Result<()> {
        let version = ctx.broker.store.defs_version();
        e2e_access(
            ctx,
            m.destination.as_str(),
            m.source.as_str(),
            m.routing_key.as_str(),
        )?;
        ctx.vhost.unbind(
            m.source.as_str(),
            m.destination.as_str(),
            true,
            m.routing_key.as_str(),
            &m.arguments,
            ctx.id,
        )?;
        ctx.sync_definitions(version).await?;
        if !m.nowait {
            ctx.send(
                self.id,
                AMQPClass::Exchange(x::AMQPMethod::UnbindOk(x::UnbindOk {})),
            );
        }
        Ok(())
    }
}

/// What an exchange-to-exchange binding needs, in RabbitMQ's order: write
/// on the destination, then (past the vhost's default-exchange refusal)
/// read on the source.
fn e2e_access(ctx: &mut ConnCtx, destination: &str, source: &str, routing_key: &str) -> Result<()> {
    ctx.check(Access::Write, "exchange", destination)?;
    if !source.is_empty() && !destination.is_empty() {
        ctx.check(Access::Read, "exchange", source)?;
        ctx.check_topic(Access::Read, source.as_bytes(), routing_key.as_bytes())?;
    }
    Ok(())
}
