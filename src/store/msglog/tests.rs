use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use super::*;
use crate::message::Meta;
use crate::store::op::Moved;

/// A message with `body`.
fn msg(body: &[u8]) -> Message {
    Message::new(
        b"ex",
        b"rk",
        &[0x10, 0, 2],
        body,
        Meta::default().with_delivery_mode(2),
    )
}

fn open(dir: &Path, segment: u64) -> MessageLog {
    MessageLog::open_tuned(dir, segment, Duration::ZERO).unwrap()
}

/// A stored message: body, deadline, time.
type Stored = (Vec<u8>, u64, u64);
/// Every stored message by (queue, seq).
type State = BTreeMap<(u64, u64), Stored>;

/// What `stored_meta` tells of every queue, against what reading each
/// message says: the same seqs, body lengths and deadlines.
fn check_meta(log: &MessageLog) {
    for q in log.queue_ids().unwrap() {
        let read: Vec<(u64, u32, u64)> = log
            .stored(q)
            .map(|m| m.unwrap())
            .map(|m| (m.seq, m.message.body().len() as u32, m.deadline))
            .collect();
        let told: Vec<(u64, u32, u64)> = log.stored_meta(q, 0).map(|m| m.unwrap()).collect();
        assert_eq!(told, read, "queue {q}");
        if let Some(&(seq, ..)) = read.get(read.len() / 2) {
            let from: Vec<_> = log.stored_meta(q, seq).map(|m| m.unwrap()).collect();
            assert_eq!(from[..], read[read.len() / 2..], "queue {q} from {seq}");
        }
    }
}

fn state(log: &MessageLog) -> State {
    let mut out = State::new();
    let mut ids = log.queue_ids().unwrap();
    ids.sort_unstable();
    for q in ids {
        for m in log.stored(q) {
            let m = m.unwrap();
            out.insert((q, m.seq), (m.message.body().to_vec(), m.deadline, m.time));
        }
    }
    out
}

#[test]
fn messages_acks_purges_and_moves_read_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20);
    for seq in 1..=5 {
        let m = msg(format!("m{seq}").as_bytes());
        log.put(1, seq, &m, false, seq * 10, seq + 1_700_000_000_000)
            .unwrap();
    }
    log.put(2, 1, &msg(b"transient"), true, 0, 0).unwrap();
    log.remove(1, 2).unwrap();
    log.purge_from(1, 5).unwrap();
    let moved = msg(b"moved");
    let moves = [Moved {
        from_seq: 3,
        to_seq: 7,
        deadline: 99,
        time: 1_700_000_000_099,
        message: &moved,
    }];
    log.move_records(1, 3, &moves, &[4]).unwrap();
    let want: State = [
        ((1, 1), (b"m1".to_vec(), 10, 1_700_000_000_001)),
        ((3, 7), (b"moved".to_vec(), 99, 1_700_000_000_099)),
    ]
    .into_iter()
    .collect();
    let mut running = want.clone();
    running.insert((2, 1), (b"transient".to_vec(), 0, 0));
    assert_eq!(state(&log), running);
    assert_eq!(
        log.range(1, 0, 10).unwrap().len(),
        1,
        "range reads what is stored"
    );
    assert_eq!(log.get(3, 7).unwrap().unwrap().body(), b"moved");
    assert!(log.get(1, 2).unwrap().is_none());
    log.commit().unwrap();
    drop(log);
    let log = open(dir.path(), 1 << 20);
    assert_eq!(state(&log), want, "the paged transient message is dropped");
}

#[test]
fn a_message_routed_to_ten_queues_is_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20);
    let m = Arc::new(msg(&[7u8; 10_000]));
    for q in 1..=10 {
        log.put(q, 1, &m, false, q, 0).unwrap();
    }
    log.commit().unwrap();
    let size = log.size_on_disk();
    assert!(
        (10_000..12_000).contains(&size),
        "one body on disk, not ten: {size} bytes"
    );
    drop(log);
    let log = open(dir.path(), 1 << 20);
    let s = state(&log);
    assert_eq!(s.len(), 10);
    for q in 1..=10 {
        assert_eq!(s[&(q, 1)], (vec![7u8; 10_000], q, 0), "queue {q}");
    }
}

#[test]
fn a_stream_protocol_message_is_not_kept_for_fan_out() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20);
    let plain = Arc::new(msg(&[7u8; 1_000]));
    log.put(1, 1, &plain, false, 0, 0).unwrap();
    assert_eq!(
        log.state.lock().recent.len(),
        1,
        "a plain message may fan out"
    );
    let mut meta = Meta::default().with_delivery_mode(2).as_amqp10();
    meta.has_headers = true;
    let stream = Arc::new(Message::new(
        b"",
        b"s",
        crate::message::amqp10::STORED_PROPS,
        &[8u8; 1_000],
        meta,
    ));
    log.put(2, 1, &stream, false, 0, 0).unwrap();
    let st = log.state.lock();
    assert_eq!(st.recent.len(), 1, "neither looked up nor pinned");
    assert_eq!(st.recent_bytes, plain.backing().len());
    drop(st);
    log.commit().unwrap();
    drop(log);
    let s = state(&open(dir.path(), 1 << 20));
    assert_eq!(s[&(2, 1)].0, vec![8u8; 1_000], "it is stored as any put");
}

#[test]
fn a_fan_out_across_a_segment_boundary_writes_the_body_again() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 4096);
    let m = msg(&[1u8; 1500]);
    for q in 1..=6 {
        log.put(q, 1, &m, false, 0, 0).unwrap();
    }
    // Every queue's message readable, the segment it refers to or its own.
    log.commit().unwrap();
    drop(log);
    let log = open(dir.path(), 4096);
    assert_eq!(state(&log).len(), 6);
}

#[test]
fn the_oldest_segments_go_once_nothing_in_them_is_live() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 4096);
    let body = [3u8; 500];
    for seq in 1..=100 {
        log.put(1, seq, &msg(&body), false, 0, 0).unwrap();
    }
    log.commit().unwrap();
    let full = log.segments().len();
    assert!(full > 10, "{full} segments");
    // The first 50 acked: their segments go, at the commit after the one
    // that saw them dead.
    for seq in 1..=50 {
        log.remove(1, seq).unwrap();
    }
    log.commit().unwrap();
    log.commit().unwrap();
    let half = log.segments().len();
    assert!(half < full * 2 / 3, "{half} of {full} segments left");
    // A message put last keeps only the segment it is in.
    log.put(2, 1, &msg(b"slow"), false, 0, 0).unwrap();
    for seq in 51..=100 {
        log.remove(1, seq).unwrap();
    }
    log.commit().unwrap();
    log.commit().unwrap();
    assert!(log.segments().len() <= 2, "{:?}", log.segments());
    log.remove(2, 1).unwrap();
    log.commit().unwrap();
    log.commit().unwrap();
    assert_eq!(log.segments().len(), 1, "only the active one is left");
    drop(log);
    let log = open(dir.path(), 4096);
    assert!(state(&log).is_empty());
}

/// A held put removed before the commit is never written, nor is its
/// removal; one still stored is written by the commit and read back
/// after a reopen; a read sees held puts; a put applied again while the
/// first is on disk goes with one removal.
#[test]
fn a_held_put_removed_before_the_commit_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20).hold_puts();
    let end = log.log.end();
    log.put(1, 1, &msg(b"acked soon"), false, 0, 7).unwrap();
    log.put(1, 2, &msg(b"kept"), false, 0, 8).unwrap();
    assert!(log.wants_commit());
    log.remove(1, 1).unwrap();
    assert_eq!(log.log.end(), end, "nothing written yet");
    log.commit().unwrap();
    assert_eq!(state(&log).len(), 1);
    let written = log.log.end() - end;
    assert!(written < 100, "{written} bytes: one small message");
    // Applied again (a replay): held while the first is on disk.
    log.put(1, 2, &msg(b"kept"), false, 0, 8).unwrap();
    log.put(1, 3, &msg(b"read before the commit"), false, 0, 9)
        .unwrap();
    assert_eq!(
        log.get(1, 3).unwrap().map(|m| m.body().to_vec()),
        Some(b"read before the commit".to_vec())
    );
    log.put(1, 4, &msg(b"held at the close"), false, 0, 9)
        .unwrap();
    log.remove(1, 2).unwrap();
    log.close().unwrap();
    drop(log);
    let log = open(dir.path(), 1 << 20);
    let seqs: Vec<u64> = state(&log).keys().map(|k| k.1).collect();
    assert_eq!(seqs, [3, 4]);
}

/// New messages in one record (a stream's batch, applied on a member)
/// are written at once and leave the puts held back held: another
/// queue's put removed before the commit is still never written, nor its
/// removal. A move with a source writes the held puts first.
#[test]
fn a_batch_of_new_messages_leaves_held_puts_held() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20).hold_puts();
    log.put(1, 1, &msg(b"acked soon"), false, 0, 7).unwrap();
    let end = log.log.end();
    let (a, b) = (msg(b"s1"), msg(b"s2"));
    let batch = |seq: u64, m| Moved {
        from_seq: 0,
        to_seq: seq,
        deadline: 0,
        time: 9,
        message: m,
    };
    log.move_records(2, 2, &[batch(1, &a), batch(2, &b)], &[])
        .unwrap();
    let written = log.log.end() - end;
    assert!(written > 0, "the batch is written at once");
    log.remove(1, 1).unwrap();
    log.commit().unwrap();
    assert_eq!(log.log.end() - end, written, "nothing but the batch");
    let stored: Vec<(u64, u64)> = state(&log).keys().copied().collect();
    assert_eq!(stored, [(2, 1), (2, 2)]);
    // A move from another queue needs its source on disk first.
    log.put(1, 2, &msg(b"moved"), false, 0, 7).unwrap();
    let source = msg(b"moved");
    let moved = Moved {
        from_seq: 2,
        ..batch(3, &source)
    };
    log.move_records(1, 2, &[moved], &[]).unwrap();
    log.close().unwrap();
    drop(log);
    let stored: Vec<(u64, u64)> = state(&open(dir.path(), 1 << 20)).keys().copied().collect();
    assert_eq!(stored, [(2, 1), (2, 2), (2, 3)]);
}

/// A stream's newest messages, held back on a member, are read from
/// memory by a reader at the tail: nothing is written for it, and a read
/// past them finds nothing without writing either.
#[test]
fn a_reader_at_the_tail_reads_held_puts_without_writing_them() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20).hold_puts();
    log.put(7, 1, &msg(b"one"), false, 0, 1).unwrap();
    log.commit().unwrap();
    let end = log.log.end();
    for seq in 2..=5 {
        log.put(7, seq, &msg(format!("m{seq}").as_bytes()), false, 0, seq)
            .unwrap();
    }
    log.put(8, 1, &msg(b"another queue's"), false, 0, 1)
        .unwrap();
    let bodies = |from, n, max| -> Vec<(u64, Vec<u8>)> {
        let read = log.range_within(7, from, n, max).unwrap();
        read.iter().map(|(s, m)| (*s, m.body().to_vec())).collect()
    };
    assert_eq!(
        bodies(3, 10, u64::MAX),
        [
            (3, b"m3".to_vec()),
            (4, b"m4".to_vec()),
            (5, b"m5".to_vec())
        ]
    );
    assert_eq!(bodies(2, 2, u64::MAX).len(), 2);
    assert_eq!(
        bodies(2, 10, 3).len(),
        1,
        "at least one, then within the bytes"
    );
    assert!(bodies(6, 10, u64::MAX).is_empty());
    assert_eq!(log.log.end(), end, "nothing written for the reads");
    // A taken-back put is not read from memory; the log is read instead.
    log.remove(7, 4).unwrap();
    assert_eq!(bodies(4, 10, u64::MAX), [(5, b"m5".to_vec())]);
    // A read that reaches into the log sees it and the held puts alike.
    assert_eq!(bodies(1, 10, u64::MAX).len(), 4);
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 4096);
    let second = MessageLog::open_tuned(dir.path(), 4096, Duration::ZERO);
    assert!(
        second.is_err_and(|e| e.to_string().contains("in use")),
        "a second process must not open it"
    );
    drop(log);
    open(dir.path(), 4096);
}

#[test]
fn a_record_of_an_unknown_kind_stops_the_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path(), 4096);
        log.put(1, 1, &msg(b"a"), false, 0, 0).unwrap();
        log.log.append(42, b"from a newer version").unwrap();
        log.commit().unwrap();
    }
    let err = MessageLog::open_tuned(dir.path(), 4096, Duration::ZERO)
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("kind 42")),
        "{err:?}"
    );
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A model of the log: what is stored, persistent and paged.
#[derive(Default, Clone)]
struct Model {
    stored: State,
    paged: std::collections::BTreeSet<(u64, u64)>,
    next: BTreeMap<u64, u64>,
}

impl Model {
    fn durable(&self) -> State {
        let mut s = self.stored.clone();
        s.retain(|k, _| !self.paged.contains(k));
        s
    }
}

/// One random operation on `log` and `model`.
fn step(rng: &mut Rng, log: &MessageLog, model: &mut Model) {
    step_each(rng, log, model, &mut |_| {})
}

/// The same, calling `each` after every record written.
fn step_each(rng: &mut Rng, log: &MessageLog, model: &mut Model, each: &mut dyn FnMut(&Model)) {
    let queue = 1 + rng.below(4);
    match rng.below(10) {
        0..=3 => {
            let fan = if rng.below(4) == 0 { 3 } else { 1 };
            let body: Vec<u8> = (0..rng.below(300)).map(|i| i as u8 ^ 0x5a).collect();
            let m = msg(&body);
            let paged = rng.below(8) == 0;
            // One publish: a fan-out's copies share its time (the later
            // queues' records refer to the first one's).
            let time = rng.below(2) * (1_700_000_000_000 + rng.below(1000));
            for q in queue..queue + fan {
                let seq = model.next.entry(q).or_insert(1);
                let deadline = rng.below(3) * 1000;
                log.put(q, *seq, &m, paged, deadline, time).unwrap();
                model
                    .stored
                    .insert((q, *seq), (body.clone(), deadline, time));
                if paged {
                    model.paged.insert((q, *seq));
                }
                *seq += 1;
                each(model);
            }
        }
        4..=6 => {
            let keys: Vec<(u64, u64)> = model.stored.keys().copied().collect();
            if let Some(&(q, seq)) = keys.get(rng.below(keys.len() as u64) as usize) {
                log.remove(q, seq).unwrap();
                model.stored.remove(&(q, seq));
                each(model);
            }
        }
        7 => {
            let next = model.next.get(&queue).copied().unwrap_or(1);
            let from = next.saturating_sub(rng.below(4));
            log.purge_from(queue, from).unwrap();
            model.stored.retain(|&(q, s), _| q != queue || s < from);
            each(model);
        }
        _ => {
            let to = 1 + (queue % 4);
            let taken: Vec<(u64, Stored)> = model
                .stored
                .range((queue, 0)..(queue + 1, 0))
                .filter(|(k, _)| !model.paged.contains(k))
                .take(3)
                .map(|(k, v)| (k.1, v.clone()))
                .collect();
            let msgs: Vec<Message> = taken.iter().map(|(_, (b, _, _))| msg(b)).collect();
            let mut moves = Vec::new();
            let time = 1_700_000_001_000 + rng.below(1000);
            for ((from_seq, (body, deadline, _)), m) in taken.iter().zip(&msgs) {
                let seq = model.next.entry(to).or_insert(1);
                moves.push(Moved {
                    from_seq: *from_seq,
                    to_seq: *seq,
                    deadline: *deadline,
                    time,
                    message: m,
                });
                model.stored.remove(&(queue, *from_seq));
                model
                    .stored
                    .insert((to, *seq), (body.clone(), *deadline, time));
                *seq += 1;
            }
            log.move_records(queue, to, &moves, &[]).unwrap();
            each(model);
        }
    }
}

/// Random puts, fan-outs, acks, purges and moves against a model, with
/// commits and reopens between: the log reads back what the model holds,
/// paged transient messages dropped at each reopen, and dead segments go.
#[test]
fn the_index_matches_a_model_through_random_operations_and_reopens() {
    against_the_model(false);
}

/// The same with puts held back until each commit (a cluster member's).
#[test]
fn held_puts_match_the_model_too() {
    against_the_model(true);
}

fn against_the_model(hold: bool) {
    let open = |dir: &Path| match hold {
        true => open(dir, 8192).hold_puts(),
        false => open(dir, 8192),
    };
    let dir = tempfile::tempdir().unwrap();
    for seed in [1u64, 7, 42] {
        let _ = fs::remove_dir_all(dir.path());
        let mut rng = Rng((seed * 0x9e37_79b9_7f4a_7c15) | 1);
        let mut model = Model::default();
        let mut log = open(dir.path());
        for round in 0..30 {
            for _ in 0..rng.below(200) {
                step(&mut rng, &log, &mut model);
            }
            if hold && rng.below(2) == 0 {
                // A checkpoint's commit: the last generation stays held,
                // and the next steps remove some of it.
                log.commit_older().unwrap();
                continue;
            }
            assert_eq!(state(&log), model.stored, "seed {seed} round {round}");
            check_meta(&log);
            log.commit().unwrap();
            if rng.below(3) == 0 {
                drop(log);
                log = open(dir.path());
                model.stored = model.durable();
                model.paged.clear();
                assert_eq!(state(&log), model.stored, "seed {seed} round {round}");
                check_meta(&log);
            }
        }
        // What is live bounds what is kept: segments of dead messages go.
        let live = log.live_bytes();
        log.commit().unwrap();
        let on_disk = log.size_on_disk();
        assert!(
            on_disk <= live * 4 + 8 * 8192 + 100_000,
            "seed {seed}: {on_disk} bytes on disk for {live} live"
        );
    }
}

/// A crash tears the unsynced tail at any point: the log opens with every
/// committed operation and a prefix of the later ones, nothing else.
#[test]
fn a_torn_tail_keeps_every_commit_and_a_prefix_of_what_followed() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut model = Model::default();
    let log = open(dir.path(), 1 << 20);
    for _ in 0..300 {
        step(&mut rng, &log, &mut model);
    }
    log.commit().unwrap();
    let committed_end = log.log.end();
    let mut after = vec![model.durable()];
    for _ in 0..60 {
        step_each(&mut rng, &log, &mut model, &mut |m| after.push(m.durable()));
    }
    log.flush().unwrap();
    let end = log.log.end();
    drop(log);
    let seg = dir.path().join(format!("{:020}.seg", 0));
    let full = fs::metadata(&seg).unwrap().len();
    let tail = end - committed_end;
    assert_eq!(full - tail, committed_end + 8, "one segment");
    let mut last = 0;
    let cuts = (committed_end + 8..full).step_by(13).chain([full]);
    for cut in cuts {
        let copy = tempfile::tempdir().unwrap();
        for e in fs::read_dir(dir.path()).unwrap() {
            let e = e.unwrap();
            if e.file_name() != "LOCK" {
                fs::copy(e.path(), copy.path().join(e.file_name())).unwrap();
            }
        }
        let f = fs::OpenOptions::new()
            .write(true)
            .open(copy.path().join(seg.file_name().unwrap()))
            .unwrap();
        f.set_len(cut).unwrap();
        drop(f);
        let log = open(copy.path(), 1 << 20);
        let got = state(&log);
        let k = after[last..]
            .iter()
            .position(|s| *s == got)
            .map(|i| i + last)
            .unwrap_or_else(|| panic!("cut at {cut}: not a prefix of the operations"));
        last = k;
        if cut == full {
            assert_eq!(
                &got,
                after.last().unwrap(),
                "the whole tail reads back uncut"
            );
        }
    }
}

/// A crash in the middle of compaction (its copies cut at any point, the
/// oldest segment still there) reads back exactly what was stored; the
/// compaction then finishes and the space comes back.
#[test]
fn a_crash_in_the_middle_of_compaction_loses_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let seg = 16 * 1024;
    let log = open(dir.path(), seg);
    let mut model = State::new();
    // Every tenth message stays: the oldest segments are mostly dead but
    // none is empty.
    for seq in 1..=400u64 {
        let body = vec![seq as u8; 300];
        log.put(1, seq, &msg(&body), false, seq, seq + 7).unwrap();
        model.insert((1, seq), (body, seq, seq + 7));
    }
    for seq in 1..=400u64 {
        if seq % 10 != 0 {
            log.remove(1, seq).unwrap();
            model.remove(&(1, seq));
        }
    }
    log.commit().unwrap();
    let before = log.size_on_disk();
    let synced = log.log.end();
    // One step of compaction, written and not synced: then a crash.
    log.compact_step().unwrap();
    log.flush().unwrap();
    let end = log.log.end();
    assert!(end > synced, "the step copied something");
    drop(log);
    let files: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    let last = files.iter().max().unwrap().clone();
    let full = fs::metadata(&last).unwrap().len();
    let tail = end - synced;
    for cut in (full - tail.min(full - 8)..=full).step_by(11) {
        let copy = tempfile::tempdir().unwrap();
        for f in &files {
            fs::copy(f, copy.path().join(f.file_name().unwrap())).unwrap();
        }
        fs::copy(dir.path().join("synced"), copy.path().join("synced")).unwrap();
        let f = fs::OpenOptions::new()
            .write(true)
            .open(copy.path().join(last.file_name().unwrap()))
            .unwrap();
        f.set_len(cut).unwrap();
        drop(f);
        let log = open(copy.path(), seg);
        assert_eq!(state(&log), model, "cut at {cut}");
    }
    // Uncut: compaction goes on from the open, and the space comes back.
    let log = open(dir.path(), seg);
    assert_eq!(state(&log), model);
    for _ in 0..100 {
        log.commit().unwrap();
    }
    assert_eq!(state(&log), model);
    let after = log.size_on_disk();
    let bound = log.live_bytes() * 2 + 3 * seg;
    assert!(
        after < before / 2 && after <= bound,
        "{after} bytes on disk after compaction ({before} before, bound {bound})"
    );
    drop(log);
    assert_eq!(state(&open(dir.path(), seg)), model);
}

/// Files of `dir` ending in `ext`, sorted.
fn files(dir: &Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .collect();
    out.sort();
    out
}

/// Puts, acks, fan-outs and moves over many small segments, committed.
fn fill(log: &MessageLog, model: &mut Model, seed: u64) {
    let mut rng = Rng(seed);
    for _ in 0..400 {
        step(&mut rng, log, model);
        if rng.below(10) == 0 {
            log.commit().unwrap();
        }
    }
    log.commit().unwrap();
}

/// Once appends moved past a segment and a sync covered it, its summary is
/// written; a reopen takes the index from the summaries and reads only the
/// last segment. A message's damage in a summarized segment is found when
/// the message is read, as the summary's module says.
#[test]
fn a_reopen_takes_finished_segments_from_their_summaries() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::default();
    let log = open(dir.path(), 4096);
    fill(&log, &mut model, 0x5eed_1234_abcd_0001);
    let segments = log.segments();
    assert!(segments.len() > 4, "{segments:?}");
    drop(log);
    let summaries = files(dir.path(), ".idx");
    assert_eq!(
        summaries.len(),
        segments.len() - 1,
        "every finished segment"
    );
    assert!(files(dir.path(), ".idx.tmp").len() <= 1, "the last one's");
    let log = open(dir.path(), 4096);
    let want = model.durable();
    assert_eq!(state(&log), want);
    check_meta(&log);
    // Damage the first segment's records past their headers: a reopen
    // that read it would refuse it (it is below the synced mark).
    let first = dir.path().join(format!("{:020}.seg", segments[0]));
    let mut bytes = fs::read(&first).unwrap();
    let n = bytes.len();
    for b in &mut bytes[40..n - 8] {
        *b ^= 0x55;
    }
    fs::write(&first, &bytes).unwrap();
    drop(log);
    let log = open(dir.path(), 4096);
    let in_first: Vec<(u64, u64)> = want
        .keys()
        .filter(|(q, s)| {
            let loc = log.state.lock().index.get(*q, *s).unwrap();
            loc.rec < segments[1]
        })
        .copied()
        .collect();
    assert!(!in_first.is_empty());
    for (q, s) in &in_first {
        assert!(log.get(*q, *s).is_err(), "message {s} of queue {q}");
    }
    for (q, s) in want.keys().filter(|k| !in_first.contains(k)) {
        assert_eq!(log.get(*q, *s).unwrap().unwrap().body(), want[&(*q, *s)].0);
    }
}

/// A summary that is missing, cut short, damaged, or left for a segment
/// that is gone does not serve: the open reads the segment instead, and
/// writes its summary again.
#[test]
fn a_damaged_or_missing_summary_reads_its_segment_instead() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::default();
    let log = open(dir.path(), 4096);
    fill(&log, &mut model, 0x5eed_1234_abcd_0002);
    drop(log);
    let summaries = files(dir.path(), ".idx");
    assert!(summaries.len() > 4, "{summaries:?}");
    fs::remove_file(&summaries[0]).unwrap();
    let cut = fs::read(&summaries[1]).unwrap();
    fs::write(&summaries[1], &cut[..cut.len() - 5]).unwrap();
    let mut flipped = fs::read(&summaries[2]).unwrap();
    flipped[20] ^= 1;
    fs::write(&summaries[2], &flipped).unwrap();
    // One whose end no longer matches (copied from a neighbour).
    fs::copy(&summaries[4], &summaries[3]).unwrap();
    let stray = dir.path().join(format!("{:020}.idx", u64::MAX / 2));
    fs::write(&stray, b"stale").unwrap();
    let log = open(dir.path(), 4096);
    assert_eq!(state(&log), model.durable());
    check_meta(&log);
    assert!(!stray.exists(), "a summary of no segment is removed");
    drop(log);
    assert_eq!(files(dir.path(), ".idx"), summaries, "written again");
    let log = open(dir.path(), 4096);
    assert_eq!(state(&log), model.durable());
}

/// A batch of puts to one queue (a MOVE with no source: a stream's
/// publish, `Store::put_batch`) is one record; its messages read back in
/// order after a reopen, from the records and from the summaries, and
/// compaction moves the ones left as any others.
///
/// A stream protocol batch (messages of nothing but their AMQP 1.0 bytes)
/// is a CHUNK record; its messages read back as a PUT's would, and a
/// range read of whole ones names where their entries lie in the file,
/// with their CRC.
#[test]
fn a_batch_of_puts_is_one_record_and_reads_back_after_reopen_and_compaction() {
    a_batch_reads_back(false);
    a_batch_reads_back(true);
}

/// A stream protocol publisher's message with `body`.
fn stream_msg(body: &[u8]) -> Message {
    let mut meta = Meta::default().with_delivery_mode(2).as_amqp10();
    meta.has_headers = true;
    Message::new(
        b"",
        b"events",
        crate::message::amqp10::STORED_PROPS,
        body,
        meta,
    )
}

fn a_batch_reads_back(chunked: bool) {
    let dir = tempfile::tempdir().unwrap();
    let seg = 64 * 1024;
    let log = open(dir.path(), seg);
    let mut model = State::new();
    let mut seq = 0u64;
    let make = if chunked { stream_msg } else { msg };
    for batch in 0..60u64 {
        let bodies: Vec<Vec<u8>> = (0..10)
            .map(|i| vec![(batch * 10 + i) as u8; 2000])
            .collect();
        let msgs: Vec<Message> = bodies.iter().map(|b| make(b)).collect();
        let moves: Vec<Moved<'_>> = msgs
            .iter()
            .map(|m| {
                seq += 1;
                Moved {
                    from_seq: 0,
                    to_seq: seq,
                    deadline: 0,
                    time: 1_700_000_000_000 + batch,
                    message: m,
                }
            })
            .collect();
        log.move_records(1, 1, &moves, &[]).unwrap();
        for (m, body) in moves.iter().zip(bodies) {
            model.insert((1, m.to_seq), (body, 0, m.time));
        }
        if batch == 0 {
            let mut kinds = Vec::new();
            log.log
                .scan(log.segments()[0], |_, r| {
                    kinds.push(r.kind);
                    true
                })
                .unwrap();
            let kind = if chunked { record::CHUNK } else { record::MOVE };
            assert_eq!(kinds, [kind], "ten messages, one record");
            // Each reads back as a PUT of it would.
            let other = MessageLog::temporary().unwrap();
            for m in &moves {
                other.put(1, m.to_seq, m.message, false, 0, m.time).unwrap();
                let (a, b) = (
                    log.get(1, m.to_seq).unwrap(),
                    other.get(1, m.to_seq).unwrap(),
                );
                let parts = |m: Option<Message>| {
                    let m = m.unwrap();
                    let p = [m.exchange(), m.routing_key(), m.properties(), m.body()]
                        .map(<[u8]>::to_vec);
                    (p, m.meta)
                };
                assert_eq!(parts(a), parts(b));
            }
        }
    }
    assert_eq!(state(&log), model);
    check_meta(&log);
    log.flush().unwrap();
    // Whole batches in the file go as they lie, the rest as read.
    let mut got = Vec::new();
    log.visit_range_within(1, 5, 30, u64::MAX, true, |seq, found| {
        match found {
            Found::Chunk(c) => {
                let mut data = vec![0u8; c.len as usize];
                std::os::unix::fs::FileExt::read_exact_at(&*c.file, &mut data, c.at).unwrap();
                assert_eq!(
                    crc32fast::hash(&data),
                    c.crc,
                    "the CRC of the chunk at {seq}"
                );
                assert_eq!((data.len(), c.count), (10 * 2004, 10));
                got.push((seq, "chunk"));
            }
            Found::Entry { body, route, time } => {
                assert_eq!((route, time), (&b"events"[..], model[&(1, seq)].2));
                assert_eq!(body, &model[&(1, seq)].0[..]);
                got.push((seq, "entry"));
            }
            Found::Record(_) | Found::Message(..) => got.push((seq, "message")),
        }
        Ok(())
    })
    .unwrap();
    let want: Vec<(u64, &str)> = match chunked {
        true => (5..=10)
            .map(|s| (s, "entry"))
            .chain([(11, "chunk"), (21, "chunk")])
            .chain((31..=34).map(|s| (s, "entry")))
            .collect(),
        false => (5..=34).map(|s| (s, "message")).collect(),
    };
    assert_eq!(got, want);
    log.commit().unwrap();
    drop(log);
    // Finished segments from their summaries, the last from its records.
    let log = open(dir.path(), seg);
    assert_eq!(state(&log), model);
    assert!(files(dir.path(), "idx").len() > 1, "summaries were written");
    // Most go: compaction copies the rest forward and the space comes back.
    for s in 1..=seq {
        if s % 10 != 0 {
            log.remove(1, s).unwrap();
            model.remove(&(1, s));
        }
    }
    let before = log.size_on_disk();
    for _ in 0..100 {
        log.commit().unwrap();
    }
    assert!(log.size_on_disk() < before / 2, "compacted");
    assert_eq!(state(&log), model);
    drop(log);
    assert_eq!(state(&open(dir.path(), seg)), model);
}
