//! A snapshot file: the applied trees (definitions, messages, delayed),
//! written and read one record at a time, never the whole state in RAM.
//!
//! Layout: the magic `WRNSNAP1`, then records (tree octet, key length u32,
//! key, value length u32, value, all big-endian), then the tree octet
//! `END`. A snapshot built while entries are being applied may hold some
//! effects of entries after its index; applying those entries again over
//! it gives the same state, since every operation sets the keys it touches
//! whatever they held (and a queue id counter only grows), and finds what
//! it needs in the dump: the trees go in order, definitions first; a
//! queue's deletion carries the queue's id; a vhost's deletion, which
//! finds its queues' ids in the definitions, removes their messages
//! before them (store/apply.rs), so a dump that misses the definitions
//! misses the messages too.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use crate::store::{Error, Result};

const MAGIC: &[u8; 8] = b"WRNSNAP1";
const END: u8 = 0xff;
/// Records per sled batch when loading.
const LOAD_BATCH: usize = 4096;

/// Writes `trees` (each tagged by its index) to `path`.
pub(super) fn dump(trees: &[&sled::Tree], path: &Path) -> Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path)?);
    w.write_all(MAGIC)?;
    for (tag, tree) in trees.iter().enumerate() {
        for item in tree.iter() {
            let (k, v) = item?;
            w.write_all(&[tag as u8])?;
            w.write_all(&(k.len() as u32).to_be_bytes())?;
            w.write_all(&k)?;
            w.write_all(&(v.len() as u32).to_be_bytes())?;
            w.write_all(&v)?;
        }
    }
    w.write_all(&[END])?;
    let f = w.into_inner().map_err(|e| Error::Io(e.into_error()))?;
    f.sync_all()?;
    Ok(())
}

/// Replaces the contents of `trees` with the snapshot at `path`.
pub(super) fn load(trees: &[&sled::Tree], path: &Path) -> Result<()> {
    let mut r = BufReader::with_capacity(1 << 20, File::open(path)?);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(Error::Corrupt("not a Warren snapshot".into()));
    }
    for t in trees {
        t.clear()?;
    }
    let mut batches: Vec<(sled::Batch, usize)> = trees.iter().map(|_| Default::default()).collect();
    loop {
        let mut tag = [0u8; 1];
        r.read_exact(&mut tag)?;
        if tag[0] == END {
            break;
        }
        let i = tag[0] as usize;
        if i >= trees.len() {
            return Err(Error::Corrupt(format!("snapshot tree {i}")));
        }
        let (k, v) = (read_bytes(&mut r)?, read_bytes(&mut r)?);
        let (batch, n) = &mut batches[i];
        batch.insert(k, v);
        *n += 1;
        if *n == LOAD_BATCH {
            trees[i].apply_batch(std::mem::take(batch))?;
            *n = 0;
        }
    }
    for (i, (batch, _)) in batches.into_iter().enumerate() {
        trees[i].apply_batch(batch)?;
    }
    Ok(())
}

fn read_bytes(r: &mut impl Read) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    // A length past what any record can be is corruption, not a reason
    // to allocate.
    if len > 1 << 30 {
        return Err(Error::Corrupt(format!("snapshot record of {len} bytes")));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_loads_back_into_other_trees() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let (a, b) = (db.open_tree("a").unwrap(), db.open_tree("b").unwrap());
        for i in 0..10_000u32 {
            a.insert(i.to_be_bytes(), vec![7u8; 100]).unwrap();
        }
        b.insert(b"k", b"v").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        dump(&[&a, &b], &path).unwrap();
        let other = sled::Config::new().temporary(true).open().unwrap();
        let (x, y) = (other.open_tree("a").unwrap(), other.open_tree("b").unwrap());
        y.insert(b"stale", b"gone").unwrap();
        load(&[&x, &y], &path).unwrap();
        assert_eq!(x.len(), 10_000);
        assert_eq!(y.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
        assert!(y.get(b"stale").unwrap().is_none());
    }

    /// A snapshot is built while entries are applied: one whose dump
    /// runs as a vhost's deletion is applied, installed on a follower that
    /// then replays the deletion, leaves none of the vhost's messages.
    #[cfg(feature = "failpoints")]
    #[test]
    fn a_snapshot_dumped_during_a_vhost_deletion_replays_clean() {
        use crate::message::{Message, Meta};
        use crate::store::apply::Applier;
        use crate::store::delivered::DeliveredLog;
        use crate::store::op::{Applied, Op};
        use crate::store::{tenancy, QueueDef, VhostDef};

        let db = sled::Config::new().temporary(true).open().unwrap();
        let a = Applier::new(&db, DeliveredLog::in_memory()).unwrap();
        let vhost = VhostDef {
            name: "v".into(),
            ..Default::default()
        };
        a.apply(&Op::PutVhost(&vhost)).unwrap();
        let def = QueueDef {
            vhost: "v".into(),
            name: "q".into(),
            id: 0,
            auto_delete: false,
            arguments: Default::default(),
        };
        let Applied::Queue(id) = a.apply(&Op::DeclareQueue(&def)).unwrap() else {
            panic!("no queue id");
        };
        let m = Message::new(b"", b"q", &[0x10, 0, 2], b"body", Meta::default());
        for seq in 1..=3 {
            let put = Op::PutMessage {
                queue_id: id,
                seq,
                deadline: 0,
                paged: false,
                message: &m,
            };
            a.apply(&put).unwrap();
        }
        // The dump runs once the vhost's definitions are gone and before
        // the deletion returns.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        // The fail point is global: other tests' definitions pass it too.
        let trees = [a.defs.clone(), a.msgs.clone(), a.delayed.clone()];
        let at = path.clone();
        let me = std::thread::current().id();
        fail::cfg_callback("apply-definitions-gone", move || {
            if std::thread::current().id() == me {
                dump(&trees.each_ref(), &at).unwrap();
            }
        })
        .unwrap();
        a.apply(&Op::DeleteVhost { name: "v" }).unwrap();
        fail::remove("apply-definitions-gone");

        let other = sled::Config::new().temporary(true).open().unwrap();
        let b = Applier::new(&other, DeliveredLog::in_memory()).unwrap();
        load(&[&b.defs, &b.msgs, &b.delayed], &path).unwrap();
        // The deletion's index is after the snapshot's: replayed.
        b.apply(&Op::DeleteVhost { name: "v" }).unwrap();
        assert_eq!(b.msgs.len(), 0, "the deleted vhost's messages stay");
        assert!(tenancy::queue_ids(&b.defs, "v").unwrap().is_empty());
    }
}
