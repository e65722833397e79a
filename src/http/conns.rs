//! The HTTP listeners' accept loop (the API, the API carried from
//! followers, Prometheus): hyper with a timer, so a request's headers must
//! arrive within `[management] header_timeout_ms` and a kept-alive
//! connection idle that long is closed (hyper starts the same timer when
//! it waits for the next request), and caps on the connections open at
//! once per listener and per client address. axum::serve has neither: 2000
//! sockets trickling headers all stayed open, and with them every file
//! descriptor a hostile client could take.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::Extensions;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

use super::{Carried, Via};
use crate::config::ManagementConfig;
use crate::util::PerSource;

/// How long a stopping listener waits for its requests under way.
const DRAIN: Duration = Duration::from_secs(10);

/// What a listener's connections come from: the address its caps count,
/// and what each request learns of its connection.
pub trait Peer: Clone + Send + Sync + 'static {
    fn ip(&self) -> IpAddr;
    fn tag(&self, ext: &mut Extensions);
}

impl Peer for SocketAddr {
    fn ip(&self) -> IpAddr {
        SocketAddr::ip(self)
    }

    fn tag(&self, ext: &mut Extensions) {
        ext.insert(ConnectInfo(*self));
    }
}

/// A carried connection counts against its client's address, not the
/// member's, and its handlers see the client's address and the member.
impl Peer for Carried {
    fn ip(&self) -> IpAddr {
        self.client.ip()
    }

    fn tag(&self, ext: &mut Extensions) {
        ext.insert(ConnectInfo(self.client));
        ext.insert(Via(self.via));
    }
}

/// Serves `router` on `listener` until `stop` says so; `what` names the
/// listener in the log.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: ManagementConfig,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
) where
    L: axum::serve::Listener,
    L::Addr: Peer,
{
    let max = limits.max_connections;
    let per_source = limits.max_connections_per_source;
    let permits = Arc::new(Semaphore::new(max));
    let sources = Arc::new(PerSource::default());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_timeout_ms));
    loop {
        let (io, peer) = tokio::select! {
            c = listener.accept() => c,
            _ = stop.changed() => break,
        };
        // Over a cap the socket is closed unread: nothing is owed to it.
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::warn!(
                listener = what,
                "connection closed: {max} connections open (management.max_connections)"
            );
            continue;
        };
        let Some(counted) = sources.take(peer.ip(), per_source) else {
            tracing::warn!(
                listener = what,
                client = %peer.ip(),
                "connection closed: {per_source} open from this address \
                 (management.max_connections_per_source)"
            );
            continue;
        };
        let (router, http, mut stop) = (router.clone(), http.clone(), stop.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                peer.tag(req.extensions_mut());
                router.clone().oneshot(req)
            });
            let conn = http.serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.changed() => {
                    // Finish the request under way, take no other.
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(DRAIN, conn).await;
                }
            }
            drop((permit, counted));
        });
    }
    // Stopping: wait (a while) for the requests under way.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(DRAIN, permits.acquire_many(all)).await;
}
