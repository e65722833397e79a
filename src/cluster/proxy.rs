//! A follower's client connections (AMQP, AMQPS, the HTTP API, HTTPS):
//! carried to the leader's Raft listener (rpc.rs `PROXY`), after a header
//! naming the client, the service, and (TLS ended here) the verified
//! client certificate, then copied both ways until either side closes. When leadership moves, the old leader
//! closes what it served (320 CONNECTION_FORCED) and so the proxied
//! connections end with it; clients reconnect, to any node.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tracing::debug;

use super::{rpc, Cluster, Link};

/// How long a client waits here for a leader to be known.
const WAIT_FOR_LEADER: Duration = Duration::from_secs(3);
/// How long reaching the leader may take (a partitioned one never answers).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub(super) async fn to_leader<S>(cluster: &Cluster, mut client: S, header: rpc::ProxyHeader)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let peer: SocketAddr = header.client;
    let Some((mut upstream, leader)) = open(cluster, header).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
        _ = leader_moved(cluster, leader) => debug!(%peer, "the leader changed: closing the proxied connection"),
    }
}

/// A link to the leader's Raft port that carries one client, the header
/// sent; and the leader's id. None if no leader is known or reached in time.
pub(super) async fn open(cluster: &Cluster, header: rpc::ProxyHeader) -> Option<(Link, u64)> {
    let peer: SocketAddr = header.client;
    let deadline = tokio::time::Instant::now() + WAIT_FOR_LEADER;
    let (leader, addr) = loop {
        if let Some(a) = cluster.leader_addr() {
            break a;
        }
        if tokio::time::Instant::now() >= deadline {
            debug!(%peer, "no leader to proxy to: closing");
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let connect = super::link::connect(&addr, cluster.tls.as_deref());
    let mut upstream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Err(_) => {
            debug!(%peer, leader = %addr, "the leader does not answer");
            return None;
        }
        Ok(Err(e)) => {
            debug!(%peer, leader = %addr, "cannot reach the leader: {e}");
            return None;
        }
    };
    let header = bincode::serialize(&header).ok()?;
    if upstream.write_all(&[rpc::PROXY]).await.is_err()
        || rpc::write_frame(&mut upstream, 0, &header).await.is_err()
    {
        return None;
    }
    Some((upstream, leader))
}

/// Returns once a node other than `leader` leads (or Raft stops). A
/// leader that hangs closes nothing: a carried connection is closed then,
/// and its client reconnects.
pub(super) async fn leader_moved(cluster: &Cluster, leader: u64) {
    let mut metrics = cluster.raft.metrics();
    loop {
        let now = metrics.borrow_and_update().current_leader;
        if now.is_some_and(|l| l != leader) {
            return;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
