//! openraft's network over the Raft listener (rpc.rs): one connection per
//! peer, one request at a time, opened again after any failure. Appends
//! carry what the link moves within openraft's timeout (append.rs).

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{EntryPayload, LogId};
use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use super::append;
use super::catch_up::Progress;
use super::link::{self, Link};
use super::raw_append;
use super::rpc;
use crate::store::raft::{Batch, Member, TypeConfig};

/// How long connecting to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long what a peer said of its build is believed.
const LEVEL_KEPT: Duration = Duration::from_secs(60);
/// How long a peer that did not say (an older build, or no answer in
/// time) is sent large entries whole before it is asked again.
const NO_LEVEL_KEPT: Duration = Duration::from_secs(2);

/// How long a snapshot chunk may take at the least.
const CHUNK_MIN: Duration = Duration::from_secs(5);
/// The slowest link a snapshot chunk is given time for, in bytes a
/// second (the nemesis's slow link carries 4 Mbit/s).
const CHUNK_RATE: u64 = 256 << 10;
/// How long installing a snapshot may take at the least, before its last
/// chunk is answered, and how fast it goes at the slowest, in bytes a
/// second.
const INSTALL_MIN: Duration = Duration::from_secs(60);
const INSTALL_RATE: u64 = 4 << 20;

/// Makes a client per peer.
#[derive(Clone, Default)]
pub struct Network {
    pub tls: link::Tls,
    /// What each peer was last seen doing (catch_up.rs).
    pub progress: Arc<Progress>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &Member) -> Peer {
        Peer {
            target,
            addr: node.raft.clone(),
            tls: self.tls.clone(),
            stream: None,
            budget: append::Budget::default(),
            staging: None,
            peer_level: None,
            progress: Arc::clone(&self.progress),
        }
    }
}

/// The connection to one peer.
pub struct Peer {
    target: u64,
    addr: String,
    tls: link::Tls,
    stream: Option<Link>,
    /// Bytes of entries one append carries.
    budget: append::Budget,
    /// The entry being staged on the peer, and how much of it it holds.
    staging: Option<(LogId<u64>, usize)>,
    /// The cluster version the peer's build applies, and when it said;
    /// forgotten when the peer closes the connection on a request.
    peer_level: Option<(u32, Instant)>,
    progress: Arc<Progress>,
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
        self.call_parts(kind, &[payload], ttl).await
    }

    /// A request whose payload is `parts` one after the other.
    async fn call_parts<P, Resp, E>(
        &mut self,
        kind: u8,
        parts: &[P],
        ttl: Duration,
    ) -> Result<Resp, Failed<E>>
    where
        P: AsRef<[u8]>,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
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
            rpc::write_frame_parts(&mut s, kind, parts).await?;
            rpc::read_frame(&mut s).await
        };
        let answer = match tokio::time::timeout(ttl, exchange).await {
            Ok(Ok((_, body))) => body,
            Ok(Err(e)) => {
                // The peer closed the connection on a request: it may be
                // another build now (restarted, or one that does not take
                // the request), so what it said of its build is asked
                // again. A request that only timed out keeps it.
                self.peer_level = None;
                return Err(RPCError::Network(NetworkError::new(&e)));
            }
            Err(e) => return Err(RPCError::Network(NetworkError::new(&e))),
        };
        let result: Result<Resp, E> =
            bincode::deserialize(&answer).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.stream = Some(s);
        self.progress.answered(self.target);
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

    /// The cluster version the peer applies (an error from a build
    /// before cluster versions, which closes the connection on the ask).
    pub async fn level(&mut self) -> Result<u32, String> {
        let r: Result<u32, Failed<RaftError<u64>>> =
            self.call(rpc::VERSION, &(), CONNECT_TIMEOUT).await;
        r.map_err(|e| e.to_string())
    }

    /// The peer's resources and raised alarms (an error from a build
    /// before members reported them).
    pub async fn resources(&mut self, ttl: Duration) -> Result<crate::alarm::Report, String> {
        let r: Result<crate::alarm::Report, Failed<RaftError<u64>>> =
            self.call(rpc::RESOURCES, &(), ttl).await;
        r.map_err(|e| e.to_string())
    }

    /// Where the peer serves the stream protocol (None: its listeners are
    /// off, or its build does not say).
    pub async fn stream_end(&mut self, ttl: Duration) -> Result<Option<super::StreamEnd>, String> {
        if self.peer_level(ttl).await < rpc::STREAM_ENDS {
            return Ok(None);
        }
        let r: Result<Option<super::StreamEnd>, Failed<RaftError<u64>>> =
            self.call(rpc::STREAM_END, &(), ttl).await;
        r.map_err(|e| e.to_string())
    }
}

impl Peer {
    /// The cluster version the peer's build applies (1: it did not say);
    /// asked again after a while (it may have been upgraded).
    async fn peer_level(&mut self, ttl: Duration) -> u32 {
        if let Some((level, at)) = self.peer_level {
            let kept = if level >= 2 {
                LEVEL_KEPT
            } else {
                NO_LEVEL_KEPT
            };
            if at.elapsed() < kept {
                return level;
            }
        }
        // Within openraft's timeout, which would drop the question.
        let level = tokio::time::timeout(ttl / 3, self.level())
            .await
            .ok()
            .and_then(Result::ok);
        if level.is_none() {
            self.stream = None;
        }
        let level = level.unwrap_or(1);
        self.peer_level = Some((level, Instant::now()));
        level
    }

    /// Whether the peer takes staged appends (its build answers
    /// `VERSION`).
    async fn stages(&mut self, ttl: Duration) -> bool {
        self.peer_level(ttl).await >= 2
    }

    /// An append request, timed to learn the budget.
    async fn timed<Req: Serialize>(
        &mut self,
        kind: u8,
        req: &Req,
        sent: usize,
        ttl: Duration,
    ) -> Result<AppendEntriesResponse<u64>, Failed<RaftError<u64>>> {
        let payload =
            bincode::serialize(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.timed_parts(kind, &[payload], sent, ttl).await
    }

    /// An append request of `parts`, timed to learn the budget.
    async fn timed_parts<P: AsRef<[u8]>>(
        &mut self,
        kind: u8,
        parts: &[P],
        sent: usize,
        ttl: Duration,
    ) -> Result<AppendEntriesResponse<u64>, Failed<RaftError<u64>>> {
        let start = Instant::now();
        let r = self.call_parts(kind, parts, ttl).await;
        match &r {
            Ok(_) => self.budget.took(sent, start.elapsed(), ttl),
            Err(RPCError::Network(_)) => self.budget.shrink(),
            Err(_) => {}
        }
        r
    }

    /// Sends the first entry of `rpc`, larger than the budget: the next
    /// part of it to stage, or, once the peer holds it all, the append.
    async fn append_staged(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        ttl: Duration,
    ) -> Result<AppendEntriesResponse<u64>, Failed<RaftError<u64>>> {
        let n = rpc.entries.len();
        let Some(first) = rpc.entries.first() else {
            return self.timed(rpc::APPEND, &rpc, 0, ttl).await;
        };
        let log_id = first.log_id;
        let body = append::payload(first).cloned().unwrap_or_default();
        // What the peer holds lives on this connection only.
        let from = match (self.staging, &self.stream) {
            (Some((id, at)), Some(_)) if id == log_id => at,
            _ => 0,
        };
        if from < body.len() {
            let len = self.budget.bytes().min(body.len() - from);
            let part = append::Part {
                head: append::head(&rpc),
                log_id,
                offset: from as u64,
                total: body.len() as u64,
                bytes: body.slice(from..from + len),
            };
            let r = self.timed(rpc::APPEND_PART, &part, len, ttl).await;
            return match r {
                Ok(AppendEntriesResponse::Success) => {
                    self.staging = Some((log_id, from + len));
                    Ok(AppendEntriesResponse::PartialSuccess(rpc.prev_log_id))
                }
                other => {
                    self.staging = None;
                    other
                }
            };
        }
        self.staging = None;
        rpc.entries.truncate(1);
        if let Some(e) = rpc.entries.first_mut() {
            e.payload = EntryPayload::Normal(Batch::default());
        }
        let resp = self.timed(rpc::APPEND_STAGED, &rpc, 0, ttl).await?;
        Ok(append::partial(resp, Some(log_id), n == 1))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, Failed<RaftError<u64>>> {
        // Answering before openraft's own timeout lets a slow request
        // shrink the budget (append.rs).
        let ttl = option.soft_ttl();
        let n = rpc.entries.len();
        let staging = self.staging.map(|(id, _)| id);
        let fit = match append::plan(&rpc, self.budget.bytes(), staging) {
            append::Plan::All => n,
            append::Plan::Prefix(k) => k,
            append::Plan::Stage if staging.is_some() || self.stages(ttl).await => {
                return self.append_staged(rpc, ttl).await;
            }
            // A build before staged appends takes the entry whole.
            append::Plan::Stage => 1,
        };
        rpc.entries.truncate(fit);
        let last = rpc.entries.last().map(|e| e.log_id);
        let sent = rpc.entries.iter().map(Batch::weight).sum();
        let resp = if self.peer_level(ttl).await >= rpc::RAW_APPENDS {
            let parts = raw_append::encode(rpc)
                .map_err(|e| RPCError::Network(NetworkError::new(&std::io::Error::other(e))))?;
            self.timed_parts(rpc::APPEND_RAW, &parts, sent, ttl).await?
        } else {
            self.timed(rpc::APPEND, &rpc, sent, ttl).await?
        };
        Ok(append::partial(resp, last, fit == n))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, Failed<RaftError<u64, InstallSnapshotError>>> {
        // openraft's own limit (cluster/mod.rs) is only an outer bound: a
        // chunk gets what the slowest link needs for its bytes, and the
        // last one, answered once the peer installed the snapshot, what
        // that needs for the whole.
        let bytes = rpc.data.len() as u64;
        let mut ttl = CHUNK_MIN + Duration::from_secs(bytes / CHUNK_RATE);
        if rpc.done {
            ttl += INSTALL_MIN + Duration::from_secs((rpc.offset + bytes) / INSTALL_RATE);
        }
        let index = rpc.meta.last_log_id.map_or(0, |l| l.index);
        self.progress.sending_snapshot(self.target, index);
        self.call(rpc::SNAPSHOT, &rpc, ttl.min(option.hard_ttl()))
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, Failed<RaftError<u64>>> {
        self.call(rpc::VOTE, &rpc, option.hard_ttl()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use openraft::{CommittedLeaderId, Entry, Vote};
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    fn request() -> AppendEntriesRequest<TypeConfig> {
        let id = |index| LogId::new(CommittedLeaderId::new(2, 1), index);
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(id(6)),
            leader_commit: Some(id(6)),
            entries: vec![Entry {
                log_id: id(7),
                payload: EntryPayload::Normal(Batch(Bytes::from_static(b"a batch"))),
            }],
        }
    }

    /// Serves one connection as a build of cluster version `level`: it
    /// answers `VERSION` and `APPEND`, and closes the connection on
    /// anything else (as every build does on a request it does not know).
    async fn serve(s: &mut TcpStream, level: u32, kinds: &mut Vec<u8>) {
        let mut first = [0u8];
        if s.read_exact(&mut first).await.is_err() || first[0] != rpc::RAFT {
            return;
        }
        while let Ok((kind, _)) = rpc::read_frame(s).await {
            kinds.push(kind);
            let answer = match kind {
                rpc::VERSION => bincode::serialize(&Ok::<u32, RaftError<u64>>(level)),
                rpc::APPEND if level < rpc::RAW_APPENDS => {
                    bincode::serialize(&Ok::<AppendEntriesResponse<u64>, RaftError<u64>>(
                        AppendEntriesResponse::Success,
                    ))
                }
                _ => return,
            };
            let Ok(answer) = answer else { return };
            if rpc::write_frame(s, 0, &answer).await.is_err() {
                return;
            }
        }
    }

    /// A peer restarted as an older build that does not take raw appends
    /// is asked its version again, and gets appends it takes, at once (not
    /// after `LEVEL_KEPT`).
    #[tokio::test]
    async fn a_peer_that_closes_on_a_request_is_asked_its_build_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let peer = tokio::spawn(async move {
            // The build that takes raw appends, then, restarted, one before.
            let mut seen = Vec::new();
            for level in [rpc::RAW_APPENDS, rpc::RAW_APPENDS - 1] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut kinds = Vec::new();
                serve(&mut s, level, &mut kinds).await;
                seen.push(kinds);
            }
            seen
        });
        let mut client = Network::default()
            .new_client(2, &Member { raft: addr })
            .await;
        let option = RPCOption::new(Duration::from_secs(4));
        let first = client.append_entries(request(), option.clone()).await;
        assert!(
            matches!(first, Err(RPCError::Network(_))),
            "the restart cut the raw append: {first:?}"
        );
        let second = client.append_entries(request(), option).await;
        assert!(
            matches!(second, Ok(AppendEntriesResponse::Success)),
            "the older build is sent an append it takes: {second:?}"
        );
        drop(client);
        let seen = peer.await.unwrap();
        assert_eq!(
            seen,
            vec![
                vec![rpc::VERSION, rpc::APPEND_RAW],
                vec![rpc::VERSION, rpc::APPEND]
            ]
        );
    }
}
