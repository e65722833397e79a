//! One queue link: messages move from an upstream queue into the queue of
//! the same name here when this queue's consumers (of priority 0 or more)
//! run out of work. The link starts consuming upstream, at priority -1 so
//! the upstream's own consumers come first, once the queue here is empty
//! and one of its consumers could take a message; it cancels that
//! consumer once the queue here has no consumer, or a backlog beyond the
//! link's own prefetch (its consumers are not keeping up). Stopping only
//! then, rather than whenever the queue here is briefly not empty, keeps
//! a busy queue fed without a stop and start per prefetch. Work moves to
//! where the consumers are.
//! What arrives is published here to the queue through the default
//! exchange and acked upstream once durable (on-confirm); nothing is
//! deleted upstream when the link stops.

use std::time::Duration;

use amq_protocol::types::{AMQPValue, FieldTable};
use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::{Channel, Connection};

use super::deliver::{deliver, refuse, Built};
use super::headers::{self, QueueSource};
use super::link::{close, failed, open, stopped, Context, Ended, Opened, BATCH};
use super::{LinkSpec, State};
use crate::message::Message;
use crate::shovel::spec::AckMode;

/// How often the queue here is looked at.
const LOOK_EVERY: Duration = Duration::from_millis(50);

pub(super) async fn run(spec: &LinkSpec, ctx: &Context) -> Ended {
    let Opened {
        conn,
        uri,
        name: conn_name,
        props,
    } = match open(spec, ctx).await {
        Ok(u) => u,
        Err(e) => return e,
    };
    // Consumer priorities are what keeps the upstream's own consumers
    // first: an upstream without them is refused, as RabbitMQ refuses it.
    let priorities = match props.inner().get("capabilities") {
        Some(AMQPValue::FieldTable(c)) => c.inner().get("consumer_priorities").cloned(),
        _ => None,
    };
    let ended = match priorities {
        Some(AMQPValue::Boolean(true)) => work(spec, ctx, &conn, &uri.redacted(), &conn_name).await,
        _ => Ended::Failed("error", "upstream_lacks_consumer_priorities".into()),
    };
    close(&conn).await;
    ended
}

/// Declares the upstream queue unless it exists, as the queue here is.
async fn ensure_queue(spec: &LinkSpec, conn: &Connection) -> Result<(), String> {
    let name = spec.upstream_queue();
    let probe = conn.create_channel().await.map_err(|e| e.to_string())?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    if probe
        .queue_declare(name.into(), passive, FieldTable::default())
        .await
        .is_ok()
    {
        let _ = probe.close(200, "".into()).await;
        return Ok(());
    }
    let ch = conn.create_channel().await.map_err(|e| e.to_string())?;
    let opts = QueueDeclareOptions {
        durable: spec.object.durable,
        auto_delete: spec.object.auto_delete,
        ..Default::default()
    };
    ch.queue_declare(name.into(), opts, spec.object.arguments.clone())
        .await
        .map_err(|e| format!("upstream: declaring queue '{name}': {e}"))?;
    let _ = ch.close(200, "".into()).await;
    Ok(())
}

async fn consume(spec: &LinkSpec, ch: &Channel) -> Result<lapin::Consumer, Ended> {
    let mut args = FieldTable::default();
    args.insert("x-priority".into(), AMQPValue::LongInt(-1));
    ch.basic_consume(
        spec.upstream_queue().into(),
        spec.consumer_tag().as_str().into(),
        BasicConsumeOptions {
            no_ack: spec.upstream.ack_mode == AckMode::NoAck,
            ..Default::default()
        },
        args,
    )
    .await
    .map_err(|e| {
        failed(format!(
            "upstream: consuming '{}': {e}",
            spec.upstream_queue()
        ))
    })
}

async fn work(
    spec: &LinkSpec,
    ctx: &Context,
    conn: &Connection,
    uri: &str,
    conn_name: &str,
) -> Ended {
    if let Err(e) = ensure_queue(spec, conn).await {
        return Ended::Failed("error", e);
    }
    let ch = match conn.create_channel().await {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    if spec.upstream.ack_mode != AckMode::NoAck {
        if let Err(e) = ch
            .basic_qos(spec.upstream.prefetch, BasicQosOptions::default())
            .await
        {
            return failed(e);
        }
    }
    ctx.status.lock().set(State::Running(conn_name.to_string()));
    let mut look = tokio::time::interval(LOOK_EVERY);
    let mut consumer: Option<lapin::Consumer> = None;
    // Cancelled by this link (the queue here has enough): what was in
    // flight still comes, then the stream ends.
    let mut cancelling = false;
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let next = match consumer.as_mut() {
            Some(c) => tokio::select! {
                next = c.next() => Some(next),
                _ = look.tick() => None,
                _ = stopped(&ctx.stop) => return Ended::Stopped,
            },
            None => tokio::select! {
                _ = look.tick() => None,
                _ = stopped(&ctx.stop) => return Ended::Stopped,
            },
        };
        let Some(next) = next else {
            // Time to look at the queue here, and the connection.
            if !conn.status().connected() {
                return Ended::Failed("error", "upstream: the connection was lost".into());
            }
            let Some(d) = ctx.down.queue_demand(&spec.vhost, &spec.object.name) else {
                // The queue went: the set stops the link.
                continue;
            };
            let start = d.ready == 0 && d.idle;
            let stop = !d.consumed || d.ready > usize::from(spec.upstream.prefetch);
            match (consumer.is_some(), cancelling) {
                (false, _) if start => match consume(spec, &ch).await {
                    Ok(c) => {
                        consumer = Some(c);
                        cancelling = false;
                    }
                    Err(e) => return e,
                },
                (true, false) if stop => {
                    let nowait = BasicCancelOptions { nowait: false };
                    if let Err(e) = ch
                        .basic_cancel(spec.consumer_tag().as_str().into(), nowait)
                        .await
                    {
                        return failed(format!("upstream: cancelling: {e}"));
                    }
                    cancelling = true;
                }
                _ => {}
            }
            continue;
        };
        batch.clear();
        let mut next = Some(next);
        let mut ended = false;
        while let Some(n) = next.take() {
            match n {
                Some(Ok(d)) => batch.push(d),
                Some(Err(e)) => return failed(format!("upstream: {e}")),
                None => ended = true,
            }
            if !ended && batch.len() < BATCH {
                next = consumer.as_mut().and_then(|c| c.next().now_or_never());
            }
        }
        if let Err(e) = forward(spec, ctx, uri, &batch).await {
            return e;
        }
        if ended {
            if !cancelling {
                // Cancelled upstream: the queue there was deleted.
                return Ended::Failed("error", "basic_cancel".into());
            }
            consumer = None;
            cancelling = false;
        }
    }
}

/// Makes `batch` into messages for the queue here, then publishes and
/// settles it.
async fn forward(
    spec: &LinkSpec,
    ctx: &Context,
    uri: &str,
    batch: &[lapin::message::Delivery],
) -> Result<(), Ended> {
    let up = &spec.upstream;
    let mut built = Built::with_capacity(batch.len());
    for (i, d) in batch.iter().enumerate() {
        let from = QueueSource {
            uri,
            queue: &spec.object.name,
            exchange: d.exchange.as_str(),
            routing_key: d.routing_key.as_str(),
        };
        let props =
            headers::received_in_queue(&d.properties, &from, d.redelivered, up.trust_user_id);
        let raw = crate::message::encode_properties(&props);
        match crate::message::read_meta(&raw) {
            Ok(meta) => built.push(
                i,
                Message::new(b"", spec.object.name.as_bytes(), &raw, &d.data, meta),
            ),
            Err(e) => {
                refuse(spec, d, &format!("its properties: {e:?}")).await?;
                built.rejected(i);
            }
        }
    }
    deliver(spec, ctx, batch, built).await
}
