//! Delivery tags on a channel with a reader served here. The leader's
//! deliveries and this node's share one sequence, given in the order they
//! are written to the client; each unsettled tag remembers what it stands
//! for. A client's ack, nack or reject is split: its part for the leader
//! goes under the leader's tags (a multiple one up to the leader's tag of
//! the last delivery it covers, which is exact: both sequences grow with
//! the client's), its part here is credit. A tag the channel does not
//! hold is sent to the leader as one it never gave, so that it refuses it
//! (406 "unknown delivery tag") as it would have.

use std::collections::BTreeMap;

use bytes::BytesMut;

use super::{frames, Chan, Conn, Src, ToLeader};

/// A tag no delivery has: the leader refuses it as unknown.
const UNKNOWN: u64 = u64::MAX;

/// Notes the leader's delivery `tag` and, once the channel's tags are
/// renumbered, gives it the client's next one.
pub(super) fn renumber(c: &mut Chan, frame: &mut [u8], get_ok: bool, tag: u64, no_ack: bool) {
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

impl Conn {
    /// An ack, nack or reject from the client.
    pub(super) fn settle(&mut self, ch: u16, frame: &[u8], method: u16) -> ToLeader {
        let Some(c) = self.chans.get_mut(&ch) else {
            return ToLeader::Forward;
        };
        let (Some((tag, multiple, requeue)), Some((_, map))) =
            (frames::settle_fields(frame, method), c.renumbered.as_mut())
        else {
            return ToLeader::Forward;
        };
        // As RabbitMQ: tag 0 with multiple is everything; otherwise the
        // tag named must be unsettled, or nothing is settled.
        let everything = multiple && tag == 0;
        if !everything && !map.contains_key(&tag) {
            let unknown = if tag == 0 { 0 } else { UNKNOWN };
            return instead(ch, method, unknown, false, requeue);
        }
        let taken: Vec<Src> = if multiple {
            let rest = match everything {
                true => BTreeMap::new(),
                false => map.split_off(&(tag.saturating_add(1))),
            };
            std::mem::replace(map, rest).into_values().collect()
        } else {
            map.remove(&tag).into_iter().collect()
        };
        let mut leader: Option<u64> = None;
        for s in taken {
            match s {
                Src::Leader(t) => leader = Some(leader.map_or(t, |l| l.max(t))),
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
            Some(t) => instead(ch, method, t, multiple, requeue),
        }
    }

    /// basic.recover: the leader delivers its unsettled messages again
    /// under new tags, and a stream's are credit given back (as the
    /// leader's streams do): every tag held so far means nothing now.
    pub(super) fn recover(&mut self, ch: u16) {
        let Some(c) = self.chans.get_mut(&ch) else {
            return;
        };
        if let Some((_, map)) = &mut c.renumbered {
            map.clear();
        }
        for l in c.locals.values_mut() {
            l.unacked = 0;
            l.handle.wake.notify_one();
        }
    }
}

fn instead(ch: u16, method: u16, tag: u64, multiple: bool, requeue: bool) -> ToLeader {
    let mut out = BytesMut::with_capacity(24);
    frames::put_settle(&mut out, ch, method, tag, multiple, requeue);
    ToLeader::Instead(out)
}
