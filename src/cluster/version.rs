//! Which cluster version the members apply (store/op.rs `LEVEL`): the
//! leader raises the version committed in the log only once every member
//! said it applies it, and a node joins only if it applies the version
//! the cluster is at.

use openraft::network::RaftNetworkFactory;

use super::Cluster;
use crate::store::op::LEVEL;

impl Cluster {
    /// The cluster version node `id` (its Raft listener at `raft`) applies.
    pub async fn member_level(&self, id: u64, raft: &str) -> Result<u32, String> {
        if id == self.id {
            return Ok(LEVEL);
        }
        let mut net = self.network();
        let member = crate::store::raft::Member { raft: raft.into() };
        net.new_client(id, &member).await.level().await
    }

    /// The newest cluster version every member (voter or learner) applies;
    /// an error naming a member that did not say.
    pub async fn members_level(&self) -> Result<u32, String> {
        let members: Vec<(u64, String)> = {
            let m = self.raft.metrics();
            let m = m.borrow();
            m.membership_config
                .membership()
                .nodes()
                .map(|(&id, n)| (id, n.raft.clone()))
                .collect()
        };
        let mut level = LEVEL;
        for (id, raft) in members {
            let l = self
                .member_level(id, &raft)
                .await
                .map_err(|e| format!("node {id} did not say its cluster version: {e}"))?;
            level = level.min(l);
        }
        Ok(level)
    }
}
