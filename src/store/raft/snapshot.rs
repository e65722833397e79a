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
//!
//! A member keeps its messages in the message log (store/msglog): tree 1
//! (messages) is written from the log's index, each message as sled's
//! messages tree held it (key: queue id and seq; value: the message
//! record), and loaded back into the log; so members that keep their
//! messages in sled (older builds) and in the log read each other's
//! snapshots.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use crate::store::messages::{encode_record, message_key, split_key};
use crate::store::msglog::MessageLog;
use crate::store::op::TIMED_RECORDS;
use crate::store::{Error, Result};

const MAGIC: &[u8; 8] = b"WRNSNAP1";
const END: u8 = 0xff;
/// Records per sled batch when loading.
const LOAD_BATCH: usize = 4096;

/// The tag of the messages' records.
const MESSAGES: usize = 1;

fn record(w: &mut impl Write, tag: usize, k: &[u8], v: &[u8]) -> Result<()> {
    w.write_all(&[tag as u8])?;
    w.write_all(&(k.len() as u32).to_be_bytes())?;
    w.write_all(k)?;
    w.write_all(&(v.len() as u32).to_be_bytes())?;
    w.write_all(v)?;
    Ok(())
}

/// Writes `trees` (each tagged by its index) to `path`; with `log`, the
/// messages (tag 1) come from it instead of `trees[1]`. Not synced: a dump
/// is a copy made to be sent (snapshot_data.rs), removed at the next
/// start; the member receiving it syncs what it received.
pub(super) fn dump(trees: &[&sled::Tree], log: Option<&MessageLog>, path: &Path) -> Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path)?);
    w.write_all(MAGIC)?;
    // Members that do not read records' times may still be in the cluster
    // until its version says otherwise.
    let timed = crate::store::cluster_version::read(trees[0])? >= TIMED_RECORDS;
    for (tag, tree) in trees.iter().enumerate() {
        if let Some(log) = log.filter(|_| tag == MESSAGES) {
            let mut ids = log.queue_ids()?;
            ids.sort_unstable();
            let mut v = bytes::BytesMut::new();
            for queue in ids {
                for m in log.stored(queue) {
                    let m = m?;
                    let time = if timed { m.time } else { 0 };
                    encode_record(&m.message, false, m.deadline, time, &mut v);
                    record(&mut w, tag, &message_key(queue, m.seq), &v)?;
                }
            }
            continue;
        }
        for item in tree.iter() {
            let (k, v) = item?;
            record(&mut w, tag, &k, &v)?;
        }
    }
    w.write_all(&[END])?;
    w.into_inner().map_err(|e| Error::Io(e.into_error()))?;
    Ok(())
}

/// Replaces the contents of `trees` with the snapshot at `path`; with
/// `log`, the messages go there instead of `trees[1]` (the caller commits
/// the log).
pub(super) fn load(trees: &[&sled::Tree], log: Option<&MessageLog>, path: &Path) -> Result<()> {
    let mut r = BufReader::with_capacity(1 << 20, File::open(path)?);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(Error::Corrupt("not a Warren snapshot".into()));
    }
    for t in trees {
        t.clear()?;
    }
    if let Some(log) = log {
        for queue in log.queue_ids()? {
            log.purge_from(queue, 0)?;
        }
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
        if let Some(log) = log.filter(|_| i == MESSAGES) {
            let (queue, seq) =
                split_key(&k).ok_or_else(|| Error::Corrupt("snapshot message key".into()))?;
            log.put_encoded(queue, seq, &v)?;
            continue;
        }
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
        dump(&[&a, &b], None, &path).unwrap();
        let other = sled::Config::new().temporary(true).open().unwrap();
        let (x, y) = (other.open_tree("a").unwrap(), other.open_tree("b").unwrap());
        y.insert(b"stale", b"gone").unwrap();
        load(&[&x, &y], None, &path).unwrap();
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
                time: 0,
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
                dump(&trees.each_ref(), None, &at).unwrap();
            }
        })
        .unwrap();
        a.apply(&Op::DeleteVhost { name: "v" }).unwrap();
        fail::remove("apply-definitions-gone");

        let other = sled::Config::new().temporary(true).open().unwrap();
        let b = Applier::new(&other, DeliveredLog::in_memory()).unwrap();
        load(&[&b.defs, &b.msgs, &b.delayed], None, &path).unwrap();
        // The deletion's index is after the snapshot's: replayed.
        b.apply(&Op::DeleteVhost { name: "v" }).unwrap();
        assert_eq!(b.msgs.len(), 0, "the deleted vhost's messages stay");
        assert!(tenancy::queue_ids(&b.defs, "v").unwrap().is_empty());
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;
    use crate::message::{Message, Meta};

    fn put(log: &MessageLog, queue: u64, seq: u64, deadline: u64) {
        let body = format!("{queue}.{seq}");
        let m = Message::new(b"", b"q", &[0x10, 0, 2], body.as_bytes(), Meta::default());
        log.put(queue, seq, &m, false, deadline, 0).unwrap();
    }

    fn contents(log: &MessageLog) -> Vec<(u64, u64, Vec<u8>, u64)> {
        let mut ids = log.queue_ids().unwrap();
        ids.sort_unstable();
        let mut out = Vec::new();
        for q in ids {
            for m in log.stored(q) {
                let m = m.unwrap();
                out.push((q, m.seq, m.message.body().to_vec(), m.deadline));
            }
        }
        out
    }

    /// A member's messages travel in a snapshot from its log to another
    /// member's log (whose older messages go), and to and from a member
    /// that keeps them in sled (an older build), with their deadlines.
    #[test]
    fn messages_go_from_log_to_log_and_to_and_from_sled() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let trees = ["d", "m", "x"].map(|n| db.open_tree(n).unwrap());
        trees[0].insert(b"def", b"v").unwrap();
        let a = MessageLog::temporary().unwrap();
        put(&a, 3, 1, 0);
        put(&a, 3, 2, 77);
        put(&a, 9, 5, 0);
        a.remove(3, 1).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        dump(&trees.each_ref(), Some(&a), &path).unwrap();

        let b = MessageLog::temporary().unwrap();
        put(&b, 3, 1, 0);
        put(&b, 4, 1, 0);
        let other = sled::Config::new().temporary(true).open().unwrap();
        let mine = ["d", "m", "x"].map(|n| other.open_tree(n).unwrap());
        load(&mine.each_ref(), Some(&b), &path).unwrap();
        assert_eq!(contents(&b), contents(&a));
        assert_eq!(contents(&b)[0], (3, 2, b"3.2".to_vec(), 77));
        assert_eq!(mine[0].get(b"def").unwrap().as_deref(), Some(&b"v"[..]));
        assert!(mine[1].is_empty(), "the messages went to the log");

        // To an older member: sled's messages tree.
        let old = sled::Config::new().temporary(true).open().unwrap();
        let theirs = ["d", "m", "x"].map(|n| old.open_tree(n).unwrap());
        load(&theirs.each_ref(), None, &path).unwrap();
        assert_eq!(theirs[1].len(), 2);
        // And back from it.
        let back = dir.path().join("back");
        dump(&theirs.each_ref(), None, &back).unwrap();
        let c = MessageLog::temporary().unwrap();
        load(&mine.each_ref(), Some(&c), &back).unwrap();
        assert_eq!(contents(&c), contents(&a));
    }

    /// A snapshot's messages keep the time they were stored only once the
    /// cluster's version says every member reads it.
    #[test]
    fn times_travel_once_the_cluster_version_allows() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let trees = ["d", "m", "x"].map(|n| db.open_tree(n).unwrap());
        let a = MessageLog::temporary().unwrap();
        let m = Message::new(b"", b"q", &[0x10, 0, 2], b"b", Meta::default());
        a.put(3, 1, &m, false, 0, 1_700_000_000_123).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let times = |path: &Path| {
            let b = MessageLog::temporary().unwrap();
            let other = sled::Config::new().temporary(true).open().unwrap();
            let mine = ["d", "m", "x"].map(|n| other.open_tree(n).unwrap());
            load(&mine.each_ref(), Some(&b), path).unwrap();
            b.stored(3).map(|m| m.unwrap().time).collect::<Vec<_>>()
        };
        let before = dir.path().join("before");
        dump(&trees.each_ref(), Some(&a), &before).unwrap();
        assert_eq!(times(&before), vec![0], "an older member may read it");
        crate::store::cluster_version::raise(&trees[0], TIMED_RECORDS).unwrap();
        let after = dir.path().join("after");
        dump(&trees.each_ref(), Some(&a), &after).unwrap();
        assert_eq!(times(&after), vec![1_700_000_000_123]);
    }
}
