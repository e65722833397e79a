//! Appends carried in what the link can move within openraft's timeout.
//! openraft 0.9 cancels each AppendEntries after one heartbeat interval,
//! whatever it carries, and retries it whole: an entry the link cannot
//! carry in that time never replicates, and commits stop behind it.
//!
//! So the leader's side sends at most `budget` bytes of entries per
//! request, a budget learnt from how long requests take, and answers
//! openraft with a partial success for what it sent (openraft sends the
//! rest next). An entry larger than the budget is staged on the follower
//! first, in parts of the budget's size, each riding on an empty append
//! that checks the follower's log as a heartbeat does; once the follower
//! holds all of it, the entry is appended from what it holds. Every
//! request then finishes within the timeout, and the time an entry takes
//! grows with its bytes. A follower keeps one staged entry per
//! connection, dropped with the connection.

use std::time::Duration;

use bytes::BytesMut;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use openraft::{EntryPayload, LogId};
use serde::{Deserialize, Serialize};

use crate::store::raft::{Batch, TypeConfig};

/// Bytes of entries one request starts with, before the link is timed.
const FIRST_BUDGET: usize = 1 << 20;
/// The least a request carries (a link slower than this per heartbeat
/// interval cannot carry the log anyway).
const MIN_BUDGET: usize = 64 << 10;
/// The most a request carries.
const MAX_BUDGET: usize = 16 << 20;
/// The largest entry a follower stages.
pub const STAGE_MAX: u64 = 512 << 20;

/// One part of an entry staged on a follower.
#[derive(Serialize, Deserialize)]
pub struct Part {
    /// An append with no entries: the follower checks its log against
    /// `prev_log_id` and the leader's vote, as for a heartbeat, and keeps
    /// the part only if that succeeds.
    pub head: AppendEntriesRequest<TypeConfig>,
    /// The entry the part belongs to.
    pub log_id: LogId<u64>,
    /// Where the part starts in the entry's payload.
    pub offset: u64,
    /// The payload's whole length.
    pub total: u64,
    pub bytes: bytes::Bytes,
}

/// What one request should carry, learnt from how long requests take.
pub struct Budget {
    bytes: usize,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            bytes: FIRST_BUDGET,
        }
    }
}

impl Budget {
    /// Bytes the next request carries.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A request of `sent` bytes took `took` of `ttl`: a quick full one
    /// doubles the budget, a slow one halves it.
    pub fn took(&mut self, sent: usize, took: Duration, ttl: Duration) {
        if took > ttl / 2 {
            self.shrink();
        } else if took < ttl / 4 && sent >= self.bytes / 2 {
            self.bytes = (self.bytes * 2).min(MAX_BUDGET);
        }
    }

    /// A request failed (timed out, most likely).
    pub fn shrink(&mut self) {
        self.bytes = (self.bytes / 2).max(MIN_BUDGET);
    }
}

/// What to send of an append request.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// All of it: a heartbeat, or entries within the budget.
    All,
    /// Its first `n` entries, answered as a partial success.
    Prefix(usize),
    /// Its first entry in parts: larger than the budget, or being staged
    /// already (a peer of an older build gets it whole instead).
    Stage,
}

/// What to send of `rpc` with `budget` bytes, `staging` the entry the
/// peer is being given in parts, if any.
pub fn plan(
    rpc: &AppendEntriesRequest<TypeConfig>,
    budget: usize,
    staging: Option<LogId<u64>>,
) -> Plan {
    let Some(first) = rpc.entries.first() else {
        return Plan::All;
    };
    let normal = payload(first).is_some();
    if normal && staging == Some(first.log_id) {
        return Plan::Stage;
    }
    match fitting(rpc, budget) {
        0 if normal => Plan::Stage,
        n if n.max(1) >= rpc.entries.len() => Plan::All,
        n => Plan::Prefix(n.max(1)),
    }
}

/// How many of `rpc`'s entries fit in `budget` bytes (0: the first alone
/// is larger).
fn fitting(rpc: &AppendEntriesRequest<TypeConfig>, budget: usize) -> usize {
    let mut total = 0;
    rpc.entries
        .iter()
        .take_while(|e| {
            total += Batch::weight(e);
            total <= budget
        })
        .count()
}

/// The payload of a normal entry.
pub fn payload(e: &openraft::Entry<TypeConfig>) -> Option<&bytes::Bytes> {
    match &e.payload {
        EntryPayload::Normal(b) => Some(&b.0),
        _ => None,
    }
}

/// An empty append with `rpc`'s vote, previous log id and commit.
pub fn head(rpc: &AppendEntriesRequest<TypeConfig>) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: rpc.vote,
        prev_log_id: rpc.prev_log_id,
        leader_commit: rpc.leader_commit,
        entries: Vec::new(),
    }
}

/// A sent prefix that the follower took whole is a partial success of the
/// request openraft made.
pub fn partial(
    resp: AppendEntriesResponse<u64>,
    last_sent: Option<LogId<u64>>,
    all: bool,
) -> AppendEntriesResponse<u64> {
    match resp {
        AppendEntriesResponse::Success if !all => AppendEntriesResponse::PartialSuccess(last_sent),
        r => r,
    }
}

/// The entry a follower is being given in parts, on one connection.
#[derive(Default)]
pub struct Staged {
    entry: Option<(LogId<u64>, u64, BytesMut)>,
}

impl Staged {
    /// Keeps `part` (its head was accepted). A part that does not follow
    /// the last one starts the entry again if it is its first, else is an
    /// error (the leader starts over on a new connection).
    pub fn keep(&mut self, part: Part) -> Result<(), String> {
        if part.total > STAGE_MAX {
            return Err(format!("a staged entry of {} bytes", part.total));
        }
        let follows = matches!(&self.entry, Some((id, total, buf))
            if *id == part.log_id && *total == part.total && buf.len() as u64 == part.offset);
        if !follows {
            if part.offset != 0 {
                return Err("a staged part out of order".into());
            }
            self.entry = Some((part.log_id, part.total, BytesMut::new()));
        }
        let Some((_, total, buf)) = &mut self.entry else {
            return Err("no staged entry".into());
        };
        if buf.len() as u64 + part.bytes.len() as u64 > *total {
            self.entry = None;
            return Err("a staged part past the entry's end".into());
        }
        buf.extend_from_slice(&part.bytes);
        Ok(())
    }

    /// `rpc` with its one entry's payload taken from what was staged.
    pub fn complete(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
    ) -> Result<AppendEntriesRequest<TypeConfig>, String> {
        let Some((id, total, buf)) = self.entry.take() else {
            return Err("nothing staged".into());
        };
        match rpc.entries.as_mut_slice() {
            [e] if e.log_id == id && buf.len() as u64 == total => {
                e.payload = EntryPayload::Normal(Batch(buf.freeze()));
                Ok(rpc)
            }
            _ => Err("the staged entry is not the one appended".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, Vote};

    fn id(i: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(1, 1), i)
    }

    fn part(offset: u64, total: u64, bytes: &'static [u8]) -> Part {
        Part {
            head: AppendEntriesRequest {
                vote: Vote::new_committed(1, 1),
                prev_log_id: Some(id(4)),
                leader_commit: None,
                entries: Vec::new(),
            },
            log_id: id(5),
            offset,
            total,
            bytes: bytes::Bytes::from_static(bytes),
        }
    }

    fn append_of(i: u64, payload: &[u8]) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(id(i - 1)),
            leader_commit: None,
            entries: vec![Entry {
                log_id: id(i),
                payload: EntryPayload::Normal(Batch(bytes::Bytes::copy_from_slice(payload))),
            }],
        }
    }

    fn append_of_sizes(sizes: &[usize]) -> AppendEntriesRequest<TypeConfig> {
        let entries = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Entry {
                log_id: id(5 + i as u64),
                payload: EntryPayload::Normal(Batch(bytes::Bytes::from(vec![0u8; n]))),
            })
            .collect();
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(id(4)),
            leader_commit: None,
            entries,
        }
    }

    #[test]
    fn requests_are_cut_to_the_budget() {
        // A heartbeat goes as it is.
        assert_eq!(plan(&append_of_sizes(&[]), 1000, None), Plan::All);
        assert_eq!(plan(&append_of_sizes(&[100, 100]), 1000, None), Plan::All);
        // Each entry weighs its payload plus 64.
        assert_eq!(
            plan(&append_of_sizes(&[300, 300, 300]), 800, None),
            Plan::Prefix(2)
        );
        assert_eq!(plan(&append_of_sizes(&[5000, 10]), 1000, None), Plan::Stage);
        // An entry being staged goes on in parts, whatever the budget.
        assert_eq!(
            plan(&append_of_sizes(&[500]), 1000, Some(id(5))),
            Plan::Stage
        );
        assert_eq!(plan(&append_of_sizes(&[500]), 1000, Some(id(9))), Plan::All);
    }

    #[test]
    fn parts_make_the_entry() {
        let mut s = Staged::default();
        s.keep(part(0, 6, b"abc")).unwrap();
        s.keep(part(3, 6, b"def")).unwrap();
        let rpc = s.complete(append_of(5, b"")).unwrap();
        assert_eq!(payload(&rpc.entries[0]).unwrap().as_ref(), b"abcdef");
        // Taken: a second completion has nothing.
        assert!(s.complete(append_of(5, b"")).is_err());
    }

    #[test]
    fn gaps_overruns_and_other_entries_are_refused() {
        let mut s = Staged::default();
        assert!(s.keep(part(3, 6, b"def")).is_err());
        s.keep(part(0, 6, b"abc")).unwrap();
        assert!(s.keep(part(3, 6, b"defg")).is_err());
        s.keep(part(0, 6, b"abc")).unwrap();
        assert!(s.complete(append_of(5, b"")).is_err(), "incomplete");
        s.keep(part(0, 6, b"abc")).unwrap();
        s.keep(part(3, 6, b"def")).unwrap();
        assert!(s.complete(append_of(6, b"")).is_err(), "another entry");
        assert!(s.keep(part(0, STAGE_MAX + 1, b"a")).is_err());
    }

    #[test]
    fn the_budget_follows_the_link() {
        let ttl = Duration::from_millis(200);
        let mut b = Budget::default();
        b.took(FIRST_BUDGET, Duration::from_millis(10), ttl);
        assert_eq!(b.bytes(), FIRST_BUDGET * 2);
        // A small request says nothing of the link.
        b.took(10, Duration::from_millis(1), ttl);
        assert_eq!(b.bytes(), FIRST_BUDGET * 2);
        b.took(FIRST_BUDGET, Duration::from_millis(150), ttl);
        assert_eq!(b.bytes(), FIRST_BUDGET);
        for _ in 0..20 {
            b.shrink();
        }
        assert_eq!(b.bytes(), MIN_BUDGET);
    }
}
