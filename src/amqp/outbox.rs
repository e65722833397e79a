//! `Outbox`: the bytes waiting to go out on one connection, and the writer
//! task that drains them. Everyone who sends to the peer (the connection's own
//! replies, queues delivering to its consumers, confirms) encodes frames
//! straight into the outbox buffer; the writer swaps the buffer out and sends
//! it with one write, so many frames share one syscall. The writer also sends
//! heartbeats when the link is otherwise idle.
//!
//! Bounds: above the high-water mark queues skip the connection's
//! consumers and the reader stops reading the peer until the writer has
//! drained the buffer (a peer that pipelines requests and never reads its
//! replies cannot grow it); a write that makes no progress for the send
//! timeout ends the connection (its socket is shut both ways, which wakes
//! the reader), so a peer that stopped reading releases what it holds.
//!
//! In a cluster, a buffer that holds deliveries goes out only while the
//! leadership lease holds (store/lease.rs), checked before every write: a
//! leader paused (SIGSTOP, a stall) with deliveries buffered must not send
//! them once resumed, when a newer leader may have handed the same
//! messages to another consumer. It waits for the lease to come back for
//! at most the lease's length, then drops the connection unwritten (the
//! deliveries stay unacked and come back from the leader of the day).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::transport::Writer;
use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use super::codec;
use crate::queue::Queue;
use crate::store::Store;

/// Initial buffer size: enough for a handshake; buffers grow with traffic.
const SMALL: usize = 512;

/// Outgoing bytes of one connection.
pub struct Outbox {
    inner: Mutex<Inner>,
    notify: Notify,
    /// Woken after each write, and when the writer ends.
    drained: Notify,
    /// Wakes the connection's reader for work it owns (a delivery timed out).
    reader: Notify,
    /// Above this many buffered bytes, queues stop delivering to the
    /// connection and its reader stops reading until the writer drained it.
    high_water: usize,
    /// How long one write may make no progress before the peer is dropped.
    send_timeout: Duration,
    /// The buffer's length as of the last change (read without the lock).
    buffered: AtomicUsize,
    /// How much of the buffer is replies to the peer's own requests (all
    /// but deliveries): what stops the reader, so that a peer cannot make
    /// the broker answer without end while never reading, while deliveries
    /// (already bounded: queues skip a full outbox) never stop a peer that
    /// is busy sending, say, the publishes it makes while consuming.
    replies: AtomicUsize,
    /// Heartbeat interval in seconds agreed at tune (0 = none).
    heartbeat: AtomicU64,
    closed: AtomicBool,
    /// Bytes and writes to the socket (the writer's, one load and store
    /// per write).
    send_oct: AtomicU64,
    send_cnt: AtomicU64,
    /// What a buffer holding deliveries waits for (none: a single node).
    gate: Option<Gate>,
}

/// A replicated store's leadership lease, and how long a write waits for
/// it to hold again before the connection is dropped.
pub struct Gate {
    pub store: Arc<Store>,
    pub patience: Duration,
}

struct Inner {
    buf: BytesMut,
    /// Queues that held back deliveries because the buffer was full.
    waiting: Vec<Weak<Queue>>,
    /// Close the socket once everything buffered has been written.
    finish: bool,
    /// Whether the buffer holds deliveries (`gate` applies).
    leased: bool,
}

impl Outbox {
    /// An empty outbox with these bounds; deliveries wait for `gate`.
    pub fn new(high_water: usize, send_timeout: Duration, gate: Option<Gate>) -> Self {
        Outbox {
            inner: Mutex::new(Inner {
                buf: BytesMut::with_capacity(SMALL),
                waiting: Vec::new(),
                finish: false,
                leased: false,
            }),
            notify: Notify::new(),
            drained: Notify::new(),
            reader: Notify::new(),
            high_water,
            send_timeout,
            buffered: AtomicUsize::new(0),
            replies: AtomicUsize::new(0),
            heartbeat: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            send_oct: AtomicU64::new(0),
            send_cnt: AtomicU64::new(0),
            gate,
        }
    }

    /// Encodes a reply (anything but a delivery) with `f` into the buffer
    /// and wakes the writer.
    pub fn send<R>(&self, f: impl FnOnce(&mut BytesMut) -> R) -> R {
        self.append(f, true, false)
    }

    /// Encodes a delivery (basic.deliver, a server-sent basic.cancel) with
    /// `f` into the buffer and wakes the writer.
    pub fn send_delivery<R>(&self, f: impl FnOnce(&mut BytesMut) -> R) -> R {
        self.append(f, false, true)
    }

    /// Encodes a reply that hands out a message (basic.get-ok) with `f`
    /// into the buffer and wakes the writer.
    pub fn send_got<R>(&self, f: impl FnOnce(&mut BytesMut) -> R) -> R {
        self.append(f, true, true)
    }

    fn append<R>(&self, f: impl FnOnce(&mut BytesMut) -> R, reply: bool, leased: bool) -> R {
        let r = {
            let mut inner = self.inner.lock();
            let before = inner.buf.len();
            let r = f(&mut inner.buf);
            let len = inner.buf.len();
            inner.leased |= leased;
            self.buffered.store(len, Ordering::Relaxed);
            if reply {
                // Written under the buffer's lock: no read-modify-write.
                let n = self.replies.load(Ordering::Relaxed);
                self.replies.store(n + (len - before), Ordering::Relaxed);
            }
            r
        };
        self.notify.notify_one();
        r
    }

    /// Whether the peer is too far behind to take more deliveries; if so the
    /// queue is remembered and woken when the buffer drains.
    pub fn is_full(&self, queue: &Arc<Queue>) -> bool {
        if self.buffered.load(Ordering::Relaxed) < self.high_water {
            return false;
        }
        let mut inner = self.inner.lock();
        if inner.buf.len() < self.high_water {
            return false;
        }
        let weak = Arc::downgrade(queue);
        if !inner.waiting.iter().any(|w| w.ptr_eq(&weak)) {
            inner.waiting.push(weak);
        }
        true
    }

    /// Wakes the connection's reader (see `woken`).
    pub fn wake_reader(&self) {
        self.reader.notify_one();
    }

    /// Resolves when `wake_reader` was called.
    pub async fn woken(&self) {
        self.reader.notified().await
    }

    /// This outbox's address: how queues know which consumers waited on it.
    fn addr(&self) -> usize {
        self as *const Outbox as usize
    }

    /// Whether the peer is too far behind on replies for the reader to read
    /// more of its requests.
    pub fn is_backlogged(&self) -> bool {
        self.replies.load(Ordering::Relaxed) >= self.high_water
    }

    /// Whether the buffer is over the high-water mark (no registration:
    /// for a delivery that is dropped rather than waited for).
    pub fn is_over_high_water(&self) -> bool {
        self.buffered.load(Ordering::Relaxed) >= self.high_water
    }

    /// Waits until the replies buffered are below half the high-water
    /// mark, or the writer is gone.
    pub async fn drained(&self) {
        loop {
            let woken = self.drained.notified();
            if self.is_closed() || self.replies.load(Ordering::Relaxed) < self.high_water / 2 {
                return;
            }
            woken.await;
        }
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

    /// Bytes and writes sent so far.
    pub fn sent(&self) -> (u64, u64) {
        (
            self.send_oct.load(Ordering::Relaxed),
            self.send_cnt.load(Ordering::Relaxed),
        )
    }

    /// The writer task: runs until the socket fails, a write makes no
    /// progress for the send timeout, or `finish` is called.
    pub async fn run_writer(self: Arc<Self>, mut socket: Writer) {
        let mut spare = BytesMut::with_capacity(SMALL);
        // One heartbeat timer for the connection's life, re-armed only when
        // it fires (not on every write: that would be a timer-wheel update
        // per message).
        let idle = tokio::time::sleep(Duration::from_secs(1));
        tokio::pin!(idle);
        let mut last_write = Instant::now();
        loop {
            let (mut out, finish, woken, leased) = {
                let mut inner = self.inner.lock();
                let woken = if inner.buf.len() < self.high_water / 2 {
                    std::mem::take(&mut inner.waiting)
                } else {
                    Vec::new()
                };
                let out = std::mem::replace(&mut inner.buf, spare);
                self.buffered.store(0, Ordering::Relaxed);
                self.replies.store(0, Ordering::Relaxed);
                let leased = std::mem::take(&mut inner.leased);
                (out, inner.finish, woken, leased)
            };
            for q in woken {
                if let Some(q) = q.upgrade() {
                    q.outbox_drained(self.addr());
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
                match self.write(&mut socket, &out, leased).await {
                    Ok(()) => {}
                    Err(Failed::Socket) => break,
                    Err(Failed::Stalled) => {
                        tracing::warn!(
                            timeout_ms = self.send_timeout.as_millis() as u64,
                            "peer stopped reading: closing the connection (send_timeout)"
                        );
                        // The reader may be waiting on the peer: wake it.
                        shutdown_both(&socket);
                        break;
                    }
                    Err(Failed::Unleased) => {
                        tracing::warn!(
                            "deliveries buffered while this node's leadership lease lapsed: \
                             closing the connection without sending them"
                        );
                        shutdown_both(&socket);
                        break;
                    }
                }
                out.clear();
                last_write = Instant::now();
                self.drained.notify_waiters();
            }
            // Keep the larger buffer for reuse, but not a huge one forever.
            if out.capacity() > 8 * self.high_water {
                out = BytesMut::with_capacity(SMALL);
            }
            spare = out;
        }
        self.closed.store(true, Ordering::Release);
        self.drained.notify_waiters();
        let _ = socket.shutdown().await;
        // Wake queues that waited on us: they will now see a closed outbox.
        let waiting = std::mem::take(&mut self.inner.lock().waiting);
        for q in waiting.into_iter().filter_map(|q| q.upgrade()) {
            q.outbox_drained(self.addr());
        }
    }

    /// Writes all of `out`, each write of `leased` bytes (deliveries) only
    /// while the gate's lease holds.
    async fn write(&self, socket: &mut Writer, mut out: &[u8], leased: bool) -> Result<(), Failed> {
        while !out.is_empty() {
            if leased && !self.leased().await {
                return Err(Failed::Unleased);
            }
            match tokio::time::timeout(self.send_timeout, socket.write(out)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Err(Failed::Socket),
                Ok(Ok(n)) => {
                    let (oct, cnt) = (&self.send_oct, &self.send_cnt);
                    oct.store(oct.load(Ordering::Relaxed) + n as u64, Ordering::Relaxed);
                    cnt.store(cnt.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                    out = &out[n..];
                }
                Err(_) => return Err(Failed::Stalled),
            }
        }
        // TLS may keep records it could not send yet: they must go now,
        // not with the next batch. (A plain socket keeps nothing back.)
        if !socket.buffers() {
            return Ok(());
        }
        if leased && !self.leased().await {
            return Err(Failed::Unleased);
        }
        match tokio::time::timeout(self.send_timeout, socket.flush()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Failed::Socket),
            Err(_) => Err(Failed::Stalled),
        }
    }

    /// Whether the gate's lease holds now, or comes back within its
    /// patience (always, without a gate).
    async fn leased(&self) -> bool {
        let Some(gate) = &self.gate else {
            return true;
        };
        if let Some(held) = held_by_fail_point() {
            tokio::time::sleep(held).await;
        }
        if gate.store.may_deliver() {
            return true;
        }
        let until = Instant::now() + gate.patience;
        while Instant::now() < until {
            tokio::time::sleep(LEASE_POLL).await;
            if gate.store.may_deliver() {
                return true;
            }
        }
        false
    }
}

/// How long the `outbox-before-write` fail point holds a write of
/// deliveries (`return(MS)`), for tests of a node paused with deliveries
/// buffered (tests/cluster/cluster_paused_leader.rs).
fn held_by_fail_point() -> Option<Duration> {
    fail::fail_point!("outbox-before-write", |ms: Option<String>| {
        ms.and_then(|ms| ms.parse().ok()).map(Duration::from_millis)
    });
    None
}

/// Why a write ended the connection.
enum Failed {
    /// The socket failed.
    Socket,
    /// A write made no progress for the send timeout.
    Stalled,
    /// Deliveries were buffered, and the lease did not hold again in time.
    Unleased,
}

/// How often a write waiting for the lease looks again.
const LEASE_POLL: Duration = Duration::from_millis(10);

/// Shuts the socket down in both directions, so a reader blocked on it
/// sees the end of the stream.
fn shutdown_both(socket: &Writer) {
    let fd = socket.fd();
    // SAFETY: the fd belongs to the socket, which lives for this call.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}
