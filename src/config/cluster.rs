//! `[cluster]`: mirroring. A node with no node id runs alone, with no Raft
//! cost; with one, it is a member of the cluster its peers list names.

use serde::Deserialize;

/// A cluster member as configured: its id and its Raft address.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Peer {
    pub id: u64,
    /// host:port of its Raft listener.
    pub raft: String,
}

/// The cluster settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's id (1 and up); none: a single node.
    pub node_id: Option<u64>,
    /// The port of this node's Raft listener (Raft messages and clients
    /// proxied by followers); it binds the AMQP listener's address.
    pub raft_port: Option<u16>,
    /// Every member, this node included ("1=HOST:PORT,2=..." on the
    /// command line). The lowest id forms the cluster on first start.
    pub peers: Vec<Peer>,
    /// Raft heartbeat interval, ms.
    pub heartbeat_ms: u64,
    /// A follower that heard no heartbeat for a random time between this
    /// and twice this (ms) stands for election.
    pub election_timeout_ms: u64,
    /// A leader that has not heard from a majority for this long (ms),
    /// or whose log sync has run this long, stops serving and steps down.
    /// Plus two heartbeats, it must stay below the followers' lease (twice
    /// the election timeout: they elect no one sooner after hearing from
    /// the leader), so that a deposed leader stops before another serves.
    pub step_down_ms: u64,
    /// Log entries between snapshots.
    pub snapshot_every: u64,
    /// MiB of log entries since the last snapshot that start the next one
    /// whatever their count (entries are up to 1 MiB: a count alone lets
    /// the log grow to gigabytes).
    pub log_max_mb: u64,
    /// Log entries kept before a snapshot, for followers a little behind
    /// (one further behind gets the snapshot).
    pub log_keep: u64,
    /// MiB of those entries kept at the most (entries are up to 1 MiB:
    /// a count alone kept up to a gigabyte on every member, and the
    /// purged files new entries are written over came only that late).
    pub log_keep_mb: u64,
    /// MiB of log entries the leader keeps, past `log_keep`, for a live
    /// member catching up (one installing a snapshot, or back from a
    /// partition): beyond it, the member gets a newer snapshot instead.
    pub log_hold_mb: u64,
    /// A file holding the secret every member proves it knows on the Raft
    /// port (as RabbitMQ's Erlang cookie); the same file on every member.
    pub secret_file: Option<std::path::PathBuf>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node_id: None,
            raft_port: None,
            peers: Vec::new(),
            heartbeat_ms: 250,
            election_timeout_ms: 1_000,
            step_down_ms: 1_200,
            snapshot_every: 20_000,
            log_max_mb: 512,
            log_keep: 1_000,
            log_keep_mb: 64,
            log_hold_mb: 4_096,
            secret_file: None,
        }
    }
}

/// The fewest bytes a cluster secret may have.
const SECRET_MIN: usize = 16;

/// Reads a cluster secret from `path` (surrounding whitespace trimmed).
pub fn read_secret(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let raw = std::fs::read(path).map_err(|e| format!("cluster secret {}: {e}", path.display()))?;
    let secret = raw.trim_ascii().to_vec();
    if secret.len() < SECRET_MIN {
        return Err(format!(
            "cluster secret {}: at least {SECRET_MIN} bytes, please",
            path.display()
        ));
    }
    Ok(secret)
}

impl ClusterConfig {
    /// Whether this node is a cluster member.
    pub fn enabled(&self) -> bool {
        self.node_id.is_some()
    }

    /// The host part of this node's own entry in `peers` (brackets taken
    /// off an IPv6 address): what the other members reach it by.
    pub fn own_host(&self) -> Option<String> {
        let id = self.node_id?;
        let own = self.peers.iter().find(|p| p.id == id)?;
        let (host, _) = own.raft.rsplit_once(':')?;
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        Some(bare.unwrap_or(host).to_string())
    }

    /// Checks the settings hang together.
    pub fn check(&self) -> Result<(), String> {
        let Some(id) = self.node_id else {
            if self.raft_port.is_some() || !self.peers.is_empty() {
                return Err("--raft-port and --peers need --node-id".into());
            }
            return Ok(());
        };
        if id == 0 {
            return Err("node ids start at 1".into());
        }
        if self.raft_port.is_none() {
            return Err("a cluster node needs --raft-port".into());
        }
        if !self.peers.iter().any(|p| p.id == id) {
            return Err(format!("--peers must list this node ({id})"));
        }
        let mut ids: Vec<u64> = self.peers.iter().map(|p| p.id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != self.peers.len() {
            return Err("--peers lists a node id twice".into());
        }
        if self.heartbeat_ms == 0 || self.election_timeout_ms <= self.heartbeat_ms {
            return Err("election_timeout_ms must be above heartbeat_ms (above 0)".into());
        }
        let lease = 2 * self.election_timeout_ms;
        if self.step_down_ms == 0 || self.step_down_ms + 2 * self.heartbeat_ms >= lease {
            return Err(format!(
                "step_down_ms ({}) plus two heartbeats ({} ms) must be below twice \
                 election_timeout_ms ({lease} ms): a leader cut off from the others must stop \
                 serving before they can elect another",
                self.step_down_ms,
                2 * self.heartbeat_ms
            ));
        }
        if self.log_max_mb == 0 || self.snapshot_every == 0 {
            return Err("log_max_mb and snapshot_every must be above 0".into());
        }
        Ok(())
    }
}

/// Reads "1=host:port,2=host:port".
pub fn parse_peers(text: &str) -> Result<Vec<Peer>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|one| {
            let (id, addr) = one
                .split_once('=')
                .ok_or_else(|| format!("peer '{one}' is not ID=HOST:PORT"))?;
            let id = id
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("peer '{one}': the id is not a number"))?;
            let addr = addr.trim();
            if addr
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .is_none()
            {
                return Err(format!("peer '{one}': the address is not HOST:PORT"));
            }
            Ok(Peer {
                id,
                raft: addr.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_check() {
        let peers = parse_peers("1=127.0.0.1:7001, 2=localhost:7002,3=[::1]:7003").unwrap();
        assert_eq!(peers.len(), 3);
        assert_eq!(peers[2].raft, "[::1]:7003");
        assert!(parse_peers("1=nope").is_err());
        assert!(parse_peers("x=h:1").is_err());
        let mut c = ClusterConfig {
            node_id: Some(2),
            raft_port: Some(7002),
            peers,
            ..Default::default()
        };
        assert!(c.check().is_ok());
        assert_eq!(c.own_host().as_deref(), Some("localhost"));
        c.node_id = Some(3);
        assert_eq!(c.own_host().as_deref(), Some("::1"));
        c.node_id = Some(4);
        assert_eq!(c.own_host(), None);
        assert!(c.check().is_err());
        assert!(ClusterConfig::default().check().is_ok());
    }

    #[test]
    fn a_step_down_slower_than_the_followers_lease_is_refused() {
        let node = |step_down_ms, election_timeout_ms| ClusterConfig {
            node_id: Some(1),
            raft_port: Some(7001),
            peers: parse_peers("1=127.0.0.1:7001").unwrap(),
            step_down_ms,
            election_timeout_ms,
            ..Default::default()
        };
        assert!(node(1_200, 1_000).check().is_ok());
        // 2000 + 2 x 250 is not below the 2000 ms lease.
        let e = node(2_000, 1_000).check().unwrap_err();
        assert!(e.contains("step_down_ms"), "{e}");
        assert!(node(2_000, 2_000).check().is_ok());
        assert!(node(0, 1_000).check().is_err());
    }
}
