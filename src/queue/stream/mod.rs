//! A stream (`x-queue-type=stream`): an append-only log of messages read
//! by offset. A publish appends: the message gets the next offset, an
//! `x-stream-offset` header carrying it (added once, at the append, so
//! every read hands out the stored bytes as they are), and a PUT record
//! in the message log (store/msglog) under the stream's id, its sequence
//! number the offset plus one; the confirm waits for the group commit
//! that syncs it. Nothing removes a message but the stream's deletion:
//! acks are credit, they move a reader's window and delete nothing.
//!
//! Each consumer is a reader with a cursor of its own (offset.rs: where
//! it starts). A reader takes messages while its prefetch has room and
//! its connection's outbox takes them: from the newest messages kept in
//! memory (`TAIL_BYTES`), else read back from the log a batch at a time.
//! A reader at the end waits for the next append, which delivers to it;
//! a reader refused for credit or a full outbox waits for the ack or
//! the drain that wakes it, as a queue's consumers do.
//!
//! The time of each second's first append is kept (`marks`), so a
//! reader that starts at a time finds its offset without reading the log.
//! Retention (retention.rs) drops whole segments from the start; readers
//! behind move on to what is kept. A reader may filter (filter.rs) and
//! have its offset tracked by the server (tracking.rs).

pub mod filter;
pub mod offset;
mod recovery;
mod retention;
pub mod shared;
pub mod tracking;

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use amq_protocol::types::AMQPValue;
use parking_lot::Mutex;

use super::{Consumer, Entry, Queue, Refused, Settle, Unacked};
use crate::message::{amqp10, Message};
use crate::store::{self, Found};
pub use filter::Filter;
pub use offset::Start;
use retention::{Limits, Segments};
use tracking::Tracked;

/// Bytes of the newest messages a stream keeps in memory for readers
/// near its end.
const TAIL_BYTES: usize = 8 << 20;
/// At most this many messages are read back from the log at a time for
/// one reader...
const READ_BATCH: usize = 256;
/// ...and about this many bytes of bodies (each reader behind the tail
/// keeps what it read ahead).
const READ_AHEAD_BYTES: u64 = 512 << 10;
/// A visit (a stream protocol reader's chunk, a peek) reads at most this
/// many messages from the log at a time: a chunk's at once, so that a
/// record holding a batch of them is read once for it, not once per part.
const VISIT_BATCH: usize = 4096;
/// A batch's record never holds offsets on both sides of a multiple of
/// this: a stream protocol reader's chunks end at such multiples
/// (stream_protocol/subscribe.rs), so each reads the records it needs
/// and no part of the next chunk's.
pub const BATCH_ALIGN: u64 = 512;
/// A filtered reader passes over at most this many messages in one
/// delivery round, then goes on in a later one (so a filter that
/// matches little never holds the stream's lock for long).
const SKIP_BUDGET: usize = 4096;

/// `msg` as a stream keeps it at `offset`: an AMQP 1.0 message (the
/// stream protocol's) as it came, its readers there have the offset in
/// the chunk; any other with an `x-stream-offset` header.
fn stored_form(msg: Message, offset: u64) -> Arc<Message> {
    match msg.meta.amqp10 {
        true => Arc::new(msg),
        false => {
            Arc::new(msg.with_header("x-stream-offset", AMQPValue::LongLongInt(offset as i64)))
        }
    }
}

/// A stream's state, beside its queue's.
#[derive(Default)]
pub struct Stream {
    log: Mutex<Log>,
    /// Tracked offsets to write before the next commit, by reader name
    /// (tracking.rs); `track_registered` says whether the queue is
    /// registered for that write.
    tracks: Mutex<tracking::Tracks>,
    track_registered: AtomicBool,
    /// Offsets below this one were removed from the store (retention
    /// goes on from here after a failed removal).
    removed: Mutex<u64>,
    /// Messages appended, delivered and acked since start (the queue's
    /// counters show them: the queue's state is not locked per message).
    published: AtomicU64,
    delivered: AtomicU64,
    acked: AtomicU64,
    /// Set once it is deleted (read without the log's lock).
    gone: AtomicBool,
    /// Readers outside the queue's (the stream protocol's) waiting for
    /// an append.
    pub appended: Appended,
    /// Held while a named stream protocol publisher checks its ids
    /// against the highest stored and appends (`dedup_guard`).
    dedup: Mutex<()>,
    /// What its readers encoded last, for the others (shared.rs).
    pub shared: shared::Shared,
}

/// Wakes the tasks waiting for a stream's next append, costing an append
/// nothing but a load while none waits.
#[derive(Default)]
pub struct Appended {
    waiting: std::sync::atomic::AtomicUsize,
    notify: tokio::sync::Notify,
}

impl Appended {
    fn wake(&self) {
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Waits until an append after `check` found nothing: `check` runs
    /// once this task is registered, so an append during it is not
    /// missed; `Some` from it returns at once.
    pub async fn after<T>(&self, check: impl FnOnce() -> Option<T>) -> Option<T> {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        self.waiting.fetch_add(1, Ordering::AcqRel);
        struct Leave<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _leave = Leave(&self.waiting);
        if let Some(found) = check() {
            return Some(found);
        }
        notified.await;
        None
    }

    /// Wakes every waiter (the stream was deleted).
    pub fn wake_all(&self) {
        self.notify.notify_waiters();
    }
}

/// What adding a reader did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    Added,
    /// The stream was deleted meanwhile.
    Deleted,
    /// A reader whose offset is tracked under the same name is attached.
    NameTaken,
}

/// How a consumer reads a stream.
#[derive(Debug, Clone, Default)]
pub struct ReadSpec {
    /// Where it starts (if its offset is not tracked yet).
    pub start: Start,
    /// What it takes (None: everything).
    pub filter: Option<Filter>,
    /// The name its offset is tracked under, if it is.
    pub track: Option<String>,
}

#[derive(Default)]
struct Log {
    /// The offset of the first message kept.
    first: u64,
    /// The offset the next message gets.
    next: u64,
    /// Body bytes of the messages kept.
    bytes: u64,
    /// The newest messages, oldest first, each with when it was stored
    /// (ms since the epoch; 0: not recorded), and their body bytes.
    tail: VecDeque<(Arc<Message>, u64)>,
    tail_bytes: usize,
    /// (second since the epoch, the offset of the first message stored
    /// in it), one per second that saw an append, oldest first.
    marks: VecDeque<(u64, u64)>,
    readers: Vec<Reader>,
    deleted: bool,
    /// Its segments, and the retention limits last read.
    segments: Segments,
    limits: Limits,
    /// Marks from this offset on are one per second that saw an append;
    /// before it (what a start read back) one per segment (recovery.rs).
    exact_from: u64,
    /// In a cluster (the queue delivers after commit): (offset, the
    /// commit that covers its write) of the appends not known committed
    /// yet, oldest first. Readers see only what is before the first.
    uncommitted: VecDeque<(u64, u64)>,
}

struct Reader {
    consumer: Arc<Consumer>,
    /// The offset it reads next.
    cursor: u64,
    /// Why it does not take deliveries now (None: it does, or it is at
    /// the end and waits for an append).
    waits: Option<Refused>,
    filter: Option<Filter>,
    track: Option<Tracked>,
    /// Messages read back from the log, from about its cursor on (while
    /// it reads behind the tail).
    ahead: VecDeque<(u64, Arc<Message>)>,
}

/// What a stream holds, for the API and declare-ok.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extent {
    pub first: u64,
    pub next: u64,
    pub bytes: u64,
    /// Its retention segments (retention.rs).
    pub segments: u64,
}

impl Extent {
    /// Messages kept.
    pub fn messages(&self) -> u64 {
        self.next - self.first
    }

    /// The offset of the last message kept, if any is.
    pub fn last(&self) -> Option<u64> {
        (self.next > self.first).then(|| self.next - 1)
    }
}

impl Log {
    /// The offset of the first message in `tail`.
    fn tail_first(&self) -> u64 {
        self.next - self.tail.len() as u64
    }

    /// How many messages to read ahead at a time: about
    /// `READ_AHEAD_BYTES` of bodies at the stream's average size.
    fn read_batch(&self) -> usize {
        let count = (self.next - self.first).max(1);
        let average = (self.bytes / count).max(1);
        (READ_AHEAD_BYTES / average).clamp(1, READ_BATCH as u64) as usize
    }

    fn keep_in_tail(&mut self, msg: Arc<Message>, time: u64) {
        self.tail_bytes += msg.body().len();
        self.tail.push_back((msg, time));
        while self.tail_bytes > TAIL_BYTES && self.tail.len() > 1 {
            if let Some((old, _)) = self.tail.pop_front() {
                self.tail_bytes -= old.body().len();
            }
        }
    }

    fn mark(&mut self, offset: u64, time_ms: u64) {
        let second = time_ms / 1000;
        if self.marks.back().is_none_or(|&(s, _)| s < second) {
            self.marks.push_back((second, offset));
        }
    }

    /// Applies retention at `now_ms`: the offsets it dropped.
    fn retain(&mut self, now_ms: u64) -> Option<Range<u64>> {
        let (first, dropped) = self.segments.retain(self.bytes, &self.limits, now_ms)?;
        let old = self.first;
        self.first = first;
        self.bytes -= dropped;
        while self.marks.len() > 1 && self.marks[1].1 <= first {
            self.marks.pop_front();
        }
        while !self.tail.is_empty() && self.tail_first() < first {
            if let Some((m, _)) = self.tail.pop_front() {
                self.tail_bytes -= m.body().len();
            }
        }
        for r in &mut self.readers {
            r.cursor = r.cursor.max(first);
        }
        Some(old..first)
    }

    /// The offsets between which the first message stored at or after
    /// `ms` (second precision) lies, by the marks: the last mark of an
    /// earlier second and the first of that second or later.
    fn time_bounds(&self, ms: u64) -> (u64, u64) {
        let second = ms / 1000;
        let at = self.marks.partition_point(|&(s, _)| s < second);
        let hi = self
            .marks
            .get(at)
            .map_or(self.next, |&(_, o)| o.max(self.first));
        let lo = match at {
            0 => self.first,
            _ => self.marks[at - 1].1.max(self.first),
        };
        (lo.min(hi), hi)
    }

    /// Where a reader asking for `start` begins.
    fn resolve(&self, start: Start) -> u64 {
        match start {
            Start::First => self.first,
            Start::Last => self.next.saturating_sub(1).max(self.first),
            Start::Next => self.next,
            Start::Offset(n) => n.clamp(self.first, self.next),
            // The first message of its second or a later one (marks are
            // per second; before `exact_from` the stream seeks first).
            Start::Time(ms) => self.time_bounds(ms).1,
        }
    }
}

/// The retention limits `args` (with the queue's policy) set.
fn limits(args: &super::args::QueueArgs) -> Limits {
    Limits {
        max_bytes: args.max_length_bytes,
        max_age_ms: args.max_age_ms,
        segment_bytes: args
            .stream_segment_bytes
            .unwrap_or(retention::SEGMENT_BYTES),
    }
}

/// Runs `queue`'s retention once a second while it exists (a stream no
/// one publishes to still loses what ages out).
pub fn watch_retention(queue: &Arc<Queue>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<Queue> = Arc::downgrade(queue);
    runtime.spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(q) = weak.upgrade() else { return };
            let Some(s) = q.stream.as_ref().filter(|_| !q.is_deleted()) else {
                return;
            };
            let live = limits(&q.state.lock().live);
            if let Err(e) = s.enforce(&q, live, crate::util::record_ms()) {
                tracing::error!(stream = %q.config.name, "retention failed: {e}");
            }
        }
    });
}

/// The store's sequence number of offset `offset` (sequence numbers
/// start at 1).
fn seq_of(offset: u64) -> u64 {
    offset + 1
}

/// The offset of the store's sequence number `seq` (readers that read
/// the store directly: a follower's).
pub fn offset_of(seq: u64) -> u64 {
    seq.saturating_sub(1)
}

impl Stream {
    /// A new stream with the retention its arguments set (its policy's
    /// is read once a second).
    pub fn new(args: &super::args::QueueArgs) -> Stream {
        let stream = Stream::default();
        stream.log.lock().limits = limits(args);
        stream
    }

    /// What the stream holds.
    pub fn extent(&self) -> Extent {
        let log = self.log.lock();
        Extent {
            first: log.first,
            next: log.next,
            bytes: log.bytes,
            segments: log.segments.len() as u64,
        }
    }

    /// The average body length of the messages kept (1 if none).
    pub fn average_body_len(&self) -> u64 {
        let log = self.log.lock();
        (log.bytes / log.next.saturating_sub(log.first).max(1)).max(1)
    }

    /// Puts its message counters in `c` (publish, deliver and ack).
    pub fn counters(&self, c: &mut super::stats::Counters) {
        c.publish = self.published.load(Ordering::Relaxed);
        c.deliver = self.delivered.load(Ordering::Relaxed);
        c.ack = self.acked.load(Ordering::Relaxed);
    }

    /// Its readers' consumers, oldest first.
    pub fn consumers(&self) -> Vec<Arc<Consumer>> {
        let log = self.log.lock();
        log.readers
            .iter()
            .map(|r| Arc::clone(&r.consumer))
            .collect()
    }

    /// How many readers it has.
    pub fn readers(&self) -> usize {
        self.log.lock().readers.len()
    }

    /// Appends `msg` (durable at the next group commit) and delivers it
    /// to the readers waiting at the end.
    pub fn push(&self, queue: &Arc<Queue>, msg: &Message) -> store::Result<bool> {
        self.append(queue, 1, |first, _| {
            let msg = stored_form(msg.clone(), first);
            queue
                .store
                .put_message(queue.config.store_id, seq_of(first), &msg, 0)?;
            Ok([msg])
        })
    }

    /// Appends `msgs` in order, as `push` appends each, with one write to
    /// the store for them all (the stream protocol's Publish), or one per
    /// part where they cross a multiple of `BATCH_ALIGN` offsets.
    pub fn push_batch<I>(&self, queue: &Arc<Queue>, msgs: I) -> store::Result<bool>
    where
        I: IntoIterator<Item = Message>,
        I::IntoIter: ExactSizeIterator,
    {
        let msgs = msgs.into_iter();
        self.append(queue, msgs.len(), |first, time| {
            let msgs: Vec<Arc<Message>> = (first..)
                .zip(msgs)
                .map(|(offset, m)| stored_form(m, offset))
                .collect();
            let mut at = 0;
            while at < msgs.len() {
                let offset = first + at as u64;
                let room = (BATCH_ALIGN - offset % BATCH_ALIGN) as usize;
                let part = &msgs[at..msgs.len().min(at + room)];
                let id = queue.config.store_id;
                queue.store.put_batch(id, seq_of(offset), part, time)?;
                at += part.len();
            }
            Ok(msgs)
        })
    }

    /// Appends the `n` messages `write` stores (given the first offset and
    /// the time), then delivers them to the readers waiting at the end;
    /// false if the stream was deleted (nothing is written).
    fn append<M>(
        &self,
        queue: &Arc<Queue>,
        n: usize,
        write: impl FnOnce(u64, u64) -> store::Result<M>,
    ) -> store::Result<bool>
    where
        M: IntoIterator<Item = Arc<Message>>,
    {
        let dropped = {
            let mut log = self.log.lock();
            if log.deleted {
                return Ok(false);
            }
            let first = log.next;
            let time = crate::util::record_ms();
            let msgs = write(first, time)?;
            if queue.after_commit {
                // Taken after the write: the commit that covers it.
                let ticket = queue.store.ticket();
                log.uncommitted
                    .extend((first..first + n as u64).map(|o| (o, ticket)));
            }
            let segment_bytes = log.limits.segment_bytes;
            let mut rolled = false;
            for msg in msgs {
                let offset = log.next;
                let bytes = msg.body().len() as u64;
                log.next += 1;
                log.bytes += bytes;
                log.mark(offset, time);
                rolled |= log.segments.append(offset, bytes, time, segment_bytes);
                log.keep_in_tail(msg, time);
            }
            self.published
                .fetch_add(log.next - first, Ordering::Relaxed);
            self.deliver(queue, &mut log);
            self.appended.wake();
            if rolled {
                log.retain(time)
            } else {
                None
            }
        };
        if let Some(dropped) = dropped {
            self.forget(queue, dropped);
        }
        Ok(true)
    }

    /// Applies retention with `limits` (the timer, once a second).
    pub fn enforce(&self, queue: &Queue, limits: Limits, now_ms: u64) -> store::Result<()> {
        if let Some(left) = self.unremoved() {
            self.forget(queue, left);
        }
        let dropped = {
            let mut log = self.log.lock();
            if log.deleted {
                return Ok(());
            }
            log.limits = limits;
            log.retain(now_ms)
        };
        if let Some(dropped) = dropped {
            self.forget(queue, dropped);
        }
        Ok(())
    }

    /// Removes from the store the messages retention dropped, and any a
    /// failed removal left before them. A failure is logged (the
    /// publisher whose append rolled the segment is not to blame) and
    /// the next round, a second later at most, goes on from it.
    fn forget(&self, queue: &Queue, dropped: Range<u64>) {
        self.shared.forget_below(dropped.end);
        let mut removed = self.removed.lock();
        // From where removals got to (a failed one left some behind; a
        // later round may have gone past this one's range).
        for offset in *removed..dropped.end {
            if let Err(e) = queue
                .store
                .remove_message(queue.config.store_id, seq_of(offset))
            {
                tracing::error!(
                    stream = %queue.config.name,
                    "cannot remove offset {offset}, dropped by retention: {e}"
                );
                return;
            }
            *removed = offset + 1;
        }
    }

    /// Offsets dropped whose removal failed, to retry (the timer).
    fn unremoved(&self) -> Option<Range<u64>> {
        let first = self.log.lock().first;
        let removed = *self.removed.lock();
        (removed < first).then_some(removed..first)
    }

    /// Adds a reader reading as `spec` says: from its tracked offset if
    /// it has one, else from `spec.start`.
    pub fn add_reader(
        &self,
        queue: &Queue,
        consumer: Arc<Consumer>,
        spec: ReadSpec,
    ) -> store::Result<Attach> {
        let tracked = match &spec.track {
            Some(name) => match self.tracks.lock().get(name) {
                Some(at) => Some(at),
                None => queue.store.tracked_offset(queue.config.store_id, name)?,
            },
            None => None,
        };
        let start = match tracked {
            Some(at) => Start::Offset(at),
            None => self.seek(queue, spec.start)?,
        };
        let mut log = self.log.lock();
        if log.deleted {
            return Ok(Attach::Deleted);
        }
        // Two readers under one name would each write the other's place
        // over (one's unacked messages skipped on resume).
        if let Some(name) = &spec.track {
            if log
                .readers
                .iter()
                .any(|r| r.track.as_ref().is_some_and(|t| &t.name == name))
            {
                return Ok(Attach::NameTaken);
            }
        }
        let cursor = log.resolve(start);
        log.readers.push(Reader {
            consumer,
            cursor,
            waits: None,
            filter: spec.filter,
            track: spec.track.map(Tracked::new),
            ahead: VecDeque::new(),
        });
        Ok(Attach::Added)
    }

    /// Up to `count` messages from `start` on, and about `max_bytes` of
    /// bodies at most (at least one), for a look at the stream (the
    /// API's get): no reader, nothing moves. Each with its offset and
    /// when it was stored (ms since the epoch; 0: not recorded).
    pub fn peek(
        &self,
        queue: &Queue,
        start: Start,
        count: usize,
        max_bytes: usize,
    ) -> store::Result<Vec<(u64, Arc<Message>, u64)>> {
        let mut all = Vec::new();
        self.visit(queue, start, count, max_bytes, false, |o, found| {
            let (m, time) = found.into_message()?;
            all.push((o, m, time));
            Ok(())
        })?;
        Ok(all)
    }

    /// Calls `f` with each message `peek` would return, in order: those
    /// read back from the log as their records where the read left them,
    /// the newest as kept in memory; stops at the first error `f`
    /// returns. Whether it stopped for `max_bytes` (more was readable).
    /// With `chunks`, whole stream batches in the log's files go to `f`
    /// as they lie (`Found::Chunk`, given its first offset).
    pub fn visit(
        &self,
        queue: &Queue,
        start: Start,
        count: usize,
        max_bytes: usize,
        chunks: bool,
        mut f: impl FnMut(u64, Found<'_>) -> store::Result<()>,
    ) -> store::Result<bool> {
        let start = self.seek(queue, start)?;
        let (from, end, tail_first, from_tail) = {
            let mut log = self.log.lock();
            let from = log.resolve(start);
            let (visible, _) = Self::committed_end(queue, &mut log);
            let end = visible.min(from.saturating_add(count as u64));
            let tail_first = log.tail_first();
            let from_tail: Vec<_> = (from.max(tail_first)..end)
                .map(|o| {
                    let (m, time) = &log.tail[(o - tail_first) as usize];
                    (o, Arc::clone(m), *time)
                })
                .collect();
            (from, end, tail_first, from_tail)
        };
        let mut budget = Budget {
            max: max_bytes as u64,
            taken: 0,
            bytes: 0,
        };
        // What is older than the tail is read back, outside the lock.
        let mut at = from;
        let older = tail_first.min(end);
        while at < older && (budget.taken == 0 || budget.left() > 0) {
            let want = (older - at).min(VISIT_BATCH as u64) as usize;
            let (mut last, mut full) = (None, false);
            queue.store.visit_range_within(
                queue.config.store_id,
                seq_of(at),
                want,
                budget.left(),
                chunks,
                |seq, found| {
                    let o = seq.saturating_sub(1);
                    let n = match &found {
                        Found::Chunk(c) => u64::from(c.count),
                        _ => 1,
                    };
                    last = Some(o + n - 1);
                    // A chunk goes whole or not at all.
                    if full || o + n > end {
                        full |= o < end;
                        return Ok(());
                    }
                    if !budget.fits(found.body_len()?) {
                        full = true;
                        return Ok(());
                    }
                    f(o, found)
                },
            )?;
            let Some(last) = last else { break };
            if full {
                return Ok(true);
            }
            at = last + 1;
        }
        for (o, m, time) in from_tail.into_iter().filter(|(o, ..)| *o >= at) {
            if !budget.fits(m.body().len() as u64) {
                return Ok(true);
            }
            f(o, Found::Message(m, time))?;
        }
        Ok(budget.taken > 0 && budget.left() == 0)
    }

    /// The offset a reader starting at `start` reads first.
    pub fn place(&self, queue: &Queue, start: Start) -> store::Result<u64> {
        let start = self.seek(queue, start)?;
        Ok(self.log.lock().resolve(start))
    }

    /// The end of what a reader may read now: in a cluster, what is
    /// committed.
    pub fn readable_end(&self, queue: &Queue) -> u64 {
        let mut log = self.log.lock();
        Self::committed_end(queue, &mut log).0
    }

    /// Whether it was deleted.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Records `offset` under `name` (written before the next commit,
    /// as a reader's tracked offset is): the stream protocol's stored
    /// offsets and publisher sequences.
    pub fn store_tracked(&self, queue: &Arc<Queue>, name: &str, offset: u64) {
        self.track(queue, name, offset);
    }

    /// Held by a named publisher (the stream protocol's) for one batch:
    /// reading the highest publishing id stored under its reference,
    /// appending what is above it and recording the new highest happen
    /// under it, so two publishers with one reference (a reconnect racing
    /// the old connection) never both store an id, and the recorded id
    /// only grows.
    pub fn dedup_guard(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.dedup.lock()
    }

    /// What is recorded under `name`: the newest write, committed or
    /// about to be.
    pub fn tracked(&self, queue: &Queue, name: &str) -> store::Result<Option<u64>> {
        match self.tracks.lock().get(name) {
            Some(at) => Ok(Some(at)),
            None => queue.store.tracked_offset(queue.config.store_id, name),
        }
    }

    /// Removes reader `id` (its tracked offset is written before the next
    /// commit); how many remain.
    pub fn remove_reader(&self, queue: &Arc<Queue>, id: u64) -> usize {
        let mut log = self.log.lock();
        if let Some(at) = log.readers.iter().position(|r| r.consumer.id == id) {
            let mut r = log.readers.remove(at);
            if let Some(t) = &mut r.track {
                let resume = t.to_write(r.cursor).unwrap_or(t.resume_at(r.cursor));
                self.track(queue, &t.name, resume);
            }
        }
        log.readers.len()
    }

    /// Reader `name` resumes at `offset`: written before the next commit.
    fn track(&self, queue: &Arc<Queue>, name: &str, offset: u64) {
        self.tracks.lock().moved(name, offset);
        if !self.track_registered.swap(true, Ordering::AcqRel) {
            let holder: Weak<Queue> = Arc::downgrade(queue);
            queue.store.defer(holder);
        }
    }

    /// Writes the tracked offsets that moved (the queue's deferred write,
    /// just before a commit). A write that fails is logged, not put on the
    /// commit (every confirm in the broker would wait on it): the reader
    /// resumes from its place in memory, or after a restart a little
    /// earlier, and is handed a few messages again.
    pub fn write_tracked(&self, store: &store::Store, queue_id: u64) -> store::Result<()> {
        self.track_registered.store(false, Ordering::Release);
        let moved = self.tracks.lock().take_moved();
        if self.gone.load(Ordering::Acquire) {
            return Ok(());
        }
        for (name, offset) in moved {
            if let Err(e) = store.track_offset(queue_id, &name, offset) {
                tracing::warn!(%name, offset, "cannot record a stream reader's offset: {e}");
            }
        }
        Ok(())
    }

    /// Delivers what the readers can take.
    pub fn dispatch(&self, queue: &Arc<Queue>) {
        let mut log = self.log.lock();
        self.deliver(queue, &mut log);
    }

    /// Readers waiting for the outbox at `at` may take deliveries again.
    pub fn outbox_drained(&self, queue: &Arc<Queue>, at: usize) {
        let mut log = self.log.lock();
        for r in &mut log.readers {
            if r.waits == Some(Refused::Outbox(at)) {
                r.waits = None;
            }
        }
        self.deliver(queue, &mut log);
    }

    /// Consumer `consumer` may have credit again.
    pub fn unpark(&self, queue: &Arc<Queue>, consumer: &Consumer) {
        let mut log = self.log.lock();
        Self::credit_back(&mut log, consumer);
        self.deliver(queue, &mut log);
    }

    /// Settled deliveries: their credit is free (nothing is removed; a
    /// requeue, a reject and a nack are credit too). An ack moves a
    /// tracked reader's offset.
    pub fn settle(&self, queue: &Arc<Queue>, taken: impl Iterator<Item = Unacked>, how: Settle) {
        let mut log = self.log.lock();
        for u in taken {
            let Some(c) = &u.consumer else { continue };
            Self::credit_back(&mut log, c);
            // An ack, or a reject without requeue (the reader is done
            // with it), moves a tracked reader on; a requeue does not: it
            // is read again on resume.
            if how == Settle::Requeue {
                continue;
            }
            if how == Settle::Ack {
                self.acked.fetch_add(1, Ordering::Relaxed);
            }
            let Some(r) = log.readers.iter_mut().find(|r| r.consumer.id == c.id) else {
                continue;
            };
            if let Some(t) = &mut r.track {
                t.acked(u.entry.seq);
                if let Some(at) = t.to_write(r.cursor) {
                    self.track(queue, &t.name, at);
                }
            }
        }
        self.deliver(queue, &mut log);
    }

    fn credit_back(log: &mut Log, consumer: &Consumer) {
        consumer.parked.store(false, Ordering::Relaxed);
        for r in &mut log.readers {
            if r.consumer.id == consumer.id && r.waits == Some(Refused::Credit) {
                r.waits = None;
            }
        }
    }

    /// Marks the stream deleted; its readers' consumers, to be cancelled.
    pub fn delete(&self) -> Vec<Arc<Consumer>> {
        let mut log = self.log.lock();
        log.deleted = true;
        self.gone.store(true, Ordering::Release);
        log.tail.clear();
        log.tail_bytes = 0;
        self.appended.wake_all();
        log.readers.drain(..).map(|r| r.consumer).collect()
    }

    /// Hands each reader what it can take now: in a cluster, only what
    /// is committed, and nothing while the leader's lease is in doubt
    /// (store/lease.rs), as a queue's dispatch does.
    fn deliver(&self, queue: &Arc<Queue>, log: &mut Log) {
        if queue.after_commit && !queue.store.may_deliver() {
            if !log.readers.is_empty() {
                queue.dispatch_when_leased();
            }
            return;
        }
        let (end, waits_for) = Self::committed_end(queue, log);
        for i in 0..log.readers.len() {
            let mut skipped = 0;
            while log.readers[i].waits.is_none() && log.readers[i].cursor < end {
                let Some((offset, msg)) = self.fetch(queue, log, i) else {
                    break;
                };
                if offset >= end {
                    break;
                }
                let r = &mut log.readers[i];
                // The filter reads the stored label (a stream protocol
                // publisher's is in the stored property list, not in the
                // AMQP 0-9-1 form below).
                if r.filter.as_ref().is_some_and(|f| !f.matches(&msg)) {
                    r.cursor = offset + 1;
                    skipped += 1;
                    if skipped == SKIP_BUDGET {
                        Self::go_on_later(queue);
                        break;
                    }
                    continue;
                }
                // Readers here speak AMQP 0-9-1: a stream protocol
                // publisher's message is read as that.
                let msg = amqp10::readable(msg, offset);
                let entry = Entry {
                    msg,
                    seq: offset,
                    redelivered: false,
                    stored: false,
                    deadline: 0,
                    enqueued: 0,
                    returned: 0,
                };
                let consumer = Arc::clone(&r.consumer);
                let r = &mut log.readers[i];
                match consumer.sink.try_deliver(&consumer, queue, entry) {
                    Ok(()) => {
                        r.cursor = offset + 1;
                        self.delivered.fetch_add(1, Ordering::Relaxed);
                        if let Some(t) = &mut r.track {
                            t.delivered(offset);
                        }
                    }
                    Err((_, why)) => {
                        if why == Refused::Credit {
                            consumer.parked.store(true, Ordering::Relaxed);
                        }
                        r.waits = Some(why);
                    }
                }
            }
        }
        // A reader that reached what is not committed yet is woken by
        // the commit.
        if let Some(ticket) = waits_for {
            if log
                .readers
                .iter()
                .any(|r| r.waits.is_none() && r.cursor >= end)
            {
                queue.dispatch_at_commit(ticket);
            }
        }
    }

    /// The end of what readers may see (the first offset not committed
    /// yet, in a cluster; else the next), and the commit that moves it.
    fn committed_end(queue: &Queue, log: &mut Log) -> (u64, Option<u64>) {
        if !queue.after_commit {
            return (log.next, None);
        }
        let committed = queue.store.committed_now();
        while log
            .uncommitted
            .front()
            .is_some_and(|&(_, t)| t <= committed)
        {
            log.uncommitted.pop_front();
        }
        match log.uncommitted.front() {
            Some(&(offset, ticket)) => (offset, Some(ticket)),
            None => (log.next, None),
        }
    }

    /// A delivery round for `queue` soon (a filtered reader ran out of
    /// its budget for this one).
    fn go_on_later(queue: &Arc<Queue>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let q = Arc::clone(queue);
        runtime.spawn(async move {
            tokio::task::yield_now().await;
            q.dispatch();
        });
    }

    /// The message reader `i` reads next (at its cursor, or the first
    /// kept after it), from the tail or from what it read ahead; None at
    /// the end, or if the log cannot be read.
    fn fetch(&self, queue: &Queue, log: &mut Log, i: usize) -> Option<(u64, Arc<Message>)> {
        loop {
            let (next, tail_first) = (log.next, log.tail_first());
            let batch = log.read_batch();
            let r = &mut log.readers[i];
            if r.cursor >= next {
                return None;
            }
            if r.cursor >= tail_first {
                r.ahead.clear();
                let (msg, _) = &log.tail[(r.cursor - tail_first) as usize];
                return Some((r.cursor, Arc::clone(msg)));
            }
            while r.ahead.front().is_some_and(|(at, _)| *at < r.cursor) {
                r.ahead.pop_front();
            }
            if let Some((at, msg)) = r.ahead.front() {
                // Past the cursor: what lay between is gone.
                r.cursor = *at;
                return Some((*at, Arc::clone(msg)));
            }
            match self.read_back(queue, r.cursor, batch, READ_AHEAD_BYTES) {
                Ok(read) if read.is_empty() => r.cursor = tail_first,
                Ok(read) => r.ahead = read,
                Err(e) => {
                    tracing::error!(
                        stream = %queue.config.name,
                        "cannot read offset {} back: {e}", r.cursor
                    );
                    return None;
                }
            }
        }
    }

    /// Up to `n` messages from offset `from` on, and about `max_bytes` of
    /// bodies (at least one), read back from the log.
    fn read_back(
        &self,
        queue: &Queue,
        from: u64,
        n: usize,
        max_bytes: u64,
    ) -> store::Result<VecDeque<(u64, Arc<Message>)>> {
        let batch =
            queue
                .store
                .load_range_within(queue.config.store_id, seq_of(from), n, max_bytes)?;
        Ok(batch
            .into_iter()
            .map(|(seq, m)| (seq.saturating_sub(1), m))
            .collect())
    }
}

/// What a read may still take: at least one message, about `max` bytes
/// of bodies.
struct Budget {
    max: u64,
    taken: usize,
    bytes: u64,
}

impl Budget {
    /// Whether a body of `len` bytes fits (it is then counted).
    fn fits(&mut self, len: u64) -> bool {
        let fit = self.taken == 0 || self.bytes + len <= self.max;
        if fit {
            self.taken += 1;
            self.bytes += len;
        }
        fit
    }

    fn left(&self) -> u64 {
        self.max.saturating_sub(self.bytes)
    }
}

#[cfg(test)]
mod tests;
