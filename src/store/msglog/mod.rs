//! A node's message store (a single node's, and each cluster member's,
//! store/raft/checkpoint.rs): every stored message, ack and purge
//! as a record in one node-wide append-only log (segments.rs), with the
//! index of where each queue's messages lie kept in memory (index.rs).
//! sled keeps definitions only.
//!
//! - A message is written once per node: a message routed to several
//!   queues is one PUT and a small REF per other queue, while its body is
//!   in the segment being written (record.rs).
//! - Acks and purges are small records; nothing is rewritten in place.
//! - Every record reaches the disk with the group commit (sync.rs): one
//!   write and one fdatasync per batch, whatever fed it.
//! - Space comes back a segment at a time: once no live message is left
//!   in the oldest segments, the commit after the one that saw it removes
//!   them (its sync covers every record that killed them). Only the oldest
//!   go, so an ack's record never outlives the segment it belongs to
//!   while the put it kills is still on disk: at open, a put is never read
//!   back without the records written after it.
//! - At open the index is rebuilt from each finished segment's summary
//!   (summary.rs), and from the records of the last segment and of any
//!   without a whole summary (their CRCs checked); paged transient
//!   messages are dropped, as RabbitMQ drops transient messages at a
//!   restart. A record's CRC is checked whenever it is read.
//!
//! One lock guards the index and the appends: a put holds it for the
//! append's copy into the buffer (the message is encoded before).

mod compact;
mod held;
mod index;
mod open;
mod range;
mod record;
mod slots;
mod summary;
#[cfg(test)]
mod tests;

use rustc_hash::FxHashMap;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

use self::held::{Held, HeldPut};
use self::index::{Index, Loc};
pub use self::range::{Found, StoredChunk};
use self::record::{Rec, PUT_MESSAGE_AT};
use self::summary::{Entry, Summary, Writer};
use super::messages::{decode_record, record_len, Decoded, StoredMessage};
use super::op::Moved;
use super::segments::{SegmentLog, RECORD_HEADER, SEGMENT_BYTES};
use super::{Error, Result};
use crate::message::Message;

/// How long the log's synced mark may lag (segments.rs).
const MARK_EVERY: Duration = Duration::from_secs(1);
/// Bodies remembered for fan-out between two commits, at the most, and
/// their bytes: the map pins them in memory, and paged transient messages
/// may go a while without a commit (the flusher's tick).
const RECENT_MAX: usize = 16 * 1024;
const RECENT_BYTES: usize = 16 << 20;
/// Messages read per batch when a queue's are read in order.
const READ_BATCH: usize = 1024;

/// The node's message log.
pub struct MessageLog {
    log: SegmentLog,
    segment_bytes: u64,
    state: Mutex<State>,
    /// The log's end as the last commit's sync covered it.
    synced: std::sync::atomic::AtomicU64,
    /// Writes the segments' summaries (taken before `state`).
    writer: Mutex<Writer>,
    /// The directory's lock, held while the log is open.
    _lock: File,
    /// A temporary log's directory, removed on drop.
    temporary: Option<PathBuf>,
    /// Puts are held back until the next commit (`hold_puts`).
    hold: bool,
}

struct State {
    index: Index,
    /// Puts not written yet (`hold_puts`).
    held: Held,
    /// The bodies written since the last commit, by their buffer: a
    /// message routed to several queues shares the first one's.
    recent: FxHashMap<(usize, usize), Recent>,
    /// The bytes `recent` pins.
    recent_bytes: usize,
    /// How far compaction went in the oldest segment (compact.rs).
    compact: Option<u64>,
    /// Compaction met a record it could not read: off until the next open.
    compact_failed: bool,
    /// The summary of the segment appends go to (None: it missed a
    /// record, and that segment is read whole at the next open).
    summary: Option<Summary>,
    /// Summaries of segments appends went past, not handed on yet.
    finished: Vec<Summary>,
    /// Segments whose summary missed a record.
    broken: Vec<u64>,
}

impl State {
    /// Notes the record at `pos`, in segment `base`, in its summary.
    fn note(&mut self, base: u64, pos: u64, e: &Entry) {
        if let Some(s) = &mut self.summary {
            if s.base == base {
                s.add(pos, e);
                return;
            }
        }
        if let Some(mut s) = self.summary.take() {
            s.end = Some(base);
            self.finished.push(s);
        }
        // A summary begins with its segment's first record.
        if pos == base {
            let mut s = Summary::new(base);
            s.add(pos, e);
            self.summary = Some(s);
        }
    }

    /// The summaries' entries since the last call, and the segments whose
    /// summary broke.
    fn take_summaries(&mut self) -> (Vec<Summary>, Vec<u64>) {
        let mut out = std::mem::take(&mut self.finished);
        out.extend(self.summary.as_mut().map(Summary::take));
        (out, std::mem::take(&mut self.broken))
    }
}

struct Recent {
    pos: u64,
    len: u32,
    /// The segment it is in: only a record of the same one refers to it.
    base: u64,
    /// Keeps the buffer (and so its address) while it is a key.
    _pin: Bytes,
}

/// The last record a run of reads read: its position, kind and payload
/// (the messages of a MOVE or a CHUNK share one).
type Last = Option<(u64, u8, Bytes)>;

/// What `put_locked` needs of a put, borrowed.
#[derive(Clone, Copy)]
struct PutRef<'a> {
    queue: u64,
    seq: u64,
    msg: &'a Message,
    paged: bool,
    deadline: u64,
}

impl<'a> PutRef<'a> {
    fn of(p: &'a HeldPut) -> PutRef<'a> {
        PutRef {
            queue: p.queue,
            seq: p.seq,
            msg: &p.msg,
            paged: p.paged,
            deadline: p.deadline,
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

fn corrupt(what: String) -> Error {
    Error::Corrupt(what)
}

/// Refuses a message the index could not keep, before it is appended.
fn check_len(len: usize) -> Result<()> {
    if len > slots::MAX_LEN as usize {
        return Err(Error::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a message of {len} bytes is longer than the message log keeps ({} bytes)",
                slots::MAX_LEN
            ),
        )));
    }
    Ok(())
}

/// Points the index at message `seq` of `queue` (its length was checked).
fn index_insert(index: &mut Index, queue: u64, seq: u64, loc: Loc) -> Result<()> {
    index.insert(queue, seq, loc).map_err(|_| {
        corrupt(format!(
            "message {seq} of queue {queue} ({} bytes at {}) cannot be indexed",
            loc.len, loc.rec
        ))
    })
}

impl MessageLog {
    /// Opens (or creates) the log in `dir` and reads it.
    pub fn open(dir: &Path) -> Result<MessageLog> {
        MessageLog::open_tuned(dir, SEGMENT_BYTES, MARK_EVERY)
    }

    /// The same, with segments of `segment_bytes` and the synced mark
    /// rewritten at most once per `mark_every` (tests).
    pub fn open_tuned(dir: &Path, segment_bytes: u64, mark_every: Duration) -> Result<MessageLog> {
        fs::create_dir_all(dir)?;
        let lock = open::lock_dir(dir)?;
        let log = SegmentLog::open_tuned(dir, segment_bytes, mark_every)?;
        let mut writer = Writer::new(dir);
        let opened = open::read_index(&log, dir, &mut writer)?;
        if opened.read + opened.summarized > 1 {
            tracing::info!(
                summarized = opened.summarized,
                read = opened.read,
                "message log opened: segments from their summaries, and read whole"
            );
        }
        let end = log.end();
        Ok(MessageLog {
            log,
            segment_bytes,
            synced: end.into(),
            state: Mutex::new(State {
                index: opened.index,
                held: Held::default(),
                recent: FxHashMap::default(),
                recent_bytes: 0,
                compact: None,
                compact_failed: false,
                summary: opened.summary,
                finished: Vec::new(),
                broken: Vec::new(),
            }),
            writer: Mutex::new(writer),
            _lock: lock,
            temporary: None,
            hold: false,
        })
    }

    /// Holds puts back until the next commit (held.rs): a cluster
    /// member's log, whose Raft log keeps what it applied until a
    /// checkpoint commits this log. A message removed before then is
    /// never written.
    pub fn hold_puts(mut self) -> MessageLog {
        self.hold = true;
        self
    }

    /// A log in a new temporary directory, removed on drop (tests, and
    /// temporary stores).
    pub fn temporary() -> Result<MessageLog> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "warren-msglog-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        let mut log = MessageLog::open_tuned(&dir, SEGMENT_BYTES, MARK_EVERY)?;
        log.temporary = Some(dir);
        Ok(log)
    }

    /// Appends a record (its entry `e`) under the state lock `st`, so that
    /// its segment's summary sees every record in order.
    fn append(&self, st: &mut State, kind: u8, payload: &[u8], e: &Entry) -> Result<u64> {
        self.append_known(st, kind, payload, None, e)
    }

    /// `append`, for a payload whose bytes from `tail.0` on have the
    /// CRC-32 `tail.1` (`SegmentLog::append_known`).
    fn append_known(
        &self,
        st: &mut State,
        kind: u8,
        payload: &[u8],
        tail: Option<(usize, u32)>,
        e: &Entry,
    ) -> Result<u64> {
        let base = self.log.next_base(payload.len());
        match self.log.append_known(kind, payload, tail) {
            Ok(pos) => {
                st.index.segment(base);
                st.note(base, pos, e);
                Ok(pos)
            }
            Err(err) => {
                let broken = st.summary.take().map(|s| s.base);
                st.broken.extend(broken);
                Err(err.into())
            }
        }
    }

    /// Stores message `seq` of queue `queue` (`paged`: a transient one
    /// paged out of memory, dropped at the next open).
    pub fn put(
        &self,
        queue: u64,
        seq: u64,
        msg: &Message,
        paged: bool,
        deadline: u64,
        time: u64,
    ) -> Result<()> {
        if self.hold {
            check_len(record_len(msg, deadline, time))?;
            let mut st = self.state.lock();
            st.held.hold(HeldPut {
                queue,
                seq,
                msg: msg.clone(),
                paged,
                deadline,
                time,
            });
            if st.held.is_full() {
                self.release(&mut st)?;
            }
            return Ok(());
        }
        SCRATCH.with(|s| {
            let mut buf = s.borrow_mut();
            // Encoded before the lock is taken (wasted for a fan-out's
            // later queues, which write a REF).
            record::put(queue, seq, msg, paged, deadline, time, &mut buf);
            check_len(buf.len() - PUT_MESSAGE_AT as usize)?;
            let put = PutRef {
                queue,
                seq,
                msg,
                paged,
                deadline,
            };
            self.put_locked(&mut self.state.lock(), put, &buf)
        })
    }

    /// Writes the puts held back, in order.
    fn release(&self, st: &mut State) -> Result<()> {
        let puts = st.held.take_all();
        self.write_held(st, puts)
    }

    /// Writes `puts`, taken from those held, in order.
    /// A put that cannot be written poisons the log: the puts taken out
    /// of `held` with it exist nowhere else, and a commit that succeeded
    /// later would let a checkpoint's mark cover them. Every later commit
    /// fails instead, and the member stops (raft/checkpoint.rs).
    fn write_held(&self, st: &mut State, puts: Vec<HeldPut>) -> Result<()> {
        let mut buf = BytesMut::new();
        for put in puts {
            record::put(
                put.queue,
                put.seq,
                &put.msg,
                put.paged,
                put.deadline,
                put.time,
                &mut buf,
            );
            let written = check_len(buf.len() - PUT_MESSAGE_AT as usize)
                .and_then(|()| self.put_locked(st, PutRef::of(&put), &buf));
            if let Err(e) = written {
                self.log.poison();
                return Err(e);
            }
        }
        Ok(())
    }

    /// The state, with every held put written: what a read sees.
    fn released(&self) -> Result<parking_lot::MutexGuard<'_, State>> {
        let mut st = self.state.lock();
        if !st.held.is_empty() {
            self.release(&mut st)?;
        }
        Ok(st)
    }

    /// Appends `put`, encoded in `buf`: a REF to the same body written
    /// since the last commit in the same segment, if there is one.
    fn put_locked(&self, st: &mut State, put: PutRef<'_>, buf: &[u8]) -> Result<()> {
        let PutRef {
            queue,
            seq,
            msg,
            paged,
            deadline,
        } = put;
        let key = (msg.backing().as_ptr() as usize, msg.backing().len());
        // A message published over the stream protocol goes to its one
        // stream only: no later put can share its body, so it is neither
        // looked up nor pinned in `recent`.
        let shared = !msg.meta.amqp10;
        if let Some(r) = shared.then(|| st.recent.get(&key)).flatten() {
            let payload = record::reference(queue, seq, deadline, paged, r.pos, r.len);
            if self.log.next_base(payload.len()) == r.base {
                let (body, len) = (r.pos, r.len);
                let body_len = msg.body().len() as u32;
                let e = Entry::Ref {
                    queue,
                    seq,
                    deadline,
                    paged,
                    body,
                    len,
                    body_len,
                };
                let pos = self.append(st, record::REF, &payload, &e)?;
                return open::insert_entry(&mut st.index, pos, &e);
            }
        }
        let base = self.log.next_base(buf.len());
        let len = (buf.len() - PUT_MESSAGE_AT as usize) as u32;
        let body_len = msg.body().len() as u32;
        let e = Entry::Put {
            queue,
            seq,
            len,
            paged,
            body_len,
            timed: deadline != 0,
        };
        let pos = self.append(st, record::PUT, buf, &e)?;
        open::insert_entry(&mut st.index, pos, &e)?;
        if !shared {
            return Ok(());
        }
        if st.recent.len() >= RECENT_MAX || st.recent_bytes >= RECENT_BYTES {
            st.recent.clear();
            st.recent_bytes = 0;
        }
        let pin = msg.backing().clone();
        st.recent_bytes += pin.len();
        st.recent.insert(
            key,
            Recent {
                pos,
                len,
                base,
                _pin: pin,
            },
        );
        Ok(())
    }

    /// Stores a message record as an older store wrote it (migration).
    pub fn put_encoded(&self, queue: u64, seq: u64, encoded: &[u8]) -> Result<()> {
        let mut buf = BytesMut::new();
        record::put_encoded(queue, seq, encoded, &mut buf);
        check_len(encoded.len())?;
        let e = Entry::of(record::PUT, &buf)
            .ok_or_else(|| corrupt(format!("message {seq} of queue {queue}: no message record")))?;
        let mut st = self.released()?;
        let pos = self.append(&mut st, record::PUT, &buf, &e)?;
        open::insert_entry(&mut st.index, pos, &e)
    }

    /// Forgets message `seq` of `queue` (acked, expired, dropped).
    pub fn remove(&self, queue: u64, seq: u64) -> Result<()> {
        let mut st = self.state.lock();
        // Never written, and so no ack either; but a put applied again
        // (a replay) may be held while the first one is on disk.
        st.held.take(queue, seq);
        if st.index.remove(queue, seq) {
            let e = Entry::Other(Rec::Ack { queue, seq });
            self.append(&mut st, record::ACK, &record::pair(queue, seq), &e)?;
        }
        Ok(())
    }

    /// Forgets every message of `queue` from `from` on.
    pub fn purge_from(&self, queue: u64, from: u64) -> Result<()> {
        let mut st = self.released()?;
        if st.index.remove_from(queue, from) > 0 {
            let e = Entry::Other(Rec::Purge { queue, from });
            self.append(&mut st, record::PURGE, &record::pair(queue, from), &e)?;
        }
        Ok(())
    }

    /// Moves messages of queue `from` to queue `to`, and removes
    /// `removes` from `from`, in one record (see `Op::MoveMessages`).
    pub fn move_records(
        &self,
        from: u64,
        to: u64,
        moves: &[Moved<'_>],
        removes: &[u64],
    ) -> Result<()> {
        let mut buf = BytesMut::new();
        // A stream protocol batch goes as the chunk its readers send.
        let kind = match from == to && record::chunkable(moves, removes) {
            true => record::CHUNK,
            false => record::MOVE,
        };
        let at = match kind {
            record::CHUNK => record::chunk(to, moves, &mut buf),
            _ => record::moves(from, to, moves, removes, &mut buf),
        };
        for m in &at {
            check_len(m.len as usize)?;
        }
        let e = Entry::Other(Rec::Move {
            from,
            to,
            moves: at,
            removes: removes.to_vec(),
        });
        // New messages (a stream's batch: no source, nothing removed)
        // depend on no held put: those stay held. A move's source must be
        // written before it.
        let new = from == to && removes.is_empty() && moves.iter().all(|m| m.from_seq == 0);
        let mut st = match new {
            true => self.state.lock(),
            false => self.released()?,
        };
        // A CHUNK's entries have their CRC in its head.
        let tail = (kind == record::CHUNK)
            .then(|| record::chunk_head(&buf))
            .flatten()
            .map(|(h, _)| (h.entries_at, h.crc));
        let pos = self.append_known(&mut st, kind, &buf, tail, &e)?;
        open::apply(&mut st.index, pos, &e)
    }

    /// Message `seq` of `queue`, if it is stored.
    pub fn get(&self, queue: u64, seq: u64) -> Result<Option<Message>> {
        let Some(loc) = self.released()?.index.get(queue, seq) else {
            return Ok(None);
        };
        let mut last = None;
        let found = self.read_current(queue, seq, loc, &mut last)?;
        Ok(found.map(|d| d.message))
    }

    /// Where each stored message of `queue` from `from` on lies, in
    /// order, looked up a batch at a time.
    fn indexed(&self, queue: u64, from: u64) -> impl Iterator<Item = Result<(u64, Loc)>> + '_ {
        let mut from = from;
        let mut batch = std::collections::VecDeque::new();
        let mut done = false;
        std::iter::from_fn(move || {
            if batch.is_empty() && !done {
                let st = match self.released() {
                    Ok(st) => st,
                    Err(e) => {
                        done = true;
                        return Some(Err(e));
                    }
                };
                batch = st.index.range(queue, from, READ_BATCH).into();
                match batch.back() {
                    Some((seq, _)) => from = seq + 1,
                    None => done = true,
                }
            }
            batch.pop_front().map(Ok)
        })
    }

    /// Every stored message of `queue` in order, with its deadline, read a
    /// batch at a time (recovery).
    pub fn stored(&self, queue: u64) -> impl Iterator<Item = Result<StoredMessage>> + '_ {
        self.stored_from(queue, 0)
    }

    /// The same from `from` on.
    pub fn stored_from(
        &self,
        queue: u64,
        from: u64,
    ) -> impl Iterator<Item = Result<StoredMessage>> + '_ {
        let mut last = None;
        self.indexed(queue, from).filter_map(move |found| {
            let (seq, loc) = match found {
                Ok(found) => found,
                Err(e) => return Some(Err(e)),
            };
            self.read_current(queue, seq, loc, &mut last)
                .map(|found| {
                    found.map(|d| StoredMessage {
                        seq,
                        message: Arc::new(d.message),
                        deadline: d.deadline,
                        time: d.time,
                    })
                })
                .transpose()
        })
    }

    /// The stored messages of `queue` from `from` on, in order, as the
    /// index has them: seq, body length, and the deadline (read back only
    /// for a message that has one). A queue's recovery takes what it
    /// leaves in the log this way, without reading it.
    pub fn stored_meta(
        &self,
        queue: u64,
        from: u64,
    ) -> impl Iterator<Item = Result<(u64, u32, u64)>> + '_ {
        let mut last = None;
        self.indexed(queue, from).filter_map(move |found| {
            let (seq, loc) = match found {
                Ok(found) => found,
                Err(e) => return Some(Err(e)),
            };
            if !loc.timed {
                return Some(Ok((seq, loc.body_len, 0)));
            }
            self.read_current(queue, seq, loc, &mut last)
                .map(|found| found.map(|d| (seq, loc.body_len, d.deadline)))
                .transpose()
        })
    }

    /// The seq of the first and the last stored message of `queue`.
    pub fn bounds(&self, queue: u64) -> Result<Option<(u64, u64)>> {
        Ok(self.released()?.index.bounds(queue))
    }

    /// The queues with stored messages.
    pub fn queue_ids(&self) -> Result<Vec<u64>> {
        Ok(self.released()?.index.queue_ids())
    }

    /// Message `seq` of `queue`, read at `loc`, or where the index says it
    /// is now if that read failed: compaction may have moved it, and its
    /// old segment gone, since `loc` was looked up (None: it went meanwhile).
    fn read_current(
        &self,
        queue: u64,
        seq: u64,
        loc: Loc,
        last: &mut Last,
    ) -> Result<Option<Decoded>> {
        let e = match self.read(loc, last) {
            Ok(found) => return Ok(Some(found)),
            Err(e) => e,
        };
        let now = self.state.lock().index.get(queue, seq);
        match now {
            None => Ok(None),
            Some(now) if now != loc => {
                *last = None;
                self.read(now, last).map(Some)
            }
            Some(_) => Err(e),
        }
    }

    /// The message at `loc` with its deadline and time; `last` keeps the
    /// last record read (the messages of a MOVE share one).
    fn read(&self, loc: Loc, last: &mut Last) -> Result<Decoded> {
        let (kind, payload) = match last {
            Some((pos, kind, p)) if *pos == loc.body => (*kind, p.clone()),
            _ => {
                let r = self.log.read(loc.body)?;
                let p = Bytes::from(r.payload);
                *last = Some((loc.body, r.kind, p.clone()));
                (r.kind, p)
            }
        };
        let (at, end) = (loc.at as usize, loc.at as usize + loc.len as usize);
        if end > payload.len() {
            return Err(corrupt(format!("no message at {}+{at}", loc.body)));
        }
        let record = match kind {
            record::CHUNK => record::chunk_message(&payload, at, loc.len as usize)
                .ok_or_else(|| corrupt(format!("no chunk at {}", loc.body)))?,
            _ => payload.slice(at..end),
        };
        let mut d = decode_record(record)?;
        if loc.rec != loc.body {
            let r = self.log.read(loc.rec)?;
            match record::parse(r.kind, &r.payload) {
                Some(Rec::Ref { deadline, .. }) => d.deadline = deadline,
                _ => return Err(corrupt(format!("no reference at {}", loc.rec))),
            }
        }
        Ok(d)
    }

    /// Writes what was appended (a copy must reach the OS before what it
    /// replaces, kept elsewhere, is removed).
    pub fn flush(&self) -> Result<()> {
        drop(self.released()?);
        Ok(self.log.flush()?)
    }

    /// The group commit's part: a step of compaction if one is due, then
    /// makes every record appended so far durable, then removes the oldest
    /// segments that were dead before it began.
    pub fn commit(&self) -> Result<()> {
        drop(self.released()?);
        self.commit_written()
    }

    /// A commit that leaves the puts held since the last such commit
    /// held (held.rs): they get another interval in which to be removed.
    /// Everything else appended before the call is durable when it returns.
    pub fn commit_older(&self) -> Result<()> {
        {
            let mut st = self.state.lock();
            let ended = st.held.next_generation();
            let older = st.held.take_before(ended);
            self.write_held(&mut st, older)?;
        }
        self.commit_written()
    }

    /// `commit`'s part after the held puts it writes.
    fn commit_written(&self) -> Result<()> {
        self.compact_step()?;
        let wanted = self.state.lock().index.wanted_from(self.log.active());
        let end = self.log.sync()?;
        self.synced
            .fetch_max(end, std::sync::atomic::Ordering::Relaxed);
        {
            let mut st = self.state.lock();
            st.recent.clear();
            st.recent_bytes = 0;
        }
        let mut writer = self.writer.lock();
        self.hand_summaries(&mut writer);
        writer.finish(end);
        let gone: Vec<u64> = self
            .log
            .segments()
            .into_iter()
            .take_while(|&b| b < wanted)
            .collect();
        if self.log.remove_below(wanted)? > 0 {
            self.state.lock().index.forget_below(wanted);
            for base in gone {
                writer.drop_segment(base);
            }
        }
        Ok(())
    }

    /// Whether a commit has work though nobody waits for one: records not
    /// synced yet (acks, publishes without confirms), dead segments to
    /// remove, or compaction due.
    pub fn wants_commit(&self) -> bool {
        if self.log.end() > self.synced.load(std::sync::atomic::Ordering::Relaxed) {
            return true;
        }
        let first = self.log.segments().first().copied().unwrap_or(0);
        let active = self.log.active();
        let st = self.state.lock();
        !st.held.is_empty() || st.compact.is_some() || st.index.wanted_from(active) > first || {
            drop(st);
            self.compaction_due()
        }
    }

    /// Makes everything durable and writes the synced mark (a clean
    /// stop, the end of a migration).
    pub fn close(&self) -> Result<()> {
        drop(self.released()?);
        let end = self.log.sync_marked()?;
        let mut writer = self.writer.lock();
        self.hand_summaries(&mut writer);
        writer.finish(end);
        self.log.finish_reaping();
        Ok(())
    }

    /// Hands the summaries' new entries to the writer.
    fn hand_summaries(&self, writer: &mut Writer) {
        let (pieces, broken) = self.state.lock().take_summaries();
        for base in broken {
            writer.drop_segment(base);
        }
        for piece in pieces {
            writer.add(piece);
        }
    }

    /// Bytes the log's files hold.
    pub fn size_on_disk(&self) -> u64 {
        self.log.size()
    }

    /// The bytes of every stored message.
    pub fn live_bytes(&self) -> u64 {
        let st = self.state.lock();
        st.index.live_bytes() + st.held.bytes() as u64
    }

    /// Marks the log as if a sync had failed (tests).
    #[cfg(test)]
    pub fn poison(&self) {
        self.log.poison();
    }

    /// The segment files' first positions (tests, metrics).
    pub fn segments(&self) -> Vec<u64> {
        self.log.segments()
    }
}

impl Drop for MessageLog {
    fn drop(&mut self) {
        if let Some(dir) = &self.temporary {
            let _ = fs::remove_dir_all(dir);
        }
    }
}
