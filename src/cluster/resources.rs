//! Cluster-wide resource alarms, as RabbitMQ's: while this node leads, it
//! asks every other member once a second for its resources (rpc.rs
//! `RESOURCES`: its memory and free disk, and which of its own alarms are
//! raised) and holds the members' raised alarms beside its own
//! (alarm::Alarms). A member low on disk blocks every publisher, as if
//! the leader were: a follower that cannot write cannot take the log
//! either, and with two such the cluster could confirm nothing. A member
//! that does not answer counts as clear until it does (as RabbitMQ
//! forgets the alarms of a node that went down), and what it last
//! reported is forgotten.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::network::RaftNetworkFactory;

use super::{network, Cluster};
use crate::alarm::{Monitors, Report};
use crate::store::raft::Member;

/// How often each member is asked.
const ASK_EVERY: Duration = Duration::from_secs(1);
/// How long an answer may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

impl Cluster {
    /// This node's resource alarms (for the node's life).
    pub fn monitors(&self) -> Monitors {
        self.monitors.clone()
    }

    /// What member `id` last reported of its resources, while this node
    /// leads and the member answers.
    pub fn member_report(&self, id: u64) -> Option<Report> {
        self.reports.lock().get(&id).copied()
    }

    /// Asks the other members for their resources once a second, for as
    /// long as the future runs (a term this node leads: see `forget`).
    pub async fn watch_members(self: Arc<Self>) {
        let mut net = self.network();
        // A connection per member, kept across asks.
        let mut peers: BTreeMap<u64, (String, network::Peer)> = BTreeMap::new();
        let mut tick = tokio::time::interval(ASK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let members: BTreeMap<u64, String> = {
                let m = self.raft.metrics();
                let m = m.borrow();
                m.membership_config
                    .membership()
                    .nodes()
                    .filter(|(&id, _)| id != self.id)
                    .map(|(&id, n)| (id, n.raft.clone()))
                    .collect()
            };
            // Members that left, or moved, are forgotten.
            let gone: Vec<u64> = peers
                .iter()
                .filter(|(id, (raft, _))| members.get(id) != Some(raft))
                .map(|(&id, _)| id)
                .collect();
            for id in gone {
                peers.remove(&id);
                self.record(id, None);
                self.record_stream_end(id, None);
            }
            for (&id, raft) in &members {
                if let std::collections::btree_map::Entry::Vacant(e) = peers.entry(id) {
                    let member = Member { raft: raft.clone() };
                    e.insert((raft.clone(), net.new_client(id, &member).await));
                }
            }
            // And where it serves the stream protocol (stream_ends.rs).
            let asks = peers.iter_mut().map(|(&id, (_, peer))| async move {
                let report = peer.resources(ANSWER_WITHIN).await;
                let end = match report {
                    Ok(_) => peer.stream_end(ANSWER_WITHIN).await.ok().flatten(),
                    Err(_) => None,
                };
                (id, report, end)
            });
            for (id, answer, end) in futures::future::join_all(asks).await {
                self.record_stream_end(id, end);
                match answer {
                    Ok(report) => self.record(id, Some(report)),
                    Err(e) => {
                        tracing::debug!(member = id, "no resources report: {e}");
                        self.record(id, None);
                    }
                }
            }
        }
    }

    /// Forgets every member's report and alarms (the term ended).
    pub fn forget_members(&self) {
        self.reports.lock().clear();
        self.stream_ends.lock().clear();
        self.monitors.alarms.clear_members();
    }

    fn record(&self, id: u64, report: Option<Report>) {
        let raised = report.map_or(0, |r| r.raised);
        let before = {
            let mut reports = self.reports.lock();
            let before = reports.get(&id).map_or(0, |r| r.raised);
            match report {
                Some(r) => reports.insert(id, r),
                None => reports.remove(&id),
            };
            before
        };
        if raised != before {
            let names: Vec<&str> = crate::alarm::resources(raised)
                .into_iter()
                .map(|r| r.name())
                .collect();
            if raised == 0 {
                tracing::info!(member = id, "a member's resource alarms cleared");
            } else {
                tracing::warn!(member = id, raised = ?names, "a member's resource alarm: blocking publishers");
            }
        }
        self.monitors.alarms.set_member(id, raised);
    }
}
