//! Streams and super streams as the stream protocol makes them. A super
//! stream (RabbitMQ 3.11) is a durable direct exchange, marked with the
//! argument `x-super-stream`, whose bindings name its partitions: one
//! stream each, bound with its binding key and `x-stream-partition-order`
//! (its place, from 0). CreateSuperStream makes all of it or nothing;
//! the same topology declared over AMQP or the HTTP API serves as well.
//! Route answers the partitions a routing key reaches (the exchange's own
//! routing), Partitions all of them in order, DeleteSuperStream removes
//! the exchange and its partitions. Codes and checks are RabbitMQ's.

use std::sync::Arc;

use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};

use super::codes::*;
use crate::access::Access;
use crate::broker::Broker;
use crate::message::{Message, Meta};
use crate::vhost::{Destination, ExchangeSpec, QueueSpec, VHost};

/// The binding argument that orders the partitions.
pub const ORDER: &str = "x-stream-partition-order";
/// The exchange argument that marks a super stream.
pub const MARKER: &str = "x-super-stream";
/// Partitions one super stream may have, at most (RabbitMQ's default).
const MAX_PARTITIONS: usize = 1000;

/// Who asks, where.
pub struct Ctx<'a> {
    pub broker: &'a Arc<Broker>,
    pub vhost: &'a Arc<VHost>,
    pub user: &'a str,
}

impl Ctx<'_> {
    fn allowed(&self, access: Access, name: &str) -> bool {
        self.broker
            .users
            .permission(self.user, &self.vhost.name)
            .is_some_and(|p| p.allows(access, name))
    }

    /// Writes what was changed to the store (a create or delete is
    /// answered once it is durable).
    async fn synced(&self) -> u16 {
        match self.broker.store.sync().await {
            Ok(()) => OK,
            Err(_) => INTERNAL_ERROR,
        }
    }
}

/// The queue declaration of stream `name` with the stream protocol's
/// `arguments` (as their `x-` queue arguments); an argument RabbitMQ does
/// not know, or a value that does not parse, is PRECONDITION_FAILED.
pub fn stream_spec(name: &str, arguments: &[(&str, &str)]) -> Result<QueueSpec, u16> {
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from("stream")),
    );
    for (k, v) in arguments {
        let value = match *k {
            "max-length-bytes" | "stream-max-segment-size-bytes" | "initial-cluster-size" => {
                match v.parse::<i64>() {
                    Ok(n) => AMQPValue::LongLongInt(n),
                    Err(_) => return Err(PRECONDITION_FAILED),
                }
            }
            "max-age" => AMQPValue::LongString(LongString::from(*v)),
            // RabbitMQ 3.13 takes the older names as "balanced" (the
            // Rust client sends "least-leaders" by default).
            "queue-leader-locator" => AMQPValue::LongString(LongString::from(match *v {
                "least-leaders" | "random" => "balanced",
                other => other,
            })),
            // An argument RabbitMQ does not know is refused, not kept.
            _ => return Err(PRECONDITION_FAILED),
        };
        args.insert(ShortString::from(format!("x-{k}")), value);
    }
    Ok(QueueSpec {
        name: name.to_string(),
        durable: true,
        exclusive: false,
        auto_delete: false,
        arguments: args,
        server_named: false,
    })
}

/// A name a client may give an exchange or a stream here.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && !name.starts_with("amq.")
}

/// The response code a refused declaration gets.
fn code_of(e: &crate::vhost::error::Error) -> u16 {
    match e.kind {
        crate::vhost::error::Kind::AccessRefused => ACCESS_REFUSED,
        _ => PRECONDITION_FAILED,
    }
}

/// CreateSuperStream: the exchange `name`, the streams `partitions` bound
/// with `keys` in order, each made with `arguments`; all or nothing.
pub async fn create(
    ctx: &Ctx<'_>,
    name: &str,
    partitions: &[&str],
    keys: &[&str],
    arguments: &[(&str, &str)],
) -> u16 {
    if !valid_name(name) || !partitions.iter().all(|p| valid_name(p)) {
        return PRECONDITION_FAILED;
    }
    let permitted = ctx.allowed(Access::Configure, name)
        && ctx.allowed(Access::Read, name)
        && partitions
            .iter()
            .all(|p| ctx.allowed(Access::Configure, p) && ctx.allowed(Access::Write, p));
    if !permitted {
        return ACCESS_REFUSED;
    }
    let mut unique: Vec<&str> = partitions.to_vec();
    unique.sort_unstable();
    unique.dedup();
    if partitions.is_empty()
        || partitions.len() != keys.len()
        || unique.len() != partitions.len()
        || partitions.len() > MAX_PARTITIONS
    {
        return PRECONDITION_FAILED;
    }
    if ctx.vhost.exchange(name).is_some() || partitions.iter().any(|p| ctx.vhost.queue(p).is_some())
    {
        return STREAM_ALREADY_EXISTS;
    }
    let mut specs = Vec::with_capacity(partitions.len());
    for p in partitions {
        match stream_spec(p, arguments) {
            Ok(s) => specs.push(s),
            Err(code) => return code,
        }
    }
    let mut marker = FieldTable::default();
    marker.insert(ShortString::from(MARKER), AMQPValue::Boolean(true));
    let exchange = ExchangeSpec {
        name: name.to_string(),
        kind: "direct".into(),
        durable: true,
        auto_delete: false,
        internal: false,
        arguments: marker,
    };
    if let Err(e) = ctx.vhost.declare_exchange(&exchange, false) {
        tracing::info!(name, "super stream create refused: {}", e.text);
        return code_of(&e);
    }
    // What this call made, and only that, goes if a step fails. (A
    // stream declared elsewhere between the check above and its
    // declaration here is found taken just before, and kept.)
    let mut made: Vec<&str> = Vec::new();
    let mut failed = None;
    for (i, (spec, key)) in specs.iter().zip(keys).enumerate() {
        if ctx.vhost.queue(&spec.name).is_some() {
            failed = Some((
                spec.name.clone(),
                STREAM_ALREADY_EXISTS,
                "taken".to_string(),
            ));
            break;
        }
        let queue = match ctx.vhost.declare_queue(spec, false, 0) {
            Ok(q) => q,
            Err(e) => {
                failed = Some((spec.name.clone(), code_of(&e), e.text));
                break;
            }
        };
        made.push(&spec.name);
        let mut order = FieldTable::default();
        order.insert(ShortString::from(ORDER), AMQPValue::LongLongInt(i as i64));
        if let Err(e) = ctx.vhost.bind(name, Destination::Queue(queue), key, &order) {
            failed = Some((spec.name.clone(), code_of(&e), e.text));
            break;
        }
    }
    if let Some((what, code, why)) = failed {
        tracing::info!(name, partition = %what, "super stream create refused: {why}");
        for p in made {
            let _ = ctx.vhost.delete_queue(p, false, false, 0);
        }
        let _ = ctx.vhost.delete_exchange(name, false);
        let _ = ctx.synced().await;
        return code;
    }
    ctx.synced().await
}

/// The streams bound to exchange `name`, in partition order (bindings
/// without an order after those with one, by name).
fn bound_streams(vhost: &VHost, name: &str) -> Option<Vec<String>> {
    let x = vhost.exchange(name)?;
    let mut found: Vec<(Option<i64>, String)> = x
        .bindings
        .read()
        .list()
        .into_iter()
        .filter_map(|(_, args, dest)| match dest {
            Destination::Queue(q) if q.stream().is_some() => {
                Some((order_of(&args), q.config.name.clone()))
            }
            _ => None,
        })
        .collect();
    found.sort_by(|a, b| match (a.0, b.0) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.1.cmp(&b.1),
    });
    Some(found.into_iter().map(|(_, n)| n).collect())
}

/// A binding's `x-stream-partition-order`, as any integer type.
fn order_of(args: &FieldTable) -> Option<i64> {
    Some(match args.inner().get(ORDER)? {
        AMQPValue::LongLongInt(n) => *n,
        AMQPValue::LongInt(n) => *n as i64,
        AMQPValue::LongUInt(n) => *n as i64,
        AMQPValue::ShortInt(n) => *n as i64,
        AMQPValue::ShortUInt(n) => *n as i64,
        AMQPValue::ShortShortInt(n) => *n as i64,
        AMQPValue::ShortShortUInt(n) => *n as i64,
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.parse().ok()?,
        _ => return None,
    })
}

/// DeleteSuperStream: the exchange and the streams bound to it.
pub async fn delete(ctx: &Ctx<'_>, name: &str) -> u16 {
    if !ctx.allowed(Access::Configure, name) {
        return ACCESS_REFUSED;
    }
    let Some(partitions) = bound_streams(ctx.vhost, name) else {
        return STREAM_DOES_NOT_EXIST;
    };
    if !partitions.iter().all(|p| ctx.allowed(Access::Configure, p)) {
        return ACCESS_REFUSED;
    }
    if let Err(e) = ctx.vhost.delete_exchange(name, false) {
        tracing::info!(name, "super stream delete refused: {}", e.text);
        return code_of(&e);
    }
    for p in &partitions {
        if let Err(e) = ctx.vhost.delete_queue(p, false, false, 0) {
            tracing::warn!(name, partition = %p, "a super stream's partition stays: {}", e.text);
        }
    }
    ctx.synced().await
}

/// Route: the partitions of super stream `name` that `key` reaches (none
/// is OK with an empty list, as in RabbitMQ).
pub fn route(ctx: &Ctx<'_>, key: &str, name: &str) -> (u16, Vec<String>) {
    if !ctx.allowed(Access::Write, name) {
        return (ACCESS_REFUSED, Vec::new());
    }
    let Some(x) = ctx.vhost.exchange(name) else {
        return (STREAM_DOES_NOT_EXIST, Vec::new());
    };
    // The exchange's own routing decides (a direct exchange's: the key).
    let probe = Message::new(
        name.as_bytes(),
        key.as_bytes(),
        &[0, 0],
        b"",
        Meta::default(),
    );
    let mut to = Vec::new();
    x.bindings.read().route(key, None, &probe, &mut to);
    let mut streams: Vec<String> = Vec::new();
    for dest in to {
        if let Destination::Queue(q) = dest {
            if q.stream().is_some() && !streams.contains(&q.config.name) {
                streams.push(q.config.name.clone());
            }
        }
    }
    if !streams.iter().all(|s| ctx.allowed(Access::Write, s)) {
        return (ACCESS_REFUSED, Vec::new());
    }
    (OK, streams)
}

/// Partitions: every partition of super stream `name`, in order.
pub fn partitions(ctx: &Ctx<'_>, name: &str) -> (u16, Vec<String>) {
    let may = |n: &str| ctx.allowed(Access::Read, n) || ctx.allowed(Access::Write, n);
    if !may(name) {
        return (ACCESS_REFUSED, Vec::new());
    }
    let Some(streams) = bound_streams(ctx.vhost, name) else {
        return (STREAM_DOES_NOT_EXIST, Vec::new());
    };
    if !streams.iter().all(|s| may(s)) {
        return (ACCESS_REFUSED, Vec::new());
    }
    (OK, streams)
}

/// The partition index of `stream` in super stream `name` (what a single
/// active consumer group of a partition is placed by), as RabbitMQ takes
/// it: its binding's `x-stream-partition-order`, else a number the
/// stream's name ends with after a `-`; None if it is not bound there or
/// has neither (the group is then a plain stream's).
pub fn partition_index(vhost: &VHost, name: &str, stream: &str) -> Option<usize> {
    let x = vhost.exchange(name)?;
    let orders: Vec<Option<i64>> = x
        .bindings
        .read()
        .list()
        .into_iter()
        .filter_map(|(_, args, dest)| match dest {
            Destination::Queue(q) if q.stream().is_some() && q.config.name == stream => {
                Some(order_of(&args))
            }
            _ => None,
        })
        .collect();
    // The binding that sorts first, as Partitions sorts them.
    let first = *orders.iter().min_by_key(|o| (o.is_none(), **o))?;
    let index = match first {
        Some(order) => order,
        None => stream.rsplit_once('-')?.1.parse().ok()?,
    };
    usize::try_from(index).ok()
}
