//! Dead segments' files, unlinked off the commit path. Unlinking a large
//! file makes the kernel drop its cached pages, about 10 ms for 64 MiB
//! here: a commit that removed a deleted stream's 150 segments itself
//! held every confirm in the broker for seconds. `remove_below` takes the
//! segments out of the log at once and hands their files here; one
//! thread unlinks them in the order given, oldest first, and syncs the
//! directory after each batch, so a crash midway still leaves no hole
//! (only older dead segments, which the next open reads and drops again).
//! A failed unlink stops the reaping: a newer file gone while an older
//! one stays would be a hole. Dropping the reaper waits for what it was
//! given (a store reopened in the same process must not find files
//! vanishing under it).

use std::fs::{self, File};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

pub struct Reaper {
    tx: Mutex<Option<mpsc::Sender<Vec<PathBuf>>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Reaper {
    /// A reaper for the segments of the directory `dir` (None: unlink
    /// them on the caller's thread, the thread could not start).
    pub fn start(dir: File) -> Reaper {
        let (tx, rx) = mpsc::channel::<Vec<PathBuf>>();
        let thread = std::thread::Builder::new()
            .name("warren-reaper".into())
            .spawn(move || {
                for batch in rx {
                    if let Err(e) = unlink(&batch, &dir) {
                        tracing::error!(
                            "cannot remove a dead log segment ({e}): the rest stay until \
                             the next start"
                        );
                        return;
                    }
                }
            });
        match thread {
            Ok(t) => Reaper {
                tx: Mutex::new(Some(tx)),
                thread: Mutex::new(Some(t)),
            },
            Err(e) => {
                tracing::warn!("no reaper thread ({e}): dead segments go on the commit path");
                Reaper {
                    tx: Mutex::new(None),
                    thread: Mutex::new(None),
                }
            }
        }
    }

    /// Unlinks `files`, oldest first, after every batch handed over
    /// before; here and now if there is no thread (then `dir` is synced).
    pub fn reap(&self, files: Vec<PathBuf>, dir: &File) -> std::io::Result<()> {
        if files.is_empty() {
            return Ok(());
        }
        let files = match self.tx.lock().as_ref() {
            Some(tx) => match tx.send(files) {
                Ok(()) => return Ok(()),
                // The thread stopped after a failure: nothing more goes
                // (a newer file gone before an older one would be a hole).
                Err(e) => {
                    tracing::warn!("{} dead log segments stay until the next start", e.0.len());
                    return Ok(());
                }
            },
            None => files,
        };
        unlink(&files, dir)
    }

    /// Waits until everything handed over is unlinked, and stops.
    pub fn finish(&self) {
        drop(self.tx.lock().take());
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.finish();
    }
}

fn unlink(files: &[PathBuf], dir: &File) -> std::io::Result<()> {
    for f in files {
        match fs::remove_file(f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    dir.sync_all()
}
