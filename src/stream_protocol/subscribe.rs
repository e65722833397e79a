//! Subscriptions: each reads its stream from its offset on its own task
//! and sends chunks, one per credit, as RabbitMQ's stream protocol counts
//! them. A chunk is what was readable at once (at most `CHUNK_MESSAGES`
//! messages and about the frame max of bytes): Warren's log has no
//! chunks of its own, so a reader gets batches as large as it lets it
//! have. An unfiltered reader writes each chunk (chunk.rs) as it reads
//! it: what was read back from the log goes from the read's buffer into
//! the frame, one copy. At the end of the stream the task waits
//! for the next append (in a cluster, its commit); a stream deleted under
//! it ends it (its connection drops it and sends a MetadataUpdate). A
//! subscription with `filter.N` properties gets only the messages labelled with one of those values
//! (and unlabelled ones with `match-unfiltered`), exactly: each run of
//! consecutive offsets it takes is a chunk, where RabbitMQ sends whole
//! chunks its Bloom filter lets through for the client to filter again. A single active consumer reads only
//! while its group has it active (groups.rs); until then its task only
//! watches for the stream to go, and its credit adds up.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BufMut;
use tokio::sync::Semaphore;

use super::chunk::{Chunk, ChunkFrame};
use super::codes::*;
use super::groups::{Inbox, Membership};
use super::out::Out;
use super::wire;
use crate::message::Message;
use crate::queue::stream::{Filter, Start, Stream};
use crate::queue::Queue;
use crate::store::Store;

/// At most this many messages go in one chunk.
pub(crate) const CHUNK_MESSAGES: usize = 4096;
/// An unfiltered reader's chunks end at multiples of this many offsets
/// (or of a larger power of two of them, `chunk_unit`), or at its byte
/// budget, so that readers that started anywhere meet at the same chunks.
/// Batches are stored in records that end at these multiples too.
const CHUNK_UNIT: u64 = crate::queue::stream::BATCH_ALIGN;

/// The offsets an unfiltered chunk ends at multiples of: `CHUNK_UNIT`,
/// doubled (up to `CHUNK_MESSAGES`) while that many messages of
/// `average` body bytes fill at most half of `budget`. Small messages
/// get large chunks: a chunk costs a credit round trip and a read off the
/// runtime whatever it holds, and at 16 bytes 512 to a chunk was half a
/// reader's CPU. Every unit divides the larger ones, so readers whose
/// average differed still meet.
fn chunk_unit(average: u64, budget: usize) -> u64 {
    let mut unit = CHUNK_UNIT;
    while unit * 2 <= CHUNK_MESSAGES as u64
        && (unit * 2).saturating_mul(average.max(1)) <= budget as u64 / 2
    {
        unit *= 2;
    }
    unit
}

/// A subscription: its credit, and the task that reads for it (a single
/// active consumer that is not active has one that only watches for
/// its stream to go).
pub struct Subscription {
    pub credit: Arc<Semaphore>,
    task: tokio::task::JoinHandle<()>,
    /// Its place in the management API's list.
    _listed: super::view::Listed,
    reading: bool,
    /// What it reads and where it tells.
    pub target: Target,
    /// Its place in a single active consumer group, if it is in one.
    pub sac: Option<Sac>,
}

/// A subscription's stream, and how it reaches its client and connection.
#[derive(Clone)]
pub struct Target {
    pub stream: String,
    pub queue: Arc<Queue>,
    pub out: Out,
    pub ending: Ending,
    /// Its credit and counters (what the management API shows).
    pub stats: Arc<super::view::ConsumerStats>,
}

/// How a subscription's task tells its connection that it ended by
/// itself (its stream went), so the connection drops it (and its place in
/// a group) as RabbitMQ does.
#[derive(Clone)]
pub struct Ending {
    pub inbox: Arc<Inbox>,
    pub id: u8,
    /// Tells this subscription from an earlier one with its id.
    pub serial: u64,
}

/// A single active consumer's state on its connection.
pub struct Sac {
    pub membership: Membership,
    /// The offset specification it subscribed with (kind, value).
    pub spec: (u16, u64),
    /// The messages it takes, if not all.
    pub filter: Option<Arc<Filter>>,
    /// The ConsumerUpdate the client has not answered yet: its
    /// correlation id, whether it said active, the step-down's epoch,
    /// and when it was sent.
    pub asked: Option<Asked>,
}

#[derive(Clone, Copy)]
pub struct Asked {
    pub correlation: u32,
    pub active: bool,
    pub epoch: u64,
    pub at: Instant,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Subscription {
    /// A subscription that reads with `reader` from the start, listed
    /// by `listed`.
    pub fn reading(reader: Reader, listed: super::view::Listed) -> Self {
        let credit = Arc::clone(&reader.target.stats.credit);
        let target = reader.target.clone();
        target.stats.active.store(true, Ordering::Relaxed);
        target.stats.offset.store(reader.cursor, Ordering::Relaxed);
        let task = tokio::spawn(read(reader, Arc::clone(&credit)));
        Subscription {
            credit,
            task,
            _listed: listed,
            reading: true,
            target,
            sac: None,
        }
    }

    /// A single active consumer that waits to be made active, its credit
    /// kept for then.
    pub fn waiting(target: Target, sac: Sac, listed: super::view::Listed) -> Self {
        Subscription {
            credit: Arc::clone(&target.stats.credit),
            task: tokio::spawn(watch(target.clone())),
            _listed: listed,
            reading: false,
            target,
            sac: Some(sac),
        }
    }

    /// Whether it reads (else credit only adds up).
    pub fn is_reading(&self) -> bool {
        self.reading
    }

    /// Starts reading with `reader` (made active).
    pub fn start(&mut self, reader: Reader) {
        self.target.stats.active.store(true, Ordering::Relaxed);
        let first = reader.cursor;
        self.target.stats.offset.store(first, Ordering::Relaxed);
        self.task.abort();
        self.task = tokio::spawn(read(reader, Arc::clone(&self.credit)));
        self.reading = true;
    }

    /// Stops reading (no longer active): once this returns its reader has
    /// ended, so nothing more is sent (a credit it held and did not use
    /// is given back); it goes on watching for its stream to go.
    pub async fn stop(&mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
        self.task = tokio::spawn(watch(self.target.clone()));
        self.reading = false;
        self.target.stats.active.store(false, Ordering::Relaxed);
    }
}

/// Has the connection tell the client when the stream goes, reading
/// nothing.
async fn watch(t: Target) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if t.queue.stream().is_none_or(|s| s.is_gone()) {
            went(&t);
            return;
        }
        if t.out.closed() {
            return;
        }
    }
}

/// The subscription's stream is no more (or cannot be read): the
/// connection drops the subscription and tells the client.
fn went(t: &Target) {
    t.ending.inbox.ended(t.ending.id, t.ending.serial);
}

/// A subscription names at most this many filter values (clients send a
/// few; each message is tested against each).
const MAX_FILTER_VALUES: usize = 64;

/// What a Subscribe asks (after its correlation id).
pub struct Subscribe<'a> {
    pub id: u8,
    pub stream: &'a str,
    /// The offset specification (kind, value).
    pub spec: (u16, u64),
    pub credit: u16,
    pub properties: Vec<(&'a str, &'a str)>,
}

impl<'a> Subscribe<'a> {
    pub fn parse(f: &mut wire::Fields<'a>) -> Result<Subscribe<'a>, wire::Malformed> {
        let id = f.u8()?;
        let stream = f.string()?;
        let kind = f.u16()?;
        // Only an offset and a timestamp carry a value.
        let value = if matches!(kind, 4 | 5) { f.u64()? } else { 0 };
        let credit = f.u16()?;
        // The Java client leaves the array out when it is empty.
        let properties = if f.is_empty() { Vec::new() } else { f.pairs()? };
        Ok(Subscribe {
            id,
            stream,
            spec: (kind, value),
            credit,
            properties,
        })
    }

    /// The value of property `name`, if given.
    pub fn property(&self, name: &str) -> Option<&'a str> {
        self.properties
            .iter()
            .find(|(k, _)| *k == name)
            .map(|p| p.1)
    }

    /// Whether it joins a single active consumer group.
    pub fn single_active(&self) -> bool {
        self.property("single-active-consumer") == Some("true")
    }

    /// Where it starts; PRECONDITION_FAILED for an unknown specification.
    pub fn start(&self) -> Result<Start, u16> {
        start_of(self.spec.0, self.spec.1).ok_or(PRECONDITION_FAILED)
    }

    /// The messages it takes (`filter.N`, `match-unfiltered`), None for
    /// all; PRECONDITION_FAILED past `MAX_FILTER_VALUES` values.
    pub fn filter(&self) -> Result<Option<Arc<Filter>>, u16> {
        let values: Vec<Vec<u8>> = self
            .properties
            .iter()
            .filter(|(k, _)| k.starts_with("filter."))
            .map(|(_, v)| v.as_bytes().to_vec())
            .collect();
        if values.len() > MAX_FILTER_VALUES {
            return Err(PRECONDITION_FAILED);
        }
        let unfiltered = self.property("match-unfiltered") == Some("true");
        Ok(Filter::of_values(values, unfiltered).map(Arc::new))
    }
}

/// Whether a client whose ExchangeCommandVersions lists `theirs` (key,
/// min, max) takes Deliver version 2.
pub fn speaks_deliver_v2(theirs: &[(u16, u16, u16)]) -> bool {
    theirs
        .iter()
        .any(|&(k, min, max)| k == DELIVER && min <= 2 && max >= 2)
}

/// Where a subscription starts, from its offset specification.
pub fn start_of(kind: u16, value: u64) -> Option<Start> {
    Some(match kind {
        1 => Start::First,
        2 => Start::Last,
        3 => Start::Next,
        4 => Start::Offset(value),
        5 => Start::Time((value as i64).max(0) as u64),
        _ => return None,
    })
}

/// What a subscription reads and where it sends it.
pub struct Reader {
    pub id: u8,
    pub target: Target,
    /// The offset it reads next.
    pub cursor: u64,
    /// The connection's frame max.
    pub frame_max: u32,
    pub store: Arc<Store>,
    /// The messages it takes, if not all (`filter.N` properties).
    pub filter: Option<Arc<Filter>>,
    /// Its chunks go as Deliver version 2 (the client asked for it).
    pub v2: bool,
}

async fn read(r: Reader, credit: Arc<Semaphore>) {
    let Reader {
        id,
        target,
        mut cursor,
        frame_max,
        store,
        filter,
        v2,
    } = r;
    let Target {
        stream: name,
        queue,
        out,
        ..
    } = &target;
    // Bodies in one chunk, about; the frame max bounds the whole frame.
    let budget = (frame_max as usize).saturating_sub(1024).max(1024);
    let mut committed = store.flushed();
    let after_commit = store.delivers_after_commit();
    // Read and not sent yet (a filtered reader's): runs of consecutive
    // offsets, each sent as a chunk of its own (a chunk's offsets have no
    // gaps).
    let mut pending: Vec<(u64, Arc<Message>, u64)> = Vec::new();
    // The room a chunk is built in: the last one's size (a chunk that
    // outgrows it grows; one much smaller is copied out, chunk.rs).
    let mut room = 64 << 10;
    loop {
        // The next chunk is read before its credit comes: RabbitMQ's
        // clients subscribe with one credit and give one back as they
        // finish a chunk, so a read after that left the client idle while
        // it ran.
        let c = loop {
            let Some(stream) = queue.stream().filter(|s| !s.is_gone()) else {
                went(&target);
                return;
            };
            if !pending.is_empty() {
                break super::chunk::take_run(&mut pending);
            }
            // A chunk another reader made is taken here: no hop to a
            // blocking thread for a lookup.
            if filter.is_none() {
                if let Some(c) = shared_chunk(stream, cursor, budget) {
                    break c;
                }
            }
            let (q, f) = (Arc::clone(queue), filter.clone());
            let at = cursor;
            // Read off the runtime: unfiltered, a chunk written as it is
            // read; filtered, the last offset read and what the filter
            // keeps of it.
            let read = tokio::task::spawn_blocking(move || {
                let s = q.stream()?;
                Some(match f {
                    None => read_chunk(&q, s, at, budget, room).map(Read::Chunk),
                    Some(f) => {
                        s.peek(&q, Start::Offset(at), CHUNK_MESSAGES, budget)
                            .map(|mut batch| {
                                let last = batch.last().map(|&(o, ..)| o);
                                batch.retain(|(_, m, _)| f.matches(m));
                                Read::Filtered(last, batch)
                            })
                    }
                })
            })
            .await;
            match read {
                Ok(Some(Ok(Read::Chunk(c)))) if c.entries > 0 => break c,
                Ok(Some(Ok(Read::Filtered(Some(last), kept)))) => {
                    cursor = last + 1;
                    // All filtered out: read on.
                    pending = kept;
                    continue;
                }
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(e))) => {
                    // The client is told the stream is not available (it
                    // may subscribe again), rather than left waiting.
                    tracing::error!(stream = %name, "a subscription cannot read: {e}");
                    went(&target);
                    return;
                }
                // The stream went, or the read failed: told the same.
                _ => {
                    went(&target);
                    return;
                }
            }
            // Nothing readable: wait for an append, a commit (in a
            // cluster, what was appended becomes readable at its commit),
            // or a second (the stream may go).
            let readable = || (stream.readable_end(queue) > cursor).then_some(());
            tokio::select! {
                _ = stream.appended.after(readable) => {}
                _ = committed.changed(), if after_commit => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if out.closed() {
                return;
            }
        };
        // Without credit it still notices its stream go (each second);
        // a credit already there is taken without a timer.
        let permit = match credit.try_acquire() {
            Ok(p) => Ok(p),
            Err(_) => loop {
                tokio::select! {
                    p = credit.acquire() => break p,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {
                        if queue.stream().is_none_or(|s| s.is_gone()) {
                            went(&target);
                            return;
                        }
                        if out.closed() {
                            return;
                        }
                    }
                }
            },
        };
        // Held until its chunk is sent: a reader stopped before that gives
        // it back.
        let Ok(permit) = permit else {
            return;
        };
        let (n, last) = (c.entries, c.last());
        cursor = cursor.max(last + 1);
        room = c.copied();
        // Deliver 2 names what is committed: at least what is sent.
        let committed = v2.then(|| {
            let end = queue.stream().map_or(0, |s| s.readable_end(queue));
            end.saturating_sub(1).max(last)
        });
        let (head, parts) = c.frame(id, committed);
        if !out.send_chunk(head, parts).await {
            return;
        }
        permit.forget();
        target.stats.sent(n as u64, last);
    }
}

/// What a reader read: a chunk, or (filtered) the last offset read and
/// the messages the filter kept.
enum Read {
    Chunk(Chunk),
    Filtered(Option<u64>, Vec<(u64, Arc<Message>, u64)>),
}

/// The chunk from offset `at` of stream `s` (of `queue`): at most to the
/// next multiple of `chunk_unit` and about `budget` bytes of bodies,
/// so that readers that started anywhere meet at the same chunks after
/// their first. One another reader of the stream made is taken as it
/// is; one this reader makes (in `room` bytes to begin with) is shared
/// if it is whole (more could not have gone in).
fn read_chunk(
    queue: &Queue,
    s: &Stream,
    at: u64,
    budget: usize,
    room: usize,
) -> crate::store::Result<Chunk> {
    if let Some(c) = shared_chunk(s, at, budget) {
        return Ok(c);
    }
    let key = budget as u64;
    let unit = chunk_unit(s.average_body_len(), budget);
    let count = (unit - at % unit) as usize;
    let mut c = ChunkFrame::new(room.min(budget));
    let full = s.visit(queue, Start::Offset(at), count, budget, true, |o, found| {
        c.push_found(o, found)
    })?;
    let c = c.finish();
    if c.entries > 0 && (full || usize::from(c.entries) == count) {
        s.shared.put(c.first, key, Arc::new(c.clone()));
    }
    Ok(c)
}

/// The chunk from offset `at` for `budget` that another reader of `s`
/// made, if it is kept.
fn shared_chunk(s: &Stream, at: u64, budget: usize) -> Option<Chunk> {
    let c = s.shared.get(at, budget as u64)?;
    c.downcast_ref::<Chunk>().cloned()
}

/// Tells the client its stream is no more.
pub async fn gone(out: &Out, name: &str) {
    out.write(|o| {
        wire::frame(o, METADATA_UPDATE, 1, |o| {
            o.put_u16(STREAM_NOT_AVAILABLE);
            wire::put_str(o, name);
        })
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliver_2_is_for_clients_that_list_it() {
        assert!(speaks_deliver_v2(&[(DELIVER, 1, 2)]));
        assert!(!speaks_deliver_v2(&[(DELIVER, 1, 1), (PUBLISH, 1, 2)]));
    }

    #[test]
    fn offset_specifications() {
        assert_eq!(start_of(1, 0), Some(Start::First));
        assert_eq!(start_of(4, 9), Some(Start::Offset(9)));
        assert_eq!(start_of(5, 1_000), Some(Start::Time(1_000)));
        assert_eq!(start_of(9, 0), None);
    }

    /// Small messages get larger chunks; every unit is a power-of-two
    /// multiple of the least, so units that differ still line up.
    #[test]
    fn chunk_units_grow_for_small_messages_and_line_up() {
        let budget = (1 << 20) - 1024;
        for (average, unit) in [(0, 4096), (16, 4096), (100, 4096), (200, 2048)] {
            assert_eq!(chunk_unit(average, budget), unit, "{average} bytes");
        }
        for average in [1024, 8192, 1 << 20] {
            assert_eq!(chunk_unit(average, budget), CHUNK_UNIT, "{average} bytes");
        }
        for average in [0, 100, 200, 300, 600, 1024] {
            let unit = chunk_unit(average, budget);
            assert!(unit.is_power_of_two() && unit.is_multiple_of(CHUNK_UNIT));
            assert!(unit * average.max(1) <= budget as u64 / 2 || unit == CHUNK_UNIT);
        }
        assert_eq!(chunk_unit(16, 4096), CHUNK_UNIT, "a small frame max");
    }
}
