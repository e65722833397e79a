//! `Outbox`: the bytes waiting to go out on one connection, and the writer
//! task that drains them. Everyone who sends to the peer (the connection's own
//! replies, queues delivering to its consumers, confirms) encodes frames
//! straight into the outbox buffer; the writer swaps the buffer out and sends
//! it with one write, so many frames share one syscall. The writer also sends
//! heartbeats when the link is otherwise idle.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

use super::codec;
use crate::queue::Queue;

/// Above this many buffered bytes, queues stop delivering to the connection
/// until the writer has drained it (consumer back-pressure).
const HIGH_WATER: usize = 4 << 20;

/// Initial buffer size: enough for a handshake; buffers grow with traffic.
const SMALL: usize = 512;

/// Outgoing bytes of one connection.
pub struct Outbox {
    inner: Mutex<Inner>,
    notify: Notify,
    /// Heartbeat interval in seconds agreed at tune (0 = none).
    heartbeat: AtomicU64,
    closed: AtomicBool,
}

struct Inner {
    buf: BytesMut,
    /// Queues that held back deliveries because the buffer was full.
    waiting: Vec<Weak<Queue>>,
    /// Close the socket once everything buffered has been written.
    finish: bool,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Outbox {
            inner: Mutex::new(Inner {
                buf: BytesMut::with_capacity(SMALL),
                waiting: Vec::new(),
                finish: false,
            }),
            notify: Notify::new(),
            heartbeat: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Encodes frames with `f` into the buffer and wakes the writer.
    pub fn send<R>(&self, f: impl FnOnce(&mut BytesMut) -> R) -> R {
        let r = {
            let mut inner = self.inner.lock();
            f(&mut inner.buf)
        };
        self.notify.notify_one();
        r
    }

    /// Whether the peer is too far behind to take more deliveries; if so the
    /// queue is remembered and woken when the buffer drains.
    pub fn is_full(&self, queue: &Arc<Queue>) -> bool {
        let mut inner = self.inner.lock();
        if inner.buf.len() < HIGH_WATER {
            return false;
        }
        let weak = Arc::downgrade(queue);
        if !inner.waiting.iter().any(|w| w.ptr_eq(&weak)) {
            inner.waiting.push(weak);
        }
        true
    }

    /// Whether the socket is gone (deliveries would be lost).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Sets the heartbeat interval the writer keeps.
    pub fn set_heartbeat(&self, secs: u16) {
        self.heartbeat.store(secs as u64, Ordering::Release);
        self.notify.notify_one();
    }

    /// Asks the writer to send what is buffered, then close the socket.
    pub fn finish(&self) {
        self.inner.lock().finish = true;
        self.notify.notify_one();
    }

    /// The writer task: runs until the socket fails or `finish` is called.
    pub async fn run_writer(self: Arc<Self>, mut socket: OwnedWriteHalf) {
        let mut spare = BytesMut::with_capacity(SMALL);
        // One heartbeat timer for the connection's life, re-armed only when
        // it fires (not on every write: that would be a timer-wheel update
        // per message).
        let idle = tokio::time::sleep(Duration::from_secs(1));
        tokio::pin!(idle);
        let mut last_write = Instant::now();
        loop {
            let (mut out, finish, woken) = {
                let mut inner = self.inner.lock();
                let woken = if inner.buf.len() < HIGH_WATER / 2 {
                    std::mem::take(&mut inner.waiting)
                } else {
                    Vec::new()
                };
                (
                    std::mem::replace(&mut inner.buf, spare),
                    inner.finish,
                    woken,
                )
            };
            for q in woken {
                if let Some(q) = q.upgrade() {
                    q.dispatch();
                }
            }
            if out.is_empty() {
                if finish {
                    break;
                }
                let hb = self.heartbeat.load(Ordering::Acquire);
                if hb == 0 {
                    self.notify.notified().await;
                } else {
                    let period = Duration::from_secs(hb);
                    tokio::select! {
                        _ = self.notify.notified() => {}
                        _ = &mut idle => {
                            let now = Instant::now();
                            let due = last_write + period;
                            if now >= due {
                                codec::put_heartbeat(&mut out);
                                idle.as_mut().reset((now + period).into());
                            } else {
                                idle.as_mut().reset(due.into());
                            }
                        }
                    }
                }
            }
            if !out.is_empty() {
                if socket.write_all(&out).await.is_err() {
                    break;
                }
                out.clear();
                last_write = Instant::now();
            }
            // Keep the larger buffer for reuse, but not a huge one forever.
            if out.capacity() > 8 * HIGH_WATER {
                out = BytesMut::with_capacity(SMALL);
            }
            spare = out;
        }
        self.closed.store(true, Ordering::Release);
        let _ = socket.shutdown().await;
        // Wake queues that waited on us: they will now see a closed outbox.
        let waiting = std::mem::take(&mut self.inner.lock().waiting);
        for q in waiting.into_iter().filter_map(|q| q.upgrade()) {
            q.dispatch();
        }
    }
}
