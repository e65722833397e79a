//! One carried AMQP connection's state, as the frames passing both ways
//! show it: who logged in and where, each channel's prefetch, the
//! synchronous requests the leader has not answered yet, the leader's
//! message whose content is still arriving on each channel, and, once a
//! channel has a stream reader served here, the delivery tags the client
//! sees (settle.rs).
//!
//! What this node writes on a channel never lands inside one of the
//! leader's messages: while the leader's content is arriving on a channel,
//! what is written here for it (a delivery, consume-ok, cancel-ok, a
//! cancel) is held until the message is whole.

mod settle;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use amq_protocol::protocol::{basic, channel, confirm, connection, exchange, queue, AMQPClass};
use bytes::BytesMut;
use tokio::sync::Notify;

use super::frames::{self, ACK, NACK, REJECT};
use crate::amqp::codec::{FRAME_BODY, FRAME_HEADER};

/// A stream reader served here: its task's handle.
#[derive(Default)]
pub(super) struct Handle {
    /// Credit came back, the channel's flow resumed, or the reader must
    /// stop.
    pub wake: Notify,
    stop: AtomicBool,
}

impl Handle {
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_one();
    }
}

/// A reader here, as the connection knows it: `id` tells it from a later
/// reader under the same tag.
struct Local {
    id: u64,
    prefetch: u32,
    unacked: u32,
    handle: Arc<Handle>,
    /// Its consume-ok is not sent yet (its start is being placed).
    owed: bool,
}

/// Where a delivery the client knows by a tag came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Src {
    Leader(u64),
    Local(u64),
}

/// What the leader is to answer on a channel, in order.
enum Pending {
    Consume { no_ack: bool },
    Get { no_ack: bool },
}

/// The leader's message arriving on a channel: its header is due, or
/// this many body bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Content {
    Header,
    Body(u64),
}

#[derive(Default)]
struct Chan {
    /// The leader's last delivery tag here.
    leader_tag: u64,
    /// Tags the client has seen, once one came from here: the next, and
    /// what each unsettled one stands for.
    renumbered: Option<(u64, BTreeMap<u64, Src>)>,
    prefetch: u16,
    global_qos: bool,
    /// Synchronous requests the leader has not answered.
    outstanding: u32,
    pending: VecDeque<Pending>,
    /// The leader's consumers here, and those of them that take no acks.
    leader_consumers: HashSet<String>,
    no_ack: HashSet<String>,
    locals: HashMap<String, Local>,
    paused: bool,
    /// The leader closed it: nothing more is sent on it.
    closing: bool,
    /// The leader's message still arriving here, and what waits for it.
    content: Option<Content>,
    held: BytesMut,
}

impl Chan {
    fn wake_locals(&self) {
        self.locals
            .values()
            .for_each(|l| l.handle.wake.notify_one());
    }

    fn stop_all(&self) {
        self.locals.values().for_each(|l| l.handle.stop());
    }

    /// Reader `tag`, if it is still the one numbered `id`.
    fn local(&self, tag: &str, id: u64) -> Option<&Local> {
        self.locals.get(tag).filter(|l| l.id == id)
    }
}

/// A stream reader to start: what the client asked for.
pub(super) struct Asked {
    pub channel: u16,
    pub tag: String,
    pub queue: String,
    pub nowait: bool,
    pub arguments: amq_protocol::types::FieldTable,
}

/// What becomes of a frame from the client.
pub(super) enum ToLeader {
    Forward,
    /// Not for the leader (answered here).
    Drop,
    /// These bytes instead (an ack's part for the leader).
    Instead(BytesMut),
    /// A consume of a stream this node may serve: `Conn::start_local`
    /// decides, else it is forwarded.
    Consume(Asked),
    /// The connection ends (this node closed it).
    End,
}

/// One carried connection.
#[derive(Default)]
pub(super) struct Conn {
    /// Bytes for the client.
    pub out: BytesMut,
    pub frame_max: u32,
    /// The user the leader let in (PLAIN, AMQPLAIN, EXTERNAL), its
    /// vhost, and whether the leader opened the connection.
    pub user: Option<String>,
    pub vhost: Option<String>,
    open: bool,
    /// A start-ok and an open went by; a client that sends a second of
    /// either is served only by the leader (which refuses it), as the
    /// carrier could not tell which one the leader let in.
    started: bool,
    opening: bool,
    spoiled: bool,
    pub cancel_notify: bool,
    /// The connection ends: no reader sends anything more.
    pub closed: bool,
    /// The leader's side ended: once `out` is written, so does the
    /// client's.
    pub finished: bool,
    /// This node closed the connection: nothing more passes either way.
    refused: bool,
    /// A side sent what is not AMQP as this node reads it: bytes pass as
    /// they come and nothing is answered here.
    raw: bool,
    /// The most readers here plus the leader's consumers on a channel
    /// (0: no limit; the leader's consumer_max_per_channel).
    consumer_max: u64,
    /// The user an EXTERNAL login names.
    external: Option<String>,
    chans: HashMap<u16, Chan>,
    next_local: u64,
}

/// A client method that the leader answers, unless it says nowait.
fn expects_reply(class: &AMQPClass) -> bool {
    match class {
        AMQPClass::Channel(channel::AMQPMethod::Flow(_)) | AMQPClass::Access(_) => true,
        AMQPClass::Exchange(m) => match m {
            exchange::AMQPMethod::Declare(m) => !m.nowait,
            exchange::AMQPMethod::Delete(m) => !m.nowait,
            exchange::AMQPMethod::Bind(m) => !m.nowait,
            exchange::AMQPMethod::Unbind(m) => !m.nowait,
            _ => false,
        },
        AMQPClass::Queue(m) => match m {
            queue::AMQPMethod::Declare(m) => !m.nowait,
            queue::AMQPMethod::Bind(m) => !m.nowait,
            queue::AMQPMethod::Purge(m) => !m.nowait,
            queue::AMQPMethod::Delete(m) => !m.nowait,
            queue::AMQPMethod::Unbind(_) => true,
            _ => false,
        },
        AMQPClass::Basic(m) => match m {
            basic::AMQPMethod::Qos(_) | basic::AMQPMethod::Recover(_) => true,
            basic::AMQPMethod::Get(_) => true,
            basic::AMQPMethod::Consume(m) => !m.nowait,
            basic::AMQPMethod::Cancel(m) => !m.nowait,
            _ => false,
        },
        AMQPClass::Tx(_) => true,
        AMQPClass::Confirm(confirm::AMQPMethod::Select(m)) => !m.nowait,
        _ => false,
    }
}

/// Whether a method from the leader answers a client's request.
fn is_reply(class: u16, method: u16) -> bool {
    matches!(
        (class, method),
        (20, 11 | 21 | 41)
            | (30, 11)
            | (40, 11 | 21 | 31 | 51)
            | (50, 11 | 21 | 31 | 41 | 51)
            | (60, 11 | 21 | 31 | 71 | 72 | 111)
            | (85, 11)
            | (90, 11 | 21 | 31)
    )
}

impl Conn {
    /// A connection whose channels take `max` consumers (0: no limit);
    /// `external` is the user an EXTERNAL login names (the client
    /// certificate verified here, read as the leader reads it).
    pub fn new(max: u64, external: Option<String>) -> Conn {
        Conn {
            consumer_max: max,
            external,
            ..Conn::default()
        }
    }

    /// Reads a frame from the client on its way to the leader.
    pub fn client_sent(&mut self, frame: &[u8]) -> ToLeader {
        if self.raw {
            return ToLeader::Forward;
        }
        if self.refused {
            return match frames::method(frame) {
                Some((10, 51)) => ToLeader::End,
                Some((10, 50)) => {
                    let ok = AMQPClass::Connection(connection::AMQPMethod::CloseOk(
                        connection::CloseOk {},
                    ));
                    crate::amqp::codec::put_method(&mut self.out, 0, ok);
                    ToLeader::End
                }
                _ => ToLeader::Drop,
            };
        }
        let Some((class, method)) = frames::method(frame) else {
            return ToLeader::Forward;
        };
        let ch = frames::channel(frame);
        if class == 60 && matches!(method, ACK | NACK | REJECT) {
            return self.settle(ch, frame, method);
        }
        if class == 60 && method == 40 {
            return ToLeader::Forward;
        }
        let Ok(parsed) = crate::amqp::codec::parse_method(frames::payload(frame)) else {
            return ToLeader::Forward;
        };
        match parsed {
            AMQPClass::Connection(m) => {
                self.connection_from_client(m);
                return ToLeader::Forward;
            }
            AMQPClass::Channel(channel::AMQPMethod::Open(_)) => {
                let c = self.chans.entry(ch).or_default();
                c.stop_all();
                *c = Chan::default();
                c.outstanding = 1;
                return ToLeader::Forward;
            }
            AMQPClass::Channel(channel::AMQPMethod::Close(_))
            | AMQPClass::Channel(channel::AMQPMethod::CloseOk(_)) => {
                if let Some(c) = self.chans.remove(&ch) {
                    c.stop_all();
                }
                return ToLeader::Forward;
            }
            _ => {}
        }
        let Some(c) = self.chans.get_mut(&ch) else {
            return ToLeader::Forward;
        };
        let replied = expects_reply(&parsed);
        match parsed {
            AMQPClass::Channel(channel::AMQPMethod::Flow(f)) => {
                c.paused = !f.active;
                c.wake_locals();
            }
            AMQPClass::Basic(basic::AMQPMethod::Qos(q)) => {
                if q.global {
                    c.global_qos = q.prefetch_count != 0;
                } else {
                    c.prefetch = q.prefetch_count;
                }
            }
            AMQPClass::Basic(basic::AMQPMethod::Consume(m)) => {
                let tag = m.consumer_tag.as_str();
                // The leader's (and RabbitMQ's) answers, connection errors:
                // it does not see the readers here.
                let max = self.consumer_max;
                let consumers = (c.locals.len() + c.leader_consumers.len()) as u64;
                let refusal = if c.locals.contains_key(tag) {
                    Some(format!("attempt to reuse consumer tag '{tag}'"))
                } else if max != 0 && !c.locals.is_empty() && consumers >= max {
                    Some(format!("reached maximum ({max}) of consumers per channel"))
                } else {
                    None
                };
                if let Some(text) = refusal {
                    self.refuse(530, &format!("NOT_ALLOWED - {text}"), (60, 20));
                    return ToLeader::Drop;
                }
                if c.outstanding == 0 && !m.no_ack && !m.exclusive {
                    return ToLeader::Consume(Asked {
                        channel: ch,
                        tag: tag.to_string(),
                        queue: m.queue.to_string(),
                        nowait: m.nowait,
                        arguments: m.arguments,
                    });
                }
                self.forward_consume(ch, tag, m.no_ack, m.nowait);
                return ToLeader::Forward;
            }
            AMQPClass::Basic(basic::AMQPMethod::Cancel(m)) => {
                let tag = m.consumer_tag.as_str();
                if let Some(l) = c.locals.remove(tag) {
                    l.handle.stop();
                    // A consume is answered before its cancel.
                    if l.owed {
                        self.answer_consume(ch, tag);
                    }
                    if !m.nowait {
                        self.put_local(ch, |out| frames::put_consumer_method(out, ch, 31, tag));
                    }
                    return ToLeader::Drop;
                }
            }
            AMQPClass::Basic(basic::AMQPMethod::Get(g)) => {
                c.pending.push_back(Pending::Get { no_ack: g.no_ack })
            }
            AMQPClass::Basic(basic::AMQPMethod::Recover(_))
            | AMQPClass::Basic(basic::AMQPMethod::RecoverAsync(_)) => self.recover(ch),
            _ => {}
        }
        if let Some(c) = self.chans.get_mut(&ch).filter(|_| replied) {
            c.outstanding += 1;
        }
        ToLeader::Forward
    }

    /// A consume the leader serves after all.
    pub fn forward_consume(&mut self, ch: u16, tag: &str, no_ack: bool, nowait: bool) {
        let Some(c) = self.chans.get_mut(&ch) else {
            return;
        };
        if nowait {
            c.leader_consumers.insert(tag.to_string());
            if no_ack {
                c.no_ack.insert(tag.to_string());
            }
        } else {
            c.outstanding += 1;
            c.pending.push_back(Pending::Consume { no_ack });
        }
    }

    fn connection_from_client(&mut self, m: connection::AMQPMethod) {
        match m {
            connection::AMQPMethod::StartOk(_) | connection::AMQPMethod::Open(_)
                if self.spoiled => {}
            connection::AMQPMethod::StartOk(_) if self.started => self.spoil(),
            connection::AMQPMethod::StartOk(ok) => {
                self.started = true;
                self.user = match ok.mechanism.as_str() {
                    "EXTERNAL" => self.external.clone(),
                    m => crate::amqp::auth::decode(m, ok.response.as_bytes())
                        .ok()
                        .map(|c| c.user),
                };
                self.cancel_notify = cancels(&ok.client_properties);
            }
            connection::AMQPMethod::TuneOk(t) => self.frame_max = t.frame_max,
            connection::AMQPMethod::Open(_) if self.opening => self.spoil(),
            connection::AMQPMethod::Open(o) => {
                self.opening = true;
                self.vhost = Some(o.virtual_host.to_string());
            }
            connection::AMQPMethod::Close(_) | connection::AMQPMethod::CloseOk(_) => {
                self.end();
            }
            _ => {}
        }
    }

    /// No reader is started here from now on (see `started`).
    fn spoil(&mut self) {
        self.spoiled = true;
        self.user = None;
        self.vhost = None;
    }

    /// A side sent what is not AMQP as this node reads it: the readers
    /// stop, and from here on the bytes pass as they come.
    pub fn go_raw(&mut self) {
        self.end();
        self.raw = true;
    }

    /// Closes the connection from here with `code` (the client's
    /// close-ok ends it; nothing more passes either way meanwhile).
    fn refuse(&mut self, code: u16, text: &str, (class, method): (u16, u16)) {
        self.end();
        self.refused = true;
        let close = connection::Close {
            reply_code: code,
            reply_text: text.into(),
            class_id: class,
            method_id: method,
        };
        let close = AMQPClass::Connection(connection::AMQPMethod::Close(close));
        crate::amqp::codec::put_method(&mut self.out, 0, close);
    }

    /// Whether channel `ch` may have a stream reader served here now:
    /// logged in, the channel open with a prefetch and no global one, the
    /// leader owing it nothing, and none of the leader's deliveries on it
    /// yet (their tags would need to be known unsettled to be renumbered);
    /// `tag` (the consumer tag) not in use on it and the channel under
    /// `consumer_max` consumers.
    pub fn may_serve(&self, ch: u16, tag: &str) -> bool {
        let max = self.consumer_max;
        let Some(c) = self.chans.get(&ch) else {
            return false;
        };
        let consumers = (c.locals.len() + c.leader_consumers.len()) as u64;
        self.open
            && !self.closed
            && self.user.is_some()
            && self.vhost.is_some()
            && !c.closing
            && !c.paused
            && c.outstanding == 0
            && c.prefetch > 0
            && !c.global_qos
            && (c.leader_tag == 0 || c.renumbered.is_some())
            && !c.leader_consumers.contains(tag)
            && !c.locals.contains_key(tag)
            && (max == 0 || consumers < max)
    }

    /// Starts serving consumer `tag` on `ch` here (`may_serve` said so):
    /// its id among this connection's readers, and its handle. Its
    /// consume-ok is sent once its start is placed (`consumed`).
    pub fn start_local(&mut self, ch: u16, tag: &str, nowait: bool) -> Option<(u64, Arc<Handle>)> {
        let c = self.chans.get_mut(&ch)?;
        self.next_local += 1;
        let id = self.next_local;
        let handle = Arc::new(Handle::default());
        c.locals.insert(
            tag.to_string(),
            Local {
                id,
                prefetch: u32::from(c.prefetch),
                unacked: 0,
                handle: Arc::clone(&handle),
                owed: !nowait,
            },
        );
        if c.renumbered.is_none() {
            c.renumbered = Some((c.leader_tag + 1, BTreeMap::new()));
        }
        // Its consume-ok is owed, as the leader's answers are.
        c.outstanding += u32::from(!nowait);
        Some((id, handle))
    }

    /// Sends reader `id`'s consume-ok if it is owed: its start is placed.
    pub fn consumed(&mut self, ch: u16, tag: &str, id: u64) {
        let owed = self
            .chans
            .get_mut(&ch)
            .and_then(|c| c.locals.get_mut(tag).filter(|l| l.id == id))
            .is_some_and(|l| std::mem::take(&mut l.owed));
        if owed {
            self.answer_consume(ch, tag);
        }
    }

    fn answer_consume(&mut self, ch: u16, tag: &str) {
        if let Some(c) = self.chans.get_mut(&ch) {
            c.outstanding = c.outstanding.saturating_sub(1);
            if !c.closing && !self.closed {
                self.put_local(ch, |out| frames::put_consumer_method(out, ch, 21, tag));
            }
        }
    }

    /// Appends what this node writes on `ch`: held while the leader's
    /// message is arriving there.
    fn put_local(&mut self, ch: u16, put: impl FnOnce(&mut BytesMut)) {
        if self.raw {
            return;
        }
        match self.chans.get_mut(&ch) {
            Some(c) if c.content.is_some() => put(&mut c.held),
            _ => put(&mut self.out),
        }
    }

    /// How many more deliveries reader `id` (`tag` on `ch`) may send now;
    /// None once it is gone.
    pub fn credit(&self, ch: u16, tag: &str, id: u64) -> Option<u32> {
        if self.closed {
            return None;
        }
        let c = self.chans.get(&ch)?;
        let l = c.local(tag, id)?;
        if c.closing || l.handle.stopped() {
            return None;
        }
        Some(match c.paused {
            true => 0,
            false => l.prefetch.saturating_sub(l.unacked),
        })
    }

    /// Appends a delivery of reader `id`: false if it has no credit now.
    pub fn deliver(&mut self, ch: u16, tag: &str, id: u64, msg: &crate::message::Message) -> bool {
        if self.credit(ch, tag, id).unwrap_or(0) == 0 {
            return false;
        }
        let frame_max = match self.frame_max {
            0 => 1 << 17,
            n => n,
        };
        let Some(c) = self.chans.get_mut(&ch) else {
            return false;
        };
        let (Some(l), Some((next, map))) = (c.locals.get_mut(tag), c.renumbered.as_mut()) else {
            return false;
        };
        let t = *next;
        *next += 1;
        map.insert(t, Src::Local(l.id));
        l.unacked += 1;
        // While the leader's message arrives here, after it (its tag
        // order kept: the held frames go out before its next method).
        let out = match c.content {
            Some(_) => &mut c.held,
            None => &mut self.out,
        };
        frames::put_deliver(out, ch, tag, t, msg, frame_max);
        true
    }

    /// Ends reader `id` because its stream went (or cannot be read):
    /// basic.cancel if the client takes it.
    pub fn cancel_local(&mut self, ch: u16, tag: &str, id: u64) {
        let Some(c) = self.chans.get_mut(&ch) else {
            return;
        };
        if c.local(tag, id).is_none() {
            return;
        }
        if let Some(l) = c.locals.remove(tag) {
            l.handle.stop();
            if self.cancel_notify && !c.closing && !self.closed {
                self.put_local(ch, |out| frames::put_consumer_method(out, ch, 30, tag));
            }
        }
    }

    /// Stops every reader: the connection ends.
    pub fn end(&mut self) {
        self.closed = true;
        self.chans.values().for_each(Chan::stop_all);
    }

    /// Reads a frame from the leader (rewriting its delivery tag on a
    /// renumbered channel) and appends it for the client.
    pub fn leader_sent(&mut self, mut frame: BytesMut) {
        if self.refused {
            return;
        }
        self.read_leader(&mut frame);
        self.out.extend_from_slice(&frame);
        let ch = frames::channel(&frame);
        if let Some(c) = self.chans.get_mut(&ch) {
            if c.content.is_none() && !c.held.is_empty() {
                self.out.extend_from_slice(&c.held);
                c.held.clear();
            }
        }
    }

    fn read_leader(&mut self, frame: &mut [u8]) {
        let ch = frames::channel(frame);
        let kind = frames::kind(frame);
        if kind == FRAME_HEADER || kind == FRAME_BODY {
            if let Some(c) = self.chans.get_mut(&ch) {
                c.content = content_after(c.content, kind, frames::payload(frame));
            }
            return;
        }
        let Some((class, method)) = frames::method(frame) else {
            return;
        };
        if ch == 0 {
            match (class, method) {
                (10, 41) => self.open = true,
                (10, 50) => self.end(),
                _ => {}
            }
            return;
        }
        let Some(c) = self.chans.get_mut(&ch) else {
            return;
        };
        if is_reply(class, method) {
            c.outstanding = c.outstanding.saturating_sub(1);
        }
        if matches!((class, method), (60, 50 | 60 | 71)) {
            c.content = Some(Content::Header);
        }
        match (class, method) {
            (20, 40) => {
                c.closing = true;
                c.stop_all();
            }
            (20, 41) => {
                if let Some(c) = self.chans.remove(&ch) {
                    c.stop_all();
                }
            }
            (60, 21) => {
                let tag = consumer_tag(frame);
                if let Some(Pending::Consume { no_ack }) = c.pending.pop_front() {
                    if no_ack {
                        c.no_ack.insert(tag.clone());
                    }
                }
                c.leader_consumers.insert(tag);
            }
            (60, 30) | (60, 31) => {
                let tag = consumer_tag(frame);
                c.leader_consumers.remove(&tag);
                c.no_ack.remove(&tag);
            }
            (60, 72) => {
                c.pending.pop_front();
            }
            (60, 71) => {
                let no_ack = matches!(c.pending.pop_front(), Some(Pending::Get { no_ack: true }));
                if let Some(tag) = frames::get_ok_tag(frame) {
                    settle::renumber(c, frame, true, tag, no_ack);
                }
            }
            (60, 60) => {
                if let Some((consumer, tag)) = frames::deliver_tags(frame) {
                    if c.renumbered.is_none() {
                        c.leader_tag = tag;
                        return;
                    }
                    let no_ack = c.no_ack.contains(&*String::from_utf8_lossy(consumer));
                    settle::renumber(c, frame, false, tag, no_ack);
                }
            }
            _ => {}
        }
    }
}

/// Where a channel's content stands after a header or body frame.
fn content_after(now: Option<Content>, kind: u8, payload: &[u8]) -> Option<Content> {
    match (now, kind) {
        (Some(Content::Header), FRAME_HEADER) => {
            let size = payload
                .get(4..12)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_be_bytes);
            (size > 0).then_some(Content::Body(size))
        }
        (Some(Content::Body(left)), FRAME_BODY) => {
            let left = left.saturating_sub(payload.len() as u64);
            (left > 0).then_some(Content::Body(left))
        }
        (now, _) => now,
    }
}

/// The consumer tag of basic.consume-ok, basic.cancel or cancel-ok (the
/// first field).
fn consumer_tag(frame: &[u8]) -> String {
    let p = frames::payload(frame);
    let len = p.get(4).copied().unwrap_or(0) as usize;
    String::from_utf8_lossy(p.get(5..5 + len).unwrap_or_default()).into_owned()
}

/// Whether the client's properties say it takes basic.cancel.
fn cancels(props: &amq_protocol::types::FieldTable) -> bool {
    use amq_protocol::types::AMQPValue;
    let Some(AMQPValue::FieldTable(caps)) = props.inner().get("capabilities") else {
        return false;
    };
    matches!(
        caps.inner().get("consumer_cancel_notify"),
        Some(AMQPValue::Boolean(true))
    )
}

#[cfg(test)]
mod tests;
