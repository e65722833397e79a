//! What openraft reads and writes as a snapshot's data: a file, dumped
//! from the applied state only when it is first read.
//!
//! A member's applied state is its own sled trees and message log, made
//! durable by checkpoints (checkpoint.rs); a snapshot needs no copy of it
//! to let the Raft log be purged. So building one records its meta only
//! (machine.rs), and the state is written out when a leader sends it to a
//! member that needs it: the first read or seek of this data starts the
//! dump, on a blocking thread, and the reads wait for it. openraft also
//! asks for the current snapshot at every start and drops it unread: that
//! dumps nothing.
//!
//! A dump made later than its meta's index holds the effects of entries
//! after it; the member installing it applies them again, which changes
//! nothing (snapshot.rs). Dumps of one snapshot are shared: the first one
//! stays in `sending-<id>.snapshot` until a newer snapshot is built, and
//! each reader opens it for itself.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};
use tokio::task::JoinHandle;

use super::snapshot;
use crate::store::msglog::MessageLog;

/// The applied state a snapshot's data is dumped from.
#[derive(Clone)]
pub struct Source {
    pub trees: [sled::Tree; 3],
    /// The messages (else in `trees[1]`).
    pub log: Option<Arc<MessageLog>>,
    /// Where dumps go.
    pub dir: PathBuf,
    /// Held while a dump is made: one at a time, and a second reader of
    /// the same snapshot finds the first one's file.
    pub dumping: Arc<parking_lot::Mutex<()>>,
    /// Names the current snapshot (machine.rs `SNAPSHOT`).
    pub meta: sled::Tree,
}

impl Source {
    /// The dump of snapshot `id`, made if there is none yet.
    fn dump(&self, id: &str) -> io::Result<std::fs::File> {
        let _one = self.dumping.lock();
        let path = sending_file(&self.dir, id);
        match std::fs::File::open(&path) {
            Ok(f) => return Ok(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let tmp = self.dir.join(format!("dumping-{id}.snapshot"));
        let trees = self.trees.each_ref();
        snapshot::dump(&trees, self.log.as_deref(), &tmp).map_err(io::Error::other)?;
        // Opened before it is renamed: a newer snapshot's build removes
        // the older dumps without waiting for this one.
        let f = std::fs::File::open(&tmp)?;
        std::fs::rename(&tmp, &path)?;
        if !self.is_current(id) {
            // A newer snapshot was built meanwhile: no later reader wants
            // this one (this reader keeps its handle).
            let _ = std::fs::remove_file(&path);
        }
        tracing::info!(snapshot = id, "snapshot dumped to be sent");
        Ok(f)
    }

    /// Whether `id` is the current snapshot's.
    fn is_current(&self, id: &str) -> bool {
        super::machine::current_snapshot(&self.meta)
            .ok()
            .flatten()
            .is_some_and(|m| m.snapshot_id == id)
    }
}

/// The file a snapshot's dump is kept in while it is current.
pub(super) fn sending_file(dir: &std::path::Path, id: &str) -> PathBuf {
    dir.join(format!("sending-{id}.snapshot"))
}

enum State {
    /// A file: one being received, or a dump ready to read.
    Ready(tokio::fs::File),
    /// Not dumped yet.
    Lazy(Source, String),
    /// Being dumped.
    Dumping(JoinHandle<io::Result<std::fs::File>>),
    /// Taken by a failed dump.
    Failed,
}

/// A snapshot's data (openraft's `SnapshotData`).
pub struct SnapshotData {
    state: State,
    /// A seek asked for before the dump was ready.
    seek: Option<io::SeekFrom>,
}

impl SnapshotData {
    /// Data in `f` (a snapshot being received).
    pub fn file(f: tokio::fs::File) -> SnapshotData {
        SnapshotData {
            state: State::Ready(f),
            seek: None,
        }
    }

    /// Snapshot `id`'s data, dumped from `source` when first read.
    pub fn lazy(source: Source, id: String) -> SnapshotData {
        SnapshotData {
            state: State::Lazy(source, id),
            seek: None,
        }
    }

    /// The file, once there is one.
    pub fn as_file(&mut self) -> io::Result<&mut tokio::fs::File> {
        match &mut self.state {
            State::Ready(f) => Ok(f),
            _ => Err(io::Error::other("the snapshot is not dumped")),
        }
    }

    /// Starts the dump if it has not begun; ready once the file is.
    fn poll_file(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&mut tokio::fs::File>> {
        loop {
            match &mut self.state {
                State::Ready(_) => break,
                State::Lazy(..) => {
                    let State::Lazy(source, id) = std::mem::replace(&mut self.state, State::Failed)
                    else {
                        unreachable!("matched above")
                    };
                    self.state =
                        State::Dumping(tokio::task::spawn_blocking(move || source.dump(&id)));
                }
                State::Dumping(job) => {
                    let done = ready!(Pin::new(job).poll(cx));
                    match done.map_err(io::Error::other).and_then(|r| r) {
                        Ok(f) => self.state = State::Ready(tokio::fs::File::from_std(f)),
                        Err(e) => {
                            self.state = State::Failed;
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                State::Failed => {
                    return Poll::Ready(Err(io::Error::other("the snapshot's dump failed")))
                }
            }
        }
        match &mut self.state {
            State::Ready(f) => Poll::Ready(Ok(f)),
            _ => unreachable!("the loop breaks only when ready"),
        }
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let f = ready!(self.get_mut().poll_file(cx))?;
        Pin::new(f).poll_read(cx, buf)
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        match &mut this.state {
            State::Ready(f) => {
                this.seek = None;
                Pin::new(f).start_seek(position)
            }
            _ => {
                this.seek = Some(position);
                Ok(())
            }
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let this = self.get_mut();
        let seek = this.seek;
        let f = ready!(this.poll_file(cx))?;
        if let Some(position) = seek {
            Pin::new(&mut *f).start_seek(position)?;
            this.seek = None;
            let State::Ready(f) = &mut this.state else {
                unreachable!("poll_file made it ready")
            };
            return Pin::new(f).poll_complete(cx);
        }
        Pin::new(f).poll_complete(cx)
    }
}

fn not_writable() -> io::Error {
    io::Error::other("a snapshot being sent is not written to")
}

impl AsyncWrite for SnapshotData {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().state {
            State::Ready(f) => Pin::new(f).poll_write(cx, b),
            _ => Poll::Ready(Err(not_writable())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().state {
            State::Ready(f) => Pin::new(f).poll_flush(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().state {
            State::Ready(f) => Pin::new(f).poll_shutdown(cx),
            _ => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, Meta};
    use tokio::io::{AsyncReadExt, AsyncSeekExt};

    fn source(dir: &std::path::Path) -> Source {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let trees = ["d", "m", "y"].map(|n| db.open_tree(n).unwrap());
        trees[0].insert(b"k", b"v").unwrap();
        let log = Arc::new(MessageLog::temporary().unwrap());
        let m = Message::new(b"", b"q", &[0x10, 0, 2], b"body", Meta::default());
        log.put(7, 1, &m, false, 0, 0).unwrap();
        let meta = db.open_tree("raft_sm").unwrap();
        let current = openraft::SnapshotMeta::<u64, super::super::Member> {
            snapshot_id: "1-5-x".into(),
            ..Default::default()
        };
        meta.insert(
            super::super::machine::SNAPSHOT,
            bincode::serialize(&current).unwrap(),
        )
        .unwrap();
        Source {
            trees,
            log: Some(log),
            dir: dir.to_path_buf(),
            dumping: Arc::default(),
            meta,
        }
    }

    /// Nothing is dumped until the data is read; then a seek to the end
    /// waits for the dump, and two readers share one file.
    #[tokio::test]
    async fn the_dump_waits_for_the_first_read() {
        let dir = tempfile::tempdir().unwrap();
        let src = source(dir.path());
        let unread = SnapshotData::lazy(src.clone(), "1-5-x".into());
        drop(unread);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

        let mut a = SnapshotData::lazy(src.clone(), "1-5-x".into());
        let end = a.seek(io::SeekFrom::End(0)).await.unwrap();
        assert!(end > 8, "the dump holds a definition and a message");
        a.seek(io::SeekFrom::Start(0)).await.unwrap();
        let mut bytes = Vec::new();
        a.read_to_end(&mut bytes).await.unwrap();
        assert_eq!(bytes.len() as u64, end);
        assert_eq!(&bytes[..8], b"WRNSNAP1");

        // Another reader of the same snapshot reads the same file.
        let mut b = SnapshotData::lazy(src, "1-5-x".into());
        let mut again = Vec::new();
        b.read_to_end(&mut again).await.unwrap();
        assert_eq!(again, bytes);
        assert!(sending_file(dir.path(), "1-5-x").exists());
    }

    /// A dump of a snapshot that is no longer the current one is read by
    /// the stream that asked for it and not kept for another.
    #[tokio::test]
    async fn an_older_snapshots_dump_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = SnapshotData::lazy(source(dir.path()), "1-4-old".into());
        let mut bytes = Vec::new();
        old.read_to_end(&mut bytes).await.unwrap();
        assert_eq!(&bytes[..8], b"WRNSNAP1");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// Data not dumped yet is not written to.
    #[tokio::test]
    async fn lazy_data_refuses_writes() {
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().unwrap();
        let mut lazy = SnapshotData::lazy(source(dir.path()), "1-5-x".into());
        assert!(lazy.write_all(b"x").await.is_err());
    }
}
