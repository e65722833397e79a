//! One carried AMQP connection's state, as the frames passing both ways
//! show it: who logged in and where, each channel's prefetch, the
//! synchronous requests the leader has not answered yet, and, once a
//! channel has a stream reader served here, the delivery tags the client
//! sees. Those are renumbered: the leader's deliveries and this node's
//! share one sequence per channel, in the order they reach the client, and
//! the client's acks are split between the two (an ack the leader's part
//! of which is multiple goes up to the leader's tag of the last delivery it
//! covers, which is exact: both sequences grow with the client's).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use amq_protocol::protocol::{basic, channel, confirm, connection, exchange, queue, AMQPClass};
use bytes::BytesMut;
use tokio::sync::Notify;

use super::frames::{self, ACK, NACK, REJECT};

/// A stream reader served here: its task's handle.
#[derive(Default)]
pub(super) struct Handle {
    /// Credit came back, the channel's flow resumed, or it must stop.
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

struct Local {
    id: u64,
    prefetch: u32,
    unacked: u32,
    handle: Arc<Handle>,
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
}

/// One carried connection.
#[derive(Default)]
pub(super) struct Conn {
    /// Bytes for the client.
    pub out: BytesMut,
    pub frame_max: u32,
    /// The user the leader let in (PLAIN and AMQPLAIN), its vhost, and
    /// whether the leader opened the connection.
    pub user: Option<String>,
    pub vhost: Option<String>,
    open: bool,
    pub cancel_notify: bool,
    /// The connection ends: no reader sends anything more.
    pub closed: bool,
    /// The leader's side ended: once `out` is written, so does the
    /// client's.
    pub finished: bool,
    chans: HashMap<u16, Chan>,
    next_local: u64,
}

/// A client method that the leader answers, unless it says nowait.
fn expects_reply(class: &AMQPClass) -> bool {
    match class {
        AMQPClass::Channel(channel::AMQPMethod::Flow(_)) => true,
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
            | (40, 11 | 21 | 31 | 51)
            | (50, 11 | 21 | 31 | 41 | 51)
            | (60, 11 | 21 | 31 | 71 | 72 | 111)
            | (85, 11)
            | (90, 11 | 21 | 31)
    )
}

impl Conn {
    /// Reads a frame from the client on its way to the leader.
    pub fn client_sent(&mut self, frame: &[u8]) -> ToLeader {
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
                *c = Chan::default();
                c.outstanding = 1;
                return ToLeader::Forward;
            }
            AMQPClass::Channel(channel::AMQPMethod::Close(_))
            | AMQPClass::Channel(channel::AMQPMethod::CloseOk(_)) => {
                if let Some(c) = self.chans.remove(&ch) {
                    stop_all(&c);
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
                c.locals.values().for_each(|l| l.handle.wake.notify_one());
            }
            AMQPClass::Basic(basic::AMQPMethod::Qos(q)) => {
                if q.global {
                    c.global_qos = q.prefetch_count != 0;
                } else {
                    c.prefetch = q.prefetch_count;
                }
            }
            AMQPClass::Basic(basic::AMQPMethod::Consume(m)) => {
                if c.outstanding == 0 && !m.no_ack && !m.exclusive {
                    return ToLeader::Consume(Asked {
                        channel: ch,
                        tag: m.consumer_tag.to_string(),
                        queue: m.queue.to_string(),
                        nowait: m.nowait,
                        arguments: m.arguments,
                    });
                }
                self.forward_consume(ch, m.consumer_tag.as_str(), m.no_ack, m.nowait);
                return ToLeader::Forward;
            }
            AMQPClass::Basic(basic::AMQPMethod::Cancel(m)) => {
                let tag = m.consumer_tag.as_str();
                if let Some(l) = c.locals.remove(tag) {
                    l.handle.stop();
                    if !m.nowait {
                        frames::put_consumer_method(&mut self.out, ch, 31, tag);
                    }
                    return ToLeader::Drop;
                }
            }
            AMQPClass::Basic(basic::AMQPMethod::Get(g)) => {
                c.pending.push_back(Pending::Get { no_ack: g.no_ack })
            }
            AMQPClass::Basic(basic::AMQPMethod::Recover(_))
            | AMQPClass::Basic(basic::AMQPMethod::RecoverAsync(_)) => {
                // The leader delivers its unacked messages again, under
                // new tags: the old ones mean nothing to it any more.
                if let Some((_, map)) = &mut c.renumbered {
                    map.retain(|_, s| matches!(s, Src::Local(_)));
                }
            }
            _ => {}
        }
        if replied {
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
            connection::AMQPMethod::StartOk(ok) => {
                let creds =
                    crate::amqp::auth::decode(ok.mechanism.as_str(), ok.response.as_bytes());
                self.user = creds.ok().map(|c| c.user);
                self.cancel_notify = cancels(&ok.client_properties);
            }
            connection::AMQPMethod::TuneOk(t) => self.frame_max = t.frame_max,
            connection::AMQPMethod::Open(o) => self.vhost = Some(o.virtual_host.to_string()),
            connection::AMQPMethod::Close(_) | connection::AMQPMethod::CloseOk(_) => {
                self.end();
            }
            _ => {}
        }
    }

    /// Whether channel `ch` may have a stream reader served here now:
    /// logged in, the channel open with a prefetch and no global one, the
    /// leader owing it nothing, and none of the leader's deliveries on it
    /// yet (their tags would need to be known unsettled to be renumbered);
    /// `tag` (the consumer tag) not in use on it.
    pub fn may_serve(&self, ch: u16, tag: &str) -> bool {
        let Some(c) = self.chans.get(&ch) else {
            return false;
        };
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
    }

    /// Starts serving consumer `tag` on `ch` here (`may_serve` said so):
    /// its handle, and its id among this connection's readers.
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
            },
        );
        if c.renumbered.is_none() {
            c.renumbered = Some((c.leader_tag + 1, BTreeMap::new()));
        }
        if !nowait {
            frames::put_consumer_method(&mut self.out, ch, 21, tag);
        }
        Some((id, handle))
    }

    /// How many more deliveries reader `tag` on `ch` may send now; None
    /// once it is gone.
    pub fn credit(&self, ch: u16, tag: &str) -> Option<u32> {
        if self.closed {
            return None;
        }
        let c = self.chans.get(&ch)?;
        let l = c.locals.get(tag)?;
        if c.closing || l.handle.stopped() {
            return None;
        }
        Some(match c.paused {
            true => 0,
            false => l.prefetch.saturating_sub(l.unacked),
        })
    }

    /// Appends a delivery of reader `tag` on `ch`: false if it has no
    /// credit left (or is gone).
    pub fn deliver(&mut self, ch: u16, tag: &str, msg: &crate::message::Message) -> bool {
        if self.credit(ch, tag).unwrap_or(0) == 0 {
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
        frames::put_deliver(&mut self.out, ch, tag, t, msg, frame_max);
        true
    }

    /// Ends reader `tag` on `ch` because its stream went: basic.cancel if
    /// the client takes it.
    pub fn cancel_local(&mut self, ch: u16, tag: &str) {
        let Some(c) = self.chans.get_mut(&ch) else {
            return;
        };
        if let Some(l) = c.locals.remove(tag) {
            l.handle.stop();
            if self.cancel_notify && !c.closing && !self.closed {
                frames::put_consumer_method(&mut self.out, ch, 30, tag);
            }
        }
    }

    /// Stops every reader: the connection ends.
    pub fn end(&mut self) {
        self.closed = true;
        self.chans.values().for_each(stop_all);
    }

    /// Reads (and in a renumbered channel rewrites) a frame from the
    /// leader on its way to the client.
    pub fn leader_sent(&mut self, frame: &mut [u8]) {
        let Some((class, method)) = frames::method(frame) else {
            return;
        };
        let ch = frames::channel(frame);
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
        match (class, method) {
            (20, 40) => {
                c.closing = true;
                stop_all(c);
            }
            (20, 41) => {
                if let Some(c) = self.chans.remove(&ch) {
                    stop_all(&c);
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
                    renumber(c, frame, true, tag, no_ack);
                }
            }
            (60, 60) => {
                if let Some((consumer, tag)) = frames::deliver_tags(frame) {
                    if c.renumbered.is_none() {
                        c.leader_tag = tag;
                        return;
                    }
                    let no_ack = c.no_ack.contains(&*String::from_utf8_lossy(consumer));
                    renumber(c, frame, false, tag, no_ack);
                }
            }
            _ => {}
        }
    }

    /// An ack, nack or reject from the client: on a renumbered channel,
    /// its part for the leader (if any) under the leader's tags, and
    /// credit back to the readers here.
    fn settle(&mut self, ch: u16, frame: &[u8], method: u16) -> ToLeader {
        let Some(c) = self.chans.get_mut(&ch) else {
            return ToLeader::Forward;
        };
        let (Some((tag, multiple, requeue)), Some((_, map))) =
            (frames::settle_fields(frame, method), c.renumbered.as_mut())
        else {
            return ToLeader::Forward;
        };
        let taken: Vec<Src> = if multiple {
            let rest = match tag {
                0 => BTreeMap::new(),
                t => map.split_off(&(t.saturating_add(1))),
            };
            std::mem::replace(map, rest).into_values().collect()
        } else {
            map.remove(&tag).into_iter().collect()
        };
        // Nothing of the client's named: the leader refuses the tag as
        // unknown (406), as it would have. No delivery has this tag.
        let mut leader = (taken.is_empty() && tag != 0).then_some(u64::MAX);
        for s in taken {
            match s {
                Src::Leader(t) => leader = Some(leader.map_or(t, |l: u64| l.max(t))),
                Src::Local(id) => {
                    if let Some(l) = c.locals.values_mut().find(|l| l.id == id) {
                        l.unacked = l.unacked.saturating_sub(1);
                        l.handle.wake.notify_one();
                    }
                }
            }
        }
        match leader {
            None => ToLeader::Drop,
            Some(t) => {
                let mut out = BytesMut::with_capacity(24);
                frames::put_settle(&mut out, ch, method, t, multiple && t != u64::MAX, requeue);
                ToLeader::Instead(out)
            }
        }
    }
}

/// Notes the leader's delivery `tag` and, once the channel's tags are
/// renumbered, gives it the client's next one.
fn renumber(c: &mut Chan, frame: &mut [u8], get_ok: bool, tag: u64, no_ack: bool) {
    c.leader_tag = tag;
    if let Some((next, map)) = &mut c.renumbered {
        let t = *next;
        *next += 1;
        frames::set_delivery_tag(frame, get_ok, t);
        if !no_ack {
            map.insert(t, Src::Leader(tag));
        }
    }
}

fn stop_all(c: &Chan) {
    c.locals.values().for_each(|l| l.handle.stop());
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
#[path = "conn_tests.rs"]
mod tests;
