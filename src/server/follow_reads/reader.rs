//! A stream reader served from this follower's copy: where it starts
//! (the offset forms the leader takes, placed with what this node applied),
//! then the messages after its cursor read from the applied message log a
//! batch at a time, filtered, and delivered while it has credit. At the end
//! it waits for the next applied entry. The applied state holds only
//! committed entries, so a reader here sees nothing the leader might lose.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::warn;

use super::conn::Handle;
use super::{Reads, Shared};
use crate::message::Message;
use crate::queue::stream::{Filter, Start};
use crate::store::{self, Store};

/// Messages read back at once, and their body bytes at the most.
const READ_N: usize = 256;
const READ_BYTES: u64 = 512 << 10;

/// What a reader serves.
pub(super) struct Spec {
    pub channel: u16,
    pub tag: String,
    pub vhost: String,
    pub queue: String,
    pub queue_id: u64,
    pub start: Start,
    pub filter: Option<Filter>,
}

/// The offset `start` names in the stream `id` as this node holds it.
pub(super) fn start_offset(store: &Store, id: u64, start: Start) -> store::Result<u64> {
    let (first, next) = match store.message_bounds(id)? {
        Some((a, b)) => (a.saturating_sub(1), b),
        None => (0, 0),
    };
    Ok(match start {
        Start::First => first,
        Start::Last => next.saturating_sub(1).max(first),
        Start::Next => next,
        Start::Offset(n) => n.clamp(first, next),
        Start::Time(ms) => {
            // The first offset stored in `ms`'s second or later, by a
            // binary search of the stored times.
            let second = ms / 1000;
            let (mut a, mut b) = (first, next);
            while a < b {
                let mid = a + (b - a) / 2;
                match store.message_from(id, mid + 1)? {
                    Some(m) if m.time / 1000 < second => a = m.seq.saturating_sub(1).max(mid) + 1,
                    _ => b = mid,
                }
            }
            a
        }
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> store::Result<T> + Send + 'static,
) -> store::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| store::Error::Sync(format!("a read stopped: {e}")))?
}

/// Serves `spec` until the reader is cancelled, its channel or connection
/// ends, or its stream goes.
pub(super) async fn serve(shared: Arc<Shared>, reads: Arc<Reads>, handle: Arc<Handle>, spec: Spec) {
    let (ch, tag, id) = (spec.channel, spec.tag.as_str(), spec.queue_id);
    let store = Arc::clone(&reads.store);
    let start = spec.start;
    let mut cursor = match blocking(move || start_offset(&store, id, start)).await {
        Ok(c) => c,
        Err(e) => return fail(&shared, &spec, e),
    };
    let mut ahead: VecDeque<(u64, Arc<Message>)> = VecDeque::new();
    let mut applied = reads.applied.clone();
    loop {
        let woken = handle.wake.notified();
        let Some(credit) = shared.conn.lock().credit(ch, tag) else {
            return;
        };
        if credit == 0 {
            woken.await;
            continue;
        }
        if ahead.is_empty() {
            applied.borrow_and_update();
            let store = Arc::clone(&reads.store);
            let from = cursor + 1;
            let read = move || store.load_range_within(id, from, READ_N, READ_BYTES);
            match blocking(read).await {
                Err(e) => return fail(&shared, &spec, e),
                Ok(batch) if batch.is_empty() => {
                    if !reads.is_stream(&spec.vhost, &spec.queue, id) {
                        shared.conn.lock().cancel_local(ch, tag);
                        shared.wake_writer.notify_one();
                        return;
                    }
                    tokio::select! {
                        r = applied.changed() => if r.is_err() { return },
                        _ = woken => {}
                    }
                    continue;
                }
                Ok(batch) => ahead = batch.into(),
            }
        }
        let mut sent = 0;
        {
            let mut st = shared.conn.lock();
            while let Some((seq, msg)) = ahead.front() {
                let wanted = spec.filter.as_ref().is_none_or(|f| f.matches(msg));
                if wanted && !st.deliver(ch, tag, msg) {
                    break;
                }
                cursor = *seq;
                sent += wanted as u64;
                ahead.pop_front();
            }
        }
        if sent > 0 {
            reads
                .cluster
                .stream_reads
                .fetch_add(sent, Ordering::Relaxed);
            shared.wake_writer.notify_one();
            shared.room().await;
        }
    }
}

/// A read failed: the reader ends as if its stream went, and the log says
/// why.
fn fail(shared: &Shared, spec: &Spec, e: store::Error) {
    warn!(queue = %spec.queue, vhost = %spec.vhost, "a follower's stream reader stops: {e}");
    shared.conn.lock().cancel_local(spec.channel, &spec.tag);
    shared.wake_writer.notify_one();
}
