//! Streams' tracked offsets (queue/stream/tracking.rs): per stream and
//! reader name, the offset the reader resumes at. Kept in the
//! definitions tree under their own prefix, so a cluster's snapshots
//! carry them with the definitions; forgotten with their stream.

use super::definitions::key;
use super::{Error, Result};

/// The keys' prefix in the definitions tree.
const TRACKED: &str = "so";

fn prefix(queue_id: u64) -> Vec<u8> {
    let mut k = key(TRACKED, &[&queue_id.to_string()]);
    k.push(0);
    k
}

fn key_of(queue_id: u64, name: &str) -> Vec<u8> {
    let mut k = prefix(queue_id);
    k.extend_from_slice(name.as_bytes());
    k
}

/// Applies `Op::TrackOffset`.
pub(super) fn track(tree: &sled::Tree, queue_id: u64, name: &str, offset: u64) -> Result<()> {
    tree.insert(key_of(queue_id, name), &offset.to_be_bytes())?;
    Ok(())
}

/// Where reader `name` of stream `queue_id` resumes, if it was tracked.
pub(super) fn tracked(tree: &sled::Tree, queue_id: u64, name: &str) -> Result<Option<u64>> {
    match tree.get(key_of(queue_id, name))? {
        None => Ok(None),
        Some(v) => {
            let bytes: [u8; 8] = v.as_ref().try_into().map_err(|_| {
                Error::Corrupt(format!("tracked offset of {name:?} in queue {queue_id}"))
            })?;
            Ok(Some(u64::from_be_bytes(bytes)))
        }
    }
}

/// Forgets stream `queue_id`'s tracked offsets.
pub(super) fn forget(tree: &sled::Tree, queue_id: u64) -> Result<()> {
    for item in tree.scan_prefix(prefix(queue_id)).keys() {
        tree.remove(item?)?;
    }
    Ok(())
}

impl super::Store {
    /// Records that reader `name` of stream `queue_id` resumes at
    /// `offset` (durable at the next commit).
    pub fn track_offset(&self, queue_id: u64, name: &str, offset: u64) -> Result<()> {
        self.submit(&super::Op::TrackOffset {
            queue_id,
            name,
            offset,
        })
        .map(drop)
    }

    /// Where reader `name` of stream `queue_id` resumes, if it is tracked.
    pub fn tracked_offset(&self, queue_id: u64, name: &str) -> Result<Option<u64>> {
        tracked(&self.defs, queue_id, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_per_stream_and_name_and_go_with_the_stream() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let t = db.open_tree("definitions").unwrap();
        track(&t, 1, "a", 5).unwrap();
        track(&t, 1, "a", 9).unwrap();
        track(&t, 1, "b", 2).unwrap();
        track(&t, 11, "a", 7).unwrap();
        assert_eq!(tracked(&t, 1, "a").unwrap(), Some(9));
        assert_eq!(tracked(&t, 1, "b").unwrap(), Some(2));
        assert_eq!(tracked(&t, 1, "c").unwrap(), None);
        forget(&t, 1).unwrap();
        assert_eq!(tracked(&t, 1, "a").unwrap(), None);
        assert_eq!(tracked(&t, 11, "a").unwrap(), Some(7));
    }
}
