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
use crate::store::raft::{Member, TypeConfig};

/// How long connecting to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The entries' bytes one append request carries at most (one entry of
/// any size goes alone).
const APPEND_MAX_BYTES: usize = 8 << 20;

/// The slowest link a request's time allows for, bytes per second.
const MIN_BANDWIDTH: usize = 16 << 20;

/// An entry's bytes on the wire, near enough.
fn entry_bytes(e: &openraft::Entry<TypeConfig>) -> usize {
    match &e.payload {
        openraft::EntryPayload::Normal(b) => b.0.len() + 64,
        _ => 256,
    }
}

/// What `bytes` add to a request's time.
fn transfer_time(bytes: usize) -> Duration {
    Duration::from_millis((bytes as u64).saturating_mul(1000) / MIN_BANDWIDTH as u64)
}

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
        let Some(s) = self.stream.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(
                &std::io::Error::other("no connection"),
            )));
        };
        let exchange = async {
            rpc::write_frame(s, kind, &payload).await?;
            rpc::read_frame(s).await
        };
        let answer = match tokio::time::timeout(ttl, exchange).await {
            Ok(Ok((_, body))) => body,
            Ok(Err(e)) => {
                self.stream = None;
                return Err(RPCError::Network(NetworkError::new(&e)));
            }
            Err(e) => {
                self.stream = None;
                return Err(RPCError::Network(NetworkError::new(&e)));
            }
        };
        let result: Result<Resp, E> = bincode::deserialize(&answer).map_err(|e| {
            self.stream = None;
            RPCError::Network(NetworkError::new(&e))
        })?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, Failed<RaftError<u64>>> {
        // A follower far behind is sent many entries at once, each a whole
        // group commit (up to megabytes): openraft is told to send fewer,
        // and a large request gets the time its bytes need.
        let sizes: Vec<usize> = rpc.entries.iter().map(entry_bytes).collect();
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
        let bytes: usize = sizes.iter().sum();
        let ttl = option.hard_ttl() + transfer_time(bytes);
        self.call(rpc::APPEND, &rpc, ttl).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, Failed<RaftError<u64, InstallSnapshotError>>> {
        let ttl = option.hard_ttl() + transfer_time(rpc.data.len());
        self.call(rpc::SNAPSHOT, &rpc, ttl).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, Failed<RaftError<u64>>> {
        self.call(rpc::VOTE, &rpc, option.hard_ttl()).await
    }
}
