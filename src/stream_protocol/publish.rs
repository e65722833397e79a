//! Publishers: a publish appends its messages to their stream as they
//! came (their AMQP 1.0 bytes, message/amqp10.rs), together (one append
//! and one store write for the frame's messages, `Stream::push_batch`,
//! unless the stream's queue deduplicates each), and is confirmed once
//! the group commit that covers the batch is done (on a cluster,
//! committed on a majority). A publisher declared with a reference is
//! deduplicated by publishing id, as RabbitMQ does: a message whose id is
//! not above the highest stored for that reference on that stream is
//! confirmed and not stored again. The highest id is recorded with the stream's tracked
//! offsets (written before the commit that covers the batch), so it holds
//! across reconnects, restarts and failovers, and QueryPublisherSequence
//! reads it.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::BufMut;
use tokio::sync::mpsc;

use super::codes::*;
use super::out::Out;
use super::wire;
use crate::message::batch::Batch;
use crate::message::{amqp10, Message, Meta};
use crate::queue::Queue;
use crate::store::Store;

/// The tracked name a publisher reference's highest id is kept under
/// (apart from stored offsets, which clients name as they like).
pub fn sequence_name(reference: &str) -> String {
    format!("\0publisher\0{reference}")
}

/// A declared publisher.
pub struct Publisher {
    pub stream: String,
    pub queue: Arc<Queue>,
    /// Its reference, if it has one (then it is deduplicated).
    pub reference: Option<String>,
    /// The property list of a message with a filter label, written here
    /// (reused: nothing allocated per message).
    pub props: Vec<u8>,
    /// Its counters, and its place in the management API's list.
    pub stats: Arc<super::view::PublisherStats>,
    pub _listed: super::view::Listed,
}

/// One batch's outcome: ids to confirm (once `ticket` is committed) and
/// ids refused, with their codes.
#[derive(Default)]
pub struct Outcome {
    pub confirm: Vec<u64>,
    pub errors: Vec<(u64, u16)>,
}

impl Publisher {
    /// Appends the messages of a publish (`count` of them in `f`, version
    /// 2 with a filter value each: stored as the message's label for
    /// filtered readers, queue/stream/filter.rs).
    pub fn publish(
        &mut self,
        f: &mut wire::Fields<'_>,
        count: usize,
        version: u16,
        max_size: u64,
    ) -> Result<Outcome, wire::Malformed> {
        let mut out = Outcome::default();
        let gone = self.queue.is_deleted();
        // A named publisher's ids are checked against the highest stored
        // under its reference on the stream (not a copy of its own: a
        // publisher of the same name elsewhere may have moved it), under
        // the stream's dedup guard for the whole batch.
        let stream = self.queue.stream();
        let sequence = self.reference.as_deref().map(sequence_name);
        let _guard = match (&sequence, &stream) {
            (Some(_), Some(s)) => Some(s.dedup_guard()),
            _ => None,
        };
        let (mut last, mut unreadable) = (None, false);
        if let (Some(name), Some(s)) = (&sequence, &stream) {
            match s.tracked(&self.queue, name) {
                Ok(l) => last = l,
                Err(e) => {
                    tracing::error!(stream = %self.stream, "cannot read a publisher's sequence: {e}");
                    unreadable = true;
                }
            }
        }
        let mut moved = false;
        // A stream's messages go to it in one append (store/writes.rs
        // `put_batch`), unless its queue deduplicates each.
        let batched = stream.is_some() && self.queue.dedup().is_none();
        // A batch's messages share one buffer: its bodies (the rest of the
        // frame at most) and a route and property list each. What is
        // reserved is no more than the frame can hold (an id and a length
        // a message) and twice the frame's bytes, whatever its count says:
        // the buffer grows past that only as messages really come.
        let (mut ids, mut batch) = match batched {
            true => {
                let count = count.min(f.remaining() / 12);
                let each = 2 + self.stream.len() + amqp10::STORED_PROPS.len();
                let bytes = (f.remaining() + count * each).min(2 * f.remaining());
                (
                    Vec::with_capacity(count),
                    Batch::with_capacity(bytes, count),
                )
            }
            false => (Vec::new(), Batch::with_capacity(0, 0)),
        };
        for _ in 0..count {
            let id = f.u64()?;
            // Version 2 labels each message with a filter value (or null;
            // any bytes, as RabbitMQ takes them).
            let label = if version >= 2 {
                f.raw_string_or_null()?
            } else {
                None
            };
            let body = f.bytes()?;
            if gone {
                out.errors.push((id, STREAM_DOES_NOT_EXIST));
                continue;
            }
            if unreadable {
                out.errors.push((id, INTERNAL_ERROR));
                continue;
            }
            // The label is stored with the body: it counts.
            if (body.len() + label.map_or(0, <[u8]>::len)) as u64 > max_size {
                out.errors.push((id, PRECONDITION_FAILED));
                continue;
            }
            if sequence.is_some() && last.is_some_and(|l| id <= l) {
                out.confirm.push(id);
                continue;
            }
            let props = match label {
                Some(label) => {
                    amqp10::stored_props_with(label, &mut self.props);
                    &self.props[..]
                }
                None => amqp10::STORED_PROPS,
            };
            // Its property list is a headers table (as a restart reads it).
            let mut meta = Meta::default().with_delivery_mode(2).as_amqp10();
            meta.has_headers = true;
            if batched {
                batch.push(b"", self.stream.as_bytes(), props, body, meta);
                ids.push(id);
                if sequence.is_some() {
                    // A later copy of this id in the batch is a duplicate.
                    last = Some(id);
                }
                continue;
            }
            let msg = Message::new(b"", self.stream.as_bytes(), props, body, meta);
            match self.queue.push(&Arc::new(msg)) {
                Ok(p) if p.stored => {
                    out.confirm.push(id);
                    if sequence.is_some() {
                        last = Some(id);
                        moved = true;
                    }
                }
                // Deleted meanwhile.
                Ok(_) => out.errors.push((id, STREAM_DOES_NOT_EXIST)),
                Err(e) => {
                    tracing::error!(stream = %self.stream, "cannot append: {e}");
                    out.errors.push((id, INTERNAL_ERROR));
                }
            }
        }
        if let (false, Some(s)) = (batch.is_empty(), &stream) {
            match s.push_batch(&self.queue, batch.into_messages()) {
                Ok(true) => {
                    out.confirm.extend_from_slice(&ids);
                    moved = sequence.is_some();
                }
                Ok(false) => out
                    .errors
                    .extend(ids.iter().map(|&id| (id, STREAM_DOES_NOT_EXIST))),
                Err(e) => {
                    tracing::error!(stream = %self.stream, "cannot append: {e}");
                    out.errors
                        .extend(ids.iter().map(|&id| (id, INTERNAL_ERROR)));
                }
            }
        }
        if let (true, Some(name), Some(stream), Some(last)) = (moved, &sequence, &stream, last) {
            stream.store_tracked(&self.queue, name, last);
        }
        Ok(out)
    }
}

/// Writes a PublishError for `errors` of `publisher`.
pub async fn send_errors(out: &Out, publisher: u8, errors: &[(u64, u16)]) {
    if errors.is_empty() {
        return;
    }
    out.write(|o| {
        wire::frame(o, PUBLISH_ERROR, 1, |o| {
            o.put_u8(publisher);
            o.put_u32(errors.len() as u32);
            for &(id, code) in errors {
                o.put_u64(id);
                o.put_u16(code);
            }
        })
    })
    .await;
}

/// Batches waiting for their commit, at most, per connection: past it
/// the connection's reader waits (its client's publishes wait in the
/// socket), as when the store is congested.
const UNCONFIRMED: usize = 1024;

/// Confirms batches once their commits are done, in order.
pub struct Confirmer {
    tx: mpsc::Sender<(u64, u8, Vec<u64>)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Confirmer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Confirmer {
    /// Starts the task; it ends with the connection (its `Out` closed or
    /// this dropped). Its frames stay within `frame_max`. A journal that
    /// failed a commit never confirms again: the client is told so with
    /// a close (it reconnects, in a cluster to the new leader) rather
    /// than left waiting.
    pub fn start(
        store: Arc<Store>,
        out: Out,
        frame_max: u32,
        view: Arc<super::view::View>,
    ) -> Confirmer {
        let (tx, mut rx) = mpsc::channel::<(u64, u8, Vec<u64>)>(UNCONFIRMED);
        // Ids in one confirm frame, at most (a frame's header is 13 bytes).
        let per_frame = ((frame_max as usize).saturating_sub(64) / 8).max(1);
        let task = tokio::spawn(async move {
            let mut check = tokio::time::interval(std::time::Duration::from_millis(100));
            let mut flushed = store.flushed();
            let mut waiting: VecDeque<(u64, u8, Vec<u64>)> = VecDeque::new();
            loop {
                if waiting.is_empty() {
                    match rx.recv().await {
                        Some(b) => waiting.push_back(b),
                        None => return,
                    }
                }
                while waiting.len() < UNCONFIRMED {
                    match rx.try_recv() {
                        Ok(b) => waiting.push_back(b),
                        Err(_) => break,
                    }
                }
                let Some(&(ticket, _, _)) = waiting.front() else {
                    continue;
                };
                if *flushed.borrow_and_update() < ticket {
                    tokio::select! {
                        changed = flushed.changed() => if changed.is_err() { return },
                        b = rx.recv(), if waiting.len() < UNCONFIRMED => match b {
                            Some(b) => waiting.push_back(b),
                            None => return,
                        },
                        _ = check.tick() => if !store.journal_open() {
                            tracing::error!("the store failed a commit: closing a stream connection");
                            out.write(|o| {
                                wire::frame(o, CLOSE, 1, |o| {
                                    o.put_u32(0);
                                    o.put_u16(INTERNAL_ERROR);
                                    wire::put_str(o, "the store failed a commit");
                                })
                            })
                            .await;
                            return;
                        },
                    }
                    continue;
                }
                let done = *flushed.borrow();
                // Every batch the commit covers, one frame per publisher
                // run.
                let mut frames = bytes::BytesMut::new();
                while waiting.front().is_some_and(|&(t, _, _)| t <= done) {
                    let Some((_, publisher, mut ids)) = waiting.pop_front() else {
                        break;
                    };
                    while waiting
                        .front()
                        .is_some_and(|&(t, p, _)| t <= done && p == publisher)
                    {
                        if let Some((_, _, more)) = waiting.pop_front() {
                            ids.extend(more);
                        }
                    }
                    view.confirmed(publisher, ids.len() as u64);
                    for ids in ids.chunks(per_frame) {
                        wire::frame(&mut frames, PUBLISH_CONFIRM, 1, |o| {
                            o.put_u8(publisher);
                            o.put_u32(ids.len() as u32);
                            for &id in ids {
                                o.put_u64(id);
                            }
                        });
                    }
                }
                if !out.send(frames.freeze()).await {
                    return;
                }
            }
        });
        Confirmer { tx, task }
    }

    /// Confirms `ids` of `publisher` once `ticket` is committed.
    pub async fn after(&self, ticket: u64, publisher: u8, ids: Vec<u64>) {
        let _ = self.tx.send((ticket, publisher, ids)).await;
    }
}
