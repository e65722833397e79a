//! What a connection writes: frames from any of its tasks (answers,
//! confirms, each subscription's chunks) go through one bounded queue to
//! one writer, which writes as many as are waiting at once, in one
//! vectored write (no copy) where the socket takes one. A full queue
//! holds whoever sends, so a client that reads slowly slows its own
//! deliveries and nothing grows without bound; a client that takes
//! nothing for `send_timeout` is let go (the writer ends, and with it the
//! connection), as on the AMQP port.

use std::io::IoSlice;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Frames waiting for the writer, at most.
const QUEUED: usize = 256;
/// Bytes gathered into one write, about.
const WRITE_BATCH: usize = 256 << 10;
/// Frames in one vectored write, at most (IOV_MAX is 1024).
const MAX_SLICES: usize = 64;

/// The sending side; cloned by each task that writes.
#[derive(Clone)]
pub struct Out {
    /// Each frame in one or two parts (the second empty for one).
    tx: mpsc::Sender<(Bytes, Bytes)>,
}

impl Out {
    /// Queues a frame; false once the writer is gone (the connection
    /// ended).
    pub async fn send(&self, frame: Bytes) -> bool {
        self.tx.send((frame, Bytes::new())).await.is_ok()
    }

    /// Queues a frame made of `head` then `body` (a body shared with
    /// other connections goes out with no copy).
    pub async fn send_parts(&self, head: Bytes, body: Bytes) -> bool {
        self.tx.send((head, body)).await.is_ok()
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
/// where `w` takes one (TCP), else copied into one buffer (TLS).
pub fn start<W: AsyncWrite + Unpin + Send + 'static>(
    mut w: W,
    send_timeout: Duration,
) -> (Out, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<(Bytes, Bytes)>(QUEUED);
    let task = tokio::spawn(async move {
        let vectored = w.is_write_vectored();
        let mut frames: Vec<Bytes> = Vec::with_capacity(MAX_SLICES);
        let mut batch = BytesMut::new();
        while let Some(first) = rx.recv().await {
            let mut bytes = add(&mut frames, first);
            while bytes < WRITE_BATCH && frames.len() + 2 <= MAX_SLICES {
                match rx.try_recv() {
                    Ok(f) => bytes += add(&mut frames, f),
                    Err(_) => break,
                }
            }
            let written = if vectored || frames.len() == 1 {
                write_frames(&mut w, &mut frames, send_timeout).await
            } else {
                batch.clear();
                for f in frames.drain(..) {
                    batch.extend_from_slice(&f);
                }
                write_all(&mut w, &batch, send_timeout).await
            };
            frames.clear();
            if !written {
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

/// Adds a frame's parts to `frames`; its length.
fn add(frames: &mut Vec<Bytes>, (head, body): (Bytes, Bytes)) -> usize {
    let len = head.len() + body.len();
    frames.push(head);
    if !body.is_empty() {
        frames.push(body);
    }
    len
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

    /// Frames queued together reach the socket whole and in order
    /// through short writes, vectored or copied.
    #[tokio::test]
    async fn frames_arrive_whole_and_in_order_through_short_writes() {
        for vectored in [true, false] {
            let got = Arc::new(Mutex::new(Vec::new()));
            let w = Trickle {
                got: Arc::clone(&got),
                vectored,
            };
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
