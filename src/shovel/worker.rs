//! One shovel's work: connect to the source and the destination (lapin,
//! the AMQP 0-9-1 client Warren's tests already drive), declare what the
//! definition names, consume and republish, and ack at the source as the
//! ack mode says. With on-confirm a message is acked at the source only
//! once the destination confirmed it, so a lost connection on either side
//! (or a kill of either broker) leaves it unacked there: the source gives
//! it back, redelivered, to the next run. Nothing is lost; a message can
//! come twice, flagged redelivered at the source.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::acker::{self, settled, Pending};
use super::client;
use super::spec::{AckMode, DeleteAfter, Dest, Source, Spec};
use super::uri::Uri;
use super::{Ends, Status};

/// How one run of a shovel ended.
pub enum Ended {
    /// `src-delete-after` reached: the shovel is done.
    Done,
    /// A connection or channel failed, or a peer refused something.
    Failed(String),
    /// Asked to stop (deleted, restarted, the broker stops).
    Stopped,
}

/// What a run needs besides the definition.
pub struct Context {
    pub kind: super::Kind,
    pub name: String,
    pub vhost: String,
    /// This broker's own AMQP listener (a URI without a host).
    pub reach: super::client::Reach,
    /// The cluster name, for `x-shovelled`'s `shovelled-by`.
    pub cluster: String,
    pub status: Arc<parking_lot::Mutex<Status>>,
    /// Messages forwarded (acked at the source, or published with no-ack).
    pub forwarded: Arc<AtomicU64>,
    /// Turns true when the shovel must stop: the run closes its
    /// connections (the source then requeues what it had not acked).
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// Resolves once `ctx` is asked to stop.
pub async fn stopped(ctx: &Context) {
    let mut stop = ctx.stop.clone();
    let _ = stop.wait_for(|s| *s).await;
}

/// A JSON argument value as an AMQP table value.
fn amqp_value(v: &Value) -> AMQPValue {
    match v {
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => AMQPValue::LongLongInt(i),
            (None, Some(f)) => AMQPValue::Double(f),
            _ => AMQPValue::Void,
        },
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        _ => AMQPValue::Void,
    }
}

fn table(map: &Map<String, Value>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in map {
        t.insert(ShortString::from(k.as_str()), amqp_value(v));
    }
    t
}

/// Declares queue `name` unless it exists: a passive declare first (on
/// its own channel, which a 404 closes), then a durable one with `args`,
/// unless `predeclared` (the key that says so) leaves it to others. Its
/// message count.
async fn ensure_queue(
    conn: &Connection,
    name: &str,
    args: &Map<String, Value>,
    predeclared: Option<&str>,
) -> Result<u32, String> {
    let probe = conn.create_channel().await.map_err(|e| e.to_string())?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let missing = match probe
        .queue_declare(name.into(), passive, FieldTable::default())
        .await
    {
        Ok(q) => {
            let _ = probe.close(200, "".into()).await;
            return Ok(q.message_count());
        }
        Err(e) => e,
    };
    if let Some(key) = predeclared {
        return Err(format!(
            "no queue '{name}' yet, and {key} leaves declaring it to others ({missing})"
        ));
    }
    let ch = conn.create_channel().await.map_err(|e| e.to_string())?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let q = ch
        .queue_declare(name.into(), durable, table(args))
        .await
        .map_err(|e| format!("cannot declare queue '{name}': {e}"))?;
    let _ = ch.close(200, "".into()).await;
    Ok(q.message_count())
}

/// The `x-shovelled` table this shovel adds to each message.
fn forward_table(spec: &Spec, ctx: &Context, src: &Uri, dest: &Uri) -> AMQPValue {
    let mut t = FieldTable::default();
    let mut put = |k: &str, v: &str| {
        t.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
    };
    put("shovelled-by", &ctx.cluster);
    put("shovel-type", ctx.kind.name());
    put("shovel-name", &ctx.name);
    if ctx.kind == super::Kind::Dynamic {
        put("shovel-vhost", &ctx.vhost);
    }
    put("src-uri", &src.redacted());
    put("dest-uri", &dest.redacted());
    match &spec.source {
        Source::Queue { name, .. } => put("src-queue", name),
        Source::Exchange { name, key } => {
            put("src-exchange", name);
            put("src-exchange-key", key);
        }
    }
    match &spec.dest {
        Dest::Queue { name, .. } => put("dest-queue", name),
        Dest::Exchange { name, key } => {
            put("dest-exchange", name);
            if let Some(k) = key {
                put("dest-exchange-key", k);
            }
        }
        Dest::Original { key: Some(k) } => put("dest-exchange-key", k),
        Dest::Original { key: None } => {}
    }
    AMQPValue::FieldTable(t)
}

/// The properties a message goes on with.
fn properties(mut p: BasicProperties, spec: &Spec, forward: Option<&AMQPValue>) -> BasicProperties {
    for (k, v) in &spec.publish_properties {
        let s = || ShortString::from(v.as_str().unwrap_or_default());
        let n = v.as_u64().unwrap_or_default();
        p = match k.as_str() {
            "content_type" => p.with_content_type(s()),
            "content_encoding" => p.with_content_encoding(s()),
            "correlation_id" => p.with_correlation_id(s()),
            "reply_to" => p.with_reply_to(s()),
            "expiration" => p.with_expiration(s()),
            "message_id" => p.with_message_id(s()),
            "type" => p.with_type(s()),
            "user_id" => p.with_user_id(s()),
            "app_id" => p.with_app_id(s()),
            "cluster_id" => p.with_cluster_id(s()),
            "delivery_mode" => p.with_delivery_mode(n as u8),
            "priority" => p.with_priority(n as u8),
            "timestamp" => p.with_timestamp(n),
            _ => p,
        };
    }
    if forward.is_none() && !spec.timestamp_header {
        return p;
    }
    let mut headers = p.headers().clone().unwrap_or_default();
    if let Some(f) = forward {
        let mut items = vec![f.clone()];
        if let Some(AMQPValue::FieldArray(old)) = headers.inner().get("x-shovelled") {
            items.extend(old.as_slice().iter().cloned());
        }
        headers.insert(
            "x-shovelled".into(),
            AMQPValue::FieldArray(FieldArray::from(items)),
        );
    }
    if spec.timestamp_header {
        let secs = (crate::util::now_ms() / 1000) as i64;
        headers.insert("x-shovelled-timestamp".into(), AMQPValue::LongLongInt(secs));
    }
    p.with_headers(headers)
}

/// Where a message goes: (exchange, routing key).
fn route<'a>(dest: &'a Dest, exchange: &'a str, key: &'a str) -> (&'a str, &'a str) {
    match dest {
        Dest::Queue { name, .. } => ("", name),
        Dest::Exchange { name, key: k } => (name, k.as_deref().unwrap_or(key)),
        Dest::Original { key: k } => (exchange, k.as_deref().unwrap_or(key)),
    }
}

/// Opens the source: its topology, qos and consumer; the count left to
/// move if `src-delete-after` sets one; None if that is none at all.
async fn open_source(
    conn: &Connection,
    spec: &Spec,
) -> Result<Option<(Channel, lapin::Consumer, Option<u64>)>, String> {
    let failed = |what: &str, e: lapin::Error| format!("source: {what}: {e}");
    let (queue, length) = match &spec.source {
        Source::Queue { name, args } => {
            let predeclared = spec.src_predeclared.then_some("src-predeclared");
            let n = ensure_queue(conn, name, args, predeclared)
                .await
                .map_err(|e| format!("source: {e}"))?;
            (name.clone(), n)
        }
        Source::Exchange { .. } => (String::new(), 0),
    };
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| failed("channel", e))?;
    let queue = match &spec.source {
        Source::Queue { .. } => queue,
        Source::Exchange { name, key } => {
            let opts = QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            };
            let q = ch
                .queue_declare("".into(), opts, FieldTable::default())
                .await
                .map_err(|e| failed("declaring its queue", e))?;
            let qname = q.name().as_str().to_string();
            ch.queue_bind(
                qname.as_str().into(),
                name.as_str().into(),
                key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| failed(&format!("binding to exchange '{name}'"), e))?;
            qname
        }
    };
    let left = match spec.delete_after {
        DeleteAfter::Never => None,
        DeleteAfter::QueueLength => Some(u64::from(length)),
        DeleteAfter::Count(n) => Some(n),
    };
    if left == Some(0) {
        // Done before it began: nothing is consumed (a consumer would
        // be sent messages the run then leaves unacked).
        return Ok(None);
    }
    // Every mode consumes with acks and the prefetch: no-ack acks what it
    // reads as it reads it (forward, below), so a destination that takes
    // nothing leaves at most the prefetch and the batch being published
    // in this broker's memory, where an automatic-ack consumer would let
    // the source push everything.
    ch.basic_qos(spec.prefetch, BasicQosOptions::default())
        .await
        .map_err(|e| failed("basic.qos", e))?;
    let consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            table(&spec.consumer_args),
        )
        .await
        .map_err(|e| failed(&format!("consuming '{queue}'"), e))?;
    Ok(Some((ch, consumer, left)))
}

/// Most deliveries handed to the destination together.
const BATCH: usize = 64;

/// What the end of the task that acks on confirms means for the run.
fn acker_ended(r: Result<Result<bool, String>, tokio::task::JoinError>) -> Ended {
    match r {
        Ok(Ok(true)) => Ended::Done,
        Ok(Ok(false)) => Ended::Failed("destination: confirms stopped".into()),
        Ok(Err(e)) => Ended::Failed(e),
        Err(e) => Ended::Failed(e.to_string()),
    }
}

/// One run: until a failure, or the end `src-delete-after` sets.
pub async fn run(spec: &Spec, ctx: &Context) -> Ended {
    ctx.status.lock().set_starting();
    let conn_name = format!("Shovel {}", ctx.name);
    // A connection under way is dropped if the shovel must stop.
    let (src_conn, src_uri) = tokio::select! {
        c = client::connect(&spec.src_uris, &ctx.reach, &conn_name) => match c {
            Ok(c) => c,
            Err(e) => return Ended::Failed(format!("source connection failed: {e}")),
        },
        _ = stopped(ctx) => return Ended::Stopped,
    };
    let dest = tokio::select! {
        c = client::connect(&spec.dest_uris, &ctx.reach, &conn_name) => Some(c),
        _ = stopped(ctx) => None,
    };
    let (dest_conn, dest_uri) = match dest {
        Some(Ok(c)) => c,
        Some(Err(e)) => {
            let _ = src_conn.close(200, "".into()).await;
            return Ended::Failed(format!("destination connection failed: {e}"));
        }
        None => {
            let _ = src_conn.close(200, "".into()).await;
            return Ended::Stopped;
        }
    };
    let ended = forward(spec, ctx, &src_conn, &dest_conn, &src_uri, &dest_uri).await;
    let _ = src_conn.close(200, "".into()).await;
    let _ = dest_conn.close(200, "".into()).await;
    ended
}

async fn forward(
    spec: &Spec,
    ctx: &Context,
    src_conn: &Connection,
    dest_conn: &Connection,
    src_uri: &Uri,
    dest_uri: &Uri,
) -> Ended {
    if let Dest::Queue { name, args } = &spec.dest {
        let predeclared = spec.dest_predeclared.then_some("dest-predeclared");
        if let Err(e) = ensure_queue(dest_conn, name, args, predeclared).await {
            return Ended::Failed(format!("destination: {e}"));
        }
    }
    let dest = match dest_conn.create_channel().await {
        Ok(c) => c,
        Err(e) => return Ended::Failed(format!("destination: channel: {e}")),
    };
    if spec.ack_mode == AckMode::OnConfirm {
        if let Err(e) = dest.confirm_select(ConfirmSelectOptions::default()).await {
            return Ended::Failed(format!("destination: confirm.select: {e}"));
        }
    }
    let (_src_ch, mut consumer, mut left) = match open_source(src_conn, spec).await {
        Ok(Some(s)) => s,
        Ok(None) => return Ended::Done,
        Err(e) => return Ended::Failed(e),
    };
    ctx.status.lock().set_running(Ends {
        src: src_uri.redacted(),
        dest: dest_uri.redacted(),
        dest_conn: dest_conn.status().clone(),
    });
    let forward_header = spec
        .forward_headers
        .then(|| forward_table(spec, ctx, src_uri, dest_uri));
    // on-confirm: the confirms come back in publish order and are acked
    // at the source by a task of its own (acker.rs), so that publishing
    // never waits for one.
    let (confirms, pending) = mpsc::channel::<Pending>(usize::from(spec.prefetch.max(1)));
    let ack_batch = u64::from(spec.prefetch / 4).max(1);
    let mut acker = tokio::spawn(acker::run(
        pending,
        left,
        ack_batch,
        Arc::clone(&ctx.forwarded),
    ));
    // Cut off with the run, even if the run itself is aborted.
    let _stop_acking = AbortOnDrop(acker.abort_handle());
    // A connection that died while nothing came is noticed within this.
    let mut watch = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut batch = Vec::with_capacity(BATCH);
    let outcome = 'run: loop {
        let next = tokio::select! {
            next = consumer.next() => next,
            _ = stopped(ctx) => break Ended::Stopped,
            acked = &mut acker => break acker_ended(acked),
            _ = watch.tick() => {
                if !src_conn.status().connected() {
                    break Ended::Failed("source: the connection was lost".into());
                }
                if !dest_conn.status().connected() {
                    break Ended::Failed("destination: the connection was lost".into());
                }
                continue;
            }
        };
        // What else has come already goes with it: their publishes are
        // handed to the client together, and written together.
        let want = left.map_or(BATCH, |n| BATCH.min(n as usize));
        let mut next = Some(next);
        batch.clear();
        while let Some(n) = next.take() {
            match n {
                Some(Ok(d)) => batch.push(d),
                Some(Err(e)) => break 'run Ended::Failed(format!("source: {e}")),
                None => break 'run Ended::Failed("source: the consumer was cancelled".into()),
            }
            if batch.len() < want {
                next = consumer.next().now_or_never();
            }
        }
        if spec.ack_mode == AckMode::NoAck {
            // Gone from the source once read, as with automatic acks.
            if let Some(last) = batch.last() {
                let all = BasicAckOptions { multiple: true };
                if let Err(e) = settled(last.acker.ack(all).await) {
                    break 'run Ended::Failed(e);
                }
            }
        }
        let publishes = batch.iter().map(|d| {
            let (exchange, key) = route(&spec.dest, d.exchange.as_str(), d.routing_key.as_str());
            let props = properties(d.properties.clone(), spec, forward_header.as_ref());
            dest.basic_publish(
                exchange.into(),
                key.into(),
                BasicPublishOptions::default(),
                &d.data,
                props,
            )
        });
        // join_all polls them in order: the frames go out in the order
        // the source delivered.
        let published = futures::future::join_all(publishes).await;
        let taken = batch.len() as u64;
        for (delivery, published) in batch.drain(..).zip(published) {
            let confirm = match published {
                Ok(c) => c,
                Err(e) => break 'run Ended::Failed(format!("destination: {e}")),
            };
            match spec.ack_mode {
                AckMode::OnConfirm => {
                    if confirms.send((delivery.acker, confirm)).await.is_err() {
                        // The acker ended: it says why.
                        break 'run acker_ended((&mut acker).await);
                    }
                }
                AckMode::OnPublish => {
                    if let Err(e) = settled(delivery.acker.ack(BasicAckOptions::default()).await) {
                        break 'run Ended::Failed(e);
                    }
                    ctx.forwarded.fetch_add(1, Ordering::Relaxed);
                }
                AckMode::NoAck => {
                    ctx.forwarded.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if let Some(n) = left.as_mut() {
            *n -= taken.min(*n);
            if *n == 0 {
                if spec.ack_mode != AckMode::OnConfirm {
                    break Ended::Done;
                }
                // Published all it had to: the rest of what the prefetch
                // brought stays unacked, and goes back to the source
                // queue when the connection closes. The acker ends once
                // it has settled the last.
                break tokio::select! {
                    acked = &mut acker => acker_ended(acked),
                    _ = stopped(ctx) => Ended::Stopped,
                };
            }
        }
    };
    if matches!(outcome, Ended::Stopped) {
        // Asked to stop: what the destination confirmed is acked first
        // (the acker ends when nothing more comes), briefly, so that it
        // does not come again.
        drop(confirms);
        let _ = tokio::time::timeout(FLUSH_ON_STOP, &mut acker).await;
    }
    outcome
}

/// How long a stopping run waits for the acks of what was confirmed.
const FLUSH_ON_STOP: std::time::Duration = std::time::Duration::from_secs(2);

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
