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
//! behind move on to what is kept.

pub mod offset;
mod retention;

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use amq_protocol::types::AMQPValue;
use parking_lot::Mutex;

use super::{Consumer, Entry, Queue, Refused, Unacked};
use crate::message::Message;
use crate::store;
pub use offset::Start;
use retention::{Limits, Segments};

/// Bytes of the newest messages a stream keeps in memory for readers
/// near its end.
const TAIL_BYTES: usize = 8 << 20;
/// Messages read back from the log at a time for one reader.
const READ_BATCH: usize = 256;

/// A stream's state, beside its queue's.
#[derive(Default)]
pub struct Stream {
    log: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    /// The offset of the first message kept.
    first: u64,
    /// The offset the next message gets.
    next: u64,
    /// Body bytes of the messages kept.
    bytes: u64,
    /// The newest messages, oldest first, and their body bytes.
    tail: VecDeque<Arc<Message>>,
    tail_bytes: usize,
    /// (second since the epoch, the offset of the first message stored
    /// in it), one per second that saw an append, oldest first.
    marks: VecDeque<(u64, u64)>,
    readers: Vec<Reader>,
    deleted: bool,
    /// Its segments, and the retention limits last read.
    segments: Segments,
    limits: Limits,
}

struct Reader {
    consumer: Arc<Consumer>,
    /// The offset it reads next.
    cursor: u64,
    /// Why it does not take deliveries now (None: it does, or it is at
    /// the end and waits for an append).
    waits: Option<Refused>,
}

/// What a stream holds, for the API and declare-ok.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extent {
    pub first: u64,
    pub next: u64,
    pub bytes: u64,
}

impl Extent {
    /// Messages kept.
    pub fn messages(&self) -> u64 {
        self.next - self.first
    }
}

impl Log {
    /// The offset of the first message in `tail`.
    fn tail_first(&self) -> u64 {
        self.next - self.tail.len() as u64
    }

    fn keep_in_tail(&mut self, msg: Arc<Message>) {
        self.tail_bytes += msg.body().len();
        self.tail.push_back(msg);
        while self.tail_bytes > TAIL_BYTES && self.tail.len() > 1 {
            if let Some(old) = self.tail.pop_front() {
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
            if let Some(m) = self.tail.pop_front() {
                self.tail_bytes -= m.body().len();
            }
        }
        for r in &mut self.readers {
            r.cursor = r.cursor.max(first);
        }
        Some(old..first)
    }

    /// Where a reader asking for `start` begins.
    fn resolve(&self, start: Start) -> u64 {
        match start {
            Start::First => self.first,
            Start::Last => self.next.saturating_sub(1).max(self.first),
            Start::Next => self.next,
            Start::Offset(n) => n.clamp(self.first, self.next),
            Start::Time(ms) => {
                let second = ms.div_ceil(1000);
                let at = self.marks.partition_point(|&(s, _)| s < second);
                self.marks
                    .get(at)
                    .map_or(self.next, |&(_, offset)| offset.max(self.first))
            }
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
            if let Err(e) = s.enforce(&q, live, crate::util::coarse_wall_ms()) {
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
        }
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
        let dropped = {
            let mut log = self.log.lock();
            if log.deleted {
                return Ok(false);
            }
            let offset = log.next;
            let msg =
                Arc::new(msg.with_header("x-stream-offset", AMQPValue::LongLongInt(offset as i64)));
            let time = crate::util::coarse_wall_ms();
            queue
                .store
                .put_message(queue.config.store_id, seq_of(offset), &msg, 0)?;
            let bytes = msg.body().len() as u64;
            log.next += 1;
            log.bytes += bytes;
            log.mark(offset, time);
            let segment_bytes = log.limits.segment_bytes;
            let rolled = log.segments.append(offset, bytes, time, segment_bytes);
            log.keep_in_tail(msg);
            self.deliver(queue, &mut log);
            if rolled {
                log.retain(time)
            } else {
                None
            }
        };
        if let Some(dropped) = dropped {
            Self::forget(queue, dropped)?;
        }
        Ok(true)
    }

    /// Applies retention with `limits` (the timer, once a second).
    pub fn enforce(&self, queue: &Queue, limits: Limits, now_ms: u64) -> store::Result<()> {
        let dropped = {
            let mut log = self.log.lock();
            if log.deleted {
                return Ok(());
            }
            log.limits = limits;
            log.retain(now_ms)
        };
        match dropped {
            Some(dropped) => Self::forget(queue, dropped),
            None => Ok(()),
        }
    }

    /// Removes from the store the messages retention dropped.
    fn forget(queue: &Queue, dropped: Range<u64>) -> store::Result<()> {
        for offset in dropped {
            queue
                .store
                .remove_message(queue.config.store_id, seq_of(offset))?;
        }
        Ok(())
    }

    /// Takes back what the log holds of the stream (a start).
    pub fn recover(&self, queue: &Queue) -> store::Result<u64> {
        let mut log = self.log.lock();
        log.limits = limits(&queue.args);
        let segment_bytes = log.limits.segment_bytes;
        let mut first = None;
        for item in queue.store.messages(queue.config.store_id) {
            let m = item?;
            let offset = m.seq.saturating_sub(1);
            first.get_or_insert(offset);
            let bytes = m.message.body().len() as u64;
            log.next = offset + 1;
            log.bytes += bytes;
            log.mark(offset, m.time);
            log.segments.append(offset, bytes, m.time, segment_bytes);
            log.keep_in_tail(m.message);
        }
        log.first = first.unwrap_or(log.next);
        Ok(log.next - log.first)
    }

    /// Adds a reader starting at `start`.
    pub fn add_reader(&self, consumer: Arc<Consumer>, start: Start) -> bool {
        let mut log = self.log.lock();
        if log.deleted {
            return false;
        }
        let cursor = log.resolve(start);
        log.readers.push(Reader {
            consumer,
            cursor,
            waits: None,
        });
        true
    }

    /// Removes reader `id`; how many remain.
    pub fn remove_reader(&self, id: u64) -> usize {
        let mut log = self.log.lock();
        log.readers.retain(|r| r.consumer.id != id);
        log.readers.len()
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
    /// requeue, a reject and a nack are credit too).
    pub fn settle(&self, queue: &Arc<Queue>, taken: impl Iterator<Item = Unacked>) {
        let mut log = self.log.lock();
        for u in taken {
            if let Some(c) = &u.consumer {
                Self::credit_back(&mut log, c);
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
        log.tail.clear();
        log.tail_bytes = 0;
        log.readers.drain(..).map(|r| r.consumer).collect()
    }

    /// Hands each reader what it can take now.
    fn deliver(&self, queue: &Arc<Queue>, log: &mut Log) {
        let mut read: VecDeque<(u64, Arc<Message>)> = VecDeque::new();
        for i in 0..log.readers.len() {
            read.clear();
            loop {
                let (cursor, waits) = (log.readers[i].cursor, log.readers[i].waits);
                if waits.is_some() || cursor >= log.next {
                    break;
                }
                let msg = if cursor >= log.tail_first() {
                    Arc::clone(&log.tail[(cursor - log.tail_first()) as usize])
                } else {
                    match read.front() {
                        Some((at, _)) if *at == cursor => match read.pop_front() {
                            Some((_, m)) => m,
                            None => break,
                        },
                        _ => {
                            read = match self.read_back(queue, cursor) {
                                Ok(batch) => batch,
                                Err(e) => {
                                    tracing::error!(
                                        stream = %queue.config.name,
                                        "cannot read offset {cursor} back: {e}"
                                    );
                                    break;
                                }
                            };
                            match read.front() {
                                // A message the log no longer has: on from
                                // the next it has.
                                Some((at, _)) if *at > cursor => {
                                    log.readers[i].cursor = *at;
                                    continue;
                                }
                                Some(_) => continue,
                                None => {
                                    log.readers[i].cursor = log.tail_first();
                                    continue;
                                }
                            }
                        }
                    }
                };
                let entry = Entry {
                    msg,
                    seq: cursor,
                    redelivered: false,
                    stored: false,
                    deadline: 0,
                    enqueued: 0,
                    returned: 0,
                };
                let consumer = Arc::clone(&log.readers[i].consumer);
                match consumer.sink.try_deliver(&consumer, queue, entry) {
                    Ok(()) => log.readers[i].cursor = cursor + 1,
                    Err((_, why)) => {
                        if why == Refused::Credit {
                            consumer.parked.store(true, Ordering::Relaxed);
                        }
                        log.readers[i].waits = Some(why);
                    }
                }
            }
        }
    }

    /// Messages from offset `from` on, read back from the log.
    fn read_back(&self, queue: &Queue, from: u64) -> store::Result<VecDeque<(u64, Arc<Message>)>> {
        let batch = queue
            .store
            .load_range(queue.config.store_id, seq_of(from), READ_BATCH)?;
        Ok(batch
            .into_iter()
            .map(|(seq, m)| (seq.saturating_sub(1), m))
            .collect())
    }
}
