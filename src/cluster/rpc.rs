//! The Raft listener's wire format. A connection starts with one octet:
//! `RAFT`, then requests and their answers in turn, each a frame (u32
//! length, big-endian, then a kind octet and the bincode of the request;
//! an answer is the bincode of `Result<answer, error>`); or `PROXY`, then
//! one frame naming the client a follower accepted, then that client's
//! own bytes both ways (proxy.rs).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A connection carrying Raft messages.
pub const RAFT: u8 = b'R';
/// A connection carrying a client proxied by a follower.
pub const PROXY: u8 = b'P';

/// Request kinds.
pub const APPEND: u8 = 1;
pub const VOTE: u8 = 2;
pub const SNAPSHOT: u8 = 3;
/// A leader that stepped down asks a follower to stand for election now
/// (Raft's TimeoutNow, which openraft 0.9 lacks); the body is empty.
pub const ELECT: u8 = 4;
/// Which cluster version the member applies (store/op.rs `LEVEL`); the
/// body is empty, the answer a u32. A build before cluster versions
/// closes the connection on it.
pub const VERSION: u8 = 5;
/// One part of an entry too large for one append, staged on the follower
/// (append.rs `Part`; the answer is the head's append response). Only
/// sent to a member that answers `VERSION`.
pub const APPEND_PART: u8 = 6;
/// An append of one entry whose payload the follower staged: the request
/// carries the entry with an empty payload.
pub const APPEND_STAGED: u8 = 7;
/// A member's resources and raised alarms (a leader asks each member:
/// resources.rs). A build before it closes the connection on the ask.
pub const RESOURCES: u8 = 8;

/// The largest frame taken (an append of many entries, a snapshot chunk).
const FRAME_MAX: usize = 512 << 20;

/// Writes one frame: `kind` (0 for an answer) and `payload`.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    let len =
        u32::try_from(payload.len() + 1).map_err(|_| std::io::Error::other("frame too large"))?;
    let mut head = [0u8; 5];
    head[..4].copy_from_slice(&len.to_be_bytes());
    head[4] = kind;
    w.write_all(&head).await?;
    w.write_all(payload).await?;
    w.flush().await
}

/// Reads one frame: its kind and payload. Reads exactly the frame, so
/// the bytes after it stay in the stream.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > FRAME_MAX {
        return Err(std::io::Error::other(format!("bad frame length {len}")));
    }
    let kind = r.read_u8().await?;
    let len = len - 1;
    // Grown as the bytes arrive: a length alone allocates nothing.
    let mut buf = Vec::with_capacity(len.min(64 << 10));
    (&mut *r).take(len as u64).read_to_end(&mut buf).await?;
    if buf.len() != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok((kind, buf))
}

/// Who a proxied connection is from, and what it came for.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProxyHeader {
    /// The client's address as the follower saw it.
    pub client: std::net::SocketAddr,
    /// The listener it connected to.
    pub service: Service,
    /// The member it connected to.
    pub via: u64,
    /// Whether the client spoke TLS to the follower (AMQPS, HTTPS); the
    /// follower ended that TLS and carries the plain bytes.
    pub tls: bool,
    /// The client certificate (DER) the follower verified, for an EXTERNAL
    /// login; kept only from a member that proved the cluster secret.
    pub certificate: Option<Vec<u8>>,
}

/// What a proxied client came for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Service {
    /// AMQP 0-9-1 (from the AMQP or the AMQPS port).
    Amqp,
    /// The management HTTP API (from the HTTP or the HTTPS port).
    Http,
}
