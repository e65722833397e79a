//! An open connection's commands (mod.rs has the handshake). A request
//! that does not parse, and a frame past the frame max, close the
//! connection with the protocol's code (a frame that does not parse has
//! no fields to answer); an unknown command with a correlation id is
//! answered with "unknown frame"; every other refusal is the command's
//! response code, as RabbitMQ gives it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BufMut;
use tokio::io::AsyncRead;
use tokio::sync::watch;

mod sac;

use super::codes::*;
use super::groups::{Groups, Inbox, Key};
use super::out::Out;
use super::publish::{self, Confirmer, Publisher};
use super::subscribe::{self, Ending, Sac, Subscription, Target};
use super::super_streams;
use super::view::{ConsumerStats, PublisherStats, View};
use super::wire::{self, Fields, Malformed, ReadError};
use super::Session;
use crate::access::Access;
use crate::broker::Broker;
use crate::queue::stream::Filter;
use crate::queue::Queue;

/// References (of publishers and stored offsets) are at most this long,
/// as RabbitMQ's are.
const MAX_REFERENCE: usize = 256;

struct Conn {
    s: Session,
    broker: Arc<Broker>,
    out: Out,
    publishers: HashMap<u8, Publisher>,
    subscriptions: HashMap<u8, Subscription>,
    confirmer: Confirmer,
    /// Single active consumer groups, and how they reach this connection.
    groups: Arc<Groups>,
    inbox: Arc<Inbox>,
    /// The last correlation id of a request this server sent.
    correlation: u32,
    /// The last subscription's serial.
    serial: u64,
    /// Its publishers and subscriptions as the management API lists them.
    view: Arc<View>,
    /// The client takes Deliver version 2 (it said so in its
    /// ExchangeCommandVersions).
    deliver_v2: bool,
}

/// An array of strings.
fn strings<'a>(f: &mut Fields<'a>) -> Result<Vec<&'a str>, Malformed> {
    let n = f.count(2)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(f.string()?);
    }
    Ok(out)
}

/// What a subscription does once checked.
struct Plan {
    queue: Arc<Queue>,
    /// The messages it takes, if not all.
    filter: Option<Arc<Filter>>,
    how: How,
}

enum How {
    /// Reads its stream from this offset.
    Read(u64),
    /// Joins this single active consumer group (the stream's partition
    /// index in its super stream) and waits to be made active.
    Group(Key, Option<usize>),
}

/// How a frame left the connection.
enum Next {
    Go,
    /// Close with this code and reason.
    Close(u16, String),
    /// The client closed it (answered).
    End,
}

pub async fn run<R: AsyncRead + Unpin>(
    mut rd: R,
    out: Out,
    s: Session,
    broker: Arc<Broker>,
    groups: Arc<Groups>,
    mut stop: watch::Receiver<bool>,
) {
    let heartbeat = Duration::from_secs(s.heartbeat as u64);
    let mut beating = None;
    if s.heartbeat > 0 {
        let beats = out.clone();
        beating = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(heartbeat);
            tick.tick().await;
            loop {
                tick.tick().await;
                if !beats.write(|o| wire::frame(o, HEARTBEAT, 1, |_| {})).await {
                    return;
                }
            }
        }));
    }
    // The connection's other tasks end with it (each holds an `Out`: the
    // writer ends, and the socket closes, once all are gone).
    struct Abort(Option<tokio::task::JoinHandle<()>>);
    impl Drop for Abort {
        fn drop(&mut self) {
            if let Some(t) = &self.0 {
                t.abort();
            }
        }
    }
    let _beating = Abort(beating);
    let frame_max = s.frame_max;
    let (view, closer) = (Arc::clone(&s.view), Arc::clone(&s.closer));
    let inbox = Arc::new(Inbox::default());
    let mut c = Conn {
        groups,
        inbox: Arc::clone(&inbox),
        correlation: 0,
        serial: 0,
        confirmer: Confirmer::start(
            Arc::clone(&broker.store),
            out.clone(),
            frame_max,
            Arc::clone(&view),
        ),
        view,
        deliver_v2: false,
        s,
        broker,
        out,
        publishers: HashMap::new(),
        subscriptions: HashMap::new(),
    };
    // A client silent for two heartbeats is gone (RabbitMQ's rule).
    let silence = if heartbeat.is_zero() {
        Duration::from_secs(u32::MAX as u64)
    } else {
        heartbeat * 2
    };
    let mut buf = Vec::new();
    // How often unanswered consumer updates, and publishers whose stream
    // went, are looked for.
    let mut answers = tokio::time::interval(Duration::from_secs(5));
    answers.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The frame is read by one future however many updates come in
        // meanwhile (a read dropped half way would lose its bytes).
        let read = {
            let frame = wire::read_frame(&mut rd, &mut buf, frame_max);
            tokio::pin!(frame);
            let silent = tokio::time::sleep(silence);
            tokio::pin!(silent);
            loop {
                // While a resource alarm is up a connection with publishers
                // is not read (as AMQP's publishers are held), but its groups
                // and answers go on.
                let held = !c.publishers.is_empty() && c.broker.alarms.any();
                tokio::select! {
                    r = &mut frame, if !held => break Ok(r),
                    // Held, its silence is not the client's.
                    _ = tokio::time::sleep(Duration::from_millis(100)), if held => {
                        silent.as_mut().reset(tokio::time::Instant::now() + silence);
                    }
                    _ = &mut silent => break Err(()),
                    news = inbox.take() => {
                        for (id, serial) in news.ended {
                            c.ended(id, serial).await;
                        }
                        for u in news.updates.into_values() {
                            c.update(u).await;
                        }
                    }
                    _ = answers.tick() => {
                        if c.overdue() {
                            tracing::warn!(peer = %c.s.peer, "stream client did not answer a consumer update: closing");
                            return;
                        }
                        c.publishers_gone().await;
                    },
                    _ = stop.changed() => {
                        close(&c.out, OK, "the broker is shutting down").await;
                        return;
                    }
                    why = closer.asked() => {
                        tracing::info!(peer = %c.s.peer, "closing a stream connection: {why}");
                        close(&c.out, OK, &why).await;
                        return;
                    }
                    // The writer gave up on the client (or failed): so does this.
                    _ = c.out.gone() => return,
                }
            }
        };
        let next = match read {
            Err(_) => {
                tracing::warn!(peer = %c.s.peer, "stream client missed its heartbeats: closing");
                return;
            }
            Ok(Err(ReadError::Io(_))) => return,
            Ok(Err(ReadError::TooLarge(n))) => Next::Close(
                FRAME_TOO_LARGE,
                format!("a frame of {n} bytes is over the frame max of {frame_max}"),
            ),
            Ok(Ok(())) => {
                for (id, serial) in inbox.take_ended() {
                    c.ended(id, serial).await;
                }
                c.command(&buf).await
            }
        };
        match next {
            Next::Go => {}
            Next::End => return,
            Next::Close(code, why) => {
                tracing::warn!(peer = %c.s.peer, "closing a stream connection: {why}");
                close(&c.out, code, &why).await;
                return;
            }
        }
    }
}

/// The server's close.
async fn close(out: &Out, code: u16, why: &str) {
    out.write(|o| {
        wire::frame(o, CLOSE, 1, |o| {
            o.put_u32(0);
            o.put_u16(code);
            wire::put_str(o, why);
        })
    })
    .await;
}

impl Conn {
    async fn command(&mut self, frame: &[u8]) -> Next {
        let mut f = Fields::new(frame);
        let (Ok(key), Ok(version)) = (f.u16(), f.u16()) else {
            return Next::Close(UNKNOWN_FRAME, "a frame too short for its key".into());
        };
        match self.dispatch(key, version, &mut f).await {
            Ok(next) => next,
            Err(Malformed) => Next::Close(UNKNOWN_FRAME, format!("a malformed command {key}")),
        }
    }

    async fn answer(&self, key: u16, correlation: u32, code: u16) {
        self.out
            .write(|o| wire::response(o, key, correlation, code, |_| {}))
            .await;
    }

    fn allowed(&self, access: Access, stream: &str) -> bool {
        self.broker
            .users
            .permission(&self.s.user, &self.s.vhost.name)
            .is_some_and(|p| p.allows(access, stream))
    }

    /// The stream `name` (a queue of type stream), if there is one.
    fn stream(&self, name: &str) -> Option<Arc<Queue>> {
        self.s
            .vhost
            .queue(name)
            .filter(|q| q.stream().is_some() && !q.is_deleted())
    }

    async fn dispatch(
        &mut self,
        key: u16,
        version: u16,
        f: &mut Fields<'_>,
    ) -> Result<Next, Malformed> {
        // Commands without a correlation id first.
        match key {
            HEARTBEAT => return Ok(Next::Go),
            PUBLISH => {
                let publisher = f.u8()?;
                let count = f.count(12)?;
                self.publish(publisher, count, version, f).await?;
                return Ok(Next::Go);
            }
            CREDIT => {
                let (id, credit) = (f.u8()?, f.u16()?);
                let refused = match self.subscriptions.get(&id) {
                    Some(s) => {
                        s.credit.add_permits(credit as usize);
                        // Kept for when it is active, and the client told
                        // (RabbitMQ's answer to an inactive consumer).
                        (!s.is_reading()).then_some(PRECONDITION_FAILED)
                    }
                    None => Some(SUBSCRIPTION_ID_DOES_NOT_EXIST),
                };
                if let Some(code) = refused {
                    self.out
                        .write(|o| {
                            wire::frame(o, CREDIT | RESPONSE, 1, |o| {
                                o.put_u16(code);
                                o.put_u8(id);
                            })
                        })
                        .await;
                }
                return Ok(Next::Go);
            }
            STORE_OFFSET => {
                let (reference, stream, offset) = (f.string()?, f.string()?, f.u64()?);
                // No answer: a store that cannot be done is dropped, as
                // RabbitMQ drops it.
                if let Some(q) = self.stream(stream) {
                    if valid_reference(reference) && self.allowed(Access::Read, stream) {
                        if let Some(s) = q.stream() {
                            s.store_tracked(&q, &offset_name(reference), offset);
                        }
                    }
                }
                return Ok(Next::Go);
            }
            // The client's answer to the server's close.
            k if k == CLOSE | RESPONSE => return Ok(Next::End),
            // A single active consumer's answer to ConsumerUpdate.
            k if k == CONSUMER_UPDATE | RESPONSE => {
                let correlation = f.u32()?;
                f.u16()?; // its response code
                let kind = if f.is_empty() { 0 } else { f.u16()? };
                let value = if matches!(kind, 4 | 5) { f.u64()? } else { 0 };
                self.answered(correlation, (kind, value)).await;
                return Ok(Next::Go);
            }
            k if k & RESPONSE != 0 => return Ok(Next::Go),
            _ => {}
        }
        let correlation = f.u32()?;
        match key {
            CLOSE => {
                self.answer(key, correlation, OK).await;
                return Ok(Next::End);
            }
            DECLARE_PUBLISHER => {
                let id = f.u8()?;
                let reference = f.string_or_null()?.filter(|r| !r.is_empty());
                let stream = f.string()?;
                let code = self.declare_publisher(id, reference, stream);
                self.answer(key, correlation, code).await;
            }
            DELETE_PUBLISHER => {
                let id = f.u8()?;
                let code = match self.publishers.remove(&id) {
                    Some(_) => OK,
                    None => PUBLISHER_DOES_NOT_EXIST,
                };
                self.answer(key, correlation, code).await;
            }
            QUERY_PUBLISHER_SEQUENCE => {
                let (reference, stream) = (f.string()?, f.string()?);
                let (code, seq) = match self.stream(stream) {
                    None => (STREAM_DOES_NOT_EXIST, 0),
                    Some(_) if !self.allowed(Access::Read, stream) => (ACCESS_REFUSED, 0),
                    Some(_) if !valid_reference(reference) => (PRECONDITION_FAILED, 0),
                    Some(q) => match self.tracked(&q, &publish::sequence_name(reference)) {
                        Ok(seq) => (OK, seq.unwrap_or(0)),
                        Err(_) => (INTERNAL_ERROR, 0),
                    },
                };
                self.out
                    .write(|o| wire::response(o, key, correlation, code, |o| o.put_u64(seq)))
                    .await;
            }
            QUERY_OFFSET => {
                let (reference, stream) = (f.string()?, f.string()?);
                let (code, offset) = match self.stream(stream) {
                    None => (STREAM_DOES_NOT_EXIST, 0),
                    Some(_) if !self.allowed(Access::Read, stream) => (ACCESS_REFUSED, 0),
                    Some(_) if !valid_reference(reference) => (PRECONDITION_FAILED, 0),
                    Some(q) => match self.tracked(&q, &offset_name(reference)) {
                        Ok(Some(at)) => (OK, at),
                        Ok(None) => (NO_OFFSET, 0),
                        Err(_) => (INTERNAL_ERROR, 0),
                    },
                };
                self.out
                    .write(|o| wire::response(o, key, correlation, code, |o| o.put_u64(offset)))
                    .await;
            }
            SUBSCRIBE => {
                let asked = subscribe::Subscribe::parse(f)?;
                let (id, (kind, value)) = (asked.id, asked.spec);
                let plan = self.subscribe(&asked);
                match plan {
                    Ok(Plan {
                        queue,
                        filter,
                        how: How::Read(first),
                    }) => {
                        // Answered before its first chunk can be sent.
                        self.answer(key, correlation, OK).await;
                        let (target, listed) = self.target(&asked, queue);
                        let reader = self.reader(id, target, first, filter);
                        self.subscriptions
                            .insert(id, Subscription::reading(reader, listed));
                    }
                    Ok(Plan {
                        queue,
                        filter,
                        how: How::Group(group, partition),
                    }) => {
                        // Answered before it is told it is active.
                        self.answer(key, correlation, OK).await;
                        let membership = self.groups.join(group, partition, id, &self.inbox);
                        let sac = Sac {
                            membership,
                            spec: (kind, value),
                            filter,
                            asked: None,
                        };
                        let (target, listed) = self.target(&asked, queue);
                        let sub = Subscription::waiting(target, sac, listed);
                        self.subscriptions.insert(id, sub);
                    }
                    Err(code) => self.answer(key, correlation, code).await,
                }
            }
            UNSUBSCRIBE => {
                let id = f.u8()?;
                let code = match self.subscriptions.remove(&id) {
                    Some(_) => OK,
                    None => SUBSCRIPTION_ID_DOES_NOT_EXIST,
                };
                self.answer(key, correlation, code).await;
            }
            CREATE_STREAM => {
                let stream = f.string()?;
                let arguments = f.pairs()?;
                let code = self.create(stream, &arguments).await;
                self.answer(key, correlation, code).await;
            }
            DELETE_STREAM => {
                let stream = f.string()?;
                let code = self.delete(stream).await;
                self.answer(key, correlation, code).await;
            }
            CREATE_SUPER_STREAM => {
                let name = f.string()?;
                let partitions = strings(f)?;
                let keys = strings(f)?;
                let arguments = f.pairs()?;
                let code =
                    super_streams::create(&self.ctx(), name, &partitions, &keys, &arguments).await;
                self.answer(key, correlation, code).await;
            }
            DELETE_SUPER_STREAM => {
                let name = f.string()?;
                let code = super_streams::delete(&self.ctx(), name).await;
                self.answer(key, correlation, code).await;
            }
            ROUTE | PARTITIONS => {
                let (code, streams) = if key == ROUTE {
                    let (routing_key, name) = (f.string()?, f.string()?);
                    super_streams::route(&self.ctx(), routing_key, name)
                } else {
                    super_streams::partitions(&self.ctx(), f.string()?)
                };
                self.out
                    .write(|o| {
                        wire::response(o, key, correlation, code, |o| {
                            o.put_u32(streams.len() as u32);
                            for s in &streams {
                                wire::put_str(o, s);
                            }
                        })
                    })
                    .await;
            }
            METADATA => {
                let n = f.count(2)?;
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    names.push(f.string()?);
                }
                self.metadata(correlation, &names).await;
            }
            EXCHANGE_COMMAND_VERSIONS => {
                let n = f.count(6)?;
                let mut theirs = Vec::with_capacity(n);
                for _ in 0..n {
                    theirs.push((f.u16()?, f.u16()?, f.u16()?));
                }
                self.deliver_v2 = subscribe::speaks_deliver_v2(&theirs);
                self.out
                    .write(|o| {
                        wire::response(o, key, correlation, OK, |o| {
                            o.put_u32(VERSIONS.len() as u32);
                            for &(k, min, max) in VERSIONS {
                                o.put_u16(k);
                                o.put_u16(min);
                                o.put_u16(max);
                            }
                        })
                    })
                    .await;
            }
            STREAM_STATS => {
                let stream = f.string()?;
                let stats = match self.stream(stream) {
                    None => Err(STREAM_DOES_NOT_EXIST),
                    Some(_) if !self.allowed(Access::Read, stream) => Err(ACCESS_REFUSED),
                    Some(q) => Ok(q.stream().map(|s| (s.extent(), s.readable_end(&q)))),
                };
                let (code, stats) = match stats {
                    Ok(Some((extent, end))) => {
                        let first = if extent.next > extent.first {
                            extent.first as i64
                        } else {
                            -1
                        };
                        let committed = end.checked_sub(1).map_or(-1, |o| o as i64);
                        (
                            OK,
                            vec![("first_chunk_id", first), ("committed_chunk_id", committed)],
                        )
                    }
                    Ok(None) => (STREAM_DOES_NOT_EXIST, Vec::new()),
                    Err(code) => (code, Vec::new()),
                };
                self.out
                    .write(|o| {
                        wire::response(o, key, correlation, code, |o| {
                            o.put_u32(stats.len() as u32);
                            for (k, v) in &stats {
                                wire::put_str(o, k);
                                o.put_i64(*v);
                            }
                        })
                    })
                    .await;
            }
            _ => self.answer(key, correlation, UNKNOWN_FRAME).await,
        }
        Ok(Next::Go)
    }

    fn ctx(&self) -> super_streams::Ctx<'_> {
        super_streams::Ctx {
            broker: &self.broker,
            vhost: &self.s.vhost,
            user: &self.s.user,
        }
    }

    fn tracked(&self, q: &Queue, name: &str) -> crate::store::Result<Option<u64>> {
        match q.stream() {
            Some(s) => s.tracked(q, name),
            None => Ok(None),
        }
    }

    fn declare_publisher(&mut self, id: u8, reference: Option<&str>, stream: &str) -> u16 {
        let Some(queue) = self.stream(stream) else {
            return STREAM_DOES_NOT_EXIST;
        };
        if !self.allowed(Access::Write, stream) {
            return ACCESS_REFUSED;
        }
        if self.publishers.contains_key(&id) {
            return PRECONDITION_FAILED;
        }
        let reference = match reference {
            None => None,
            Some(r) if !valid_reference(r) => return PRECONDITION_FAILED,
            // One publisher per reference and stream on a connection.
            Some(r)
                if self
                    .publishers
                    .values()
                    .any(|p| p.stream == stream && p.reference.as_deref() == Some(r)) =>
            {
                return PRECONDITION_FAILED
            }
            Some(r) => Some(r.to_string()),
        };
        let stats = Arc::new(PublisherStats::new(stream, reference.as_deref()));
        let listed = self.view.publisher(id, Arc::clone(&stats));
        self.publishers.insert(
            id,
            Publisher {
                stream: stream.to_string(),
                queue,
                reference,
                props: Vec::new(),
                stats,
                _listed: listed,
            },
        );
        OK
    }

    async fn publish(
        &mut self,
        id: u8,
        count: usize,
        version: u16,
        f: &mut Fields<'_>,
    ) -> Result<(), Malformed> {
        let max = self.broker.config.max_message_size;
        let Some(p) = self.publishers.get_mut(&id) else {
            let mut errors = Vec::with_capacity(count.min(1024));
            for _ in 0..count {
                let at = f.u64()?;
                if version >= 2 {
                    f.raw_string_or_null()?;
                }
                f.bytes()?;
                errors.push((at, PUBLISHER_DOES_NOT_EXIST));
            }
            publish::send_errors(&self.out, id, &errors).await;
            return Ok(());
        };
        let outcome = p.publish(f, count, version, max)?;
        p.stats.published.fetch_add(count as u64, Ordering::Relaxed);
        let errored = outcome.errors.len() as u64;
        p.stats.errored.fetch_add(errored, Ordering::Relaxed);
        if !outcome.confirm.is_empty() {
            let ticket = self.broker.store.ticket();
            self.confirmer.after(ticket, id, outcome.confirm).await;
        }
        publish::send_errors(&self.out, id, &outcome.errors).await;
        Ok(())
    }

    /// Checks a subscription: its stream, where it starts, and whether it
    /// joins a single active consumer group.
    fn subscribe(&self, asked: &subscribe::Subscribe<'_>) -> Result<Plan, u16> {
        let (id, stream) = (asked.id, asked.stream);
        if self.subscriptions.contains_key(&id) {
            return Err(SUBSCRIPTION_ID_ALREADY_EXISTS);
        }
        let Some(queue) = self.stream(stream) else {
            return Err(STREAM_DOES_NOT_EXIST);
        };
        if !self.allowed(Access::Read, stream) {
            return Err(ACCESS_REFUSED);
        }
        let start = asked.start()?;
        let filter = asked.filter()?;
        let property = |name: &str| asked.property(name);
        if asked.single_active() {
            // A group is named (RabbitMQ refuses one without a name).
            let name = property("name").ok_or(PRECONDITION_FAILED)?;
            let partition = property("super-stream")
                .and_then(|s| super_streams::partition_index(&self.s.vhost, s, stream));
            let group = Key {
                vhost: self.s.vhost.name.clone(),
                stream: stream.to_string(),
                name: name.to_string(),
            };
            let how = How::Group(group, partition);
            return Ok(Plan { queue, filter, how });
        }
        match queue.stream().map(|s| s.place(&queue, start)) {
            Some(Ok(first)) => Ok(Plan {
                queue,
                filter,
                how: How::Read(first),
            }),
            _ => Err(INTERNAL_ERROR),
        }
    }

    /// A new subscription's target (with the next serial).
    fn target(
        &mut self,
        asked: &subscribe::Subscribe<'_>,
        queue: Arc<Queue>,
    ) -> (Target, crate::stream_protocol::view::Listed) {
        self.serial += 1;
        let (id, stream) = (asked.id, asked.stream.to_string());
        let properties = asked.properties.iter();
        let stats = Arc::new(ConsumerStats {
            stream: stream.clone(),
            queue: Arc::clone(&queue),
            properties: properties
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            credit: Arc::new(tokio::sync::Semaphore::new(asked.credit as usize)),
            consumed: AtomicU64::new(0),
            offset: AtomicU64::new(0),
            active: AtomicBool::new(false),
        });
        let listed = self.view.consumer(id, Arc::clone(&stats));
        let target = Target {
            stream,
            queue,
            out: self.out.clone(),
            ending: Ending {
                inbox: Arc::clone(&self.inbox),
                id,
                serial: self.serial,
            },
            stats,
        };
        (target, listed)
    }

    fn reader(
        &self,
        id: u8,
        target: Target,
        cursor: u64,
        filter: Option<Arc<Filter>>,
    ) -> subscribe::Reader {
        subscribe::Reader {
            id,
            target,
            cursor,
            frame_max: self.s.frame_max,
            store: Arc::clone(&self.broker.store),
            filter,
            v2: self.deliver_v2,
        }
    }

    async fn create(&self, stream: &str, arguments: &[(&str, &str)]) -> u16 {
        if !self.allowed(Access::Configure, stream) {
            return ACCESS_REFUSED;
        }
        if self.s.vhost.queue(stream).is_some() {
            return STREAM_ALREADY_EXISTS;
        }
        let spec = match super_streams::stream_spec(stream, arguments) {
            Ok(spec) => spec,
            Err(code) => return code,
        };
        match self.s.vhost.declare_queue(&spec, false, 0) {
            Ok(_) => match self.broker.store.sync().await {
                Ok(()) => OK,
                Err(_) => INTERNAL_ERROR,
            },
            Err(e) => {
                tracing::info!(stream, "stream protocol create refused: {}", e.text);
                match e.kind {
                    crate::vhost::error::Kind::AccessRefused => ACCESS_REFUSED,
                    _ => PRECONDITION_FAILED,
                }
            }
        }
    }

    async fn delete(&mut self, stream: &str) -> u16 {
        if self.stream(stream).is_none() {
            return STREAM_DOES_NOT_EXIST;
        }
        if !self.allowed(Access::Configure, stream) {
            return ACCESS_REFUSED;
        }
        match self.s.vhost.delete_queue(stream, false, false, 0) {
            Ok(_) => match self.broker.store.sync().await {
                Ok(()) => OK,
                Err(_) => INTERNAL_ERROR,
            },
            Err(_) => PRECONDITION_FAILED,
        }
    }

    /// Publishers whose stream was deleted are dropped, and the client is
    /// told once per stream (MetadataUpdate "stream not available"), as
    /// RabbitMQ tells a deleted stream's publishers.
    async fn publishers_gone(&mut self) {
        let mut gone: Vec<String> = Vec::new();
        self.publishers.retain(|_, p| {
            let went = p.queue.is_deleted() || p.queue.stream().is_none_or(|s| s.is_gone());
            if went && !gone.contains(&p.stream) {
                gone.push(p.stream.clone());
            }
            !went
        });
        for stream in gone {
            subscribe::gone(&self.out, &stream).await;
        }
    }

    async fn metadata(&self, correlation: u32, names: &[&str]) {
        let found: Vec<(&str, bool)> = names
            .iter()
            .map(|n| (*n, self.stream(n).is_some()))
            .collect();
        // This node, reference 0: the leader of every stream (one Raft
        // group). In a cluster, the members that said where they serve
        // this protocol, references 1 and up: each holds a copy of every
        // stream, and serves its consumers (server/follow_reads).
        let mut brokers = vec![self.s.advertised.clone()];
        if let Some(c) = &self.broker.cluster {
            let tls = self.s.tls;
            let members = c.member_stream_ends().into_iter();
            brokers.extend(members.filter_map(|(_, e)| Some((e.host.clone(), e.port_for(tls)?))));
        }
        let brokers = &brokers[..brokers.len().min(u16::MAX as usize)];
        self.out
            .write(|o| {
                wire::frame(o, METADATA | RESPONSE, 1, |o| {
                    o.put_u32(correlation);
                    o.put_u32(brokers.len() as u32);
                    for (reference, (host, port)) in brokers.iter().enumerate() {
                        o.put_u16(reference as u16);
                        wire::put_str(o, host);
                        o.put_u32(*port as u32);
                    }
                    o.put_u32(found.len() as u32);
                    for (name, exists) in &found {
                        wire::put_str(o, name);
                        if *exists {
                            o.put_u16(OK);
                            o.put_u16(0);
                            o.put_u32(brokers.len() as u32 - 1);
                            for replica in 1..brokers.len() {
                                o.put_u16(replica as u16);
                            }
                        } else {
                            o.put_u16(STREAM_DOES_NOT_EXIST);
                            o.put_u16(u16::MAX);
                            o.put_u32(0);
                        }
                    }
                })
            })
            .await;
    }
}

/// Whether a publisher or offset reference is one RabbitMQ takes (at most
/// 256 bytes); a NUL is refused too (names kept apart by it).
fn valid_reference(r: &str) -> bool {
    !r.is_empty() && r.len() <= MAX_REFERENCE && !r.contains('\0')
}

/// The tracked name an offset stored under `reference` is kept under.
fn offset_name(reference: &str) -> String {
    format!("\0offset\0{reference}")
}
