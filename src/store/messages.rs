//! Persistent messages. Key: queue id (u64 BE) ++ sequence (u64 BE), so a
//! prefix scan yields one queue in order. Value: the message as it came off
//! the wire (exchange, routing key, encoded properties, body) with a version
//! octet, so there is no second serialization format.
//!
//! The first octet says whether the record is a persistent message (kept
//! across restarts) or a transient one paged out of memory (dropped at the
//! next start, as RabbitMQ drops transient messages). Its top bit says an
//! expiry deadline (ms since the epoch, u64 BE) follows, so a message's TTL
//! keeps running across a restart, as in RabbitMQ; the next bit says the
//! time the message was stored follows (ms since the epoch, u64 BE, after
//! the deadline): the publish time a stream's reader seeks by. Records
//! written before that bit existed have no time.
//!
//! Per queue, how far deliveries went is kept too (delivered.rs), so that
//! recovery can flag messages delivered before a stop.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::{Error, Result, Store};
use crate::message::{read_meta_stored, Message};

/// Record kinds (the first octet).
const PERSISTENT: u8 = 1;
const PAGED: u8 = 2;
/// Flag on the kind octet: a deadline follows.
const HAS_DEADLINE: u8 = 0x80;
/// Flag on the kind octet: the time it was stored follows.
const HAS_TIME: u8 = 0x40;
/// The kind octet without its flags.
const fn kind_of(octet: u8) -> u8 {
    octet & !(HAS_DEADLINE | HAS_TIME)
}

/// A stored message as the index knows it: seq, body length, deadline.
pub type MessageMeta = (u64, u32, u64);

/// A message read back at recovery.
pub struct StoredMessage {
    pub seq: u64,
    pub message: Arc<Message>,
    /// When it expires, ms since the epoch (0 = never, or not recorded).
    pub deadline: u64,
    /// When it was stored, ms since the epoch (0 = not recorded).
    pub time: u64,
}

/// How many of the leading bodies of lengths `lens` fit in `max_bytes`
/// together; at least one, if there is one (a read that makes progress).
pub fn within_bytes(lens: impl IntoIterator<Item = u64>, max_bytes: u64) -> usize {
    let mut bytes = 0u64;
    let mut fit = 0;
    for len in lens {
        if fit > 0 && bytes + len > max_bytes {
            break;
        }
        bytes += len;
        fit += 1;
    }
    fit
}

/// A message record decoded.
pub struct Decoded {
    pub message: Message,
    /// A transient message paged out of memory.
    pub paged: bool,
    /// Its expiry, ms since the epoch (0: none).
    pub deadline: u64,
    /// When it was stored, ms since the epoch (0: not recorded).
    pub time: u64,
}

/// The key of message `seq` of queue `queue_id`.
pub fn message_key(queue_id: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&queue_id.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// Splits a message key into (queue id, seq).
pub fn split_key(k: &[u8]) -> Option<(u64, u64)> {
    let q = <[u8; 8]>::try_from(k.get(..8)?).ok()?;
    let s = <[u8; 8]>::try_from(k.get(8..16)?).ok()?;
    Some((u64::from_be_bytes(q), u64::from_be_bytes(s)))
}

/// Encodes a persistent message's record, stored at `time`, into `out`
/// (the tests' records as a stream keeps them).
#[cfg(test)]
pub fn encode_record_at(msg: &Message, time: u64, out: &mut BytesMut) {
    encode_record(msg, false, 0, time, out)
}

/// Encodes a message record into `out`.
pub fn encode_message(msg: &Message, transient: bool, out: &mut BytesMut) {
    encode_record(msg, transient, 0, 0, out)
}

/// Encodes a message record with its expiry deadline and the time it was
/// stored (0: none) into `out`.
pub(super) fn encode_record(
    msg: &Message,
    transient: bool,
    deadline: u64,
    time: u64,
    out: &mut BytesMut,
) {
    out.clear();
    append_record(msg, transient, deadline, time, out);
}

/// The length of the record `append_record` writes.
pub(super) fn record_len(msg: &Message, deadline: u64, time: u64) -> usize {
    let optional = |v: u64| if v != 0 { 8 } else { 0 };
    1 + optional(deadline)
        + optional(time)
        + 2
        + msg.exchange().len()
        + msg.routing_key().len()
        + 4
        + msg.properties().len()
        + msg.body().len()
}

/// Appends a message record with its expiry deadline and the time it was
/// stored (0: none) to `out`.
pub(super) fn append_record(
    msg: &Message,
    transient: bool,
    deadline: u64,
    time: u64,
    out: &mut BytesMut,
) {
    out.reserve(32 + msg.size());
    let mut kind = if transient { PAGED } else { PERSISTENT };
    if deadline != 0 {
        kind |= HAS_DEADLINE;
    }
    if time != 0 {
        kind |= HAS_TIME;
    }
    out.put_u8(kind);
    if deadline != 0 {
        out.put_u64(deadline);
    }
    if time != 0 {
        out.put_u64(time);
    }
    out.put_u8(msg.exchange().len() as u8);
    out.extend_from_slice(msg.exchange());
    out.put_u8(msg.routing_key().len() as u8);
    out.extend_from_slice(msg.routing_key());
    out.put_u32(msg.properties().len() as u32);
    out.extend_from_slice(msg.properties());
    out.extend_from_slice(msg.body());
}

/// The record of a persistent message stored at `time` (0: not
/// recorded) with no deadline, from its parts: a stream batch's message
/// (msglog's CHUNK) as a MOVE would have stored it.
pub(super) fn stored_record(time: u64, route: (&[u8], &[u8]), props: &[u8], body: &[u8]) -> Bytes {
    let (exchange, routing_key) = route;
    let mut out =
        BytesMut::with_capacity(28 + exchange.len() + routing_key.len() + props.len() + body.len());
    let mut kind = PERSISTENT;
    if time != 0 {
        kind |= HAS_TIME;
    }
    out.put_u8(kind);
    if time != 0 {
        out.put_u64(time);
    }
    out.put_u8(exchange.len() as u8);
    out.extend_from_slice(exchange);
    out.put_u8(routing_key.len() as u8);
    out.extend_from_slice(routing_key);
    out.put_u32(props.len() as u32);
    out.extend_from_slice(props);
    out.extend_from_slice(body);
    out.freeze()
}

/// Whether a record holds a transient (paged) message.
pub(super) fn is_paged(raw: &[u8]) -> bool {
    raw.first().is_some_and(|&k| kind_of(k) == PAGED)
}

/// A message record's body length and deadline (0: none), read off its
/// header without decoding it; None if it is not a message record.
pub(super) fn record_meta(raw: &[u8]) -> Option<(u32, u64)> {
    let kind = *raw.first()?;
    if !matches!(kind_of(kind), PERSISTENT | PAGED) {
        return None;
    }
    let (deadline, mut at) = if kind & HAS_DEADLINE != 0 {
        (u64::from_be_bytes(raw.get(1..9)?.try_into().ok()?), 9)
    } else {
        (0, 1)
    };
    if kind & HAS_TIME != 0 {
        at += 8;
    }
    at += 1 + *raw.get(at)? as usize;
    at += 1 + *raw.get(at)? as usize;
    let props = u32::from_be_bytes(raw.get(at..at + 4)?.try_into().ok()?) as usize;
    at += 4 + props;
    let body = raw.len().checked_sub(at)?;
    Some((u32::try_from(body).ok()?, deadline))
}

/// When a message record's message was stored (ms since the epoch), read
/// off its header; 0 if it does not say (written before records did) or
/// it is not a message record.
pub fn record_time(raw: &[u8]) -> u64 {
    let Some(&kind) = raw.first() else { return 0 };
    if !matches!(kind_of(kind), PERSISTENT | PAGED) || kind & HAS_TIME == 0 {
        return 0;
    }
    let at = if kind & HAS_DEADLINE != 0 { 9 } else { 1 };
    raw.get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// A message record's property bytes and body, read off it without
/// decoding it; None if it is not a message record.
pub fn record_parts(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    let kind = *raw.first()?;
    if !matches!(kind_of(kind), PERSISTENT | PAGED) {
        return None;
    }
    let mut at = 1;
    if kind & HAS_DEADLINE != 0 {
        at += 8;
    }
    if kind & HAS_TIME != 0 {
        at += 8;
    }
    at += 1 + *raw.get(at)? as usize;
    at += 1 + *raw.get(at)? as usize;
    let props = u32::from_be_bytes(raw.get(at..at + 4)?.try_into().ok()?) as usize;
    at += 4;
    let end = at.checked_add(props)?;
    Some((raw.get(at..end)?, raw.get(end..)?))
}

/// Decodes a message record. `raw` is kept as the backing buffer: no copy.
pub fn decode_message(raw: Bytes) -> Result<Message> {
    decode_record(raw).map(|d| d.message)
}

/// Decodes a message record with what it holds beside the message.
pub(super) fn decode_record(raw: Bytes) -> Result<Decoded> {
    let bad = || Error::Corrupt("message record".into());
    let mut r = crate::wire::FieldReader::new(&raw);
    let kind = r.u8().ok_or_else(bad)?;
    if !matches!(kind_of(kind), PERSISTENT | PAGED) {
        return Err(bad());
    }
    let deadline = if kind & HAS_DEADLINE != 0 {
        r.u64().ok_or_else(bad)?
    } else {
        0
    };
    let time = if kind & HAS_TIME != 0 {
        r.u64().ok_or_else(bad)?
    } else {
        0
    };
    let route_at = raw.len() - r.remaining();
    let ex = r.short_str().ok_or_else(bad)?.len();
    let rk = r.short_str().ok_or_else(bad)?.len();
    let pl = r.u32().ok_or_else(bad)? as usize;
    r.take(pl).ok_or_else(bad)?;
    let route_end = route_at + 1 + ex + 1 + rk;
    let p_at = route_end + 4;
    let b_at = p_at + pl;
    let meta = read_meta_stored(&raw[p_at..b_at]).map_err(|_| bad())?;
    let msg = Message::from_parts(
        raw.slice(route_at..),
        p_at - route_at..b_at - route_at,
        b_at - route_at,
        meta,
    )
    .ok_or_else(bad)?;
    Ok(Decoded {
        message: msg,
        paged: kind_of(kind) == PAGED,
        deadline,
        time,
    })
}

thread_local! {
    static SCRATCH: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

/// Applies `Op::PutMessage`.
pub(super) fn put(
    tree: &sled::Tree,
    queue_id: u64,
    seq: u64,
    msg: &Message,
    paged: bool,
    deadline: u64,
    time: u64,
) -> Result<()> {
    SCRATCH.with(|s| {
        let mut buf = s.borrow_mut();
        encode_record(msg, paged, deadline, time, &mut buf);
        tree.insert(message_key(queue_id, seq), &buf[..])?;
        Ok(())
    })
}

/// Applies `Op::MoveMessages`: every put and removal in one sled batch,
/// so a crash leaves each message in exactly one queue.
pub(super) fn move_records(
    tree: &sled::Tree,
    from: u64,
    to: u64,
    moves: &[super::op::Moved<'_>],
    removes: &[u64],
) -> Result<()> {
    let mut batch = sled::Batch::default();
    let mut buf = BytesMut::new();
    for m in moves {
        encode_record(m.message, false, m.deadline, m.time, &mut buf);
        batch.insert(&message_key(to, m.to_seq)[..], &buf[..]);
        if m.from_seq != 0 {
            batch.remove(&message_key(from, m.from_seq)[..]);
        }
    }
    for &seq in removes {
        batch.remove(&message_key(from, seq)[..]);
    }
    tree.apply_batch(batch)?;
    Ok(())
}

/// Records removed per sled batch when purging: one batch for a queue of
/// millions made sled hold gigabytes at once (8 GiB for 1.6M 1 KiB).
const PURGE_BATCH: usize = 4096;

/// Applies `Op::PurgeFrom`, a bounded batch at a time.
pub(super) fn purge_from(tree: &sled::Tree, queue_id: u64, from: u64) -> Result<()> {
    let end = message_key(queue_id, u64::MAX);
    let mut start = message_key(queue_id, from).to_vec();
    loop {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        let mut last = None;
        for item in tree.range(start.clone()..=end.to_vec()).take(PURGE_BATCH) {
            let (k, _) = item?;
            batch.remove(k.clone());
            last = Some(k);
            n += 1;
        }
        tree.apply_batch(batch)?;
        match last {
            Some(k) if n == PURGE_BATCH => start = k.to_vec(),
            _ => return Ok(()),
        }
    }
}

impl Store {
    /// Deletes the records of every queue id not in `live` (recovery): a
    /// crash between deleting a queue's definition and its messages must
    /// not leave them behind forever. Seeks from one queue id to the next,
    /// so a live queue's records are not read. Returns how many queues'
    /// records went.
    pub fn sweep_orphans(&self, live: &std::collections::HashSet<u64>) -> Result<usize> {
        if let Some(log) = &self.applier.log {
            let mut swept = 0;
            for id in log.queue_ids()? {
                if !live.contains(&id) {
                    tracing::warn!(queue_id = id, "deleting the records of a deleted queue");
                    self.purge_messages(id)?;
                    swept += 1;
                }
            }
            return Ok(swept);
        }
        let mut swept = 0;
        let mut from = 0u64;
        loop {
            let Some(item) = self.msgs.range(message_key(from, 0)..).next() else {
                break;
            };
            let (k, _) = item?;
            let (id, _) = split_key(&k).ok_or_else(|| Error::Corrupt("message key".into()))?;
            if !live.contains(&id) {
                tracing::warn!(queue_id = id, "deleting the records of a deleted queue");
                self.purge_messages(id)?;
                swept += 1;
            }
            match id.checked_add(1) {
                Some(next) => from = next,
                None => break,
            }
        }
        Ok(swept)
    }

    /// The persistent messages of a queue from `from` on, without reading
    /// them: seq, body length, deadline (recovery, past what it keeps in
    /// memory). None where the store cannot tell without reading
    /// (messages in sled: the tests' stores).
    pub fn message_meta(
        &self,
        queue_id: u64,
        from: u64,
    ) -> Option<Box<dyn Iterator<Item = Result<MessageMeta>> + Send + '_>> {
        let log = self.applier.log.as_ref()?;
        Some(Box::new(log.stored_meta(queue_id, from)))
    }

    /// The seq of the first and the last stored message of a queue (a
    /// follower's stream reads); None if it has none.
    pub fn message_bounds(&self, queue_id: u64) -> Result<Option<(u64, u64)>> {
        if let Some(log) = &self.applier.log {
            return log.bounds(queue_id);
        }
        let mut all = self.messages(queue_id);
        let Some(first) = all.next().transpose()? else {
            return Ok(None);
        };
        let last = all.last().transpose()?.map_or(first.seq, |m| m.seq);
        Ok(Some((first.seq, last)))
    }

    /// The first stored message of a queue at or after `seq`, with its
    /// time (a stream's recovery and its seeks by time); None where there
    /// is none.
    pub fn message_from(&self, queue_id: u64, seq: u64) -> Result<Option<StoredMessage>> {
        self.messages_from(queue_id, seq).next().transpose()
    }

    /// The stored messages of a queue from `seq` on, in order, with their
    /// times.
    pub fn messages_from(
        &self,
        queue_id: u64,
        seq: u64,
    ) -> Box<dyn Iterator<Item = Result<StoredMessage>> + Send + '_> {
        match &self.applier.log {
            Some(log) => Box::new(log.stored_from(queue_id, seq)),
            None => Box::new(
                self.messages(queue_id)
                    .skip_while(move |m| m.as_ref().is_ok_and(|m| m.seq < seq)),
            ),
        }
    }

    /// Every persistent message of a queue, in order (recovery). Paged
    /// transient messages are deleted on the way: they do not survive.
    pub fn messages(
        &self,
        queue_id: u64,
    ) -> Box<dyn Iterator<Item = Result<StoredMessage>> + Send + '_> {
        if let Some(log) = &self.applier.log {
            return Box::new(log.stored(queue_id));
        }
        let sled = self
            .msgs
            .scan_prefix(queue_id.to_be_bytes())
            .filter_map(move |item| {
                let read = || -> Result<Option<StoredMessage>> {
                    let (k, v) = item?;
                    let (_, seq) =
                        split_key(&k).ok_or_else(|| Error::Corrupt("message key".into()))?;
                    if is_paged(&v) {
                        self.remove_message(queue_id, seq)?;
                        return Ok(None);
                    }
                    match decode_record(Bytes::copy_from_slice(&v)) {
                        Ok(d) => Ok(Some(StoredMessage {
                            seq,
                            message: Arc::new(d.message),
                            deadline: d.deadline,
                            time: d.time,
                        })),
                        Err(e) => {
                            tracing::error!(queue_id, seq, "skipping unreadable message: {e}");
                            Ok(None)
                        }
                    }
                };
                read().transpose()
            });
        Box::new(sled)
    }

    /// Up to `n` messages of a queue from sequence `from` on, and about
    /// `max_bytes` of bodies at the most (at least one): a stream's reads.
    pub fn load_range_within(
        &self,
        queue_id: u64,
        from: u64,
        n: usize,
        max_bytes: u64,
    ) -> Result<Vec<(u64, Arc<Message>)>> {
        if let Some(log) = self
            .applier
            .log
            .as_ref()
            .filter(|_| !self.applier.is_staging())
        {
            return log.range_within(queue_id, from, n, max_bytes);
        }
        let mut read = self.load_range(queue_id, from, n)?;
        let fit = within_bytes(read.iter().map(|(_, m)| m.body().len() as u64), max_bytes);
        read.truncate(fit);
        Ok(read)
    }

    /// Calls `f` with each message `load_range_within` reads, in order:
    /// from the segment log, as its record's bytes where the read left
    /// them (msglog/range.rs); with `chunks`, whole stream batches as
    /// they lie in the log's files (`Found::Chunk`).
    pub fn visit_range_within(
        &self,
        queue_id: u64,
        from: u64,
        n: usize,
        max_bytes: u64,
        chunks: bool,
        mut f: impl FnMut(u64, super::Found<'_>) -> Result<()>,
    ) -> Result<()> {
        if let Some(log) = self
            .applier
            .log
            .as_ref()
            .filter(|_| !self.applier.is_staging())
        {
            return log.visit_range_within(queue_id, from, n, max_bytes, chunks, f);
        }
        for (seq, m) in self.load_range_within(queue_id, from, n, max_bytes)? {
            f(seq, super::Found::Message(m, 0))?;
        }
        Ok(())
    }

    /// Up to `n` messages of a queue from sequence `from` on (paging in).
    pub fn load_range(
        &self,
        queue_id: u64,
        from: u64,
        n: usize,
    ) -> Result<Vec<(u64, Arc<Message>)>> {
        let staging = self.applier.is_staging();
        if let Some(log) = self.applier.log.as_ref().filter(|_| !staging) {
            return log.range(queue_id, from, n);
        }
        let range = message_key(queue_id, from)..=message_key(queue_id, u64::MAX);
        let mut out = Vec::with_capacity(n.min(4096));
        let decode = |(k, v): (sled::IVec, sled::IVec)| -> Result<(u64, Arc<Message>)> {
            let (_, seq) = split_key(&k).ok_or_else(|| Error::Corrupt("message key".into()))?;
            Ok((seq, Arc::new(decode_message(Bytes::copy_from_slice(&v))?)))
        };
        if staging {
            // Puts not applied yet (a replicated journal's leader), read
            // first: applying one writes the log (or `msgs`) before it
            // leaves the staging, so one being applied now is in one or
            // both.
            out.extend(self.applier.shipped.range(queue_id, from, n));
            if self.applier.is_staging_in_sled() {
                for item in self.applier.pending.range(range.clone()).take(n) {
                    out.push(decode(item?)?);
                }
            }
        }
        match &self.applier.log {
            Some(log) => out.extend(log.range(queue_id, from, n)?),
            None => {
                for item in self.msgs.range(range).take(n) {
                    out.push(decode(item?)?);
                }
            }
        }
        if staging {
            // Merged in sequence order, a message in both trees once.
            out.sort_by_key(|(seq, _)| *seq);
            out.dedup_by_key(|(seq, _)| *seq);
            out.truncate(n);
        }
        Ok(out)
    }

    /// Reads one message back (bodies paged out of memory).
    pub fn get_message(&self, queue_id: u64, seq: u64) -> Result<Option<Message>> {
        let key = message_key(queue_id, seq);
        if self.applier.is_staging() {
            if let Some(m) = self.applier.shipped.get(queue_id, seq) {
                return Ok(Some(m));
            }
        }
        let staged = match self.applier.is_staging_in_sled() && self.applier.is_staging() {
            true => self.applier.pending.get(key)?,
            false => None,
        };
        if let Some(log) = self.applier.log.as_ref().filter(|_| staged.is_none()) {
            return log.get(queue_id, seq);
        }
        match staged.map_or_else(|| self.msgs.get(key), |v| Ok(Some(v)))? {
            Some(v) => Ok(Some(decode_message(Bytes::copy_from_slice(&v))?)),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Meta;

    #[test]
    fn within_bytes_keeps_what_fits_and_at_least_one() {
        assert_eq!(within_bytes([10, 10, 10], 25), 2);
        assert_eq!(within_bytes([10, 10, 10], 30), 3);
        assert_eq!(within_bytes([100, 1], 10), 1);
        assert_eq!(within_bytes([], 10), 0);
    }

    /// `record_len` (a held put's length check, made without encoding)
    /// says what `append_record` writes, whatever the optional fields.
    #[test]
    fn record_len_is_what_append_record_writes() {
        for (deadline, time) in [(0, 0), (5, 0), (0, 7), (5, 7)] {
            let m = msg(b"some body");
            let mut out = BytesMut::new();
            append_record(&m, false, deadline, time, &mut out);
            assert_eq!(record_len(&m, deadline, time), out.len());
        }
    }

    fn msg(body: &'static [u8]) -> Message {
        Message::new(
            b"amq.direct",
            b"rk",
            &[0x10, 0, 2],
            body,
            Meta::default().with_delivery_mode(2),
        )
    }

    #[test]
    fn keys_sort_by_queue_then_seq() {
        assert!(message_key(1, u64::MAX) < message_key(2, 0));
        assert!(message_key(1, 255) < message_key(1, 256));
        assert_eq!(split_key(&message_key(7, 9)), Some((7, 9)));
        assert_eq!(split_key(b"short"), None);
    }

    #[test]
    fn record_round_trip() {
        let m = msg(b"hello");
        let mut buf = BytesMut::new();
        encode_message(&m, false, &mut buf);
        let back = decode_message(buf.freeze()).unwrap();
        assert_eq!(back.exchange(), m.exchange());
        assert_eq!(back.routing_key(), m.routing_key());
        assert_eq!(back.properties(), m.properties());
        assert_eq!(back.body(), m.body());
        assert_eq!(back.meta, m.meta);
        assert!(decode_message(Bytes::from_static(&[1, 5, b'a'])).is_err());
    }

    /// The time a record was stored, with a deadline or without, and
    /// kept apart from the message: the header is read past it.
    #[test]
    fn times_round_trip() {
        let m = msg(b"hello");
        let mut buf = BytesMut::new();
        for (deadline, time) in [(0, 0), (0, 1_700_000_000_001), (99, 1_700_000_000_002)] {
            for paged in [false, true] {
                encode_record(&m, paged, deadline, time, &mut buf);
                assert_eq!(record_meta(&buf), Some((5, deadline)));
                assert_eq!(is_paged(&buf), paged);
                let d = decode_record(buf.clone().freeze()).unwrap();
                assert_eq!((d.paged, d.deadline, d.time), (paged, deadline, time));
                assert_eq!(d.message.body(), b"hello");
                assert_eq!(d.message.properties(), m.properties());
            }
        }
        // Cut inside the time.
        encode_record(&m, false, 0, 7, &mut buf);
        assert!(decode_record(buf.clone().freeze().slice(..5)).is_err());
    }

    /// A message stored on a single node records when it was stored.
    #[test]
    fn a_stored_message_has_its_time() {
        let s = Store::temporary().unwrap();
        let before = crate::util::record_ms();
        s.put_message(5, 1, &msg(b"a"), 0).unwrap();
        let after = crate::util::record_ms();
        let m = s.messages(5).next().unwrap().unwrap();
        // The coarse clock may lag the call by its resolution.
        assert!(
            m.time + 50 >= before && m.time <= after + 50,
            "{before} {} {after}",
            m.time
        );
    }

    #[test]
    fn a_records_parts_are_its_properties_and_body() {
        let m = Message::new(b"ex", b"key", &[0, 0], b"body", Meta::default());
        for (deadline, time) in [(0, 0), (7, 0), (0, 9), (7, 9)] {
            let mut out = BytesMut::new();
            encode_record(&m, false, deadline, time, &mut out);
            assert_eq!(
                record_parts(&out),
                Some((&[0u8, 0][..], &b"body"[..])),
                "{deadline} {time}"
            );
            assert!(record_parts(&out[..out.len() - 5]).is_none());
            assert_eq!(record_time(&out), time, "{deadline} {time}");
            assert_eq!(record_time(&out[..9]), if deadline == 0 { time } else { 0 });
        }
    }

    #[test]
    fn deadlines_round_trip() {
        let s = Store::temporary().unwrap();
        s.put_message(5, 1, &msg(b"a"), 0).unwrap();
        s.put_message(5, 2, &msg(b"b"), 1_700_000_000_000).unwrap();
        let back: Vec<(u64, u64, Bytes)> = s
            .messages(5)
            .map(|m| m.unwrap())
            .map(|m| (m.seq, m.deadline, Bytes::copy_from_slice(m.message.body())))
            .collect();
        assert_eq!(
            back,
            vec![
                (1, 0, Bytes::from_static(b"a")),
                (2, 1_700_000_000_000, Bytes::from_static(b"b"))
            ]
        );
    }

    #[test]
    fn messages_scan_in_order_per_queue() {
        let s = Store::temporary().unwrap();
        for seq in [3u64, 1, 2] {
            s.put_message(5, seq, &msg(b"x"), 0).unwrap();
        }
        s.put_message(6, 0, &msg(b"y"), 0).unwrap();
        s.remove_message(5, 2).unwrap();
        let seqs: Vec<u64> = s.messages(5).map(|m| m.unwrap().seq).collect();
        assert_eq!(seqs, vec![1, 3]);
        s.purge_messages(5).unwrap();
        assert_eq!(s.messages(5).count(), 0);
        assert_eq!(s.messages(6).count(), 1);
        s.put_message(9, 1, &msg(b"z"), 0).unwrap();
        let live = [6u64].into_iter().collect();
        assert_eq!(s.sweep_orphans(&live).unwrap(), 1);
        assert_eq!(s.messages(6).count(), 1);
        assert_eq!(s.messages(9).count(), 0);
    }
}
