//! exchange.*: declare, delete, bind, unbind (exchange-to-exchange).

use amq_protocol::protocol::{exchange as x, AMQPClass};

use super::Channel;
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
        ctx.vhost.declare_exchange(&spec, m.passive)?;
        ctx.sync_definitions(version).await?;
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
        ctx.vhost
            .delete_exchange(m.exchange.as_str(), m.if_unused)?;
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
