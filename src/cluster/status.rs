//! What the management API and metrics show of the cluster: each member
//! with its role and whether it answers, this node's Raft log and term,
//! and membership changes (join, leave).

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::ServerState;

use super::Cluster;
use crate::store::raft::Member;

/// A learner this many log entries behind the leader, or fewer, has
/// caught up and becomes a voter.
const CAUGHT_UP: u64 = 1_000;
/// How long adding a member waits for it to catch up.
const CATCH_UP_MAX: Duration = Duration::from_secs(1_800);

/// One member.
#[derive(Debug, Clone)]
pub struct MemberStatus {
    pub id: u64,
    /// host:port of its Raft listener.
    pub raft: String,
    pub leader: bool,
    /// Counts toward the majority (else a learner, catching up).
    pub voter: bool,
    /// Its Raft listener accepted a connection just now (this node: true).
    pub reachable: bool,
    /// The last log index the leader knows it holds (leader only).
    pub matched: Option<u64>,
}

/// This node's view.
#[derive(Debug, Clone)]
pub struct Status {
    pub id: u64,
    pub term: u64,
    pub state: &'static str,
    pub leader: Option<u64>,
    pub last_log: u64,
    pub committed: u64,
    pub applied: u64,
    pub snapshot: u64,
    pub purged: u64,
    pub leader_changes: u64,
    pub members: Vec<MemberStatus>,
}

impl Status {
    /// Voters that answer, and how many a majority is.
    pub fn quorum(&self) -> (usize, usize) {
        let voters = self.members.iter().filter(|m| m.voter).count();
        let up = self
            .members
            .iter()
            .filter(|m| m.voter && m.reachable)
            .count();
        (up, voters / 2 + 1)
    }

    /// Whether stopping this node would leave the voters that answer
    /// short of a majority (RabbitMQ's node-is-quorum-critical).
    pub fn quorum_critical(&self) -> bool {
        self.quorum_critical_for(self.id)
    }

    /// Whether stopping node `id` would leave the voters that answer short
    /// of a majority.
    pub fn quorum_critical_for(&self, id: u64) -> bool {
        let (up, majority) = self.quorum();
        let voting = self
            .members
            .iter()
            .find(|m| m.id == id && m.voter)
            .map(|m| m.reachable);
        match voting {
            Some(true) => up.saturating_sub(1) < majority,
            // Already down: stopping it loses nothing more.
            Some(false) => up < majority,
            None => false,
        }
    }

    /// Entries in the log now.
    pub fn log_entries(&self) -> u64 {
        self.last_log.saturating_sub(self.purged)
    }
}

impl Cluster {
    /// This node's view of the cluster, probing each member's Raft port.
    pub async fn status(&self) -> Status {
        let mut s = self.local_status();
        let probes = s.members.iter().map(|m| {
            let addr = m.raft.clone();
            let me = m.id == self.id;
            async move {
                me || matches!(
                    tokio::time::timeout(
                        Duration::from_millis(300),
                        tokio::net::TcpStream::connect(&addr)
                    )
                    .await,
                    Ok(Ok(_))
                )
            }
        });
        let reachable = futures::future::join_all(probes).await;
        for (m, r) in s.members.iter_mut().zip(reachable) {
            m.reachable = r;
        }
        s
    }

    /// What this node knows without asking anyone (only this node counts
    /// as reachable).
    pub fn local_status(&self) -> Status {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(&id, node)| (id, node.raft.clone(), id == self.id))
            .map(|(id, raft, reachable)| MemberStatus {
                id,
                raft,
                leader: m.current_leader == Some(id),
                voter: voters.contains(&id),
                reachable,
                matched: m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id).cloned().flatten())
                    .map(|l| l.index),
            })
            .collect();
        Status {
            id: self.id,
            term: m.current_term,
            state: match m.state {
                ServerState::Leader => "leader",
                ServerState::Follower => "follower",
                ServerState::Candidate => "candidate",
                ServerState::Learner => "learner",
                ServerState::Shutdown => "shutdown",
            },
            leader: m.current_leader,
            last_log: m.last_log_index.unwrap_or(0),
            committed: self.log.committed(),
            applied: m.last_applied.map_or(0, |l| l.index),
            snapshot: m.snapshot.map_or(0, |l| l.index),
            purged: m.purged.map_or(0, |l| l.index),
            leader_changes: self.leader_changes(),
            members,
        }
    }

    /// Adds node `id` (its Raft listener at `raft`): first as a learner
    /// that catches up from the log or a snapshot, then as a voter; Ok(false)
    /// if it already was a voter there. Asked again while the node catches
    /// up (a client that gave up waiting), it waits on the same learner:
    /// adding it again would restart its replication, a snapshot on its
    /// way included, and under load it would never catch up. Refused if
    /// the node does not apply `version`, the cluster version the log is
    /// at (a build before cluster versions cannot say, and applies
    /// version 1).
    pub async fn add_member(&self, id: u64, raft: String, version: u32) -> Result<bool, String> {
        match self.membership_of(id) {
            Some((true, at)) if at == raft => return Ok(false),
            Some((false, at)) if at == raft => {}
            _ => {
                self.check_level(id, &raft, version).await?;
                self.raft
                    .add_learner(id, Member { raft }, false)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        self.caught_up(id).await?;
        let mut voters = self.voters();
        voters.insert(id);
        self.raft
            .change_membership(voters, false)
            .await
            .map(|_| true)
            .map_err(|e| e.to_string())
    }

    /// Whether node `id` is a member (a voter, else a learner), and its
    /// Raft address.
    fn membership_of(&self, id: u64) -> Option<(bool, String)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        let node = membership.get_node(&id)?;
        Some((membership.voter_ids().any(|v| v == id), node.raft.clone()))
    }

    /// Waits until this leader's log reached learner `id` but for the
    /// last `CAUGHT_UP` entries.
    async fn caught_up(&self, id: u64) -> Result<(), String> {
        let mut metrics = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + CATCH_UP_MAX;
        loop {
            {
                let m = metrics.borrow_and_update();
                if m.membership_config.membership().get_node(&id).is_none() {
                    return Err(format!("node {id} was removed while it caught up"));
                }
                let Some(replication) = &m.replication else {
                    return Err(format!(
                        "this node no longer leads; node {id} stays a learner: ask the leader again"
                    ));
                };
                let matched = replication.get(&id).copied().flatten().map(|l| l.index);
                let last = m.last_log_index.unwrap_or(0);
                if matched.is_some_and(|i| i + CAUGHT_UP >= last) {
                    return Ok(());
                }
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err("Raft stopped".into()),
                Err(_) => {
                    return Err(format!(
                        "node {id} did not catch up in {} s; it stays a learner and goes on \
                         catching up: ask again to make it a voter",
                        CATCH_UP_MAX.as_secs()
                    ))
                }
            }
        }
    }

    /// Refuses node `id` if its build does not apply cluster `version`.
    async fn check_level(&self, id: u64, raft: &str, version: u32) -> Result<(), String> {
        if version <= 1 {
            return Ok(());
        }
        // A node just started may not listen yet.
        let mut asked = self.member_level(id, raft).await;
        for _ in 0..50 {
            if asked.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            asked = self.member_level(id, raft).await;
        }
        match asked {
            Ok(l) if l >= version => Ok(()),
            Ok(l) => Err(format!(
                "node {id} applies up to cluster version {l}; the cluster is at \
                 {version}: run a newer build there"
            )),
            Err(e) => Err(format!(
                "node {id} did not say which cluster version it applies (the \
                 cluster is at {version}; an older build cannot join): {e}"
            )),
        }
    }

    /// Removes node `id` from the cluster.
    pub async fn remove_member(&self, id: u64) -> Result<(), String> {
        let mut voters = self.voters();
        if !voters.remove(&id) {
            return Err(format!("node {id} is not a voting member"));
        }
        if voters.is_empty() {
            return Err("the last member cannot leave".into());
        }
        self.raft
            .change_membership(voters, false)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn voters(&self) -> BTreeSet<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config.membership().voter_ids().collect()
    }
}
