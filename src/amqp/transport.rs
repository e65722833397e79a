//! What a connection runs over: a plain TCP socket or TLS on one. The
//! reader and writer halves are enums rather than trait objects, so the
//! plain path stays as it was (no boxing, no dynamic calls). TLS halves
//! come from tokio's split, which serialises the two directions' use of
//! the one rustls session. Read coalescing (coalesce.rs) reads the socket
//! directly, which TLS cannot allow: it is off on TLS connections.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// An accepted connection.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// A client a cluster member carried here over TLS between members:
    /// encrypted, but not the client's own TLS.
    Link(Box<TlsStream<TcpStream>>),
}

/// The connection's read side.
pub enum Reader {
    Plain(OwnedReadHalf),
    Tls {
        half: ReadHalf<TlsStream<TcpStream>>,
        fd: RawFd,
    },
}

/// The connection's write side.
pub enum Writer {
    Plain(OwnedWriteHalf),
    Tls {
        half: WriteHalf<TlsStream<TcpStream>>,
        fd: RawFd,
    },
}

impl Transport {
    fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(s) | Transport::Link(s) => s.get_ref().0,
        }
    }

    /// Where the connection arrived.
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.tcp().local_addr()
    }

    pub fn set_nodelay(&self) {
        let _ = self.tcp().set_nodelay(true);
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }

    /// The client's certificate (DER), verified in the TLS handshake, if
    /// it presented one.
    pub fn peer_certificate(&self) -> Option<Vec<u8>> {
        match self {
            Transport::Plain(_) | Transport::Link(_) => None,
            Transport::Tls(s) => s
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.to_vec()),
        }
    }

    /// Its two halves.
    pub fn split(self) -> (Reader, Writer) {
        match self {
            Transport::Plain(s) => {
                let (r, w) = s.into_split();
                (Reader::Plain(r), Writer::Plain(w))
            }
            Transport::Tls(s) | Transport::Link(s) => {
                let fd = s.get_ref().0.as_raw_fd();
                let (r, w) = tokio::io::split(*s);
                (Reader::Tls { half: r, fd }, Writer::Tls { half: w, fd })
            }
        }
    }
}

impl Reader {
    /// The socket, for coalescing: only a plain connection's may be read
    /// directly.
    pub fn plain_fd(&self) -> Option<RawFd> {
        match self {
            Reader::Plain(r) => Some(r.as_ref().as_raw_fd()),
            Reader::Tls { .. } => None,
        }
    }

    /// The socket's descriptor (for options that do not read from it).
    pub fn fd(&self) -> RawFd {
        match self {
            Reader::Plain(r) => r.as_ref().as_raw_fd(),
            Reader::Tls { fd, .. } => *fd,
        }
    }
}

impl Writer {
    /// Whether written bytes may wait in a buffer until a flush (TLS).
    pub fn buffers(&self) -> bool {
        matches!(self, Writer::Tls { .. })
    }

    /// The socket's descriptor.
    pub fn fd(&self) -> RawFd {
        match self {
            Writer::Plain(w) => w.as_ref().as_raw_fd(),
            Writer::Tls { fd, .. } => *fd,
        }
    }
}

impl AsyncRead for Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Reader::Plain(r) => Pin::new(r).poll_read(cx, buf),
            Reader::Tls { half, .. } => Pin::new(half).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Writer {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Writer::Plain(w) => Pin::new(w).poll_write(cx, buf),
            Writer::Tls { half, .. } => Pin::new(half).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Writer::Plain(w) => Pin::new(w).poll_flush(cx),
            Writer::Tls { half, .. } => Pin::new(half).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Writer::Plain(w) => Pin::new(w).poll_shutdown(cx),
            Writer::Tls { half, .. } => Pin::new(half).poll_shutdown(cx),
        }
    }
}
