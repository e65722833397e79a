//! A stream reader served from this follower's copy: where it starts
//! (the offset forms the leader takes, placed with what this node applied),
//! then the messages after its cursor read from the applied message log a
//! batch at a time, filtered, and delivered while it has credit. At the end
//! it waits for the next applied entry. The applied state holds only
//! committed entries, so a reader here sees nothing the leader might lose.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tracing::warn;

use super::conn::Handle;
use super::{Reads, Shared};
use crate::message::{amqp10, Message};
use crate::queue::stream::{offset_of, Filter, Start};
use crate::store::{self, Store};

/// Messages read back at once, and their body bytes at the most.
const READ_N: usize = 256;
const READ_BYTES: u64 = 512 << 10;

/// How long a start waits for this node to apply what was committed when
/// the consume came (it may lag the leader a little).
pub(super) const CATCH_UP: Duration = Duration::from_secs(2);
/// How often a reader without credit checks that its stream is still there.
pub(super) const STILL_THERE: Duration = Duration::from_secs(1);

/// What a reader serves.
pub(super) struct Spec {
    pub channel: u16,
    pub tag: String,
    /// Its id among the connection's readers (conn.rs `Local`).
    pub id: u64,
    /// What was committed when the consume came.
    pub committed: u64,
    /// Told once the consume is answered (the client's next frames wait).
    pub answered: Option<oneshot::Sender<()>>,
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

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> store::Result<T> + Send + 'static,
) -> store::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| store::Error::Sync(format!("a read stopped: {e}")))?
}

/// Serves `spec` until the reader is cancelled, its channel or connection
/// ends, or its stream goes. Its consume-ok is sent once its start is
/// placed: a message published after the client has it is after the start.
pub(super) async fn serve(
    shared: Arc<Shared>,
    reads: Arc<Reads>,
    handle: Arc<Handle>,
    mut spec: Spec,
) {
    let answered = spec.answered.take();
    let (ch, tag, id, queue) = (spec.channel, spec.tag.as_str(), spec.id, spec.queue_id);
    let mut applied = reads.applied.clone();
    let caught_up = applied.wait_for(|&a| a >= spec.committed);
    let _ = tokio::time::timeout(CATCH_UP, caught_up).await;
    let store = Arc::clone(&reads.store);
    let start = spec.start;
    let placed = blocking(move || start_offset(&store, queue, start)).await;
    shared.conn.lock().consumed(ch, tag, id);
    if let Some(answered) = answered {
        let _ = answered.send(());
    }
    let mut cursor = match placed {
        Ok(c) => c,
        Err(e) => return fail(&shared, &spec, e),
    };
    shared.wake_writer.notify_one();
    // Read and not handed over yet: None for what the filter skips.
    let mut ahead: VecDeque<(u64, Option<Arc<Message>>)> = VecDeque::new();
    let mut checked = Instant::now();
    loop {
        let woken = handle.wake.notified();
        let Some(credit) = shared.conn.lock().credit(ch, tag, id) else {
            return;
        };
        if credit == 0 {
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep(STILL_THERE) => {
                    if !reads.is_stream(&spec.vhost, &spec.queue, queue) {
                        return gone(&shared, &spec);
                    }
                }
            }
            continue;
        }
        if ahead.is_empty() {
            applied.borrow_and_update();
            let store = Arc::clone(&reads.store);
            let from = cursor + 1;
            // A filter passes over what it does not take: read a batch.
            let n = match spec.filter {
                Some(_) => READ_N,
                None => (credit as usize).min(READ_N),
            };
            let read = move || store.load_range_within(queue, from, n, READ_BYTES);
            match blocking(read).await {
                Err(e) => return fail(&shared, &spec, e),
                Ok(batch) if batch.is_empty() => {
                    // At the end: is the stream still there (now and then),
                    // else wait for what is applied next.
                    if checked.elapsed() >= STILL_THERE {
                        if !reads.is_stream(&spec.vhost, &spec.queue, queue) {
                            return gone(&shared, &spec);
                        }
                        checked = Instant::now();
                    }
                    tokio::select! {
                        r = applied.changed() => if r.is_err() { return },
                        _ = woken => {}
                        _ = tokio::time::sleep(STILL_THERE) => {}
                    }
                    continue;
                }
                // The filter reads the stored label; readers here speak
                // AMQP 0-9-1: a stream protocol publisher's message is read
                // as that.
                Ok(batch) => {
                    let wanted = |m: &Message| spec.filter.as_ref().is_none_or(|f| f.matches(m));
                    ahead = batch
                        .into_iter()
                        .map(|(seq, m)| {
                            let m = wanted(&m).then(|| amqp10::readable(m, offset_of(seq)));
                            (seq, m)
                        })
                        .collect()
                }
            }
        }
        let mut sent = 0;
        {
            let mut st = shared.conn.lock();
            while let Some((seq, msg)) = ahead.front() {
                if let Some(msg) = msg {
                    if !st.deliver(ch, tag, id, msg) {
                        break;
                    }
                    sent += 1;
                }
                cursor = *seq;
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

/// The stream went: the reader is cancelled.
fn gone(shared: &Shared, spec: &Spec) {
    shared
        .conn
        .lock()
        .cancel_local(spec.channel, &spec.tag, spec.id);
    shared.wake_writer.notify_one();
}

/// A read failed: the reader ends as if its stream went, and the log says
/// why.
fn fail(shared: &Shared, spec: &Spec, e: store::Error) {
    warn!(queue = %spec.queue, vhost = %spec.vhost, "a follower's stream reader stops: {e}");
    gone(shared, spec);
}
