//! Snapshots by the log's size as well as by its count, and the log's
//! purge. openraft snapshots every `snapshot_every` entries; an entry is a
//! commit round of up to 1 MiB (store/raft/journal.rs), so under load the
//! entries since the last snapshot could hold gigabytes on every member (a
//! nemesis run filled 35 GB of disk in nine minutes). Every member checks
//! once a second the bytes its log holds after its last snapshot and asks
//! for a snapshot past `log_max_mb`.
//!
//! The purge is done here too, not by openraft: up to the last snapshot
//! less `log_keep` entries holding at most `log_keep_mb`, and on the
//! leader never past what a live member catching up still needs
//! (catch_up.rs), as long as that holds less than `log_hold_mb`.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::Cluster;

/// How often the log's size is checked.
const EVERY: Duration = Duration::from_secs(1);

/// The log's bounds, in bytes and entries.
pub(super) struct Bounds {
    /// Past this many bytes since the last snapshot, take one.
    pub max_bytes: u64,
    /// Entries kept before the last snapshot.
    pub keep: u64,
    /// Bytes of those entries kept at the most.
    pub keep_bytes: u64,
    /// Bytes kept at the most for a member catching up.
    pub hold_bytes: u64,
}

/// Asks for a snapshot whenever the log after the last one holds more than
/// `max_bytes`, once per snapshot: not again until one completes (or a
/// minute passed, should openraft have dropped the request); purges what
/// no one needs.
pub(super) async fn bound_log(cluster: Arc<Cluster>, bounds: Bounds) {
    let mut stop = cluster.stop.subscribe();
    // The snapshot index when a snapshot was last asked for, and when.
    let mut asked: Option<(u64, tokio::time::Instant)> = None;
    // Whether a member was last let go for holding too much.
    let mut let_go = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.changed() => return,
        }
        let (snapshot, purged, floor) = {
            let m = cluster.raft.metrics();
            let m = m.borrow();
            let floor = m
                .replication
                .as_ref()
                .and_then(|r| cluster.progress.floor(r));
            (
                m.snapshot.map_or(0, |l| l.index),
                m.purged.map_or(0, |l| l.index),
                floor,
            )
        };
        let mut upto = snapshot
            .saturating_sub(bounds.keep)
            .max(cluster.log.last_beyond(snapshot, bounds.keep_bytes));
        if let Some(floor) = floor.filter(|f| *f < upto) {
            let held = cluster.log.bytes_after(floor);
            if held <= bounds.hold_bytes {
                upto = floor;
                let_go = false;
            } else if !let_go {
                warn!(
                    held,
                    floor, "a member catching up needs more than log_hold_mb: it gets a snapshot"
                );
                let_go = true;
            }
        }
        if upto > purged && cluster.raft.trigger().purge_log(upto).await.is_err() {
            return;
        }
        if let Some((at, when)) = asked {
            if at == snapshot && when.elapsed() < Duration::from_secs(60) {
                continue;
            }
        }
        let bytes = cluster.log.bytes_after(snapshot);
        if bytes <= bounds.max_bytes {
            asked = None;
            continue;
        }
        info!(
            bytes,
            snapshot, "the log since the last snapshot is past log_max_mb: snapshotting"
        );
        if cluster.raft.trigger().snapshot().await.is_ok() {
            asked = Some((snapshot, tokio::time::Instant::now()));
        }
    }
}
