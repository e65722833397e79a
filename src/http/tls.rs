//! HTTPS for the management API and /metrics: an axum `Listener` whose
//! connections have finished their TLS handshake. Handshakes run on their
//! own tasks (a slow client holds up no other), at most
//! `MAX_HANDSHAKES` at once, each bounded by ssl_handshake_timeout; the
//! certificate is the one in force when the handshake starts, so a reload
//! applies to the next connection.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_rustls::server::TlsStream;

use crate::tls::Tls;

/// TLS handshakes in progress at most, per listener.
const MAX_HANDSHAKES: usize = 256;

/// Accepted connections, past their TLS handshake.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp` and hands over connections whose handshake with
    /// `tls` succeeded, until `stop`.
    pub fn new(tcp: TcpListener, tls: Arc<Tls>, mut stop: watch::Receiver<bool>) -> TlsListener {
        let local = tcp
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            let permits = Arc::new(Semaphore::new(MAX_HANDSHAKES));
            loop {
                let permit = tokio::select! {
                    p = Arc::clone(&permits).acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                    _ = stop.changed() => return,
                };
                let (socket, peer) = tokio::select! {
                    accepted = tcp.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!("accept failed: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    _ = stop.changed() => return,
                };
                let (tls, tx) = (Arc::clone(&tls), tx.clone());
                tokio::spawn(async move {
                    let accept = tls.acceptor().accept(socket);
                    match tokio::time::timeout(tls.handshake_timeout(), accept).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => tracing::warn!(%peer, "HTTPS: TLS handshake failed: {e}"),
                        Err(_) => tracing::warn!(%peer, "HTTPS: TLS handshake timed out"),
                    }
                    drop(permit);
                });
            }
        });
        TlsListener { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The acceptor stopped (shutdown): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}
