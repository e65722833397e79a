//! Deduplication caches (dedup/): per exchange or durable queue, a ring
//! of `x-cache-size` slots, each the newest entry written to it. Kept in
//! the definitions tree under their own prefix, so a cluster's snapshots
//! carry them; the ring bounds what a cache keeps on disk however many
//! messages pass. Forgotten with their exchange, queue or vhost.
//!
//! Key: `k\0` ++ owner ++ slot (u64 BE); value: seq (u64 BE) ++ expiry
//! (u64 BE, ms since the epoch, 0: never) ++ the 16-byte key. (Not a
//! prefix starting with `d`: every open takes and removes what starts
//! with it, older builds' delivered marks, delivered.rs.)

use super::{Error, Result};

/// The keys' prefix in the definitions tree.
const PREFIX: &[u8] = b"k\0";

/// The owner bytes of exchange `name` of `vhost` (length-prefixed parts,
/// so a vhost's exchanges share a prefix and no owner is another's
/// prefix).
pub fn exchange_owner(vhost: &str, name: &str) -> Vec<u8> {
    let mut o = vhost_prefix(vhost);
    o.extend_from_slice(&(name.len() as u32).to_be_bytes());
    o.extend_from_slice(name.as_bytes());
    o
}

/// The owner bytes of durable queue `queue_id`.
pub fn queue_owner(queue_id: u64) -> Vec<u8> {
    let mut o = b"q".to_vec();
    o.extend_from_slice(&queue_id.to_be_bytes());
    o
}

fn vhost_prefix(vhost: &str) -> Vec<u8> {
    let mut o = b"e".to_vec();
    o.extend_from_slice(&(vhost.len() as u32).to_be_bytes());
    o.extend_from_slice(vhost.as_bytes());
    o
}

fn prefixed(owner: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(PREFIX.len() + owner.len() + 8);
    k.extend_from_slice(PREFIX);
    k.extend_from_slice(owner);
    k
}

/// One stored entry of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub slot: u64,
    pub seq: u64,
    pub expires: u64,
    pub key: [u8; 16],
}

/// Applies `Op::Dedup`.
pub(super) fn put(tree: &sled::Tree, owner: &[u8], e: &Entry) -> Result<()> {
    let mut k = prefixed(owner);
    k.extend_from_slice(&e.slot.to_be_bytes());
    let mut v = [0u8; 32];
    v[..8].copy_from_slice(&e.seq.to_be_bytes());
    v[8..16].copy_from_slice(&e.expires.to_be_bytes());
    v[16..].copy_from_slice(&e.key);
    tree.insert(k, &v)?;
    Ok(())
}

/// Every entry of cache `owner`, in slot order.
pub(super) fn entries(tree: &sled::Tree, owner: &[u8]) -> Result<Vec<Entry>> {
    let prefix = prefixed(owner);
    let mut out = Vec::new();
    for item in tree.scan_prefix(&prefix) {
        let (k, v) = item?;
        let bad = || Error::Corrupt(format!("deduplication entry {k:?}"));
        let slot: [u8; 8] = k[prefix.len()..].try_into().map_err(|_| bad())?;
        if v.len() != 32 {
            return Err(bad());
        }
        let u = |at: usize| -> Result<u64> {
            Ok(u64::from_be_bytes(
                v[at..at + 8].try_into().map_err(|_| bad())?,
            ))
        };
        out.push(Entry {
            slot: u64::from_be_bytes(slot),
            seq: u(0)?,
            expires: u(8)?,
            key: v[16..].try_into().map_err(|_| bad())?,
        });
    }
    Ok(out)
}

fn forget_prefix(tree: &sled::Tree, prefix: &[u8]) -> Result<()> {
    for k in tree.scan_prefix(prefixed(prefix)).keys() {
        tree.remove(k?)?;
    }
    Ok(())
}

/// Forgets durable queue `queue_id`'s cache.
pub(super) fn forget_queue(tree: &sled::Tree, queue_id: u64) -> Result<()> {
    forget_prefix(tree, &queue_owner(queue_id))
}

/// Forgets exchange `name`'s cache.
pub(super) fn forget_exchange(tree: &sled::Tree, vhost: &str, name: &str) -> Result<()> {
    forget_prefix(tree, &exchange_owner(vhost, name))
}

/// Forgets the caches of every exchange of `vhost` (its queues' go with
/// each queue).
pub(super) fn forget_vhost(tree: &sled::Tree, vhost: &str) -> Result<()> {
    forget_prefix(tree, &vhost_prefix(vhost))
}

impl super::Store {
    /// Records entry `e` of cache `owner` (durable at the next commit).
    pub fn put_dedup(&self, owner: &[u8], e: &Entry) -> Result<()> {
        self.submit(&super::Op::Dedup {
            owner,
            slot: e.slot,
            seq: e.seq,
            expires: e.expires,
            key: e.key,
        })
        .map(drop)
    }

    /// Every stored entry of cache `owner`.
    pub fn dedup_entries(&self, owner: &[u8]) -> Result<Vec<Entry>> {
        entries(&self.defs, owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(slot: u64, seq: u64) -> Entry {
        Entry {
            slot,
            seq,
            expires: seq * 10,
            key: [seq as u8; 16],
        }
    }

    #[test]
    fn entries_are_per_owner_and_go_with_it() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let t = db.open_tree("definitions").unwrap();
        let a = exchange_owner("/", "a");
        let ab = exchange_owner("/", "ab");
        let other = exchange_owner("v2", "a");
        let q = queue_owner(7);
        put(&t, &a, &e(0, 1)).unwrap();
        put(&t, &a, &e(1, 2)).unwrap();
        put(&t, &a, &e(0, 3)).unwrap();
        put(&t, &ab, &e(0, 4)).unwrap();
        put(&t, &other, &e(0, 5)).unwrap();
        put(&t, &q, &e(2, 6)).unwrap();
        assert_eq!(entries(&t, &a).unwrap(), vec![e(0, 3), e(1, 2)]);
        assert_eq!(entries(&t, &ab).unwrap(), vec![e(0, 4)]);
        forget_exchange(&t, "/", "a").unwrap();
        assert!(entries(&t, &a).unwrap().is_empty());
        assert_eq!(entries(&t, &ab).unwrap().len(), 1);
        forget_vhost(&t, "/").unwrap();
        assert!(entries(&t, &ab).unwrap().is_empty());
        assert_eq!(entries(&t, &other).unwrap().len(), 1);
        forget_queue(&t, 7).unwrap();
        assert!(entries(&t, &q).unwrap().is_empty());
    }
}

#[cfg(test)]
mod store_tests {
    use super::*;

    #[test]
    fn entries_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let owner = queue_owner(1);
        let e = Entry {
            slot: 0,
            seq: 0,
            expires: 0,
            key: [1; 16],
        };
        {
            let s = super::super::Store::open(dir.path(), 1 << 20).unwrap();
            s.put_dedup(&owner, &e).unwrap();
            s.flush_now().unwrap();
        }
        let s = super::super::Store::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(s.dedup_entries(&owner).unwrap(), vec![e]);
    }
}
