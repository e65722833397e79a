//! What the leader knows of the members it replicates to, so that it does
//! not purge log entries a member catching up still needs. A member far
//! behind gets a snapshot; installing one of gigabytes takes a minute or
//! more, during which a busy leader snapshots again and again. Were the
//! log purged past the snapshot being sent, the member would need another
//! snapshot once it installed this one, and so on for ever: a member
//! added under load would never become a voter (a nemesis run showed it).
//! So the leader keeps, while a member is live, the entries after what it
//! holds or after the snapshot on its way to it (compaction.rs bounds how
//! much).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use openraft::LogId;
use parking_lot::Mutex;
use tokio::time::Instant;

/// A member that answered within this long is live: what it still needs
/// is kept.
const LIVE: Duration = Duration::from_secs(10);

/// How long after its last chunk a snapshot is taken to be on its way (the
/// last chunk's answer comes only once the member installed it).
const INSTALLING: Duration = Duration::from_secs(600);

/// What was last seen of each member.
#[derive(Default)]
pub struct Progress {
    seen: Mutex<HashMap<u64, Seen>>,
}

#[derive(Default, Clone, Copy)]
struct Seen {
    /// When it last answered a request.
    answered: Option<Instant>,
    /// The last index of the snapshot being sent to it, and when a chunk
    /// of it was last sent.
    snapshot: Option<(u64, Instant)>,
}

impl Progress {
    /// `target` answered a request.
    pub fn answered(&self, target: u64) {
        self.seen.lock().entry(target).or_default().answered = Some(Instant::now());
    }

    /// A chunk of the snapshot up to `index` is being sent to `target`.
    pub fn sending_snapshot(&self, target: u64, index: u64) {
        self.seen.lock().entry(target).or_default().snapshot = Some((index, Instant::now()));
    }

    /// The highest index the log may be purged up to (inclusive) without
    /// taking what a live member still needs, given what each member
    /// holds (`matched`, openraft's replication metrics); None if no
    /// member holds anything back.
    pub fn floor(&self, matched: &BTreeMap<u64, Option<LogId<u64>>>) -> Option<u64> {
        let seen = self.seen.lock();
        matched
            .iter()
            .filter_map(|(target, m)| {
                let holds = m.map_or(0, |l| l.index);
                let s = seen.get(target)?;
                match s.snapshot {
                    // Once installed, it goes on from the snapshot's end.
                    Some((index, at)) if index > holds && at.elapsed() < INSTALLING => Some(index),
                    _ if s.answered.is_some_and(|a| a.elapsed() < LIVE) => Some(holds),
                    // Gone quiet: it will get a snapshot when it is back.
                    _ => None,
                }
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(index: u64) -> Option<LogId<u64>> {
        Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index))
    }

    #[test]
    fn a_live_member_holds_back_what_it_needs() {
        let p = Progress::default();
        let mut m = BTreeMap::from([(2, at(500)), (3, at(900))]);
        assert_eq!(p.floor(&m), None, "nothing heard from either");
        p.answered(2);
        p.answered(3);
        assert_eq!(p.floor(&m), Some(500));
        // A new member getting the snapshot up to 800 needs what follows it.
        m.insert(4, None);
        p.sending_snapshot(4, 800);
        assert_eq!(p.floor(&m), Some(500));
        m.insert(2, at(1000));
        assert_eq!(p.floor(&m), Some(800));
        // Installed: it goes on from what it holds.
        p.answered(4);
        m.insert(4, at(850));
        assert_eq!(p.floor(&m), Some(850));
    }
}
