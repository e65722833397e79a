//! What a connection writes: frames from any of its tasks (answers,
//! confirms, each subscription's chunks) go through one bounded queue to
//! one writer, which writes as many as are waiting at once. A full queue
//! holds whoever sends, so a client that reads slowly slows its own
//! deliveries and nothing grows without bound; a client that takes
//! nothing for `send_timeout` is let go (the writer ends, and with it the
//! connection), as on the AMQP port.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Frames waiting for the writer, at most.
const QUEUED: usize = 256;
/// Bytes gathered into one write, about.
const WRITE_BATCH: usize = 256 << 10;

/// The sending side; cloned by each task that writes.
#[derive(Clone)]
pub struct Out {
    tx: mpsc::Sender<Bytes>,
}

impl Out {
    /// Queues a frame; false once the writer is gone (the connection
    /// ended).
    pub async fn send(&self, frame: Bytes) -> bool {
        self.tx.send(frame).await.is_ok()
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
/// `send_timeout`.
pub fn start<W: AsyncWrite + Unpin + Send + 'static>(
    mut w: W,
    send_timeout: Duration,
) -> (Out, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Bytes>(QUEUED);
    let task = tokio::spawn(async move {
        let mut batch = BytesMut::new();
        while let Some(first) = rx.recv().await {
            if rx.is_empty() {
                if !write_all(&mut w, &first, send_timeout).await {
                    return;
                }
            } else {
                batch.clear();
                batch.extend_from_slice(&first);
                while batch.len() < WRITE_BATCH {
                    match rx.try_recv() {
                        Ok(f) => batch.extend_from_slice(&f),
                        Err(_) => break,
                    }
                }
                if !write_all(&mut w, &batch, send_timeout).await {
                    return;
                }
            }
            if rx.is_empty() && !within(send_timeout, w.flush()).await {
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    (Out { tx }, task)
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
