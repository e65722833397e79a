//! One exchange link (a queue link is queue_link.rs): from an upstream exchange into the exchange of the
//! same vhost here, as RabbitMQ's federation does it. On the upstream
//! (lapin, over its URI) the link declares a durable queue named
//! `federation: X -> <this cluster>` and an internal exchange of type
//! `x-federation-upstream` bound to it, and binds that exchange to the
//! upstream exchange once for each binding key the exchange here has
//! (kept in step as bindings come and go). What arrives in the queue is
//! published here into the exchange, with `x-received-from` saying where
//! it came from, and acked upstream once it is durable here (on-confirm).
//! So nothing is lost: an unacked message goes back to the upstream
//! queue, which keeps collecting while this broker is away.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use amq_protocol::types::{AMQPValue, FieldTable, LongString};
use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeBindOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, ExchangeUnbindOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::{Channel, Connection, ExchangeKind};
use parking_lot::Mutex;

use super::deliver::{deliver, refuse, Built};
use super::headers::{self, Source};
use super::{Downstream, Kind, LinkSpec, State, Status, Stop};
use crate::message::Message;
use crate::plugins::federation_upstream::may_forward;
use crate::shovel::client::{self, Reach};
use crate::shovel::spec::AckMode;
use crate::shovel::uri::Uri;

/// What a link needs besides its spec.
pub struct Context {
    pub down: Arc<dyn Downstream>,
    pub reach: Reach,
    pub status: Arc<Mutex<Status>>,
    pub stop: tokio::sync::watch::Receiver<Stop>,
}

/// How one run ended.
pub(super) enum Ended {
    Stopped,
    /// The status word and why.
    Failed(&'static str, String),
}

pub(super) fn failed(e: impl std::fmt::Display) -> Ended {
    Ended::Failed("error", e.to_string())
}

/// Resolves once the link is asked to stop.
pub(super) async fn stopped(stop: &tokio::sync::watch::Receiver<Stop>) {
    let mut stop = stop.clone();
    let _ = stop.wait_for(|s| *s != Stop::Run).await;
}

/// How long a stopping link may spend on deleting its upstream queue and
/// exchange, and on closing.
const CLEAN_UP_WITHIN: Duration = Duration::from_secs(4);

/// Most deliveries published here together.
pub(super) const BATCH: usize = 256;
/// How often the upstream's internal exchange is looked for (RabbitMQ's
/// `internal_exchange_check_interval`).
const CHECK_EVERY: Duration = Duration::from_secs(90);

/// Runs a link until it is stopped, starting a failed run again after
/// the upstream's reconnect delay.
pub async fn supervise(spec: Arc<LinkSpec>, ctx: Context) {
    let mut quick_at: Option<tokio::time::Instant> = None;
    loop {
        // Without acks nothing bounds what the upstream sends, so a no-ack
        // link does not connect while a resource alarm holds publishers.
        while spec.upstream.ack_mode == AckMode::NoAck && ctx.down.blocked() {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = stopped(&ctx.stop) => return,
            }
        }
        let ended = match spec.object.kind {
            Kind::Exchange => run(&spec, &ctx).await,
            Kind::Queue => super::queue_link::run(&spec, &ctx).await,
        };
        match ended {
            Ended::Stopped => return,
            Ended::Failed(word, why) => {
                tracing::warn!(
                    vhost = %spec.vhost, kind = spec.object.kind.name(), name = %spec.object.name,
                    upstream = %spec.upstream.name, "federation link failed: {why}"
                );
                // A link that was running starts again at once (as
                // RabbitMQ's supervisor does), once per reconnect delay;
                // otherwise it waits the delay, at least a second.
                let was_running = matches!(ctx.status.lock().state, State::Running(_));
                ctx.status.lock().set(State::Failed(word, why));
                let delay = spec.upstream.reconnect_delay.max(Duration::from_secs(1));
                let quick = was_running && quick_at.is_none_or(|t| t.elapsed() >= delay);
                let delay = match quick {
                    true => {
                        quick_at = Some(tokio::time::Instant::now());
                        Duration::ZERO
                    }
                    false => delay,
                };
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stopped(&ctx.stop) => return,
                }
            }
        }
    }
}

/// The names a link uses upstream.
struct Names {
    /// The upstream exchange.
    exchange: String,
    queue: String,
    /// The internal exchange this run binds (" A" or " B").
    internal: String,
    /// The other one, which a previous run may have left.
    previous: String,
}

/// The upstream exchange's name, and the upstream queue's: `federation:
/// X -> <this cluster>`, with the downstream exchange (and vhost) after a
/// colon when they differ from upstream's, as RabbitMQ names it.
fn upstream_names(spec: &LinkSpec, cluster: &str, upstream_vhost: &str) -> (String, String) {
    let ux = spec.upstream_exchange();
    let dx = &spec.object.name;
    let suffix = if upstream_vhost == spec.vhost && ux == dx {
        String::new()
    } else if upstream_vhost == spec.vhost {
        format!(":{dx}")
    } else {
        format!(":{}:{dx}", spec.vhost)
    };
    (
        ux.to_string(),
        format!("federation: {ux} -> {cluster}{suffix}"),
    )
}

/// The upstream URIs: credentials required, the vhost this exchange's
/// when the URI names none.
pub(super) fn uris(spec: &LinkSpec) -> Result<Vec<Uri>, String> {
    spec.upstream
        .uris
        .iter()
        .map(|u| {
            u.check_credentials()?;
            let mut u = u.clone();
            if !u.vhost_given {
                u.vhost = spec.vhost.clone();
            }
            Ok(u)
        })
        .collect()
}

/// A link's upstream connection, open: its name, the URI it reached and
/// the server properties the upstream announces (lapin keeps them to
/// itself, so they are read from a connection.start of their own).
pub(super) struct Opened {
    pub conn: Connection,
    pub uri: Uri,
    pub name: String,
    pub props: FieldTable,
}

/// Connects to the upstream (a stop meanwhile ends it).
pub(super) async fn open(spec: &LinkSpec, ctx: &Context) -> Result<Opened, Ended> {
    ctx.status.lock().set(State::Starting);
    let uris = uris(spec).map_err(|e| Ended::Failed("error", e))?;
    let name = format!(
        "Federation link (upstream: {}, policy: {})",
        spec.upstream.name, spec.object.policy
    );
    let (conn, uri) = tokio::select! {
        c = client::connect(&uris, &ctx.reach, &name) => c.map_err(failed)?,
        _ = stopped(&ctx.stop) => return Err(Ended::Stopped),
    };
    ctx.status.lock().uri = uri.redacted();
    let props = tokio::select! {
        p = client::server_properties(&uri, &ctx.reach) => {
            p.map_err(|e| failed(format!("upstream: reading its server properties: {e}")))
        }
        _ = stopped(&ctx.stop) => Err(Ended::Stopped),
    };
    match props {
        Ok(props) => Ok(Opened {
            conn,
            uri,
            name,
            props,
        }),
        Err(e) => {
            close(&conn).await;
            Err(e)
        }
    }
}

/// Closes a link's connection, bounded.
pub(super) async fn close(conn: &Connection) {
    let _ = tokio::time::timeout(CLEAN_UP_WITHIN, conn.close(200, "".into())).await;
}

async fn run(spec: &LinkSpec, ctx: &Context) -> Ended {
    let Opened {
        conn,
        uri,
        name: conn_name,
        props,
    } = match open(spec, ctx).await {
        Ok(u) => u,
        Err(e) => return e,
    };
    // RabbitMQ tells brokers apart by the cluster name they announce.
    let upstream_cluster = client::text_property(&props, "cluster_name");
    let cluster = ctx.down.cluster_name();
    let (exchange, queue) = upstream_names(spec, &cluster, &uri.vhost);
    let mut names = Names {
        exchange,
        internal: format!("{queue} A"),
        previous: format!("{queue} B"),
        queue,
    };
    let ended = work(
        spec,
        ctx,
        &conn,
        &uri,
        upstream_cluster.as_deref(),
        &conn_name,
        &mut names,
    )
    .await;
    let clean = matches!(ended, Ended::Stopped)
        && *ctx.stop.borrow() == Stop::CleanUp
        && !spec.upstream.keep_upstream;
    if clean {
        // Bounded well inside the grace a stopped link has.
        let _ = tokio::time::timeout(CLEAN_UP_WITHIN, clean_up(&conn, &names)).await;
    }
    close(&conn).await;
    ended
}

/// Deletes the upstream queue and the run's internal exchange (a clean
/// stop), as far as the upstream lets it.
async fn clean_up(conn: &Connection, names: &Names) {
    let Ok(ch) = conn.create_channel().await else {
        return;
    };
    let _ = ch
        .queue_delete(names.queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = ch
        .exchange_delete(
            names.internal.as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await;
    let _ = ch.close(200, "".into()).await;
}

/// Whether exchange `name` exists upstream (a passive declare on a
/// channel of its own, which a 404 closes).
async fn exists(conn: &Connection, name: &str) -> Result<bool, String> {
    let ch = conn.create_channel().await.map_err(|e| e.to_string())?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let found = ch
        .exchange_declare(
            name.into(),
            ExchangeKind::Direct,
            passive,
            FieldTable::default(),
        )
        .await
        .is_ok();
    let _ = ch.close(200, "".into()).await;
    Ok(found)
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// Declares the upstream side: the exchange if missing, the queue, the
/// internal exchange (A or B, the one a previous run did not leave) bound
/// to the queue.
async fn declare(
    spec: &LinkSpec,
    conn: &Connection,
    uri: &Uri,
    cluster: &str,
    reach: &Reach,
    names: &mut Names,
) -> Result<Channel, String> {
    let up = &spec.upstream;
    let x = &spec.object;
    let e = |what: &str, err: lapin::Error| format!("upstream: {what}: {err}");
    if !exists(conn, &names.exchange).await? {
        let ch = conn
            .create_channel()
            .await
            .map_err(|err| e("channel", err))?;
        let opts = ExchangeDeclareOptions {
            durable: x.durable,
            auto_delete: x.auto_delete,
            internal: x.internal,
            ..Default::default()
        };
        ch.exchange_declare(
            names.exchange.as_str().into(),
            ExchangeKind::Custom(x.type_name.clone()),
            opts,
            x.arguments.clone(),
        )
        .await
        .map_err(|err| e(&format!("declaring exchange '{}'", names.exchange), err))?;
        let _ = ch.close(200, "".into()).await;
    }
    let ch = conn
        .create_channel()
        .await
        .map_err(|err| e("channel", err))?;
    let mut args = FieldTable::default();
    if let Some(ms) = up.expires {
        args.insert("x-expires".into(), AMQPValue::LongInt(ms as i32));
    }
    if let Some(ms) = up.message_ttl {
        args.insert("x-message-ttl".into(), AMQPValue::LongInt(ms as i32));
    }
    if let Some(p) = &up.ha_policy {
        args.insert("x-ha-policy".into(), long(p));
    }
    args.insert("x-internal-purpose".into(), long("federation"));
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(names.queue.as_str().into(), durable, args)
        .await
        .map_err(|err| e(&format!("declaring queue '{}'", names.queue), err))?;
    if exists(conn, &names.internal).await? {
        std::mem::swap(&mut names.internal, &mut names.previous);
    }
    // A declare the upstream does not know the type of may close the
    // whole connection (503): it goes over one of its own.
    let mut hop_args = FieldTable::default();
    hop_args.insert("x-max-hops".into(), AMQPValue::LongInt(up.max_hops as i32));
    hop_args.insert("x-downstream-name".into(), long(cluster));
    hop_args.insert("x-downstream-vhost".into(), long(&spec.vhost));
    hop_args.insert("x-internal-purpose".into(), long("federation"));
    if declare_internal(uri, reach, names, "x-federation-upstream", hop_args)
        .await
        .is_err()
    {
        // No federation there: a fanout does, and the link filters.
        let mut plain = FieldTable::default();
        plain.insert("x-internal-purpose".into(), long("federation"));
        declare_internal(uri, reach, names, "fanout", plain).await?;
    }
    ch.queue_bind(
        names.queue.as_str().into(),
        names.internal.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(|err| e("binding its queue", err))?;
    Ok(ch)
}

/// Declares the run's internal exchange (replacing one of its name) over
/// a connection of its own.
async fn declare_internal(
    uri: &Uri,
    reach: &Reach,
    names: &Names,
    kind: &str,
    args: FieldTable,
) -> Result<(), String> {
    let (conn, _) = client::connect(
        std::slice::from_ref(uri),
        reach,
        "Disposable exchange federation link connection",
    )
    .await?;
    let r = async {
        let ch = conn.create_channel().await.map_err(|e| e.to_string())?;
        ch.exchange_delete(
            names.internal.as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let opts = ExchangeDeclareOptions {
            durable: true,
            internal: true,
            auto_delete: true,
            ..Default::default()
        };
        ch.exchange_declare(
            names.internal.as_str().into(),
            ExchangeKind::Custom(kind.to_string()),
            opts,
            args,
        )
        .await
        .map_err(|e| format!("upstream: declaring exchange '{}': {e}", names.internal))
    }
    .await;
    let _ = conn.close(200, "".into()).await;
    r
}

/// Upstream bindings: (key, arguments rendered) -> (key, arguments).
type Bound = HashMap<(String, String), (String, FieldTable)>;

/// The upstream bindings the exchange's bindings here call for.
fn wanted(
    spec: &LinkSpec,
    ctx: &Context,
    cluster: &str,
    upstream_cluster: Option<&str>,
    upstream_vhost: &str,
) -> Option<Bound> {
    let label = format!("{}:{} {}", spec.vhost, spec.object.name, spec.upstream.name);
    let me = headers::Downstream {
        cluster,
        vhost: &spec.vhost,
        exchange: &label,
    };
    let mut out = Bound::new();
    for (key, args) in ctx.down.bindings_of(&spec.vhost, &spec.object.name)? {
        let Some(args) = headers::bound_from(
            &args,
            spec.upstream.max_hops,
            upstream_cluster,
            upstream_vhost,
            &me,
        ) else {
            continue;
        };
        out.insert((key.clone(), format!("{args:?}")), (key, args));
    }
    Some(out)
}

/// Binds and unbinds upstream until `have` is `want`.
async fn sync_bindings(
    ch: &Channel,
    names: &Names,
    nowait: bool,
    have: &mut Bound,
    want: Bound,
) -> Result<(), String> {
    for (k, (key, args)) in &want {
        if have.contains_key(k) {
            continue;
        }
        ch.exchange_bind(
            names.internal.as_str().into(),
            names.exchange.as_str().into(),
            key.as_str().into(),
            ExchangeBindOptions { nowait },
            args.clone(),
        )
        .await
        .map_err(|e| format!("upstream: binding key '{key}': {e}"))?;
    }
    for (k, (key, args)) in have.iter() {
        if want.contains_key(k) {
            continue;
        }
        ch.exchange_unbind(
            names.internal.as_str().into(),
            names.exchange.as_str().into(),
            key.as_str().into(),
            ExchangeUnbindOptions { nowait },
            args.clone(),
        )
        .await
        .map_err(|e| format!("upstream: unbinding key '{key}': {e}"))?;
    }
    *have = want;
    Ok(())
}

async fn work(
    spec: &LinkSpec,
    ctx: &Context,
    conn: &Connection,
    uri: &Uri,
    upstream_cluster: Option<&str>,
    conn_name: &str,
    names: &mut Names,
) -> Ended {
    let up = &spec.upstream;
    let cluster = ctx.down.cluster_name();
    let Some(mut changes) = ctx.down.changes(&spec.vhost) else {
        return Ended::Stopped;
    };
    let ch = match declare(spec, conn, uri, &cluster, &ctx.reach, names).await {
        Ok(c) => c,
        Err(e) => return Ended::Failed("error", e),
    };
    let bind_ch = match up.one_channel {
        true => ch.clone(),
        false => match conn.create_channel().await {
            Ok(c) => c,
            Err(e) => return failed(e),
        },
    };
    let mut have = Bound::new();
    changes.borrow_and_update();
    let Some(want) = wanted(spec, ctx, &cluster, upstream_cluster, &uri.vhost) else {
        return Ended::Stopped;
    };
    if let Err(e) = sync_bindings(&bind_ch, names, up.bind_nowait, &mut have, want).await {
        return Ended::Failed("error", e);
    }
    // The bindings are on the new internal exchange: the old one can go.
    if let Ok(del) = conn.create_channel().await {
        let _ = del
            .exchange_delete(
                names.previous.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = del.close(200, "".into()).await;
    }
    let no_ack = up.ack_mode == AckMode::NoAck;
    if !no_ack {
        if let Err(e) = ch.basic_qos(up.prefetch, BasicQosOptions::default()).await {
            return failed(e);
        }
    }
    let mut consumer = match ch
        .basic_consume(
            names.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions {
                no_ack,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
    {
        Ok(c) => c,
        Err(e) => return failed(format!("upstream: consuming '{}': {e}", names.queue)),
    };
    ctx.status.lock().set(State::Running(conn_name.to_string()));
    let redacted = uri.redacted();
    let from = Source {
        uri: &redacted,
        exchange: &spec.object.name,
        cluster: upstream_cluster,
        vhost: &uri.vhost,
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_check = tokio::time::Instant::now();
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let next = tokio::select! {
            next = consumer.next() => next,
            _ = stopped(&ctx.stop) => return Ended::Stopped,
            r = changes.changed() => {
                if r.is_err() {
                    return Ended::Stopped;
                }
                let Some(want) = wanted(spec, ctx, &cluster, upstream_cluster, &uri.vhost) else {
                    // The exchange went: the set stops the link.
                    continue;
                };
                if let Err(e) = sync_bindings(&bind_ch, names, up.bind_nowait, &mut have, want).await {
                    return Ended::Failed("error", e);
                }
                continue;
            }
            _ = tick.tick() => {
                if !conn.status().connected() {
                    return Ended::Failed("error", "upstream: the connection was lost".into());
                }
                if last_check.elapsed() >= CHECK_EVERY {
                    last_check = tokio::time::Instant::now();
                    match exists(conn, &names.internal).await {
                        Ok(true) => {}
                        Ok(false) => return Ended::Failed(
                            "error",
                            format!("upstream: its exchange '{}' is gone", names.internal),
                        ),
                        Err(e) => return failed(e),
                    }
                }
                continue;
            }
        };
        batch.clear();
        let mut next = Some(next);
        let mut cancelled = false;
        while let Some(n) = next.take() {
            match n {
                Some(Ok(d)) => batch.push(d),
                Some(Err(e)) => return failed(format!("upstream: {e}")),
                None => cancelled = true,
            }
            if !cancelled && batch.len() < BATCH {
                next = consumer.next().now_or_never();
            }
        }
        // What came before a cancel goes on first.
        if let Err(e) = forward(spec, ctx, &cluster, &from, &batch).await {
            return e;
        }
        if cancelled {
            return Ended::Failed("error", "basic_cancel".into());
        }
    }
}

/// Makes what may go on of `batch` into messages for the exchange here
/// (what has been here, or is out of hops, is acked and dropped), then
/// publishes and settles it.
async fn forward(
    spec: &LinkSpec,
    ctx: &Context,
    cluster: &str,
    from: &Source<'_>,
    batch: &[lapin::message::Delivery],
) -> Result<(), Ended> {
    let up = &spec.upstream;
    let mut built = Built::with_capacity(batch.len());
    for (i, d) in batch.iter().enumerate() {
        let hdrs = d.properties.headers().as_ref();
        if !may_forward(hdrs, u64::from(up.max_hops), cluster, &spec.vhost) {
            continue;
        }
        let props = headers::received(&d.properties, from, d.redelivered, up.trust_user_id);
        let raw = crate::message::encode_properties(&props);
        match crate::message::read_meta(&raw) {
            Ok(meta) => built.push(
                i,
                Message::new(
                    spec.object.name.as_bytes(),
                    d.routing_key.as_str().as_bytes(),
                    &raw,
                    &d.data,
                    meta,
                ),
            ),
            Err(e) => {
                refuse(spec, d, &format!("its properties: {e:?}")).await?;
                built.rejected(i);
            }
        }
    }
    deliver(spec, ctx, batch, built).await
}
