//! A connection between two members: plain TCP, or mutual TLS when
//! `[tls]` names a certificate, its key and a CA (tls/cluster.rs: each
//! side presents its certificate and verifies the other's). The member
//! that connects names the other by the host of its Raft address, which
//! its certificate must carry (a DNS name or an IP address); the member
//! that accepts checks the same of the connecting one's (identity.rs).
//!
//! Each side then proves it knows the cluster secret (secret.rs: always
//! set), as Erlang's cookie does for RabbitMQ's nodes: the
//! connecting side sends a random challenge, the other answers with its
//! own and an HMAC-SHA256 of both, and the connecting side answers with
//! its HMAC of both. A connection that fails this carries nothing: no
//! Raft message, no proxied client, no header naming a client.

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

/// What a member link requires: TLS between members, the secret, or both.
pub struct Guard {
    pub tls: Option<LinkTls>,
    pub secret: Option<Vec<u8>>,
}

const CHALLENGE: usize = 32;
type Mac = hmac::Hmac<sha2::Sha256>;

fn mac(secret: &[u8], side: u8, client: &[u8], server: &[u8]) -> io::Result<Mac> {
    use hmac::Mac as _;
    let mut m = <Mac as hmac::Mac>::new_from_slice(secret).map_err(io::Error::other)?;
    m.update(&[side]);
    m.update(client);
    m.update(server);
    Ok(m)
}

fn refused() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        "the other side does not know the cluster secret",
    )
}

/// The connecting side's proof.
async fn prove_connecting(s: &mut Link, secret: &[u8]) -> io::Result<()> {
    use hmac::Mac as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut mine = [0u8; CHALLENGE];
    rand::Rng::fill(&mut rand::thread_rng(), &mut mine[..]);
    s.write_all(&mine).await?;
    s.flush().await?;
    let mut answer = [0u8; CHALLENGE + 32];
    s.read_exact(&mut answer).await?;
    let (theirs, their_mac) = answer.split_at(CHALLENGE);
    mac(secret, b'S', &mine, theirs)?
        .verify_slice(their_mac)
        .map_err(|_| refused())?;
    let proof = mac(secret, b'C', &mine, theirs)?.finalize().into_bytes();
    s.write_all(&proof).await?;
    s.flush().await
}

/// The accepting side's proof.
async fn prove_accepting(s: &mut Link, secret: &[u8]) -> io::Result<()> {
    use hmac::Mac as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut theirs = [0u8; CHALLENGE];
    s.read_exact(&mut theirs).await?;
    let mut answer = [0u8; CHALLENGE + 32];
    rand::Rng::fill(&mut rand::thread_rng(), &mut answer[..CHALLENGE]);
    let proof = mac(secret, b'S', &theirs, &answer[..CHALLENGE])?
        .finalize()
        .into_bytes();
    answer[CHALLENGE..].copy_from_slice(&proof);
    s.write_all(&answer).await?;
    s.flush().await?;
    let mut their_mac = [0u8; 32];
    s.read_exact(&mut their_mac).await?;
    mac(secret, b'C', &theirs, &answer[..CHALLENGE])?
        .verify_slice(&their_mac)
        .map_err(|_| refused())
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

impl Link {
    /// This end's address.
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        match self {
            Link::Plain(s) => s.local_addr(),
            Link::Server(s) => s.get_ref().0.local_addr(),
            Link::Client(s) => s.get_ref().0.local_addr(),
        }
    }
}

/// Connects to a member at `addr` (host:port).
pub async fn connect(addr: &str, guard: Option<&Guard>) -> io::Result<Link> {
    let s = TcpStream::connect(addr).await?;
    let _ = s.set_nodelay(true);
    let mut link = match guard.and_then(|g| g.tls.as_ref()) {
        None => Link::Plain(s),
        Some(tls) => {
            let host = addr
                .rsplit_once(':')
                .map_or(addr, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| io::Error::other(format!("{host} is not a TLS server name: {e}")))?;
            let handshake = tls.connector.connect(name, s);
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(t)) => Link::Client(Box::new(t)),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(io::Error::other("TLS handshake with a member timed out")),
            }
        }
    };
    if let Some(secret) = guard.and_then(|g| g.secret.as_deref()) {
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, prove_connecting(&mut link, secret)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(io::Error::other(
                    "a member did not answer the secret in time",
                ))
            }
        }
    }
    Ok(link)
}

/// The member side of a connection accepted on the Raft listener.
pub async fn accept(s: TcpStream, guard: Option<&Guard>) -> io::Result<Link> {
    let _ = s.set_nodelay(true);
    let mut link = match guard.and_then(|g| g.tls.as_ref()) {
        None => Link::Plain(s),
        Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(s)).await {
            Ok(Ok(t)) => Link::Server(Box::new(t)),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("TLS handshake from a member timed out")),
        },
    };
    if let Some(secret) = guard.and_then(|g| g.secret.as_deref()) {
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, prove_accepting(&mut link, secret)).await {
            Ok(r) => r?,
            Err(_) => return Err(io::Error::other("no answer to the secret in time")),
        }
    }
    Ok(link)
}

/// What member links require, if anything.
pub type Tls = Option<Arc<Guard>>;

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
