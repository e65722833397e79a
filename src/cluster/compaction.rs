//! Snapshots by the log's size as well as by its count. openraft snapshots
//! every `snapshot_every` entries; an entry is a commit round of up to 1
//! MiB (store/raft/journal.rs), so under load the entries since the last
//! snapshot could hold gigabytes on every member (a nemesis run filled
//! 35 GB of disk in nine minutes). Every member checks once a second the
//! bytes its log holds after its last snapshot and asks for a snapshot
//! past `log_max_mb`; the snapshot lets openraft purge the log up to it
//! (less the `log_keep` entries kept for followers a little behind).

use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use super::Cluster;

/// How often the log's size is checked.
const EVERY: Duration = Duration::from_secs(1);

/// Asks for a snapshot whenever the log after the last one holds more than
/// `max_bytes`, once per snapshot: not again until one completes (or a
/// minute passed, should openraft have dropped the request).
pub(super) async fn bound_log(cluster: Arc<Cluster>, max_bytes: u64) {
    let mut stop = cluster.stop.subscribe();
    // The snapshot index when a snapshot was last asked for, and when.
    let mut asked: Option<(u64, tokio::time::Instant)> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.changed() => return,
        }
        let snapshot = cluster
            .raft
            .metrics()
            .borrow()
            .snapshot
            .map_or(0, |l| l.index);
        if let Some((at, when)) = asked {
            if at == snapshot && when.elapsed() < Duration::from_secs(60) {
                continue;
            }
        }
        let bytes = cluster.log.bytes_after(snapshot);
        if bytes <= max_bytes {
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
