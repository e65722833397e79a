//! A Deliver frame: one chunk of consecutive offsets, as RabbitMQ's
//! stream clients read it (osiris's chunk header, then the entries, each
//! a message's AMQP 1.0 bytes behind its length). An entry is written
//! straight into the frame: as stored when the message came over this
//! protocol (from its record where a read left it, no other copy), or
//! written from its AMQP 0-9-1 form (message/amqp10.rs). The chunk's CRC
//! is the CRC-32 of its entries, as clients that check it expect. Its
//! timestamp is when its newest message was stored: osiris stamps a
//! chunk when it writes it, after its messages came.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::codes::DELIVER;
use crate::message::{amqp10, Message};
use crate::store::{self, Found};

/// The chunk header's magic and version (osiris: 5, 0).
const MAGIC_VERSION: u8 = 0x50;

/// A chunk being written: the osiris chunk header and its entries, all
/// of a Deliver frame but its head (frame size, key, version,
/// subscription, committed offset), so that readers of the same offsets
/// can share it (`Chunk::frame`).
pub struct ChunkFrame {
    o: BytesMut,
    first: u64,
    entries: u16,
    /// The latest stored time of its messages (ms since the epoch; 0:
    /// none recorded).
    time: u64,
}

/// The chunk header's length.
const HEADER: usize = 48;

impl ChunkFrame {
    /// A chunk with room for about `bytes` of entries.
    pub fn new(bytes: usize) -> Self {
        let mut o = BytesMut::with_capacity(bytes + HEADER + 64);
        o.put_u8(MAGIC_VERSION);
        o.put_u8(0); // a user chunk
        o.put_u16(0); // entries
        o.put_u32(0); // records
        o.put_i64(0); // the timestamp (`finish`)
        o.put_u64(1); // epoch
        o.put_u64(0); // the first offset
        o.put_u32(0); // CRC
        o.put_u32(0); // data length
        o.put_u32(0); // trailer length
        o.put_u32(0); // bloom filter size, reserved
        ChunkFrame {
            o,
            first: 0,
            entries: 0,
            time: 0,
        }
    }

    /// Adds the message at `offset` (the next after the last), stored at
    /// `time` (ms since the epoch; 0: not recorded).
    pub fn push(&mut self, offset: u64, msg: &Message, time: u64) {
        self.begin(offset, time);
        let o = &mut self.o;
        if amqp10::is_amqp10(msg) {
            put_entry(o, msg.body());
        } else {
            let at = o.len();
            o.put_u32(0);
            amqp10::encode_091(msg, &[b"x-stream-offset"], o);
            let len = (o.len() - at - 4) as u32;
            o[at..at + 4].copy_from_slice(&len.to_be_bytes());
        }
    }

    /// Adds what a range read found at `offset`.
    pub fn push_found(&mut self, offset: u64, found: Found<'_>) -> store::Result<()> {
        match found {
            Found::Message(m, time) => self.push(offset, &m, time),
            Found::Record(r) => match store::record_parts(r) {
                Some((props, body)) if amqp10::is_stored_props(props) => {
                    self.begin(offset, store::record_time(r));
                    put_entry(&mut self.o, body);
                }
                _ => {
                    let m = store::decode_message(Bytes::copy_from_slice(r))?;
                    self.push(offset, &m, store::record_time(r));
                }
            },
        }
        Ok(())
    }

    fn begin(&mut self, offset: u64, time: u64) {
        if self.entries == 0 {
            self.first = offset;
        }
        self.entries += 1;
        self.time = self.time.max(time);
    }

    /// The chunk, its header filled in.
    pub fn finish(mut self) -> Chunk {
        let o = &mut self.o;
        let n = self.entries;
        o[2..4].copy_from_slice(&n.to_be_bytes());
        o[4..8].copy_from_slice(&u32::from(n).to_be_bytes());
        // Messages stored before records kept their time: now.
        let time = match self.time {
            0 => crate::util::record_ms(),
            t => t,
        };
        o[8..16].copy_from_slice(&time.to_be_bytes());
        o[24..32].copy_from_slice(&self.first.to_be_bytes());
        let data = &o[HEADER..];
        let crc = crc32fast::hash(data);
        let len = data.len() as u32;
        o[32..36].copy_from_slice(&crc.to_be_bytes());
        o[36..40].copy_from_slice(&len.to_be_bytes());
        // A chunk much smaller than the room it was given (a reader at
        // the end of its stream) keeps no more memory than it needs,
        // queued or shared.
        let bytes = if self.o.capacity() > 4 * self.o.len() + 4096 {
            Bytes::copy_from_slice(&self.o)
        } else {
            self.o.freeze()
        };
        Chunk {
            bytes,
            first: self.first,
            entries: n,
        }
    }
}

/// Writes an entry holding `body` as it is.
fn put_entry(o: &mut BytesMut, body: &[u8]) {
    o.put_u32(body.len() as u32);
    o.put_slice(body);
}

/// A finished chunk; cloning it shares its bytes.
#[derive(Clone)]
pub struct Chunk {
    bytes: Bytes,
    pub first: u64,
    pub entries: u16,
}

impl Chunk {
    /// Its length in bytes.
    pub fn size(&self) -> usize {
        self.bytes.len()
    }

    /// The offset of its last entry (its first with none).
    pub fn last(&self) -> u64 {
        self.first + u64::from(self.entries.saturating_sub(1))
    }

    /// Its Deliver frame to subscription `id` as (head, chunk): version 2
    /// with `committed` (the last offset committed, which Deliver 2
    /// names as the committed chunk id: every offset up to it is),
    /// version 1 without.
    pub fn frame(&self, id: u8, committed: Option<u64>) -> (Bytes, Bytes) {
        let mut head = BytesMut::with_capacity(17);
        let rest = 4 + 1 + if committed.is_some() { 8 } else { 0 } + self.bytes.len();
        head.put_u32(rest as u32);
        head.put_u16(DELIVER);
        head.put_u16(if committed.is_some() { 2 } else { 1 });
        head.put_u8(id);
        if let Some(c) = committed {
            head.put_u64(c);
        }
        (head.freeze(), self.bytes.clone())
    }
}

/// A Deliver frame of subscription `id` holding `batch` (consecutive
/// offsets) as one chunk, as (head, chunk) (`Chunk::frame`).
/// Each message with when it was stored (ms since the epoch; 0: not
/// recorded).
pub fn chunk(id: u8, batch: &[(u64, Arc<Message>, u64)], committed: Option<u64>) -> (Bytes, Bytes) {
    let size: usize = batch.iter().map(|(_, m, _)| m.body().len() + 256).sum();
    let mut c = ChunkFrame::new(size);
    for (offset, msg, time) in batch {
        c.push(*offset, msg, *time);
    }
    c.finish().frame(id, committed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Meta;
    use rabbitmq_stream_protocol::codec::Decoder;
    use rabbitmq_stream_protocol::commands::deliver::DeliverCommand;

    /// A message as the stream protocol's publish stores it ("hi").
    fn stored() -> Message {
        Message::new(
            b"",
            b"s",
            amqp10::STORED_PROPS,
            &[0x00, 0x53, 0x75, 0xa0, 2, b'h', b'i'],
            Meta::default(),
        )
    }

    /// A frame in one piece.
    fn whole((head, chunk): (Bytes, Bytes)) -> Vec<u8> {
        [&head[..], &chunk[..]].concat()
    }

    #[test]
    fn a_chunk_reads_back_as_rabbitmqs_clients_read_it() {
        let stored = stored();
        let plain = Message::new(b"", b"s", &[0, 0], b"there", Meta::default());
        let batch = vec![(7, Arc::new(stored), 0), (8, Arc::new(plain), 0)];
        let frame = whole(chunk(3, &batch, None));
        let size = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(size, frame.len() - 4);
        assert_eq!(&frame[4..8], &[0, 8, 0, 1], "deliver, version 1");
        let (rest, d) = DeliverCommand::decode(&frame[8..]).expect("decodes");
        assert!(rest.is_empty());
        assert_eq!((d.subscription_id, d.chunk_first_offset), (3, 7));
        let bodies: Vec<_> = d
            .messages
            .iter()
            .map(|m| m.data().map(<[u8]>::to_vec))
            .collect();
        assert_eq!(bodies, vec![Some(b"hi".to_vec()), Some(b"there".to_vec())]);
        // The CRC covers the entries (after the 48-byte chunk header).
        let data = &frame[9 + 48..];
        let crc = u32::from_be_bytes(frame[9 + 32..9 + 36].try_into().unwrap());
        assert_eq!(crc, crc32fast::hash(data));
    }

    #[test]
    fn deliver_2_names_the_committed_offset_before_the_chunk() {
        let plain = Message::new(b"", b"s", &[0, 0], b"there", Meta::default());
        let batch = vec![(7, Arc::new(plain), 0)];
        let v1 = whole(chunk(3, &batch, None));
        let v2 = whole(chunk(3, &batch, Some(9)));
        assert_eq!(&v2[4..8], &[0, 8, 0, 2], "deliver, version 2");
        assert_eq!(v2[8], 3);
        assert_eq!(u64::from_be_bytes(v2[9..17].try_into().unwrap()), 9);
        // The same chunk after it (its timestamp aside).
        assert_eq!(v2.len(), v1.len() + 8);
        assert_eq!(&v2[17..27], &v1[9..19]);
        assert_eq!(&v2[35..], &v1[27..]);
    }

    /// A message read back as its record goes into a chunk as the same
    /// bytes as the message itself.
    #[test]
    fn a_record_makes_the_same_entry_as_its_message() {
        let stored = stored();
        let plain = Message::new(b"x", b"s", &[0, 0], b"there", Meta::default());
        let (mut a, mut b) = (ChunkFrame::new(0), ChunkFrame::new(0));
        for (offset, m) in [(4, &stored), (5, &plain)] {
            let mut record = BytesMut::new();
            store::encode_message(m, false, &mut record);
            a.push(offset, m, 0);
            b.push_found(offset, Found::Record(&record)).unwrap();
        }
        let (a, b) = (a.finish(), b.finish());
        assert_eq!((b.entries, b.last()), (2, 5));
        let (a, b) = (whole(a.frame(1, Some(9))), whole(b.frame(1, Some(9))));
        // All but the timestamp (after the committed offset, the magic,
        // the chunk type, and the counts).
        let ts = 4 + 4 + 1 + 8 + 2 + 6;
        assert_eq!((&a[..ts], &a[ts + 8..]), (&b[..ts], &b[ts + 8..]));
        assert!(store::record_parts(b"\x09not a record").is_none());
    }

    /// A chunk is stamped with the latest time its messages were stored,
    /// from a record or as told; with none recorded, when it is built.
    #[test]
    fn a_chunk_is_stamped_with_its_newest_messages_time() {
        let stamp = |c: Chunk| u64::from_be_bytes(c.bytes[8..16].try_into().unwrap());
        let m = stored();
        let mut c = ChunkFrame::new(0);
        c.push(0, &m, 1_700_000_000_005);
        let mut record = BytesMut::new();
        store::encode_record_at(&m, 1_700_000_000_009, &mut record);
        c.push_found(1, Found::Record(&record)).unwrap();
        c.push_found(2, Found::Message(Arc::new(m.clone()), 1_700_000_000_007))
            .unwrap();
        assert_eq!(stamp(c.finish()), 1_700_000_000_009);
        let before = crate::util::record_ms();
        let mut c = ChunkFrame::new(0);
        c.push(0, &m, 0);
        let built = stamp(c.finish());
        assert!((before..=crate::util::record_ms()).contains(&built));
    }

    /// A small chunk built with a large budget keeps only what it needs.
    #[test]
    fn a_small_chunk_keeps_no_more_than_it_needs() {
        for (room, kept) in [(1 << 20, 4096), (0, 4096)] {
            let mut c = ChunkFrame::new(room);
            c.push(0, &stored(), 0);
            let bytes = c.finish().bytes;
            assert!(bytes.len() < 100);
            let capacity = bytes.try_into_mut().expect("unshared").capacity();
            assert!(capacity < kept, "{capacity} bytes kept of {room}");
        }
    }
}
