//! The message log's records: what each kind's payload holds. Integers
//! are big-endian; a message is stored as `messages::encode_record` makes
//! it (its kind octet says persistent or paged, then its deadline and the
//! message as it came off the wire).
//!
//! - PUT: queue id, seq, the message. A queue's message, and a body other
//!   records of the same segment may refer to.
//! - REF: queue id, seq, deadline, paged (one octet), the position of a
//!   PUT in the same segment and the length of its message: the same
//!   message in another queue (a fan-out), its body written once.
//! - ACK: queue id, seq. The message is gone (acked, expired, dropped,
//!   dead-lettered).
//! - PURGE: queue id, first seq. Every message of the queue from that seq
//!   on is gone (a purge, a queue deleted).
//! - MOVE: from queue, to queue, the moves (seq in `from`, 0 if it was not
//!   stored there; seq in `to`; the message's length and the message),
//!   then the seqs of `from` removed without a copy. One record, so a crash
//!   leaves each message in exactly one of the queues. A MOVE with no
//!   source (`from` = `to`, every seq in `from` 0, no removes) is a batch
//!   of puts: a stream's batch (`Store::put_batch`), one record for all.
//! - CHUNK: queue id, first seq, time, CRC, count, routing key (a short
//!   string), then the messages as osiris chunk entries (a length, then
//!   the message's AMQP 1.0 bytes): a stream protocol Publish frame's
//!   messages that carry nothing else (no filter value, the default
//!   exchange, the stream's name as routing key). The CRC is the CRC-32
//!   of the entries, as a Deliver frame's chunk header names it, so a
//!   reader sends whole records from the file as they lie (`chunk_head`).
//!   To the index it is a MOVE with no source.

use bytes::{BufMut, BytesMut};

use crate::message::{amqp10, Message};
use crate::store::messages::{append_record, record_meta, stored_record};
use crate::store::op::Moved;

pub const PUT: u8 = 1;
pub const REF: u8 = 2;
pub const ACK: u8 = 3;
pub const PURGE: u8 = 4;
pub const MOVE: u8 = 5;
pub const CHUNK: u8 = 6;

/// Where a CHUNK's routing key starts in its payload.
const CHUNK_ROUTE_AT: usize = 33;
/// The most entries a CHUNK holds (osiris counts them in 16 bits).
pub const CHUNK_MAX: usize = u16::MAX as usize;

/// Where the message of a PUT starts in its payload.
pub const PUT_MESSAGE_AT: u32 = 16;

/// A record read back, borrowing its payload.
#[derive(Debug, PartialEq, Eq)]
pub enum Rec {
    Put {
        queue: u64,
        seq: u64,
    },
    Ref {
        queue: u64,
        seq: u64,
        deadline: u64,
        paged: bool,
        body: u64,
        len: u32,
    },
    Ack {
        queue: u64,
        seq: u64,
    },
    Purge {
        queue: u64,
        from: u64,
    },
    Move {
        from: u64,
        to: u64,
        moves: Vec<MovedAt>,
        removes: Vec<u64>,
    },
}

/// One move of a MOVE record, and where its message lies in the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MovedAt {
    pub from_seq: u64,
    pub to_seq: u64,
    pub at: u32,
    pub len: u32,
    /// The message's body length, and whether it has a deadline.
    pub body_len: u32,
    pub timed: bool,
}

/// A PUT's payload into `out`.
pub fn put(
    queue: u64,
    seq: u64,
    msg: &Message,
    paged: bool,
    deadline: u64,
    time: u64,
    out: &mut BytesMut,
) {
    out.clear();
    out.put_u64(queue);
    out.put_u64(seq);
    append_record(msg, paged, deadline, time, out);
}

/// A PUT's payload around an already encoded message record (migration).
pub fn put_encoded(queue: u64, seq: u64, record: &[u8], out: &mut BytesMut) {
    out.clear();
    out.put_u64(queue);
    out.put_u64(seq);
    out.extend_from_slice(record);
}

/// A REF's payload.
pub fn reference(
    queue: u64,
    seq: u64,
    deadline: u64,
    paged: bool,
    body: u64,
    len: u32,
) -> [u8; 37] {
    let mut out = [0u8; 37];
    out[..8].copy_from_slice(&queue.to_be_bytes());
    out[8..16].copy_from_slice(&seq.to_be_bytes());
    out[16..24].copy_from_slice(&deadline.to_be_bytes());
    out[24] = paged as u8;
    out[25..33].copy_from_slice(&body.to_be_bytes());
    out[33..37].copy_from_slice(&len.to_be_bytes());
    out
}

/// An ACK's or a PURGE's payload.
pub fn pair(a: u64, b: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a.to_be_bytes());
    out[8..].copy_from_slice(&b.to_be_bytes());
    out
}

/// A MOVE's payload into `out`; returns where each move's message lies.
pub fn moves(
    from: u64,
    to: u64,
    moved: &[Moved<'_>],
    removes: &[u64],
    out: &mut BytesMut,
) -> Vec<MovedAt> {
    out.clear();
    out.put_u64(from);
    out.put_u64(to);
    out.put_u32(moved.len() as u32);
    let mut at = Vec::with_capacity(moved.len());
    for m in moved {
        out.put_u64(m.from_seq);
        out.put_u64(m.to_seq);
        // The length, once the message is written after it.
        let len_at = out.len();
        out.put_u32(0);
        let start = out.len();
        append_record(m.message, false, m.deadline, m.time, out);
        let len = (out.len() - start) as u32;
        out[len_at..start].copy_from_slice(&len.to_be_bytes());
        at.push(MovedAt {
            from_seq: m.from_seq,
            to_seq: m.to_seq,
            at: start as u32,
            len,
            body_len: m.message.body().len() as u32,
            timed: m.deadline != 0,
        });
    }
    out.put_u32(removes.len() as u32);
    for &seq in removes {
        out.put_u64(seq);
    }
    at
}

/// Whether `moved` (a MOVE's, `from` = `to`) can be written as a CHUNK:
/// new messages at consecutive seqs, stored at one time, with no
/// deadline, each a stream protocol message with nothing beside its
/// AMQP 1.0 bytes, all with one routing key.
pub fn chunkable(moved: &[Moved<'_>], removes: &[u64]) -> bool {
    let Some(first) = moved.first() else {
        return false;
    };
    let rk = first.message.routing_key();
    removes.is_empty()
        && moved.len() <= CHUNK_MAX
        && (first.to_seq..).zip(moved).all(|(seq, m)| {
            m.to_seq == seq
                && m.from_seq == 0
                && m.deadline == 0
                && m.time == first.time
                && m.message.exchange().is_empty()
                && m.message.routing_key() == rk
                && m.message.properties() == amqp10::STORED_PROPS
                && u32::try_from(m.message.body().len()).is_ok()
        })
}

/// Where the CHUNK entry after one at `at` holding `len` bytes starts
/// (an entry is a u32 length, then the bytes); None past a u32.
pub fn chunk_next_at(at: u32, len: u32) -> Option<u32> {
    at.checked_add(len)?.checked_add(4)
}

/// A CHUNK's payload for `moved` (`chunkable`) into `out`; where each
/// message lies in it, as a MOVE's.
pub fn chunk(queue: u64, moved: &[Moved<'_>], out: &mut BytesMut) -> Vec<MovedAt> {
    out.clear();
    let Some(first) = moved.first() else {
        return Vec::new();
    };
    let rk = first.message.routing_key();
    let bytes: usize = moved.iter().map(|m| 4 + m.message.body().len()).sum();
    out.reserve(CHUNK_ROUTE_AT + rk.len() + bytes);
    out.put_u64(queue);
    out.put_u64(first.to_seq);
    out.put_u64(first.time);
    out.put_u32(0); // the CRC, below
    out.put_u32(moved.len() as u32);
    out.put_u8(rk.len() as u8);
    out.put_slice(rk);
    let entries = out.len();
    let mut at = Vec::with_capacity(moved.len());
    for m in moved {
        let body = m.message.body();
        out.put_u32(body.len() as u32);
        at.push(MovedAt {
            from_seq: 0,
            to_seq: m.to_seq,
            at: out.len() as u32,
            len: body.len() as u32,
            body_len: body.len() as u32,
            timed: false,
        });
        out.put_slice(body);
    }
    let crc = crc32fast::hash(&out[entries..]);
    out[24..28].copy_from_slice(&crc.to_be_bytes());
    at
}

/// What a CHUNK's payload says before its entries: read off the first
/// bytes of its payload, which hold them all (`CHUNK_HEAD_MAX`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkHead {
    pub queue: u64,
    pub first_seq: u64,
    pub time: u64,
    /// The CRC-32 of the entries.
    pub crc: u32,
    pub count: u32,
    /// Where the entries start in the payload.
    pub entries_at: usize,
}

/// The most bytes of a CHUNK's payload before its entries.
pub const CHUNK_HEAD_MAX: usize = CHUNK_ROUTE_AT + 255;

/// A CHUNK's head and routing key, off the start of its payload.
pub fn chunk_head(p: &[u8]) -> Option<(ChunkHead, &[u8])> {
    let mut r = Reader::new(p);
    let (queue, first_seq, time, crc, count) = (r.u64()?, r.u64()?, r.u64()?, r.u32()?, r.u32()?);
    let rk_len = r.u8()? as usize;
    let rk = r.take(rk_len)?;
    Some((
        ChunkHead {
            queue,
            first_seq,
            time,
            crc,
            count,
            entries_at: r.at,
        },
        rk,
    ))
}

/// The message record (store/messages.rs) of the CHUNK entry whose bytes
/// lie at `at..at + len` of `payload`, as a MOVE would have stored it;
/// None if the payload is not a CHUNK's.
pub fn chunk_message(payload: &[u8], at: usize, len: usize) -> Option<bytes::Bytes> {
    let (head, rk) = chunk_head(payload)?;
    let body = payload.get(at..at.checked_add(len)?)?;
    Some(stored_record(
        head.time,
        (b"", rk),
        amqp10::STORED_PROPS,
        body,
    ))
}

/// Reads a record's payload; None if it does not parse (a record of a
/// kind this build does not know, or a short one).
pub fn parse(kind: u8, p: &[u8]) -> Option<Rec> {
    let mut r = Reader::new(p);
    let rec = match kind {
        PUT => {
            let rec = Rec::Put {
                queue: r.u64()?,
                seq: r.u64()?,
            };
            // The message itself is read when it is wanted.
            r.at = p.len();
            rec
        }
        REF => Rec::Ref {
            queue: r.u64()?,
            seq: r.u64()?,
            deadline: r.u64()?,
            paged: r.u8()? != 0,
            body: r.u64()?,
            len: r.u32()?,
        },
        ACK => Rec::Ack {
            queue: r.u64()?,
            seq: r.u64()?,
        },
        PURGE => Rec::Purge {
            queue: r.u64()?,
            from: r.u64()?,
        },
        MOVE => {
            let from = r.u64()?;
            let to = r.u64()?;
            let n = r.u32()? as usize;
            let mut moves = Vec::with_capacity(n.min(p.len() / 20));
            for _ in 0..n {
                let from_seq = r.u64()?;
                let to_seq = r.u64()?;
                let len = r.u32()?;
                let at = r.at as u32;
                let (body_len, deadline) = record_meta(r.take(len as usize)?)?;
                moves.push(MovedAt {
                    from_seq,
                    to_seq,
                    at,
                    len,
                    body_len,
                    timed: deadline != 0,
                });
            }
            let m = r.u32()? as usize;
            let mut removes = Vec::with_capacity(m.min(p.len() / 8));
            for _ in 0..m {
                removes.push(r.u64()?);
            }
            Rec::Move {
                from,
                to,
                moves,
                removes,
            }
        }
        CHUNK => {
            let (head, _) = chunk_head(p)?;
            r.at = head.entries_at;
            let n = head.count as usize;
            let mut moves = Vec::with_capacity(n.min(p.len() / 4));
            for seq in (head.first_seq..).take(n) {
                let len = r.u32()?;
                let at = r.at as u32;
                r.take(len as usize)?;
                moves.push(MovedAt {
                    from_seq: 0,
                    to_seq: seq,
                    at,
                    len,
                    body_len: len,
                    timed: false,
                });
            }
            Rec::Move {
                from: head.queue,
                to: head.queue,
                moves,
                removes: Vec::new(),
            }
        }
        _ => return None,
    };
    (r.at == p.len()).then_some(rec)
}

/// Reads big-endian integers off a payload.
pub struct Reader<'a> {
    p: &'a [u8],
    pub at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(p: &'a [u8]) -> Reader<'a> {
        Reader { p, at: 0 }
    }
    pub fn done(&self) -> bool {
        self.at >= self.p.len()
    }
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.p.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    pub fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    pub fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_be_bytes)
    }
    pub fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_be_bytes)
    }
}
