//! A connection between two members: plain TCP, or mutual TLS when
//! `[tls]` names a certificate, its key and a CA (tls/cluster.rs: each
//! side presents its certificate and verifies the other's). The member
//! that connects names the other by the host of its Raft address, which
//! its certificate must carry (a DNS name or an IP address).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// How long a TLS handshake between members may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Both ends of TLS between members.
pub struct LinkTls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl LinkTls {
    /// From the node-to-node configurations.
    pub fn new(t: crate::tls::cluster::ClusterTls) -> LinkTls {
        LinkTls {
            acceptor: TlsAcceptor::from(t.server),
            connector: TlsConnector::from(t.client),
        }
    }
}

/// One member-to-member connection.
pub enum Link {
    Plain(TcpStream),
    /// Accepted from a member.
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// Made to a member.
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Connects to a member at `addr` (host:port).
pub async fn connect(addr: &str, tls: Option<&LinkTls>) -> io::Result<Link> {
    let s = TcpStream::connect(addr).await?;
    let _ = s.set_nodelay(true);
    let Some(tls) = tls else {
        return Ok(Link::Plain(s));
    };
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::other(format!("{host} is not a TLS server name: {e}")))?;
    let handshake = tls.connector.connect(name, s);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(t)) => Ok(Link::Client(Box::new(t))),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::other("TLS handshake with a member timed out")),
    }
}

/// The member side of a connection accepted on the Raft listener.
pub async fn accept(s: TcpStream, tls: Option<&LinkTls>) -> io::Result<Link> {
    let _ = s.set_nodelay(true);
    let Some(tls) = tls else {
        return Ok(Link::Plain(s));
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(s)).await {
        Ok(Ok(t)) => Ok(Link::Server(Box::new(t))),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::other("TLS handshake from a member timed out")),
    }
}

/// Shared TLS settings, if any.
pub type Tls = Option<Arc<LinkTls>>;

impl AsyncRead for Link {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Link::Server(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Link::Client(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Link {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Link::Server(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Link::Client(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_flush(cx),
            Link::Server(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Link::Client(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Link::Server(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Link::Client(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
