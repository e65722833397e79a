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
use super::out::Part;
use crate::message::{amqp10, Message};
use crate::store::{self, Found};

/// The chunk header's magic and version (osiris: 5, 0).
const MAGIC_VERSION: u8 = 0x50;

/// A chunk being written: its entries, copied into a buffer or, for a
/// stream batch stored whole, named where they lie in the log's file
/// (`Found::Chunk`), all of a Deliver frame but its head (frame size,
/// key, version, subscription, committed offset) and the chunk header,
/// so that readers of the same offsets can share it (`Chunk::frame`).
pub struct ChunkFrame {
    /// Entries being copied (not in `parts` yet).
    o: BytesMut,
    parts: Vec<Part>,
    /// The CRC-32 of the entries in `parts`, and their bytes.
    crc: crc32fast::Hasher,
    len: u64,
    first: u64,
    entries: u16,
    /// The latest stored time of its messages (ms since the epoch; 0:
    /// none recorded).
    time: u64,
}

/// The chunk header's length.
const HEADER: usize = 48;

impl ChunkFrame {
    /// A chunk with room for about `bytes` of copied entries.
    pub fn new(bytes: usize) -> Self {
        ChunkFrame {
            o: BytesMut::with_capacity(bytes + 64),
            parts: Vec::new(),
            crc: crc32fast::Hasher::new(),
            len: 0,
            first: 0,
            entries: 0,
            time: 0,
        }
    }

    /// Adds the message at `offset` (the next after the last), stored at
    /// `time` (ms since the epoch; 0: not recorded).
    pub fn push(&mut self, offset: u64, msg: &Message, time: u64) {
        self.begin(offset, 1, time);
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

    /// Adds what a range read found at `offset` (a stored chunk: its
    /// messages from `offset` on).
    pub fn push_found(&mut self, offset: u64, found: Found<'_>) -> store::Result<()> {
        match found {
            Found::Message(m, time) => self.push(offset, &m, time),
            Found::Entry { body, time, .. } => {
                self.begin(offset, 1, time);
                put_entry(&mut self.o, body);
            }
            Found::Record(r) => match store::record_parts(r) {
                Some((props, body)) if amqp10::is_stored_props(props) => {
                    self.begin(offset, 1, store::record_time(r));
                    put_entry(&mut self.o, body);
                }
                _ => {
                    let m = store::decode_message(Bytes::copy_from_slice(r))?;
                    self.push(offset, &m, store::record_time(r));
                }
            },
            Found::Chunk(c) => {
                self.begin(offset, c.count as u16, c.time);
                self.take_copied();
                self.crc
                    .combine(&crc32fast::Hasher::new_with_initial_len(c.crc, c.len));
                self.len += c.len;
                self.parts.push(Part::File(c));
            }
        }
        Ok(())
    }

    fn begin(&mut self, offset: u64, n: u16, time: u64) {
        if self.entries == 0 {
            self.first = offset;
        }
        self.entries += n;
        self.time = self.time.max(time);
    }

    /// Moves the entries copied so far into `parts`; a buffer much larger
    /// than what it holds (a reader at the end of its stream) keeps no
    /// more memory than it needs, queued or shared.
    fn take_copied(&mut self) {
        if self.o.is_empty() {
            return;
        }
        self.crc.update(&self.o);
        self.len += self.o.len() as u64;
        let bytes = if self.o.capacity() > 4 * self.o.len() + 4096 {
            let b = Bytes::copy_from_slice(&self.o);
            self.o.clear();
            b
        } else {
            self.o.split().freeze()
        };
        self.parts.push(Part::Bytes(bytes));
    }

    /// The chunk, its header filled in.
    pub fn finish(mut self) -> Chunk {
        self.take_copied();
        let n = self.entries;
        // Messages stored before records kept their time: now.
        let time = match self.time {
            0 => crate::util::record_ms(),
            t => t,
        };
        let mut header = [0u8; HEADER];
        let mut h = &mut header[..];
        h.put_u8(MAGIC_VERSION);
        h.put_u8(0); // a user chunk
        h.put_u16(n);
        h.put_u32(u32::from(n)); // records
        h.put_u64(time);
        h.put_u64(1); // epoch
        h.put_u64(self.first);
        h.put_u32(self.crc.finalize());
        h.put_u32(self.len as u32);
        h.put_u32(0); // trailer length
        h.put_u32(0); // bloom filter size, reserved
        Chunk {
            header,
            parts: self.parts,
            len: self.len,
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
    /// The chunk header (osiris's).
    header: [u8; HEADER],
    /// The entries, copied or where they lie in the log's files.
    parts: Vec<Part>,
    len: u64,
    pub first: u64,
    pub entries: u16,
}

impl Chunk {
    /// The bytes of its entries that were copied (not sent from a file).
    pub fn copied(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Bytes(b) => b.len(),
                Part::File(_) => 0,
            })
            .sum()
    }

    /// The offset of its last entry (its first with none).
    pub fn last(&self) -> u64 {
        self.first + u64::from(self.entries.saturating_sub(1))
    }

    /// Its Deliver frame to subscription `id` as (head, entries), the
    /// head with the chunk header: version 2 with `committed` (the last
    /// offset committed, which Deliver 2 names as the committed chunk
    /// id: every offset up to it is), version 1 without.
    pub fn frame(&self, id: u8, committed: Option<u64>) -> (Bytes, Vec<Part>) {
        let mut head = BytesMut::with_capacity(17 + HEADER);
        let rest = 4 + 1 + if committed.is_some() { 8 } else { 0 } + HEADER + self.len as usize;
        head.put_u32(rest as u32);
        head.put_u16(DELIVER);
        head.put_u16(if committed.is_some() { 2 } else { 1 });
        head.put_u8(id);
        if let Some(c) = committed {
            head.put_u64(c);
        }
        head.put_slice(&self.header);
        (head.freeze(), self.parts.clone())
    }
}

/// The chunk of the first run of consecutive offsets in `pending` (each
/// message with when it was stored), taken out of it: a filtered
/// reader's (a chunk's offsets have no gaps).
pub fn take_run(pending: &mut Vec<(u64, Arc<Message>, u64)>) -> Chunk {
    let run = pending
        .windows(2)
        .position(|w| w[1].0 != w[0].0 + 1)
        .map_or(pending.len(), |i| i + 1);
    let c = chunk_of(&pending[..run]);
    pending.drain(..run);
    c
}

/// The chunk of `batch` (consecutive offsets), each message with when
/// it was stored (ms since the epoch; 0: not recorded).
fn chunk_of(batch: &[(u64, Arc<Message>, u64)]) -> Chunk {
    let size: usize = batch.iter().map(|(_, m, _)| m.body().len() + 256).sum();
    let mut c = ChunkFrame::new(size);
    for (offset, msg, time) in batch {
        c.push(*offset, msg, *time);
    }
    c.finish()
}

/// A Deliver frame of subscription `id` holding `batch` as one chunk, as
/// (head, chunk) in one piece (`Chunk::frame`).
#[cfg(test)]
fn chunk(id: u8, batch: &[(u64, Arc<Message>, u64)], committed: Option<u64>) -> (Bytes, Bytes) {
    let (head, parts) = chunk_of(batch).frame(id, committed);
    // Only copied entries: one part at most.
    let body = match parts.into_iter().next() {
        Some(Part::Bytes(b)) => b,
        _ => Bytes::new(),
    };
    (head, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Meta;
    use crate::store::StoredChunk;
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

    /// A chunk's frame in one piece, its file parts read.
    fn frame_bytes((head, parts): (Bytes, Vec<Part>)) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let mut out = head.to_vec();
        for p in parts {
            match p {
                Part::Bytes(b) => out.extend_from_slice(&b),
                Part::File(c) => {
                    let mut buf = vec![0u8; c.len as usize];
                    c.file.read_exact_at(&mut buf, c.at).unwrap();
                    out.extend_from_slice(&buf);
                }
            }
        }
        out
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
        let (a, b) = (
            frame_bytes(a.frame(1, Some(9))),
            frame_bytes(b.frame(1, Some(9))),
        );
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
        let stamp = |c: Chunk| u64::from_be_bytes(c.header[8..16].try_into().unwrap());
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

    /// A stored chunk's entries (sent from its file) join entries copied
    /// before and after them in one chunk: the frame is what copying them
    /// all makes, its count, data length and CRC included.
    #[test]
    fn a_stored_chunk_joins_copied_entries_as_if_all_were_copied() {
        use std::io::Write;
        let m = |i: u8| {
            let body = [0x00, 0x53, 0x75, 0xa0, 3, b'm', b'-', b'0' + i];
            Message::new(b"", b"s", amqp10::STORED_PROPS, &body, Meta::default())
        };
        let mut file = tempfile::NamedTempFile::new().unwrap();
        let mut entries = Vec::new();
        for i in 2..5 {
            put_entry_vec(&mut entries, m(i).body());
        }
        // Something before the entries in the file, as a record's head.
        file.write_all(b"record head").unwrap();
        file.write_all(&entries).unwrap();
        let stored = StoredChunk {
            file: Arc::new(file.reopen().unwrap()),
            at: 11,
            len: entries.len() as u64,
            crc: crc32fast::hash(&entries),
            count: 3,
            time: 1_700_000_000_001,
        };
        let (mut all, mut joined) = (ChunkFrame::new(0), ChunkFrame::new(0));
        for i in 0..6 {
            all.push(10 + u64::from(i), &m(i), 1_700_000_000_001);
        }
        joined.push(10, &m(0), 1_700_000_000_001);
        joined.push(11, &m(1), 1_700_000_000_001);
        joined.push_found(12, Found::Chunk(stored)).unwrap();
        joined.push(15, &m(5), 1_700_000_000_001);
        let joined = joined.finish();
        assert_eq!((joined.first, joined.entries, joined.last()), (10, 6, 15));
        assert_eq!(joined.copied(), 2 * 12 + 12);
        let a = frame_bytes(all.finish().frame(1, None));
        let b = frame_bytes(joined.frame(1, None));
        assert_eq!(a, b);
    }

    fn put_entry_vec(o: &mut Vec<u8>, body: &[u8]) {
        o.extend_from_slice(&(body.len() as u32).to_be_bytes());
        o.extend_from_slice(body);
    }

    /// A small chunk built with a large budget keeps only what it needs.
    #[test]
    fn a_small_chunk_keeps_no_more_than_it_needs() {
        for (room, kept) in [(1 << 20, 4096), (0, 4096)] {
            let mut c = ChunkFrame::new(room);
            c.push(0, &stored(), 0);
            let Some(Part::Bytes(bytes)) = c.finish().parts.pop() else {
                panic!("one copied part");
            };
            assert!(bytes.len() < 100);
            let capacity = bytes.try_into_mut().expect("unshared").capacity();
            assert!(capacity < kept, "{capacity} bytes kept of {room}");
        }
    }
}
