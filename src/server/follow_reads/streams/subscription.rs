//! A stream protocol subscription served from this follower's copy: its
//! start placed with what this node applied (once it applied what was
//! committed when the Subscribe came), then chunks read from the applied
//! message log after its cursor, one per credit, as the leader's
//! subscriptions send them (stream_protocol/subscribe.rs). At the end it
//! waits for the next applied entry; a stream deleted under it ends it
//! with a MetadataUpdate, as on the leader.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;
use tracing::warn;

use super::{answer, Shared};
use crate::message::Message;
use crate::queue::stream::{offset_of, Filter, Start};
use crate::server::follow_reads::reader::{blocking, start_offset, CATCH_UP, STILL_THERE};
use crate::server::follow_reads::Reads;
use crate::store::{Found, Store};
use crate::stream_protocol::chunk::{self, Chunk, ChunkFrame};
use crate::stream_protocol::codes::{INTERNAL_ERROR, OK, SUBSCRIBE};
use crate::stream_protocol::out::Out;
use crate::stream_protocol::subscribe::{self, Subscribe, CHUNK_MESSAGES};

/// What a subscription here reads.
pub(super) struct Plan {
    queue_id: u64,
    start: Start,
    filter: Option<Arc<Filter>>,
}

/// How a Subscribe is served here, if this node may serve it: it joins no
/// single active consumer group, its offset specification and filter are
/// ones the leader takes, and it names a stream this node applied that
/// `user` may read in `vhost`. None leaves it to the leader.
pub(super) fn plan(reads: &Reads, asked: &Subscribe<'_>, user: &str, vhost: &str) -> Option<Plan> {
    if asked.single_active() {
        return None;
    }
    let start = asked.start().ok()?;
    let filter = asked.filter().ok()?;
    let queue_id = reads.readable(user, vhost, asked.stream)?;
    Some(Plan {
        queue_id,
        start,
        filter,
    })
}

/// A subscription here.
pub(super) struct Sub {
    pub id: u8,
    /// Tells it from an earlier subscription with its id.
    pub serial: u64,
    /// The Subscribe's, answered once the start is placed.
    pub correlation: u32,
    pub stream: String,
    pub vhost: String,
    pub plan: Plan,
    pub credit: Arc<Semaphore>,
    /// What was committed when the Subscribe came.
    pub committed: u64,
    /// The connection's frame max.
    pub frame_max: u32,
    /// Its chunks go as Deliver version 2.
    pub v2: bool,
}

/// Serves `sub` until it is unsubscribed (its task aborted), the
/// connection ends, or its stream goes.
pub(super) async fn serve(shared: Arc<Shared>, reads: Arc<Reads>, out: Out, sub: Sub) {
    let queue = sub.plan.queue_id;
    let mut applied = reads.applied.clone();
    let caught_up = applied.wait_for(|&a| a >= sub.committed);
    let _ = tokio::time::timeout(CATCH_UP, caught_up).await;
    let store = Arc::clone(&reads.store);
    let start = sub.plan.start;
    let placed = blocking(move || start_offset(&store, queue, start)).await;
    let mut cursor = match placed {
        Ok(c) => c,
        Err(e) => {
            warn!(stream = %sub.stream, vhost = %sub.vhost, "a follower's subscription cannot start: {e}");
            forget(&shared, &sub);
            let _ = out
                .send(answer(SUBSCRIBE, sub.correlation, INTERNAL_ERROR))
                .await;
            return;
        }
    };
    // Answered before its first chunk.
    if !out.send(answer(SUBSCRIBE, sub.correlation, OK)).await {
        return;
    }
    // Bodies in one chunk, about, as the leader's.
    let budget = (sub.frame_max as u64).saturating_sub(1024).max(1024);
    // Read and not sent yet, in order.
    let mut ready: VecDeque<Chunk> = VecDeque::new();
    let mut checked = Instant::now();
    loop {
        // Without credit it still notices its stream go.
        let permit = loop {
            tokio::select! {
                p = sub.credit.acquire() => break p,
                _ = tokio::time::sleep(STILL_THERE) => {
                    if !reads.is_stream(&sub.vhost, &sub.stream, queue) {
                        return gone(&shared, &out, &sub).await;
                    }
                }
            }
        };
        let Ok(permit) = permit else { return };
        while ready.is_empty() {
            applied.borrow_and_update();
            let store = Arc::clone(&reads.store);
            let (from, filter) = (cursor + 1, sub.plan.filter.clone());
            let read = move || read_chunks(&store, queue, from, budget, filter.as_deref());
            let (last, chunks) = match blocking(read).await {
                Ok(read) => read,
                Err(e) => {
                    warn!(stream = %sub.stream, vhost = %sub.vhost, "a follower's subscription stops: {e}");
                    return gone(&shared, &out, &sub).await;
                }
            };
            if let Some(last) = last {
                // The cursor is the next offset: the last seq read.
                cursor = last;
                ready.extend(chunks);
                continue;
            }
            // At the end: is the stream still there (now and then), else
            // wait for what is applied next.
            if checked.elapsed() >= STILL_THERE {
                if !reads.is_stream(&sub.vhost, &sub.stream, queue) {
                    return gone(&shared, &out, &sub).await;
                }
                checked = Instant::now();
            }
            tokio::select! {
                r = applied.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(STILL_THERE) => {}
            }
        }
        let Some(c) = ready.pop_front() else { continue };
        // Deliver 2 names what is committed: here, all that is applied,
        // which is at least what was read.
        let committed = sub.v2.then_some(cursor.saturating_sub(1));
        let (head, parts) = c.frame(sub.id, committed);
        // Counted as it goes out (a client may ask the metrics once it
        // has the chunk).
        reads
            .cluster
            .stream_reads
            .fetch_add(u64::from(c.entries), Ordering::Relaxed);
        if !out.send_chunk(head, parts).await {
            return;
        }
        permit.forget();
    }
}

/// Reads `queue` from seq `from` on: the last seq read (None: nothing
/// was there) and its chunks. Unfiltered, one chunk: entries copied from
/// the read's buffer or named where a stored batch lies in the file
/// (chunk.rs), nothing decoded. Filtered, a chunk per run of consecutive
/// offsets the filter keeps (a chunk's offsets have no gaps).
fn read_chunks(
    store: &Store,
    queue: u64,
    from: u64,
    budget: u64,
    filter: Option<&Filter>,
) -> crate::store::Result<(Option<u64>, Vec<Chunk>)> {
    let mut last = None;
    let Some(filter) = filter else {
        let mut c = ChunkFrame::new(64 << 10);
        store.visit_range_within(queue, from, CHUNK_MESSAGES, budget, true, |seq, found| {
            let n = match &found {
                Found::Chunk(c) => u64::from(c.count),
                _ => 1,
            };
            last = Some(seq + n - 1);
            c.push_found(offset_of(seq), found)
        })?;
        let c = c.finish();
        return Ok((last, (c.entries > 0).then_some(c).into_iter().collect()));
    };
    let mut kept: Vec<(u64, Arc<Message>, u64)> = Vec::new();
    store.visit_range_within(queue, from, CHUNK_MESSAGES, budget, false, |seq, found| {
        last = Some(seq);
        let (m, time) = found.into_message()?;
        if filter.matches(&m) {
            kept.push((offset_of(seq), m, time));
        }
        Ok(())
    })?;
    let mut chunks = Vec::new();
    while !kept.is_empty() {
        chunks.push(chunk::take_run(&mut kept));
    }
    Ok((last, chunks))
}

/// The subscription is no more here (if it is still the one under its id).
fn forget(shared: &Shared, sub: &Sub) {
    let mut st = shared.lock();
    if st
        .local
        .get(&sub.id)
        .is_some_and(|l| l.serial == sub.serial)
    {
        st.local.remove(&sub.id);
    }
}

/// Its stream went: the client is told, as the leader tells it, and the
/// subscription is dropped.
async fn gone(shared: &Shared, out: &Out, sub: &Sub) {
    forget(shared, sub);
    subscribe::gone(out, &sub.stream).await;
}
