//! openraft's network over the Raft listener (rpc.rs): one connection per
//! peer, one request at a time, opened again after any failure.

use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{de::DeserializeOwned, Serialize};

use super::link::{self, Link};
use super::rpc;
use crate::store::raft::{Batch, Member, TypeConfig};

/// How long connecting to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The entries' bytes one append request carries at most (one entry of
/// any size goes alone): openraft bounds each request by the heartbeat
/// interval, and 4 MiB in 250 ms asks 16 MiB/s of the link.
const APPEND_MAX_BYTES: usize = 4 << 20;

/// Makes a client per peer.
#[derive(Clone, Default)]
pub struct Network {
    pub tls: link::Tls,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &Member) -> Peer {
        Peer {
            target,
            addr: node.raft.clone(),
            tls: self.tls.clone(),
            stream: None,
        }
    }
}

/// The connection to one peer.
pub struct Peer {
    target: u64,
    addr: String,
    tls: link::Tls,
    stream: Option<Link>,
}

type Failed<E> = RPCError<u64, Member, E>;

impl Peer {
    async fn call<Req, Resp, E>(
        &mut self,
        kind: u8,
        req: &Req,
        ttl: Duration,
    ) -> Result<Resp, Failed<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload =
            bincode::serialize(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        if self.stream.is_none() {
            let connect = tokio::time::timeout(
                CONNECT_TIMEOUT,
                link::connect(&self.addr, self.tls.as_deref()),
            );
            let mut s = match connect.await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(RPCError::Unreachable(Unreachable::new(&e))),
                Err(e) => return Err(RPCError::Unreachable(Unreachable::new(&e))),
            };
            tokio::io::AsyncWriteExt::write_all(&mut s, &[rpc::RAFT])
                .await
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
            self.stream = Some(s);
        }
        // Out of `self` while the exchange runs: if openraft drops this
        // call at its own timeout, the connection goes with it, and no
        // later call reads this request's answer as its own.
        let Some(mut s) = self.stream.take() else {
            return Err(RPCError::Unreachable(Unreachable::new(
                &std::io::Error::other("no connection"),
            )));
        };
        let exchange = async {
            rpc::write_frame(&mut s, kind, &payload).await?;
            rpc::read_frame(&mut s).await
        };
        let answer = match tokio::time::timeout(ttl, exchange).await {
            Ok(Ok((_, body))) => body,
            Ok(Err(e)) => return Err(RPCError::Network(NetworkError::new(&e))),
            Err(e) => return Err(RPCError::Network(NetworkError::new(&e))),
        };
        let result: Result<Resp, E> =
            bincode::deserialize(&answer).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.stream = Some(s);
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl Peer {
    /// Asks the peer to stand for election at once (a leader handing its
    /// leadership over after stepping down).
    pub async fn elect(&mut self) -> Result<(), String> {
        let r: Result<(), Failed<RaftError<u64>>> =
            self.call(rpc::ELECT, &(), CONNECT_TIMEOUT).await;
        r.map_err(|e| e.to_string())
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, Failed<RaftError<u64>>> {
        // A follower far behind is sent many entries at once, each a whole
        // group commit (up to megabytes): openraft is told to send fewer.
        let sizes: Vec<usize> = rpc.entries.iter().map(Batch::weight).collect();
        let mut total = 0;
        let fit = sizes
            .iter()
            .take_while(|&&b| {
                total += b;
                total <= APPEND_MAX_BYTES
            })
            .count();
        if fit < sizes.len() && sizes.len() > 1 {
            let hint = fit.max(1) as u64;
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(hint),
            ));
        }
        self.call(rpc::APPEND, &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, Failed<RaftError<u64, InstallSnapshotError>>> {
        self.call(rpc::SNAPSHOT, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, Failed<RaftError<u64>>> {
        self.call(rpc::VOTE, &rpc, option.hard_ttl()).await
    }
}
