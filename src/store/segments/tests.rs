use super::*;

fn payload(i: usize) -> Vec<u8> {
    (0..(i * 7) % 90).map(|j| (i + j) as u8).collect()
}

/// Appends `n` records (kind i % 5); returns their positions.
fn fill(log: &SegmentLog, from: usize, n: usize) -> Vec<u64> {
    (from..from + n)
        .map(|i| log.append((i % 5) as u8, &payload(i)).unwrap())
        .collect()
}

fn all(log: &SegmentLog, from: u64) -> Vec<(u64, Record)> {
    let mut out = Vec::new();
    log.scan(from, |p, r| {
        out.push((p, r));
        true
    })
    .unwrap();
    out
}

fn want(i: usize) -> Record {
    Record {
        kind: (i % 5) as u8,
        payload: payload(i),
    }
}

#[test]
fn records_read_back_by_position_and_in_order_across_segments_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with(dir.path(), 256).unwrap();
    let pos = fill(&log, 0, 60);
    // From the buffer, then from the files.
    assert_eq!(log.read(pos[59]).unwrap(), want(59));
    log.flush().unwrap();
    for (i, &p) in pos.iter().enumerate() {
        assert_eq!(log.read(p).unwrap(), want(i));
    }
    assert!(log.segments().len() > 5, "{:?}", log.segments());
    assert_eq!(log.sync().unwrap(), log.end());
    drop(log);
    let log = SegmentLog::open_with(dir.path(), 256).unwrap();
    let got = all(&log, pos[0]);
    assert_eq!(got.len(), 60);
    for (i, (p, r)) in got.iter().enumerate() {
        assert_eq!((*p, r), (pos[i], &want(i)));
    }
    assert_eq!(all(&log, pos[30]).len(), 30, "from the middle");
    // Appends go on after the last record.
    let next = log.append(9, b"after").unwrap();
    assert!(next > pos[59]);
    assert_eq!(log.read(next).unwrap().payload, b"after");
}

#[test]
fn a_record_larger_than_a_segment_gets_one_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with(dir.path(), 128).unwrap();
    let a = log.append(1, b"small").unwrap();
    let big = log.append(2, &[7u8; 1000]).unwrap();
    let c = log.append(3, b"after").unwrap();
    log.sync().unwrap();
    drop(log);
    let log = SegmentLog::open_with(dir.path(), 128).unwrap();
    assert_eq!(log.read(a).unwrap().payload, b"small");
    assert_eq!(log.read(big).unwrap().payload, vec![7u8; 1000]);
    assert_eq!(log.read(c).unwrap().payload, b"after");
    assert_eq!(log.segments(), vec![0, big, c]);
}

/// Copies the log in `from` to a new directory.
fn copy(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.path().join(e.file_name())).unwrap();
    }
    to
}

fn last_segment(dir: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    segs.pop().unwrap()
}

#[test]
fn a_torn_tail_past_the_synced_position_is_cut_at_every_point() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with(dir.path(), 1 << 20).unwrap();
    let synced_pos = fill(&log, 0, 20);
    let synced = log.sync().unwrap();
    let torn_pos = fill(&log, 20, 10);
    log.flush().unwrap();
    drop(log);
    let seg = last_segment(dir.path());
    let full = fs::metadata(&seg).unwrap().len();
    let synced_len = synced + MAGIC.len() as u64;
    for len in synced_len..full {
        let d = copy(dir.path());
        let f = OpenOptions::new()
            .write(true)
            .open(d.path().join(seg.file_name().unwrap()))
            .unwrap();
        f.set_len(len).unwrap();
        drop(f);
        let log = SegmentLog::open_with(d.path(), 1 << 20).unwrap();
        let got = all(&log, 0);
        // Every synced record, then the whole records the cut left.
        let whole = torn_pos
            .iter()
            .take_while(|&&p| {
                let i = torn_pos.iter().position(|&q| q == p).unwrap() + 20;
                p + (HEADER + payload(i).len()) as u64 + MAGIC.len() as u64 <= len
            })
            .count();
        assert_eq!(got.len(), 20 + whole, "cut at {len}");
        for (i, (p, r)) in got.iter().enumerate() {
            let at = if i < 20 {
                synced_pos[i]
            } else {
                torn_pos[i - 20]
            };
            assert_eq!((*p, r), (at, &want(i)), "cut at {len}");
        }
        // The log goes on from where the cut left it.
        let next = log.append(4, b"next").unwrap();
        log.sync().unwrap();
        drop(log);
        let log = SegmentLog::open_with(d.path(), 1 << 20).unwrap();
        assert_eq!(log.read(next).unwrap().payload, b"next", "cut at {len}");
    }
}

#[test]
fn damage_past_the_synced_position_is_cut_and_below_it_stops_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with(dir.path(), 1 << 20).unwrap();
    let pos = fill(&log, 0, 20);
    log.sync().unwrap();
    let later = fill(&log, 20, 5);
    log.flush().unwrap();
    drop(log);
    let seg = last_segment(dir.path());
    let flip = |d: &Path, at: u64| {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(d.join(seg.file_name().unwrap()))
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x55], at).unwrap();
    };
    // A flipped byte in the third unsynced record: cut from there.
    let d = copy(dir.path());
    flip(d.path(), later[2] + MAGIC.len() as u64 + HEADER as u64);
    let log = SegmentLog::open_with(d.path(), 1 << 20).unwrap();
    assert_eq!(all(&log, 0).len(), 22);
    assert_eq!(log.end(), later[2]);
    drop(log);
    // The same in a synced record: the log does not open.
    let d = copy(dir.path());
    flip(d.path(), pos[5] + MAGIC.len() as u64 + 2);
    let e = SegmentLog::open_with(d.path(), 1 << 20)
        .err()
        .expect("refused");
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("below the synced position"), "{e}");
}

#[test]
fn whole_segments_below_a_position_go_and_the_rest_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with(dir.path(), 256).unwrap();
    let pos = fill(&log, 0, 60);
    log.sync().unwrap();
    let before = log.segments();
    let removed = log.remove_below(pos[40]).unwrap();
    assert!(removed > 0);
    let after = log.segments();
    assert_eq!(after.len(), before.len() - removed);
    assert!(after[0] <= pos[40], "the segment holding it stays");
    assert_eq!(log.read(pos[40]).unwrap(), want(40));
    drop(log);
    let log = SegmentLog::open_with(dir.path(), 256).unwrap();
    let got = all(&log, after[0]);
    assert_eq!(got.last().map(|(p, _)| *p), Some(pos[59]));
    assert_eq!(log.read(pos[59]).unwrap(), want(59));
}

#[test]
fn a_segment_created_but_never_written_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with(dir.path(), 1 << 20).unwrap();
    let pos = fill(&log, 0, 3);
    let end = log.sync().unwrap();
    drop(log);
    // A crash right after the next segment's file was made.
    fs::write(dir.path().join(format!("{end:020}.seg")), b"").unwrap();
    let log = SegmentLog::open_with(dir.path(), 1 << 20).unwrap();
    assert_eq!(log.segments(), vec![0]);
    assert_eq!(all(&log, 0).len(), 3);
    assert_eq!(log.read(pos[2]).unwrap(), want(2));
    // And an empty log whose first file was cut before its magic.
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(format!("{:020}.seg", 0)), b"WS").unwrap();
    let log = SegmentLog::open_with(dir.path(), 1 << 20).unwrap();
    assert_eq!(log.end(), 0);
    assert_eq!(
        log.read(log.append(1, b"x").unwrap()).unwrap().payload,
        b"x"
    );
}

#[test]
fn a_segment_that_lost_its_unsynced_end_before_the_next_one_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with(dir.path(), 256).unwrap();
    let synced_pos = fill(&log, 0, 3);
    log.sync().unwrap();
    let later = fill(&log, 3, 40);
    log.flush().unwrap();
    let segs = log.segments();
    assert!(segs.len() >= 3, "{segs:?}");
    drop(log);
    // A crash lost the second segment's last record whole (its file is
    // shorter, every record in it whole); the third one's file, made at
    // the roll, survived.
    let k = later
        .iter()
        .rposition(|&p| p >= segs[1] && p < segs[2])
        .unwrap();
    let second = dir.path().join(format!("{:020}.seg", segs[1]));
    OpenOptions::new()
        .write(true)
        .open(&second)
        .unwrap()
        .set_len(later[k] - segs[1] + MAGIC.len() as u64)
        .unwrap();
    let log = SegmentLog::open_with(dir.path(), 256).unwrap();
    let got = all(&log, 0);
    assert_eq!(got.len(), 3 + k, "up to the lost record");
    for (i, (p, r)) in got.iter().enumerate() {
        let at = if i < 3 { synced_pos[i] } else { later[i - 3] };
        assert_eq!((*p, r), (at, &want(i)));
    }
    assert_eq!(log.segments(), segs[..2].to_vec());
    let next = log.append(1, b"on").unwrap();
    assert_eq!(log.read(next).unwrap().payload, b"on");
}

/// With a synced mark rewritten lazily, a sync that reached a new segment
/// still rewrites it: damage in a segment before the one being written is
/// not taken for a torn tail and cut with everything after it.
#[test]
fn a_lazy_mark_still_covers_every_segment_but_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let hour = std::time::Duration::from_secs(3600);
    let log = SegmentLog::open_tuned(dir.path(), 512, hour).unwrap();
    fill(&log, 0, 2);
    // The first sync writes the mark; the hour has not passed for the next.
    log.sync().unwrap();
    let pos = fill(&log, 2, 40);
    let end = log.sync().unwrap();
    let segs = log.segments();
    assert!(segs.len() > 3, "{segs:?}");
    drop(log);
    // A flipped byte in a record of the second segment.
    let victim = pos.iter().copied().find(|&p| p >= segs[1]).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join(format!("{:020}.seg", segs[1])))
        .unwrap();
    let at = victim - segs[1] + MAGIC.len() as u64 + HEADER as u64;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x55], at).unwrap();
    drop(f);
    // Below the mark: nothing is cut, and reading it finds the damage
    // (the message log's open reads every record, and stops there).
    let log = SegmentLog::open_tuned(dir.path(), 512, hour).unwrap();
    assert_eq!(log.end(), end, "nothing cut");
    let e = log.scan(0, |_, _| true).expect_err("the damage is found");
    assert!(e.to_string().contains("fails its checksum"), "{e}");
}

#[test]
fn dead_segments_files_go_in_the_background_and_are_gone_once_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with(dir.path(), 256).unwrap();
    let pos = fill(&log, 0, 60);
    log.sync().unwrap();
    let files = || std::fs::read_dir(dir.path()).unwrap().count();
    let before = files();
    let removed = log.remove_below(pos[40]).unwrap();
    assert!(removed > 0);
    // Off the disk once the reaper is done.
    log.finish_reaping();
    assert_eq!(files(), before - removed);
    // After the reaper stopped, removals happen on the caller's thread.
    let pos = fill(&log, 60, 60);
    log.sync().unwrap();
    let mid = files();
    let more = log.remove_below(pos[50]).unwrap();
    assert!(more > 0);
    assert_eq!(files(), mid - more);
    assert_eq!(log.read(pos[59]).unwrap(), want(119));
}

/// Records read together are the records read one by one: across
/// segments, some still in the buffer, with ends that fall short of a
/// record (read on its own) or past the segment, and a position that
/// holds no record.
#[test]
fn records_read_together_are_the_records_read_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with(dir.path(), 512).unwrap();
    let pos = fill(&log, 0, 40);
    log.flush().unwrap();
    let more = fill(&log, 40, 5);
    let positions: Vec<u64> = pos.iter().chain(&more).copied().collect();
    let full: Vec<u64> = (0..45)
        .map(|i| positions[i] + RECORD_HEADER + payload(i).len() as u64)
        .collect();
    let got = log.read_many(&positions, &full);
    for (i, r) in got.into_iter().enumerate() {
        assert_eq!(r.unwrap(), want(i), "record {i}");
    }
    // Ends that say too little: read on their own, the same.
    let short: Vec<u64> = positions.iter().map(|&p| p + 1).collect();
    let got = log.read_many(&positions, &short);
    for (i, r) in got.into_iter().enumerate() {
        assert_eq!(r.unwrap(), want(i), "record {i}");
    }
    // Every other record, and one position inside a record.
    let some: Vec<u64> = positions.iter().step_by(2).copied().collect();
    let ends: Vec<u64> = some.iter().map(|&p| p + 200).collect();
    for (k, r) in log.read_many(&some, &ends).into_iter().enumerate() {
        assert_eq!(r.unwrap(), want(k * 2));
    }
    let inside = log.read_many(&[positions[3] + 2], &[positions[3] + 50]);
    assert!(inside[0].is_err());
}

/// A record whose tail's CRC is given gets the header computing it all
/// makes, wherever the tail starts, and reads back.
#[test]
fn a_record_with_its_tails_crc_given_reads_back() {
    let p: Vec<u8> = (0..5000u32).map(|i| (i * 31 % 251) as u8).collect();
    for at in [0, 1, 33, 4096, 4999, 5000] {
        let tail = crc32fast::hash(&p[at..]);
        assert_eq!(
            header_with_tail(6, &p, at, tail),
            header(6, &p),
            "tail from {at}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with(dir.path(), 1 << 20).unwrap();
    let pos = log
        .append_known(6, &p, Some((33, crc32fast::hash(&p[33..]))))
        .unwrap();
    log.flush().unwrap();
    let r = log.read(pos).unwrap();
    assert_eq!((r.kind, r.payload), (6, p));
}
