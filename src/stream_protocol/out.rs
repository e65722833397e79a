//! What a connection writes: frames from any of its tasks (answers,
//! confirms, each subscription's chunks) go through one bounded queue to
//! one writer, which writes as many as are waiting at once, in one
//! vectored write (no copy) where the socket takes one. A full queue
//! holds whoever sends, so a client that reads slowly slows its own
//! deliveries and nothing grows without bound; a client that takes
//! nothing for `send_timeout` is let go (the writer ends, and with it the
//! connection), as on the AMQP port.

use std::fs::File;
use std::future::Future;
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::store::StoredChunk;

/// Frames waiting for the writer, at most.
const QUEUED: usize = 256;
/// Bytes gathered into one write, about.
const WRITE_BATCH: usize = 256 << 10;
/// Frames in one vectored write, at most (IOV_MAX is 1024).
const MAX_SLICES: usize = 64;
/// The most bytes of a file part copied at once where the socket takes
/// no `sendfile` (TLS).
const COPY_MAX: usize = 64 << 10;

/// A part of a frame: bytes, or a stored chunk's entries where they lie
/// in the log's file.
#[derive(Clone)]
pub enum Part {
    Bytes(Bytes),
    File(StoredChunk),
}

/// What follows a frame's first part.
enum Body {
    None,
    Bytes(Bytes),
    Parts(Vec<Part>),
}

/// A socket the writer writes to: file parts go with `sendfile(2)` where
/// it is a TCP socket (no copy through this process), else read and
/// written.
pub trait Sink: AsyncWrite + Unpin + Send + 'static {
    /// Writes some of the `len` bytes of `file` from `at`; how many.
    /// `buf` is the writer's, kept for copies (a new one each time cost a
    /// page fault for every page of it).
    fn send_file<'a>(
        &'a mut self,
        file: &'a File,
        (at, len): (u64, usize),
        buf: &'a mut Vec<u8>,
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        async move {
            let n = len.min(COPY_MAX);
            if buf.len() < n {
                buf.resize(n, 0);
            }
            file.read_exact_at(&mut buf[..n], at)?;
            self.write_all(&buf[..n]).await?;
            Ok(n)
        }
    }
}

impl Sink for tokio::net::tcp::OwnedWriteHalf {
    async fn send_file(
        &mut self,
        file: &File,
        (at, len): (u64, usize),
        _: &mut Vec<u8>,
    ) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let socket: &tokio::net::TcpStream = self.as_ref();
        loop {
            socket.writable().await?;
            let sent = socket.try_io(tokio::io::Interest::WRITABLE, || {
                crate::util::sendfile(socket.as_raw_fd(), file.as_raw_fd(), at, len)
            });
            match sent {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                sent => return sent,
            }
        }
    }
}

impl<T: tokio::io::AsyncRead + AsyncWrite + Send + 'static> Sink for tokio::io::WriteHalf<T> {}

/// The sending side; cloned by each task that writes.
#[derive(Clone)]
pub struct Out {
    /// Each frame: its first part and what follows it.
    tx: mpsc::Sender<(Bytes, Body)>,
}

impl Out {
    /// Queues a frame; false once the writer is gone (the connection
    /// ended).
    pub async fn send(&self, frame: Bytes) -> bool {
        self.tx.send((frame, Body::None)).await.is_ok()
    }

    /// Queues a frame made of `head` then `body` (a body shared with
    /// other connections goes out with no copy).
    pub async fn send_parts(&self, head: Bytes, body: Bytes) -> bool {
        self.tx.send((head, Body::Bytes(body))).await.is_ok()
    }

    /// Queues a frame made of `head` then `parts` (a chunk, chunk.rs).
    pub async fn send_chunk(&self, head: Bytes, parts: Vec<Part>) -> bool {
        self.tx.send((head, Body::Parts(parts))).await.is_ok()
    }

    /// Queues the frames `write` puts into a buffer.
    pub async fn write(&self, write: impl FnOnce(&mut BytesMut)) -> bool {
        let mut b = BytesMut::with_capacity(64);
        write(&mut b);
        self.send(b.freeze()).await
    }

    /// Whether the writer is gone.
    pub fn closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves once the writer is gone.
    pub async fn gone(&self) {
        self.tx.closed().await
    }
}

/// Starts the writer of `w`; it ends when every `Out` is dropped (after
/// writing what was queued), a write fails, or a write takes longer than
/// `send_timeout`. Frames waiting together go in one vectored write
/// where `w` takes one (TCP), else copied into one buffer (TLS); a file
/// part goes on its own after what came before it (`Sink::send_file`).
pub fn start<W: Sink>(mut w: W, send_timeout: Duration) -> (Out, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<(Bytes, Body)>(QUEUED);
    let task = tokio::spawn(async move {
        let mut frames = Frames {
            vectored: w.is_write_vectored(),
            frames: Vec::with_capacity(MAX_SLICES),
            batch: BytesMut::new(),
            copy: Vec::new(),
            limit: send_timeout,
        };
        while let Some(first) = rx.recv().await {
            let mut bytes = 0;
            let mut next = Some(first);
            while let Some(f) = next.take() {
                bytes += match frames.add(&mut w, f).await {
                    Some(n) => n,
                    None => return,
                };
                if bytes < WRITE_BATCH && frames.frames.len() + 2 <= MAX_SLICES {
                    next = rx.try_recv().ok();
                }
            }
            if !frames.write(&mut w).await {
                return;
            }
            if rx.is_empty() && !within(send_timeout, w.flush()).await {
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    (Out { tx }, task)
}

/// Frames gathered for one write.
struct Frames {
    vectored: bool,
    frames: Vec<Bytes>,
    /// Where frames are copied for a socket that takes no vectored write.
    batch: BytesMut,
    /// Where file parts are read for a socket that takes no `sendfile`.
    copy: Vec<u8>,
    limit: Duration,
}

impl Frames {
    /// Adds a frame; its file parts are sent at once, after what was
    /// gathered before them. Its length; None if a write failed.
    async fn add<W: Sink>(&mut self, w: &mut W, (head, body): (Bytes, Body)) -> Option<usize> {
        let mut len = head.len();
        self.push(head);
        match body {
            Body::None => {}
            Body::Bytes(b) => {
                len += b.len();
                self.push(b);
            }
            Body::Parts(parts) => {
                for part in parts {
                    match part {
                        Part::Bytes(b) => {
                            len += b.len();
                            self.push(b);
                        }
                        Part::File(c) => {
                            len += c.len as usize;
                            if !self.write(w).await
                                || !send_file(w, &c, self.limit, &mut self.copy).await
                            {
                                return None;
                            }
                        }
                    }
                }
            }
        }
        Some(len)
    }

    fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.frames.push(b);
        }
    }

    /// Writes what was gathered; false if a write failed.
    async fn write<W: Sink>(&mut self, w: &mut W) -> bool {
        let written = match self.frames.len() {
            0 => true,
            1 => write_frames(w, &mut self.frames, self.limit).await,
            _ if self.vectored => write_frames(w, &mut self.frames, self.limit).await,
            _ => {
                self.batch.clear();
                for f in &self.frames {
                    self.batch.extend_from_slice(f);
                }
                write_all(w, &self.batch, self.limit).await
            }
        };
        self.frames.clear();
        written
    }
}

/// Sends a stored chunk's entries from its file; false as `write_all`.
async fn send_file<W: Sink>(
    w: &mut W,
    c: &StoredChunk,
    limit: Duration,
    copy: &mut Vec<u8>,
) -> bool {
    let mut sent = 0u64;
    while sent < c.len {
        let part = (c.at + sent, (c.len - sent) as usize);
        match tokio::time::timeout(limit, w.send_file(&c.file, part, copy)).await {
            Ok(Ok(0)) => return false,
            Ok(Ok(n)) => sent += n as u64,
            Ok(Err(e)) => {
                tracing::debug!("a stream chunk could not be sent from its file: {e}");
                return false;
            }
            Err(_) => {
                tracing::warn!(
                    "a stream client read nothing for {limit:?}: closing its connection"
                );
                return false;
            }
        }
    }
    true
}

/// Writes all of `frames` with vectored writes; false as `write_all`.
async fn write_frames<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: &mut [Bytes],
    limit: Duration,
) -> bool {
    let mut at = 0;
    loop {
        while at < frames.len() && frames[at].is_empty() {
            at += 1;
        }
        if at == frames.len() {
            return true;
        }
        let mut slices = [IoSlice::new(&[]); MAX_SLICES];
        let k = (frames.len() - at).min(MAX_SLICES);
        for (s, f) in slices.iter_mut().zip(&frames[at..at + k]) {
            *s = IoSlice::new(f);
        }
        let n = match tokio::time::timeout(limit, w.write_vectored(&slices[..k])).await {
            Ok(Ok(0)) | Ok(Err(_)) => return false,
            Ok(Ok(n)) => n,
            Err(_) => {
                tracing::warn!(
                    "a stream client read nothing for {limit:?}: closing its connection"
                );
                return false;
            }
        };
        let mut left = n;
        while left > 0 && at < frames.len() {
            let f = &mut frames[at];
            if left >= f.len() {
                left -= f.len();
                at += 1;
            } else {
                f.advance(left);
                left = 0;
            }
        }
    }
}

/// Writes all of `buf`; false if a write fails, or takes no bytes for
/// `limit` (a client reading slowly still makes progress; one that
/// stopped does not).
async fn write_all<W: AsyncWrite + Unpin>(w: &mut W, mut buf: &[u8], limit: Duration) -> bool {
    while !buf.is_empty() {
        match tokio::time::timeout(limit, w.write(buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return false,
            Ok(Ok(n)) => buf = &buf[n.min(buf.len())..],
            Err(_) => {
                tracing::warn!(
                    "a stream client read nothing for {limit:?}: closing its connection"
                );
                return false;
            }
        }
    }
    true
}

/// Whether `io` succeeded within `limit` (a client that stopped reading
/// is logged once, as it goes).
async fn within(
    limit: Duration,
    io: impl std::future::Future<Output = std::io::Result<()>>,
) -> bool {
    match tokio::time::timeout(limit, io).await {
        Ok(r) => r.is_ok(),
        Err(_) => {
            tracing::warn!("a stream client read nothing for {limit:?}: closing its connection");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    /// A socket that takes at most 7 bytes a write, vectored or not.
    struct Trickle {
        got: Arc<Mutex<Vec<u8>>>,
        vectored: bool,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(7);
            self.got.lock().unwrap().extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let mut n = 0;
            let mut got = self.got.lock().unwrap();
            for b in bufs {
                let k = b.len().min(7 - n);
                got.extend_from_slice(&b[..k]);
                n += k;
                if n == 7 {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            self.vectored
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl Sink for Trickle {}

    /// A trickling socket, and what it got.
    fn trickle(vectored: bool) -> (Trickle, Arc<Mutex<Vec<u8>>>) {
        let got = Arc::new(Mutex::new(Vec::new()));
        let w = Trickle {
            got: Arc::clone(&got),
            vectored,
        };
        (w, got)
    }

    /// A file holding `bytes` after a few others, and the part naming them.
    fn file_part(bytes: &[u8]) -> (tempfile::NamedTempFile, Part) {
        use std::io::Write;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"before").unwrap();
        f.write_all(bytes).unwrap();
        let c = StoredChunk {
            file: Arc::new(f.reopen().unwrap()),
            at: 6,
            len: bytes.len() as u64,
            crc: 0,
            count: 1,
            time: 0,
        };
        (f, Part::File(c))
    }

    /// Frames with parts in a file, among frames without, reach the
    /// socket whole and in order: read and written where it takes no
    /// `sendfile` (short writes), sent from the file to a TCP socket.
    #[tokio::test]
    async fn file_parts_arrive_in_their_place() {
        let big: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
        let (_f, part) = file_part(&big);
        let (big, part) = (&big, &part);
        let frames = |out: Out| async move {
            let mut want = Vec::new();
            for i in 0..3u8 {
                assert!(out.send(Bytes::from(vec![i; 5])).await);
                want.extend_from_slice(&[i; 5]);
                let parts = vec![Part::Bytes(Bytes::from_static(b"head")), part.clone()];
                assert!(out.send_chunk(Bytes::from_static(b"frame"), parts).await);
                want.extend_from_slice(b"framehead");
                want.extend_from_slice(big);
            }
            want
        };
        for vectored in [true, false] {
            let (w, got) = trickle(vectored);
            let (out, task) = start(w, Duration::from_secs(5));
            let want = frames(out).await;
            task.await.unwrap();
            assert!(*got.lock().unwrap() == want, "vectored: {vectored}");
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            got
        });
        let socket = tokio::net::TcpStream::connect(at).await.unwrap();
        let (_rd, wr) = socket.into_split();
        let (out, task) = start(wr, Duration::from_secs(5));
        let want = frames(out).await;
        task.await.unwrap();
        assert!(reader.await.unwrap() == want, "over TCP");
    }

    /// Frames queued together reach the socket whole and in order
    /// through short writes, vectored or copied.
    #[tokio::test]
    async fn frames_arrive_whole_and_in_order_through_short_writes() {
        for vectored in [true, false] {
            let (w, got) = trickle(vectored);
            let (out, task) = start(w, Duration::from_secs(5));
            let mut want = Vec::new();
            // Empty frames among them (the first is one).
            for i in 0..300u32 {
                let frame: Vec<u8> = (0..i % 23).map(|k| (i + k) as u8).collect();
                want.extend_from_slice(&frame);
                assert!(out.send(Bytes::from(frame)).await);
            }
            drop(out);
            task.await.unwrap();
            assert_eq!(*got.lock().unwrap(), want, "vectored: {vectored}");
        }
    }
}
