//! The delivery side of a channel, shared with the queues its consumers read
//! from: delivery tags, the unacked list, prefetch credit (per consumer and
//! per channel, as RabbitMQ's `basic.qos` defines them), and encoding
//! `basic.deliver` / `basic.get-ok` into the connection's outbox.
//!
//! Lock order: a queue's lock, then a channel's delivery lock, then the
//! outbox. Nothing here calls back into a queue while holding its lock.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use parking_lot::Mutex;

use super::codec::{self, FRAME_METHOD};
use super::error::ProtocolError;
use super::outbox::Outbox;
use crate::message::Message;
use crate::queue::{Consumer, Entry, Queue, Refused, Sink, Unacked};

struct State {
    /// What this channel delivered (for metrics; under the lock each
    /// delivery holds anyway).
    counters: crate::broker::connections::MessageCounters,
    next_tag: u64,
    unacked: VecDeque<Unacked>,
    /// Per-channel prefetch (`basic.qos global=true`), 0 = unlimited.
    global_prefetch: u32,
    /// Acked inside an uncommitted transaction: out of the unacked list
    /// but still holding prefetch credit until commit or rollback.
    held: usize,
    open: bool,
    /// No unacked delivery times out before this (it may be earlier than
    /// the real first deadline after acks; u64::MAX = none).
    earliest: u64,
    /// Tags that timed out, most recent last, so a late ack of one is
    /// ignored rather than a 406 (bounded: the oldest are forgotten).
    timed_out: VecDeque<u64>,
}

/// How many timed-out tags a channel remembers.
const TIMED_OUT_KEPT: usize = 10_000;

/// The deadline of a delivery that may stay unacked `timeout_ms` (0 = never).
fn deadline_in(timeout_ms: u64) -> u64 {
    match timeout_ms {
        0 => 0,
        ms => crate::util::coarse_now_ms().saturating_add(ms),
    }
}

/// Delivery state of one channel.
pub struct ChannelDelivery {
    /// The channel number.
    pub id: u16,
    /// Its connection's id.
    pub conn: u64,
    /// The connection's outbox.
    pub outbox: Arc<Outbox>,
    frame_max: u32,
    /// Whether the client takes server-sent basic.cancel.
    pub cancel_notify: bool,
    state: Mutex<State>,
}

impl ChannelDelivery {
    /// Delivery state for channel `id`.
    pub fn new(
        id: u16,
        conn: u64,
        outbox: Arc<Outbox>,
        frame_max: u32,
        cancel_notify: bool,
    ) -> Self {
        ChannelDelivery {
            id,
            conn,
            outbox,
            frame_max,
            cancel_notify,
            state: Mutex::new(State {
                counters: Default::default(),
                next_tag: 1,
                unacked: VecDeque::new(),
                global_prefetch: 0,
                held: 0,
                open: true,
                earliest: u64::MAX,
                timed_out: VecDeque::new(),
            }),
        }
    }

    /// What it delivered so far.
    pub fn counters(&self) -> crate::broker::connections::MessageCounters {
        self.state.lock().counters
    }

    /// Sets the per-channel prefetch.
    pub fn set_global_prefetch(&self, n: u32) {
        self.state.lock().global_prefetch = n;
    }

    /// Sends a direct reply-to reply to this channel's reply consumer `tag`
    /// (no ack, so nothing is recorded); false if the channel is closing or
    /// its outbox is over the high-water mark (the reply is dropped).
    pub fn deliver_reply(&self, tag: &str, msg: &Message) -> bool {
        let mut st = self.state.lock();
        if !st.open || self.outbox.is_closed() || self.outbox.is_over_high_water() {
            return false;
        }
        let delivery_tag = st.next_tag;
        st.next_tag += 1;
        self.outbox.send_delivery(|out| {
            let at = codec::begin_frame(out, FRAME_METHOD, self.id);
            out.put_u16(60);
            out.put_u16(60);
            codec::put_short_str(out, tag.as_bytes());
            out.put_u64(delivery_tag);
            out.put_u8(0);
            codec::put_short_str(out, msg.exchange());
            codec::put_short_str(out, msg.routing_key());
            codec::end_frame(out, at);
            codec::put_content(out, self.id, msg.properties(), msg.body(), self.frame_max);
        });
        true
    }

    /// Moves the deliveries an ack/nack/reject names into `out`, in tag
    /// order. `tag` 0 with `multiple` means every outstanding delivery.
    /// An unknown tag is 406 PRECONDITION_FAILED, as in RabbitMQ.
    pub fn take(
        &self,
        tag: u64,
        multiple: bool,
        hold: bool,
        out: &mut Vec<Unacked>,
    ) -> Result<(), ProtocolError> {
        let mut st = self.state.lock();
        let unknown = || {
            Err(ProtocolError::precondition_failed(format!(
                "unknown delivery tag {tag}"
            )))
        };
        // A tag that timed out was requeued already: a late ack, nack or
        // reject of it is ignored (with multiple, what is still
        // outstanding below it goes).
        if multiple {
            if tag == 0 {
                out.extend(st.unacked.drain(..));
            } else {
                // As RabbitMQ's collect_acks: the named tag itself must be
                // outstanding; everything up to it goes with it.
                let n = st.unacked.partition_point(|u| u.tag <= tag);
                let named = n > 0 && st.unacked[n - 1].tag == tag;
                if !named && !st.forget_timed_out(tag) {
                    return unknown();
                }
                out.extend(st.unacked.drain(..n));
            }
        } else {
            let i = st.unacked.partition_point(|u| u.tag < tag);
            if st.unacked.get(i).is_some_and(|u| u.tag == tag) {
                if let Some(u) = st.unacked.remove(i) {
                    out.push(u);
                }
            } else if !st.forget_timed_out(tag) {
                return unknown();
            }
        }
        if hold {
            st.held += out.len();
        } else {
            release_credit(out);
        }
        Ok(())
    }

    /// Whether some delivery may be past its deadline at `now` (cheap: a
    /// lower bound kept on delivery).
    pub fn has_expired(&self, now: u64) -> bool {
        self.state.lock().earliest <= now
    }

    /// Takes the deliveries past their deadline at `now` into `out` (their
    /// tags are remembered as timed out, their credit freed).
    pub fn take_expired(&self, now: u64, out: &mut Vec<Unacked>) {
        let start = out.len();
        let mut st = self.state.lock();
        let mut earliest = u64::MAX;
        // One pass, keeping the order of what stays.
        let all = std::mem::take(&mut st.unacked);
        for u in all {
            match u.deadline {
                0 => st.unacked.push_back(u),
                d if d <= now => {
                    st.timed_out.push_back(u.tag);
                    out.push(u);
                }
                d => {
                    earliest = earliest.min(d);
                    st.unacked.push_back(u);
                }
            }
        }
        while st.timed_out.len() > TIMED_OUT_KEPT {
            st.timed_out.pop_front();
        }
        st.earliest = earliest;
        release_credit(&out[start..]);
    }

    /// Takes every outstanding delivery (basic.recover, channel close).
    pub fn take_all(&self, out: &mut Vec<Unacked>) {
        let start = out.len();
        let mut st = self.state.lock();
        out.extend(st.unacked.drain(..));
        release_credit(&out[start..]);
    }

    /// Stops all further deliveries on this channel.
    pub fn close(&self) {
        self.state.lock().open = false;
    }

    /// Number of deliveries waiting for an ack.
    pub fn unacked_count(&self) -> usize {
        self.state.lock().unacked.len()
    }

    /// Sends a server-initiated `basic.cancel` (the queue went away).
    pub fn send_cancel(&self, tag: &str) {
        if !self.cancel_notify || !self.state.lock().open {
            return;
        }
        self.outbox.send_delivery(|out: &mut BytesMut| {
            let at = codec::begin_frame(out, FRAME_METHOD, self.id);
            out.put_u16(60);
            out.put_u16(30);
            codec::put_short_str(out, tag.as_bytes());
            out.put_u8(1); // nowait: the client answers nothing
            codec::end_frame(out, at);
        });
    }
}

impl ChannelDelivery {
    /// Ends a transaction's hold on `entries` (taken with `hold`): their
    /// credit is free again (tx.commit, or a close that requeues them).
    pub fn release_held(&self, entries: &[Unacked]) {
        let mut st = self.state.lock();
        st.held = st.held.saturating_sub(entries.len());
        release_credit(entries);
    }

    /// Puts held deliveries back into the unacked list (tx.rollback), in
    /// tag order; they keep the credit they held.
    pub fn restore(&self, mut back: Vec<Unacked>) {
        let mut st = self.state.lock();
        st.held = st.held.saturating_sub(back.len());
        back.extend(st.unacked.drain(..));
        back.sort_by_key(|u| u.tag);
        st.unacked = back.into();
    }
}

impl State {
    /// Whether `tag` timed out; it is forgotten either way.
    fn forget_timed_out(&mut self, tag: u64) -> bool {
        match self.timed_out.iter().position(|&t| t == tag) {
            Some(i) => {
                self.timed_out.remove(i);
                true
            }
            None => false,
        }
    }
}

/// A channel is where its consumers' deliveries go.
impl Sink for ChannelDelivery {
    fn owner(&self) -> Option<(u64, u16)> {
        Some((self.conn, self.id))
    }

    /// Delivers `entry` to `consumer` if it can take it; otherwise hands
    /// the entry back with the reason. Called by `queue` with the queue's
    /// lock held.
    fn try_deliver(
        &self,
        consumer: &Arc<Consumer>,
        queue: &Arc<Queue>,
        entry: Entry,
    ) -> Result<(), (Entry, Refused)> {
        let mut st = self.state.lock();
        if !st.open || self.outbox.is_closed() {
            return Err((entry, Refused::Closed));
        }
        if !consumer.no_ack {
            if consumer.prefetch != 0 && consumer.unacked() >= consumer.prefetch {
                return Err((entry, Refused::Credit));
            }
            if st.global_prefetch != 0 && st.unacked.len() + st.held >= st.global_prefetch as usize
            {
                return Err((entry, Refused::Credit));
            }
        }
        if self.outbox.is_full(queue) {
            let at = Arc::as_ptr(&self.outbox) as usize;
            return Err((entry, Refused::Outbox(at)));
        }
        let tag = st.next_tag;
        st.next_tag += 1;
        let c = &mut st.counters;
        if consumer.no_ack {
            c.delivered_consume_auto_ack += 1;
        } else {
            c.delivered_consume_manual_ack += 1;
        }
        c.redelivered += entry.redelivered as u64;
        let msg = &entry.msg;
        self.outbox.send_delivery(|out| {
            let at = codec::begin_frame(out, FRAME_METHOD, self.id);
            out.put_u16(60);
            out.put_u16(60);
            codec::put_short_str(out, consumer.tag.as_bytes());
            out.put_u64(tag);
            out.put_u8(entry.redelivered as u8);
            codec::put_short_str(out, msg.exchange());
            codec::put_short_str(out, msg.routing_key());
            codec::end_frame(out, at);
            codec::put_content(out, self.id, msg.properties(), msg.body(), self.frame_max);
        });
        if consumer.no_ack {
            queue.settle_delivered(entry);
        } else {
            consumer.take_credit();
            let deadline = deadline_in(consumer.timeout_ms);
            if deadline != 0 && deadline < st.earliest {
                st.earliest = deadline;
            }
            st.unacked.push_back(Unacked {
                tag,
                queue: Arc::clone(queue),
                entry,
                consumer: Some(Arc::clone(consumer)),
                deadline,
            });
        }
        Ok(())
    }

    /// Sends `basic.get-ok` for `entry`; records it as unacked unless no_ack.
    /// Returns the entry back when it needs no ack, for the queue to settle.
    fn deliver_get(
        &self,
        queue: &Arc<Queue>,
        entry: Entry,
        message_count: u32,
        no_ack: bool,
        timeout_ms: u64,
    ) -> Option<Entry> {
        let mut st = self.state.lock();
        let tag = st.next_tag;
        st.next_tag += 1;
        let c = &mut st.counters;
        if no_ack {
            c.delivered_get_auto_ack += 1;
        } else {
            c.delivered_get_manual_ack += 1;
        }
        c.redelivered += entry.redelivered as u64;
        let msg = &entry.msg;
        self.outbox.send_got(|out| {
            let at = codec::begin_frame(out, FRAME_METHOD, self.id);
            out.put_u16(60);
            out.put_u16(71);
            out.put_u64(tag);
            out.put_u8(entry.redelivered as u8);
            codec::put_short_str(out, msg.exchange());
            codec::put_short_str(out, msg.routing_key());
            out.put_u32(message_count);
            codec::end_frame(out, at);
            codec::put_content(out, self.id, msg.properties(), msg.body(), self.frame_max);
        });
        if no_ack {
            return Some(entry);
        }
        let deadline = deadline_in(timeout_ms);
        if deadline != 0 && deadline < st.earliest {
            st.earliest = deadline;
        }
        st.unacked.push_back(Unacked {
            tag,
            queue: Arc::clone(queue),
            entry,
            consumer: None,
            deadline,
        });
        None
    }

    fn cancelled(&self, tag: &str) {
        self.send_cancel(tag)
    }
}

/// Frees the per-consumer credit of settled deliveries.
fn release_credit(entries: &[Unacked]) {
    for u in entries {
        if let Some(c) = &u.consumer {
            c.give_credit();
        }
    }
}
