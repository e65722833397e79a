//! Exchanges, queues and bindings: RabbitMQ's /api/exchanges, /api/queues
//! and /api/bindings, with publish, get and purge. Changes go through the
//! vhost as AMQP's do (the same checks and texts), after the caller's AMQP
//! permissions: configure to declare and delete, write to publish and
//! bind into, read to get, purge and bind from.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{created_or_updated, no_content};
use crate::access::Access;
use crate::http::auth::Caller;
use crate::http::body::Body;
use crate::http::error::{ApiError, ApiResult};
use crate::http::list::{respond, respond_keyed, ListQuery};
use crate::http::{message, render, Api};
use crate::queue::{Entry, Queue, Refused, Settle, Sink, Unacked};
use crate::vhost::routing::Routed;
use crate::vhost::{Destination, ExchangeSpec, QueueSpec, VHost};

fn visible(api: &Api, caller: &Caller, only: Option<&str>) -> ApiResult<Vec<Arc<VHost>>> {
    match only {
        Some(v) => Ok(vec![super::vhost_for(api, caller, v, true)?]),
        None => Ok(api
            .broker
            .vhosts()
            .into_iter()
            .filter(|v| caller.sees(api, &v.name))
            .collect()),
    }
}

fn flag(b: &Map<String, Value>, k: &str, default: bool) -> ApiResult<bool> {
    match b.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(v)) => Ok(*v),
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        // RabbitMQ's {not_boolean, V}, a tuple printed as a list.
        Some(other) => Err(ApiError::bad_request_term(json!(["not_boolean", other]))),
    }
}

fn arguments(b: &Map<String, Value>) -> ApiResult<amq_protocol::types::FieldTable> {
    crate::definitions::args_from_json(b.get("arguments"), "").map_err(ApiError::bad_request)
}

/// 400 for a name AMQP could not carry (a short string: 1 to 255 bytes);
/// a queue's as RabbitMQ words it (rabbit_parameter_validation).
fn check_name(kind: &str, name: &str) -> ApiResult<()> {
    if kind == "queue" && name.len() > 255 {
        return Err(ApiError::bad_request(format!(
            "queue should be less than 255 bytes, actually was {}\n",
            name.len()
        )));
    }
    if name.is_empty() || name.len() > 255 {
        return Err(ApiError::bad_request(format!(
            "{kind} name must be 1 to 255 bytes"
        )));
    }
    Ok(())
}

// ---- exchanges

async fn list_exchanges_in(
    api: Arc<Api>,
    caller: Caller,
    only: Option<String>,
    q: ListQuery,
) -> ApiResult<Json<Value>> {
    let mut all = Vec::new();
    for vh in visible(&api, &caller, only.as_deref())? {
        for x in vh.exchanges() {
            all.push((Arc::clone(&vh), x));
        }
    }
    respond(
        all,
        &q,
        |(v, x)| (&v.name, &x.name),
        |(v, x)| render::exchange(v, x),
    )
    .map(Json)
}

pub async fn list_exchanges(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    list_exchanges_in(api, caller, None, q).await
}

pub async fn vhost_exchanges(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(v): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    list_exchanges_in(api, caller, Some(v), q).await
}

pub async fn get_default_exchange(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(v): Path<String>,
) -> ApiResult<Json<Value>> {
    get_exchange(State(api), caller, Path((v, String::new()))).await
}

pub async fn get_exchange(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let name = super::exchange_name(name);
    let vh = super::vhost_for(&api, &caller, &v, true)?;
    let x = vh.exchange(&name).ok_or_else(ApiError::not_found)?;
    Ok(Json(render::exchange(&vh, &x)))
}

pub async fn put_exchange(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
    body: Body,
) -> ApiResult<StatusCode> {
    check_name("exchange", &name)?;
    let name = super::exchange_name(name);
    let vh = super::vhost_for(&api, &caller, &v, false)?;
    caller.resource(&api, &v, Access::Configure, &name)?;
    let b = body.object().await?;
    let arguments = arguments(&b)?;
    // As over AMQP (amqp/channel/exchange.rs): a new exchange with an
    // alternate needs read on it and write on the alternate.
    let alternate = arguments
        .inner()
        .get("alternate-exchange")
        .and_then(crate::wire::value::text);
    if let Some(ae) =
        alternate.filter(|_| vh.exchange(&name).is_none() && !name.starts_with("amq."))
    {
        caller.resource(&api, &v, Access::Read, &name)?;
        caller.resource(&api, &v, Access::Write, &ae)?;
    }
    let kind = b
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("direct")
        .to_string();
    let spec = ExchangeSpec {
        name: name.clone(),
        kind,
        durable: flag(&b, "durable", true)?,
        auto_delete: flag(&b, "auto_delete", false)?,
        internal: flag(&b, "internal", false)?,
        arguments,
    };
    let existed = vh.exchange(&name).is_some();
    vh.declare_exchange(&spec, false)?;
    api.broker.store.sync().await?;
    Ok(created_or_updated(!existed))
}

#[derive(Deserialize, Default)]
pub struct DeleteQuery {
    #[serde(rename = "if-unused")]
    if_unused: Option<String>,
    #[serde(rename = "if-empty")]
    if_empty: Option<String>,
}

pub async fn delete_exchange(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
    Query(d): Query<DeleteQuery>,
) -> ApiResult<StatusCode> {
    let vh = super::vhost_for(&api, &caller, &v, false)?;
    let name = super::exchange_name(name);
    if name.is_empty() || name.starts_with("amq.") {
        // RabbitMQ's API says no more (the why goes to its log).
        tracing::info!(
            "management API: deletion of system exchange '{name}' in vhost '{v}' refused"
        );
        return Err(ApiError::not_authorised("Access refused."));
    }
    vh.exchange(&name).ok_or_else(ApiError::not_found)?;
    caller.resource(&api, &v, Access::Configure, &name)?;
    vh.delete_exchange(&name, d.if_unused.as_deref() == Some("true"))?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

pub async fn publish(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
    body: Body,
) -> ApiResult<Json<Value>> {
    let vh = super::vhost_for(&api, &caller, &v, false)?;
    let name = super::exchange_name(name);
    if name.len() > 255 {
        return Err(ApiError::bad_request(
            "exchange name is longer than 255 bytes",
        ));
    }
    let check = if name.is_empty() {
        "amq.default"
    } else {
        name.as_str()
    };
    caller.resource(&api, &v, Access::Write, check)?;
    // As over AMQP: no publishing while a resource alarm is up.
    if api.broker.alarms.any() {
        return Err(ApiError::unavailable(format!(
            "a resource alarm is in effect ({}): publishing is blocked",
            api.broker.alarms.reason()
        )));
    }
    let b = body.object().await?;
    let max = api.broker.config.max_message_size;
    let msg = Arc::new(message::from_request(&name, &b, max)?);
    let key = String::from_utf8_lossy(msg.routing_key()).into_owned();
    caller.topic(&api, &vh, &name, Access::Write, &key)?;
    // The user_id property must be the caller's own (RabbitMQ's
    // check_user_id_header), unless the caller is an impersonator.
    if let Some(id) = msg.short_property(crate::wire::props::Field::UserId) {
        if id != caller.user.name.as_bytes() && !caller.user.has_tag("impersonator") {
            return Err(ApiError::bad_request(format!(
                "user_id property set to '{}' but authenticated user was '{}'",
                String::from_utf8_lossy(id),
                caller.user.name
            )));
        }
    }
    let mut scratch = Default::default();
    let mut routes = Vec::new();
    let routed = vh
        .route(&msg, &mut scratch, &mut routes)
        .map_err(|e| match e.kind {
            crate::vhost::error::Kind::NotFound => ApiError::from(e),
            _ => ApiError::bad_request(format!("{} {}", code_of(&e), e.text)),
        })?;
    let admitted = scratch.take_admitted();
    match routed {
        Routed::Hold(delay_ms) => {
            if let Err(e) = vh.hold(&msg, delay_ms) {
                if let Some(a) = admitted {
                    a.forget();
                }
                return Err(e.into());
            }
            api.broker.store.sync().await?;
            return Ok(Json(json!({"routed": true})));
        }
        // Its original was routed (once the store holds its entry).
        Routed::Duplicate { durable } => {
            if durable {
                api.broker.store.sync().await?;
            }
            return Ok(Json(json!({"routed": true})));
        }
        Routed::Queues => {}
    }
    let routed = !routes.is_empty();
    let mut stored = false;
    let mut rejected = false;
    let mut failed = None;
    for q in routes {
        match q.push(&msg) {
            Ok(p) => {
                stored |= p.stored;
                rejected |= p.rejected;
            }
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    // Not in every queue: a retry must not be a duplicate.
    if let (true, Some(a)) = (rejected || failed.is_some(), admitted) {
        a.forget();
    }
    if let Some(e) = failed {
        return Err(ApiError::internal(e));
    }
    if stored {
        api.broker.store.sync().await?;
    }
    Ok(Json(json!({"routed": routed})))
}

fn code_of(e: &crate::vhost::Error) -> &'static str {
    use crate::vhost::error::Kind;
    match e.kind {
        Kind::NotFound => "404 NOT_FOUND -",
        Kind::AccessRefused => "403 ACCESS_REFUSED -",
        Kind::PreconditionFailed => "406 PRECONDITION_FAILED -",
        _ => "",
    }
}

// ---- queues

/// The connection id the API acts as: none (connection ids start at 1), so
/// every exclusive queue is another connection's.
pub(super) const NO_CONNECTION: u64 = 0;

async fn list_queues_in(
    api: Arc<Api>,
    caller: Caller,
    only: Option<String>,
    q: ListQuery,
) -> ApiResult<Json<Value>> {
    let mut all = Vec::new();
    for vh in visible(&api, &caller, only.as_deref())? {
        for queue in vh.queues() {
            all.push((Arc::clone(&vh), queue));
        }
    }
    respond_keyed(
        all,
        &q,
        |(v, q)| (&v.name, q.name()),
        |(v, q)| render::queue(&api, v, q, false),
        |(_, q), field| render::queue_sort_value(q, field),
    )
    .map(Json)
}

pub async fn list_queues(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    list_queues_in(api, caller, None, q).await
}

pub async fn vhost_queues(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(v): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    list_queues_in(api, caller, Some(v), q).await
}

pub async fn get_queue(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
    axum::extract::Query(sq): axum::extract::Query<crate::http::samples::SampleQuery>,
) -> ApiResult<Json<Value>> {
    let vh = super::vhost_for(&api, &caller, &v, true)?;
    let q = vh.queue(&name).ok_or_else(ApiError::not_found)?;
    let mut json = render::queue(&api, &vh, &q, true);
    if sq.wanted() {
        let (age, incr) = sq.window();
        let history = q.history(crate::util::now_ms(), age, incr);
        if let Value::Object(o) = &mut json {
            let mut stats = match o.remove("message_stats") {
                Some(Value::Object(m)) => m,
                _ => Map::new(),
            };
            crate::http::samples::add(
                &sq,
                &history,
                &crate::queue::stats::HISTORY,
                3,
                o,
                &mut stats,
            );
            o.insert("message_stats".into(), Value::Object(stats));
        }
    }
    Ok(Json(json))
}

pub async fn put_queue(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
    body: Body,
) -> ApiResult<StatusCode> {
    check_name("queue", &name)?;
    let vh = super::vhost_for(&api, &caller, &v, false)?;
    caller.resource(&api, &v, Access::Configure, &name)?;
    let b = body.object().await?;
    let mut args = arguments(&b)?;
    // As over AMQP (amqp/channel/queue.rs): a new queue with a dead-letter
    // exchange needs read on the queue and write on that exchange.
    let dlx = args
        .inner()
        .get("x-dead-letter-exchange")
        .and_then(crate::wire::value::text);
    if let Some(dlx) = dlx.filter(|_| vh.queue(&name).is_none()) {
        caller.resource(&api, &v, Access::Read, &name)?;
        caller.resource(&api, &v, Access::Write, &dlx)?;
    }
    // The API's "type" field, or the vhost's default queue type.
    let qtype = b
        .get("type")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| Some(vh.meta().default_queue_type).filter(|t| !t.is_empty()));
    if let Some(t) = qtype.filter(|_| !args.contains_key("x-queue-type")) {
        if t != "classic" {
            args.insert(
                "x-queue-type".into(),
                amq_protocol::types::AMQPValue::LongString(t.into()),
            );
        }
    }
    let spec = QueueSpec {
        name: name.clone(),
        durable: flag(&b, "durable", true)?,
        exclusive: false,
        auto_delete: flag(&b, "auto_delete", false)?,
        arguments: args,
        server_named: false,
    };
    let existed = vh.queue(&name).is_some();
    vh.declare_queue(&spec, false, 0)?;
    api.broker.store.sync().await?;
    Ok(created_or_updated(!existed))
}

pub async fn delete_queue(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
    Query(d): Query<DeleteQuery>,
) -> ApiResult<StatusCode> {
    let vh = super::vhost_for(&api, &caller, &v, false)?;
    vh.queue(&name).ok_or_else(ApiError::not_found)?;
    caller.resource(&api, &v, Access::Configure, &name)?;
    // The API is no connection (ids start at 1): a connection's exclusive
    // queue is locked to it, as it is to another connection over AMQP.
    let deleted = vh.delete_queue(
        &name,
        d.if_unused.as_deref() == Some("true"),
        d.if_empty.as_deref() == Some("true"),
        NO_CONNECTION,
    )?;
    api.broker.store.sync().await?;
    drop(deleted);
    Ok(no_content())
}

pub async fn purge(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let vh = super::vhost_for(&api, &caller, &v, false)?;
    let q = vh.queue(&name).ok_or_else(ApiError::not_found)?;
    caller.resource(&api, &v, Access::Read, &name)?;
    vh.check_exclusive(&q, NO_CONNECTION)?;
    q.purge()?;
    api.broker.store.sync().await?;
    Ok(no_content())
}

/// A message an API get took: the message, whether it was redelivered,
/// how many were left, and its entry while it waits to be settled.
type Taken = (Arc<crate::message::Message>, bool, u32, Option<Entry>);

/// Where an API get's messages go: held here until the request settles
/// them as its ackmode says.
#[derive(Default)]
struct GetSink {
    taken: Mutex<Vec<Taken>>,
}

impl Sink for GetSink {
    fn try_deliver(
        &self,
        _: &Arc<crate::queue::Consumer>,
        _: &Arc<Queue>,
        entry: Entry,
    ) -> Result<(), (Entry, Refused)> {
        Err((entry, Refused::Closed))
    }

    fn deliver_get(
        &self,
        _: &Arc<Queue>,
        entry: Entry,
        remaining: u32,
        no_ack: bool,
        _: u64,
    ) -> Option<Entry> {
        let mut taken = self.taken.lock();
        let (msg, redelivered) = (Arc::clone(&entry.msg), entry.redelivered);
        if no_ack {
            taken.push((msg, redelivered, remaining, None));
            return Some(entry);
        }
        taken.push((msg, redelivered, remaining, Some(entry)));
        None
    }

    fn cancelled(&self, _: &str) {}
}

pub async fn get_messages(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, name)): Path<(String, String)>,
    body: Body,
) -> ApiResult<Json<Value>> {
    let vh = super::vhost_for(&api, &caller, &v, false)?;
    let q = vh.queue(&name).ok_or_else(|| {
        ApiError::from(crate::vhost::Error::not_found(format!(
            "NOT_FOUND - no queue '{name}' in vhost '{v}'"
        )))
    })?;
    caller.resource(&api, &v, Access::Read, &name)?;
    // RabbitMQ gets over a channel, and answers what closed it, code and
    // all (a declare, delete or purge answers the text alone).
    vh.check_exclusive(&q, NO_CONNECTION)
        .map_err(|e| ApiError::bad_request(format!("405 RESOURCE_LOCKED - {}", e.text)))?;
    let b = body.object().await?;
    let count = b
        .get("count")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .min(10_000) as usize;
    let ackmode = b
        .get("ackmode")
        .and_then(Value::as_str)
        .unwrap_or("ack_requeue_true");
    let settle = match ackmode {
        "ack_requeue_true" | "reject_requeue_true" => Some(Settle::Requeue),
        "ack_requeue_false" => None,
        "reject_requeue_false" => Some(Settle::Reject),
        other => return Err(ApiError::bad_request(format!("unknown ackmode '{other}'"))),
    };
    let base64 = match b.get("encoding").and_then(Value::as_str).unwrap_or("auto") {
        "auto" => false,
        "base64" => true,
        other => return Err(ApiError::bad_request(format!("unknown encoding '{other}'"))),
    };
    let truncate = b
        .get("truncate")
        .and_then(Value::as_u64)
        .map(|n| n as usize);
    // At most this many payload bytes per request, so one request cannot
    // hold a whole queue in memory several times over.
    const MAX_GET_BYTES: usize = 64 << 20;
    if q.stream().is_some() {
        return stream_get(q, &b, count, base64, truncate, MAX_GET_BYTES).await;
    }
    let sink = GetSink::default();
    let mut bytes = 0usize;
    for _ in 0..count {
        if bytes >= MAX_GET_BYTES || !q.get(&sink, settle.is_none(), 0) {
            break;
        }
        bytes += sink.taken.lock().last().map_or(0, |t| t.0.body().len());
    }
    let taken = std::mem::take(&mut *sink.taken.lock());
    let mut out = Vec::with_capacity(taken.len());
    let mut back = Vec::new();
    for (msg, redelivered, remaining, entry) in taken {
        out.push(message::to_json(
            &msg,
            redelivered,
            remaining,
            base64,
            truncate,
        ));
        if let Some(entry) = entry {
            back.push(Unacked {
                tag: 0,
                queue: Arc::clone(&q),
                entry,
                consumer: None,
                deadline: 0,
            });
        }
    }
    if let Some(how) = settle {
        q.settle(back.into_iter(), how);
    }
    Ok(Json(Value::Array(out)))
}

/// A get from a stream: a look from `offset` on (a number, "first",
/// "last", "next", or an interval such as "1h"; "first" when absent),
/// as LavinMQ's UI offers. Nothing moves and nothing is removed, whatever
/// the ack mode says (a stream's acks never remove either).
async fn stream_get(
    q: Arc<Queue>,
    b: &Map<String, Value>,
    count: usize,
    base64: bool,
    truncate: Option<usize>,
    max_bytes: usize,
) -> ApiResult<Json<Value>> {
    use crate::queue::stream::Start;
    use amq_protocol::types::AMQPValue;
    let offset = match b.get("offset") {
        None | Some(Value::Null) => Start::First,
        Some(Value::String(s)) => Start::parse(
            Some(&AMQPValue::LongString(s.as_str().into())),
            crate::util::now_ms(),
        )
        .map_err(ApiError::bad_request)?,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(n) => Start::Offset(n),
            None => return Err(ApiError::bad_request(format!("invalid offset {n}"))),
        },
        Some(other) => return Err(ApiError::bad_request(format!("invalid offset {other}"))),
    };
    // The reads go to the disk: off the runtime's threads.
    let reader = Arc::clone(&q);
    let read = tokio::task::spawn_blocking(move || match reader.stream() {
        Some(s) => s.peek(&reader, offset, count, max_bytes),
        None => Ok(Vec::new()),
    })
    .await
    .map_err(|e| ApiError::internal(format!("the read stopped: {e}")))?
    .map_err(|e| ApiError::internal(format!("cannot read the stream: {e}")))?;
    let next = q.stream().map_or(0, |s| s.extent().next);
    let out = read
        .iter()
        .map(|(o, m, _)| {
            let remaining = u32::try_from(next.saturating_sub(o + 1)).unwrap_or(u32::MAX);
            let m = crate::message::amqp10::readable(Arc::clone(m), *o);
            message::to_json(&m, false, remaining, base64, truncate)
        })
        .collect();
    Ok(Json(Value::Array(out)))
}

// ---- bindings

pub async fn list_bindings(State(api): State<Arc<Api>>, caller: Caller) -> ApiResult<Json<Value>> {
    let mut all = Vec::new();
    for vh in visible(&api, &caller, None)? {
        all.extend(render::bindings(&vh));
    }
    Ok(Json(Value::Array(all)))
}

pub async fn vhost_bindings(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path(v): Path<String>,
) -> ApiResult<Json<Value>> {
    let vh = super::vhost_for(&api, &caller, &v, true)?;
    Ok(Json(Value::Array(render::bindings(&vh))))
}

fn filtered(vh: &VHost, source: Option<&str>, keep: impl Fn(&str, &str, &str) -> bool) -> Value {
    Value::Array(render::bindings_where(vh, source, keep))
}

pub async fn exchange_source_bindings(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, x)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let x = super::exchange_name(x);
    let vh = super::vhost_for(&api, &caller, &v, true)?;
    vh.exchange(&x).ok_or_else(ApiError::not_found)?;
    Ok(Json(filtered(&vh, Some(&x), |_, _, _| true)))
}

pub async fn exchange_destination_bindings(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, x)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let x = super::exchange_name(x);
    let vh = super::vhost_for(&api, &caller, &v, true)?;
    vh.exchange(&x).ok_or_else(ApiError::not_found)?;
    Ok(Json(filtered(&vh, None, |_, d, kind| {
        d == x && kind == "exchange"
    })))
}

pub async fn queue_bindings(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, q)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let vh = super::vhost_for(&api, &caller, &v, true)?;
    vh.queue(&q).ok_or_else(ApiError::not_found)?;
    Ok(Json(filtered(&vh, None, |_, d, kind| {
        d == q && kind == "queue"
    })))
}

fn kind_of(kind: &str) -> ApiResult<bool> {
    match kind {
        "q" => Ok(false),
        "e" => Ok(true),
        _ => Err(ApiError::not_found()),
    }
}

pub async fn between(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, source, kind, dest)): Path<(String, String, String, String)>,
) -> ApiResult<Json<Value>> {
    let source = super::exchange_name(source);
    let vh = super::vhost_for(&api, &caller, &v, true)?;
    let to_exchange = kind_of(&kind)?;
    vh.exchange(&source).ok_or_else(ApiError::not_found)?;
    let dtype = if to_exchange { "exchange" } else { "queue" };
    Ok(Json(filtered(&vh, Some(&source), |_, d, kind| {
        d == dest && kind == dtype
    })))
}

pub async fn bind(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, source, kind, dest)): Path<(String, String, String, String)>,
    body: Body,
) -> ApiResult<(StatusCode, [(axum::http::HeaderName, String); 1])> {
    let source = super::exchange_name(source);
    let vh = super::vhost_for(&api, &caller, &v, false)?;
    let to_exchange = kind_of(&kind)?;
    caller.resource(&api, &v, Access::Write, &dest)?;
    caller.resource(&api, &v, Access::Read, &source)?;
    let b = body.object().await?;
    let key = b
        .get("routing_key")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let args = arguments(&b)?;
    caller.topic(&api, &vh, &source, Access::Read, &key)?;
    let d: Destination = vh.destination(&dest, to_exchange, 0)?;
    vh.bind(&source, d, &key, &args)?;
    api.broker.store.sync().await?;
    let location = render::properties_key(&key, &args);
    Ok((
        StatusCode::CREATED,
        [(axum::http::header::LOCATION, location)],
    ))
}

pub async fn get_binding(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, source, kind, dest, props)): Path<(String, String, String, String, String)>,
) -> ApiResult<Json<Value>> {
    let source = super::exchange_name(source);
    let vh = super::vhost_for(&api, &caller, &v, true)?;
    let to_exchange = kind_of(&kind)?;
    let dtype = if to_exchange { "exchange" } else { "queue" };
    render::bindings_where(&vh, Some(&source), |_, d, kind| d == dest && kind == dtype)
        .into_iter()
        .find(|b| b["properties_key"] == props.as_str())
        .map(Json)
        .ok_or_else(ApiError::not_found)
}

pub async fn unbind(
    State(api): State<Arc<Api>>,
    caller: Caller,
    Path((v, source, kind, dest, props)): Path<(String, String, String, String, String)>,
) -> ApiResult<StatusCode> {
    let source = super::exchange_name(source);
    let vh = super::vhost_for(&api, &caller, &v, false)?;
    let to_exchange = kind_of(&kind)?;
    caller.resource(&api, &v, Access::Write, &dest)?;
    caller.resource(&api, &v, Access::Read, &source)?;
    let x = vh.exchange(&source).ok_or_else(ApiError::not_found)?;
    let found = x.bindings.read().list().into_iter().find(|(key, args, d)| {
        let same_dest = match d {
            Destination::Queue(q) => !to_exchange && q.name() == dest,
            Destination::Exchange(e) => to_exchange && e.name == dest,
        };
        same_dest && render::properties_key(key, args) == props
    });
    let Some((key, args, _)) = found else {
        return Err(ApiError::not_found());
    };
    vh.unbind(&source, &dest, to_exchange, &key, &args, 0)?;
    api.broker.store.sync().await?;
    Ok(no_content())
}
