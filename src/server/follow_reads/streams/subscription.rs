//! A stream protocol subscription served from this follower's copy: its
//! start placed with what this node applied (once it applied what was
//! committed when the Subscribe came), then chunks read from the applied
//! message log after its cursor, one per credit, as the leader's
//! subscriptions send them (stream_protocol/subscribe.rs). At the end it
//! waits for the next applied entry; a stream deleted under it ends it
//! with a MetadataUpdate, as on the leader.

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
use crate::stream_protocol::chunk;
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
    // Each with when it was stored (the chunk's timestamp).
    let mut pending: Vec<(u64, Arc<Message>, u64)> = Vec::new();
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
        while pending.is_empty() {
            applied.borrow_and_update();
            let store = Arc::clone(&reads.store);
            let from = cursor + 1;
            let read = move || {
                let mut batch = Vec::new();
                store.visit_range_within(
                    queue,
                    from,
                    CHUNK_MESSAGES,
                    budget,
                    false,
                    |seq, found| {
                        let (m, time) = found.into_message()?;
                        batch.push((seq, m, time));
                        Ok(())
                    },
                )?;
                Ok::<_, crate::store::Error>(batch)
            };
            let batch = match blocking(read).await {
                Ok(b) => b,
                Err(e) => {
                    warn!(stream = %sub.stream, vhost = %sub.vhost, "a follower's subscription stops: {e}");
                    return gone(&shared, &out, &sub).await;
                }
            };
            if let Some(&(last, ..)) = batch.last() {
                // The cursor is the next offset: the last seq read.
                cursor = last;
                let wanted = |m: &Message| sub.plan.filter.as_ref().is_none_or(|f| f.matches(m));
                pending = batch
                    .into_iter()
                    .filter(|(_, m, _)| wanted(m))
                    .map(|(seq, m, time)| (offset_of(seq), m, time))
                    .collect();
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
        // A chunk's offsets have no gaps: each run of them is one.
        let run = pending
            .windows(2)
            .position(|w| w[1].0 != w[0].0 + 1)
            .map_or(pending.len(), |i| i + 1);
        // Deliver 2 names what is committed: here, all that is applied,
        // which is at least what was read.
        let committed = sub.v2.then_some(cursor.saturating_sub(1));
        let (head, body) = chunk::chunk(sub.id, &pending[..run], committed);
        pending.drain(..run);
        // Counted as it goes out (a client may ask the metrics once it
        // has the chunk).
        reads
            .cluster
            .stream_reads
            .fetch_add(run as u64, Ordering::Relaxed);
        if !out.send_parts(head, body).await {
            return;
        }
        permit.forget();
    }
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
