//! Read coalescing: while a peer streams publishes (or acks) fast, pause
//! briefly after each read so that the next read takes many frames at once,
//! and with them one wake-up, one TCP ACK and one write of the deliveries
//! that follow, instead of one of each for every message or two.
//!
//! A broker that reads as soon as data arrives reads every segment the
//! client sends on its own: on loopback with a one-thread client that was
//! two publishes per read, and the kernel's per-read and per-write work
//! (epoll, the ACK that clocks the client's sends, waking the peer) was most
//! of the broker's CPU. RabbitMQ batches because it is slow; this batches on
//! purpose, as interrupt moderation does for a NIC. While the reader pauses,
//! the client's sends queue behind its congestion window and go out as a
//! few large segments once the read's ACK arrives.
//!
//! How: while the peer streams, the socket's `SO_RCVLOWAT` is set high so
//! arriving segments do not wake the runtime, a timer ends each pause, and
//! the read after it goes straight to the socket (a non-blocking read
//! returns what is there whatever the mark). If it finds nothing the stream
//! has ended: the mark goes back to one byte and reads wait as usual. When
//! pausing stops for another reason, one direct read follows the lowered
//! mark, so that nothing that arrived under the raised mark waits for the
//! next segment (Linux 4.18 and later also signal the socket then).
//!
//! The pause (`read_pause_us`, 100 us by default; 0 turns coalescing off)
//! is as long as a message may wait, about half of it on average. It is
//! not taken when handling a read already takes longer than two pauses (a
//! fanout to many consumers, say: reads then batch by themselves), and
//! otherwise only when, at the rate the peer sends, it gathers at least
//! `MIN_FRAMES` frames: a slow or request/response peer is read at once, as
//! before. A peer that waits on the broker would pay the pause per
//! exchange: so a connection with a channel in confirm or transaction mode
//! (its publisher is paced by our confirms or commit-oks) never pauses, and
//! any other synchronous method, or pauses that keep gathering next to
//! nothing (a full prefetch window, say), turn pausing off for `HOLD`.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::codec::{self, Frame};

/// How long pausing stays off after the peer showed it waits on us.
const HOLD: Duration = Duration::from_millis(100);
/// Pause only when it would gather at least this many frames.
const MIN_FRAMES: f64 = 4.0;
/// This many pauses in a row that gathered under half of `MIN_FRAMES` mean
/// the peer waits on us rather than streams (one is just a gap in the
/// stream).
const THIN_PAUSES: u32 = 3;
/// Reads further apart than this start the rate estimate afresh (ten times
/// the longest pause that may be configured).
const RESTART: Duration = Duration::from_millis(10);
/// Reads since the estimate started afresh before a pause may be taken:
/// one short gap (a client writing a publish's frames separately) is not
/// yet a stream.
const MIN_SAMPLES: u32 = 4;
/// SO_RCVLOWAT while streaming: high enough that a pause's worth of frames
/// does not wake the runtime, and at most a quarter of the receive buffer
/// so that the kernel need not grow it (and clamp the window) to honour it.
const STREAM_MARK: usize = 32 * 1024;

/// Per-connection read coalescing state; see the module docs.
pub struct Coalescer {
    /// How long a pause lasts (zero: never pause).
    pause: Duration,
    socket: sys::Socket,
    timer: sys::Timer,
    /// The socket's mark is raised (reads go through `resume`).
    streaming: bool,
    /// Reading waits for the timer.
    paused: bool,
    /// The last read ended a pause.
    after_pause: bool,
    /// Pauses in a row that gathered next to nothing.
    thin: u32,
    /// Frames per read and microseconds between reads, smoothed.
    frames_per_read: f64,
    gap_us: f64,
    /// Microseconds between reads not spent pausing, smoothed: how long
    /// handling a read (and what else the runtime had to do) took.
    busy_us: f64,
    /// Reads since the estimate started afresh.
    samples: u32,
    /// The last read filled the buffer: more is queued, read it at once.
    filled: bool,
    /// Paused with nothing to wait for (`filled`): resume at once.
    immediate: bool,
    /// The mark used while streaming (0 until first needed).
    stream_mark: usize,
    /// The read before the last, and the last.
    prev_read: Option<Instant>,
    last_read: Option<Instant>,
    /// Frames cut since `settle`.
    frames: u32,
    /// A read happened since `settle`.
    fresh: bool,
    /// The peer sent a method it waits on the answer to.
    waits: bool,
    hold_until: Option<Instant>,
    /// A channel is in confirm or transaction mode: no pauses.
    never: bool,
}

impl Coalescer {
    /// Coalescing for the connection's socket `fd` with pauses of `pause`;
    /// off until the peer streams.
    pub(crate) fn new(fd: RawFd, pause: Duration) -> Self {
        Coalescer {
            pause,
            socket: sys::Socket(fd),
            timer: sys::Timer::new(),
            streaming: false,
            paused: false,
            after_pause: false,
            thin: 0,
            frames_per_read: 0.0,
            gap_us: RESTART.as_secs_f64() * 1e6,
            busy_us: 0.0,
            samples: 0,
            filled: false,
            immediate: false,
            stream_mark: 0,
            prev_read: None,
            last_read: None,
            frames: 0,
            fresh: false,
            waits: false,
            hold_until: None,
            never: false,
        }
    }

    /// Records a read; `filled` if it filled the buffer's spare room.
    pub fn read(&mut self, now: Instant, filled: bool) {
        self.prev_read = self.last_read.replace(now);
        self.fresh = true;
        self.filled = filled;
    }

    /// Records a frame cut from what was read.
    pub fn frame(&mut self, frame: &Frame) {
        self.frames += 1;
        if let Frame::Method { channel, payload } = frame {
            // Publishes and acknowledgements stream; anything else is
            // answered (or changes state) and the peer may be waiting.
            let ids = codec::method_ids(payload);
            let streams = matches!(ids, Some((60, 40) | (60, 80) | (60, 90) | (60, 120)));
            if !streams || *channel == 0 {
                self.waits = true;
            }
            // confirm.select, tx.select: the publisher now waits on us.
            if matches!(ids, Some((85, 10) | (90, 10))) {
                self.never = true;
            }
        }
    }

    /// Decides, once the frames of a read are handled, whether to pause
    /// before the next read. Cheap when nothing was read.
    pub fn settle(&mut self) {
        if !std::mem::take(&mut self.fresh) {
            return;
        }
        let Some(now) = self.last_read else { return };
        let frames = std::mem::take(&mut self.frames) as f64;
        // Frames and gaps are smoothed apart and divided after: the mean of
        // per-read rates would overrate a peer whose reads come in pairs.
        let gap = self
            .prev_read
            .map_or(RESTART, |p| now.saturating_duration_since(p));
        let us = gap.as_secs_f64() * 1e6;
        let after_pause = std::mem::take(&mut self.after_pause);
        let busy = if after_pause {
            (us - self.pause.as_secs_f64() * 1e6).max(0.0)
        } else {
            us
        };
        // A gap estimate of RESTART or more is a seed from a fresh start,
        // not a smoothed value: seed again rather than blend with it.
        let restart_us = RESTART.as_secs_f64() * 1e6;
        if gap < RESTART && self.gap_us < restart_us {
            self.frames_per_read += (frames - self.frames_per_read) / 8.0;
            self.gap_us += (us - self.gap_us) / 8.0;
            self.busy_us += (busy - self.busy_us) / 8.0;
            self.samples = self.samples.saturating_add(1);
        } else {
            self.frames_per_read = frames;
            self.gap_us = us;
            self.busy_us = busy;
            self.samples = 0;
        }
        if after_pause {
            if frames < MIN_FRAMES / 2.0 {
                self.thin += 1;
            } else {
                self.thin = 0;
            }
        }
        if std::mem::take(&mut self.waits) || self.thin >= THIN_PAUSES {
            self.thin = 0;
            self.hold_until = Some(now + HOLD);
        }
        let held = self.never || self.pause.is_zero() || self.hold_until.is_some_and(|t| now < t);
        let pause_us = self.pause.as_secs_f64() * 1e6;
        let per_pause = self.frames_per_read * pause_us / self.gap_us.max(1.0);
        if self.streaming && std::mem::take(&mut self.filled) {
            // The read stopped at the buffer's end: the rest is waiting.
            self.paused = true;
            self.immediate = true;
        } else if !held
            && self.samples >= MIN_SAMPLES
            && per_pause >= MIN_FRAMES
            && self.busy_us < 2.0 * pause_us
            && self.timer.arm(self.pause)
        {
            self.paused = true;
            if !self.streaming {
                if self.stream_mark == 0 {
                    let room = self.socket.recv_buffer().unwrap_or(0) / 4;
                    self.stream_mark = STREAM_MARK.min(room).max(1);
                }
                self.streaming = self.stream_mark > 1 && self.socket.set_mark(self.stream_mark);
            }
        } else if self.streaming {
            self.stop_streaming();
            // What arrived while the mark was up may not have signalled
            // (kernels before 4.18 do not on lowering it): look once.
            self.paused = true;
            self.immediate = true;
        }
    }

    /// Whether reading waits for the pause to end (and then goes through
    /// `resume`).
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Resolves when the pause is over (never while not paused).
    pub async fn pause_over(&self) {
        if self.immediate {
            return;
        }
        if self.paused {
            self.timer.fired().await;
        } else {
            std::future::pending::<()>().await;
        }
    }

    /// The pause is over: reads what arrived into `buf` (at most its spare
    /// capacity). `Ok(0)` is end of stream; `WouldBlock` means nothing came,
    /// and reads go back to waiting on the socket as usual.
    pub fn resume(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.paused = false;
        self.after_pause = !std::mem::take(&mut self.immediate);
        let r = self.socket.read(buf);
        if matches!(&r, Err(e) if is_retry(e)) {
            self.after_pause = false;
            self.stop_streaming();
        }
        r
    }

    /// Stops coalescing for good: the connection is closing and waits for
    /// single small frames (close-ok), which a raised mark would hold back.
    pub fn stop(&mut self) {
        self.paused = false;
        self.immediate = false;
        self.never = true;
        self.stop_streaming();
    }

    fn stop_streaming(&mut self) {
        if std::mem::take(&mut self.streaming) {
            // Lowering the mark wakes the reader if anything is queued
            // (tcp_set_rcvlowat signals the socket).
            if !self.socket.set_mark(1) {
                tracing::warn!("could not lower SO_RCVLOWAT; the connection may stall");
            }
        }
    }
}

/// Whether a failed direct read means "nothing there now" rather than a
/// broken connection.
pub fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

#[cfg(target_os = "linux")]
mod sys {
    //! SO_RCVLOWAT, a direct non-blocking read, and a timerfd (tokio's
    //! timers tick in milliseconds and the pause is a fraction of one).

    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::time::Duration;

    use bytes::{BufMut, BytesMut};
    use tokio::io::unix::AsyncFd;
    use tracing::debug;

    /// The connection's socket, owned by the connection.
    pub struct Socket(pub RawFd);

    impl Socket {
        /// Sets SO_RCVLOWAT; false if the kernel refused.
        pub fn set_mark(&self, bytes: usize) -> bool {
            let v = bytes.min(i32::MAX as usize) as libc::c_int;
            // SAFETY: the fd is the connection's socket, open while the
            // connection runs; the option value is a c_int.
            let r = unsafe {
                libc::setsockopt(
                    self.0,
                    libc::SOL_SOCKET,
                    libc::SO_RCVLOWAT,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r != 0 {
                debug!("SO_RCVLOWAT {bytes}: {}", io::Error::last_os_error());
            }
            r == 0
        }

        /// SO_RCVBUF, bytes.
        pub fn recv_buffer(&self) -> Option<usize> {
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: the fd is the connection's open socket; `v` and `len`
            // are valid for the kernel to write.
            let r = unsafe {
                libc::getsockopt(
                    self.0,
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&mut v as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            (r == 0 && v > 0).then_some(v as usize)
        }

        /// One non-blocking read into `buf`'s spare capacity.
        pub fn read(&self, buf: &mut BytesMut) -> io::Result<usize> {
            if buf.capacity() == buf.len() {
                buf.reserve(4096);
            }
            let spare = buf.spare_capacity_mut();
            // SAFETY: reads at most `spare.len()` bytes into memory `buf`
            // owns; the socket is open and non-blocking (tokio's).
            let n = unsafe {
                libc::recv(
                    self.0,
                    spare.as_mut_ptr().cast(),
                    spare.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            // SAFETY: the kernel initialised the first `n` spare bytes.
            unsafe { buf.advance_mut(n) };
            Ok(n)
        }
    }

    pub struct Timer {
        /// Made the first time a pause is taken; None if that failed.
        fd: Option<AsyncFd<OwnedFd>>,
        failed: bool,
    }

    impl Timer {
        pub fn new() -> Self {
            Timer {
                fd: None,
                failed: false,
            }
        }

        /// Starts the timer; false if there is no timer to start.
        pub fn arm(&mut self, after: Duration) -> bool {
            if self.fd.is_none() && !self.failed {
                match timerfd() {
                    Ok(fd) => self.fd = Some(fd),
                    Err(e) => {
                        debug!("no timerfd, reads are not coalesced: {e}");
                        self.failed = true;
                    }
                }
            }
            let Some(t) = &self.fd else { return false };
            let spec = libc::itimerspec {
                it_interval: libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value: libc::timespec {
                    tv_sec: after.as_secs() as libc::time_t,
                    tv_nsec: after.subsec_nanos() as libc::c_long,
                },
            };
            // SAFETY: a valid timerfd and a fully initialised itimerspec.
            let r = unsafe { libc::timerfd_settime(t.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
            r == 0
        }

        /// Resolves when the armed timer has expired.
        pub async fn fired(&self) {
            let Some(t) = &self.fd else {
                return std::future::pending().await;
            };
            loop {
                // An error (the runtime shutting down) ends the pause: the
                // read after it finds out what is there.
                let Ok(mut guard) = t.readable().await else {
                    return;
                };
                let mut expirations = [0u8; 8];
                // SAFETY: reads at most 8 bytes into an 8-byte buffer.
                let n = unsafe {
                    libc::read(
                        t.as_raw_fd(),
                        expirations.as_mut_ptr().cast(),
                        expirations.len(),
                    )
                };
                if n == 8 {
                    return;
                }
                guard.clear_ready();
            }
        }
    }

    fn timerfd() -> io::Result<AsyncFd<OwnedFd>> {
        // SAFETY: plain system call; the fd is owned from here on.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nothing else owns it; the
        // OwnedFd keeps it open for as long as the AsyncFd holds it.
        unsafe {
            let owned = OwnedFd::from_raw_fd(fd);
            AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE)
                .map_err(io::Error::from)
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    //! Other unixes: reads are not coalesced (no timer to pause with), so
    //! `read` and `set_mark` are never reached.

    use std::io;
    use std::os::fd::RawFd;
    use std::time::Duration;

    use bytes::BytesMut;

    pub struct Socket(pub RawFd);

    impl Socket {
        pub fn set_mark(&self, _bytes: usize) -> bool {
            false
        }
        pub fn recv_buffer(&self) -> Option<usize> {
            None
        }
        pub fn read(&self, _buf: &mut BytesMut) -> io::Result<usize> {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }

    pub struct Timer;

    impl Timer {
        pub fn new() -> Self {
            Timer
        }
        pub fn arm(&mut self, _after: Duration) -> bool {
            false
        }
        pub async fn fired(&self) {
            std::future::pending().await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    const PAUSE: Duration = Duration::from_micros(100);

    fn method(channel: u16, class: u16, id: u16) -> Frame {
        let mut p = Vec::new();
        p.extend_from_slice(&class.to_be_bytes());
        p.extend_from_slice(&id.to_be_bytes());
        Frame::Method {
            channel,
            payload: Bytes::from(p),
        }
    }

    /// Feeds `reads` reads of `frames` publishes each, `gap` apart; returns
    /// whether the last one left reading paused.
    fn feed(
        c: &mut Coalescer,
        t: &mut Instant,
        reads: usize,
        frames: usize,
        gap: Duration,
    ) -> bool {
        for _ in 0..reads {
            *t += gap;
            if c.paused() {
                c.paused = false;
                c.after_pause = true;
            }
            c.read(*t, false);
            for _ in 0..frames {
                c.frame(&method(1, 60, 40));
            }
            c.settle();
        }
        c.paused()
    }

    // A socket fd of -1: the mark cannot be set, which the policy survives.
    fn coalescer() -> (Coalescer, Instant) {
        (Coalescer::new(-1, PAUSE), Instant::now())
    }

    #[tokio::test]
    async fn a_dense_stream_pauses_and_a_sparse_one_does_not() {
        let (mut c, mut t) = coalescer();
        assert!(feed(&mut c, &mut t, 20, 12, Duration::from_micros(50)));
        let (mut c, mut t) = coalescer();
        assert!(!feed(&mut c, &mut t, 50, 1, Duration::from_micros(200)));
        // 1000 msg/s: reads 1 ms apart never pause.
        let (mut c, mut t) = coalescer();
        assert!(!feed(&mut c, &mut t, 50, 1, Duration::from_millis(1)));
    }

    #[tokio::test]
    async fn a_synchronous_method_stops_pausing_for_a_while() {
        let (mut c, mut t) = coalescer();
        assert!(feed(&mut c, &mut t, 20, 12, Duration::from_micros(50)));
        c.paused = false;
        t += Duration::from_micros(50);
        c.read(t, false);
        c.frame(&method(1, 50, 10)); // queue.declare
        c.settle();
        assert!(!c.paused());
        assert!(!feed(&mut c, &mut t, 20, 12, Duration::from_micros(50)));
        t += HOLD;
        assert!(feed(&mut c, &mut t, 20, 12, Duration::from_micros(50)));
    }

    #[tokio::test]
    async fn a_zero_pause_never_pauses() {
        let mut c = Coalescer::new(-1, Duration::ZERO);
        let mut t = Instant::now();
        assert!(!feed(&mut c, &mut t, 50, 12, Duration::from_micros(50)));
    }

    #[tokio::test]
    async fn a_closing_connection_stops_pausing() {
        let (mut c, mut t) = coalescer();
        assert!(feed(&mut c, &mut t, 20, 12, Duration::from_micros(50)));
        c.stop();
        assert!(!c.paused());
        assert!(!feed(&mut c, &mut t, 20, 12, Duration::from_micros(50)));
    }

    #[tokio::test]
    async fn confirm_or_transaction_mode_never_pauses() {
        for select in [(85, 10), (90, 10)] {
            let (mut c, mut t) = coalescer();
            c.frame(&method(1, select.0, select.1));
            assert!(!feed(&mut c, &mut t, 20, 12, Duration::from_micros(50)));
            t += HOLD * 2;
            assert!(!feed(&mut c, &mut t, 20, 12, Duration::from_micros(50)));
        }
    }

    #[tokio::test]
    async fn pauses_that_gather_nothing_turn_pausing_off() {
        let (mut c, mut t) = coalescer();
        assert!(feed(&mut c, &mut t, 20, 12, Duration::from_micros(50)));
        // The peer now sends one frame per pause (it waits on us).
        for _ in 0..THIN_PAUSES {
            feed(&mut c, &mut t, 1, 1, PAUSE);
        }
        assert!(!c.paused());
        assert!(c.hold_until.is_some());
    }
}
