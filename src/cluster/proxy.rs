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

use super::{rpc, Cluster};

/// How long a client waits here for a leader to be known.
const WAIT_FOR_LEADER: Duration = Duration::from_secs(3);
/// How long reaching the leader may take (a partitioned one never answers).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub(super) async fn to_leader<S>(cluster: &Cluster, mut client: S, header: rpc::ProxyHeader)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let peer: SocketAddr = header.client;
    let deadline = tokio::time::Instant::now() + WAIT_FOR_LEADER;
    let (leader, addr) = loop {
        if let Some(a) = cluster.leader_addr() {
            break a;
        }
        if tokio::time::Instant::now() >= deadline {
            debug!(%peer, "no leader to proxy to: closing");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let connect = super::link::connect(&addr, cluster.tls.as_deref());
    let mut upstream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Err(_) => {
            debug!(%peer, leader = %addr, "the leader does not answer");
            return;
        }
        Ok(Err(e)) => {
            debug!(%peer, leader = %addr, "cannot reach the leader: {e}");
            return;
        }
    };
    let header = match bincode::serialize(&header) {
        Ok(h) => h,
        Err(_) => return,
    };
    if upstream.write_all(&[rpc::PROXY]).await.is_err()
        || rpc::write_frame(&mut upstream, 0, &header).await.is_err()
    {
        return;
    }
    // A leader that hangs closes nothing: once another node leads, this
    // connection is closed here, and the client reconnects.
    let mut metrics = cluster.raft.metrics();
    let moved = async {
        loop {
            if metrics.changed().await.is_err() {
                return;
            }
            let now = metrics.borrow().current_leader;
            if now.is_some_and(|l| l != leader) {
                return;
            }
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
        _ = moved => debug!(%peer, "the leader changed: closing the proxied connection"),
    }
}
