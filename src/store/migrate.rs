//! Moving an older data dir's messages from sled's messages tree into
//! the message log (msglog), once, at the first open by this version.
//!
//! Every persistent record is appended to the log as it was stored (paged
//! transient ones are dropped, as any open drops them), the log is synced,
//! and only then is the tree cleared and sled flushed. A crash in between
//! leaves both: the next open moves them again, and the log's index keeps
//! the last record of each message, the same bytes.

use super::messages::{is_paged, split_key};
use super::msglog::MessageLog;
use super::{Error, Result};

/// Moves every message of `msgs` (in `db`) into `log`.
pub fn messages_to_log(db: &sled::Db, msgs: &sled::Tree, log: &MessageLog) -> Result<()> {
    if msgs.is_empty() {
        return Ok(());
    }
    let mut moved = 0u64;
    for item in msgs.iter() {
        let (k, v) = item?;
        let (queue, seq) = split_key(&k).ok_or_else(|| Error::Corrupt("message key".into()))?;
        if !is_paged(&v) {
            log.put_encoded(queue, seq, &v)?;
            moved += 1;
        }
    }
    log.close()?;
    msgs.clear()?;
    db.flush()?;
    tracing::info!(
        moved,
        "moved the stored messages from sled into the message log"
    );
    Ok(())
}
