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
/// An append whose batches follow its head raw (raw_append.rs). Only
/// sent to a member that answers `VERSION` with `RAW_APPENDS` or later.
pub const APPEND_RAW: u8 = 9;

/// Where the member serves the stream protocol (stream_ends.rs; the
/// answer an `Option<StreamEnd>`). Only asked of a member that answers
/// `VERSION` with `STREAM_ENDS` or later.
pub const STREAM_END: u8 = 10;

/// The cluster version from which a member takes `APPEND_RAW`.
pub const RAW_APPENDS: u32 = 4;
/// The cluster version from which a member answers `STREAM_END`.
pub const STREAM_ENDS: u32 = 7;

/// The largest frame taken (an append of many entries, a snapshot chunk).
const FRAME_MAX: usize = 512 << 20;
/// What a frame's first read may take before the rest of its length is
/// allocated: a length alone allocates little.
const FIRST_READ: usize = 64 << 10;
/// A first part up to this long is sent in one write with the frame's
/// head (an answer, a request's head).
const SMALL_PART: usize = 4 << 10;

/// Writes one frame: `kind` (0 for an answer) and `payload`.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    write_frame_parts(w, kind, &[payload]).await
}

/// Writes one frame whose payload is `parts` one after the other, each
/// from where it lies.
pub async fn write_frame_parts<W: AsyncWrite + Unpin, P: AsRef<[u8]>>(
    w: &mut W,
    kind: u8,
    parts: &[P],
) -> std::io::Result<()> {
    let total = parts.iter().map(|p| p.as_ref().len()).sum::<usize>() + 1;
    let len = u32::try_from(total).map_err(|_| std::io::Error::other("frame too large"))?;
    let (first, rest) = match parts.split_first() {
        Some((first, rest)) if first.as_ref().len() <= SMALL_PART => (first.as_ref(), rest),
        _ => (&[][..], parts),
    };
    let mut head = Vec::with_capacity(5 + first.len());
    head.extend_from_slice(&len.to_be_bytes());
    head.push(kind);
    head.extend_from_slice(first);
    w.write_all(&head).await?;
    for p in rest {
        w.write_all(p.as_ref()).await?;
    }
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
    let mut buf = Vec::with_capacity(len.min(FIRST_READ));
    let mut r = (&mut *r).take(len as u64);
    while buf.len() < len {
        if buf.len() == buf.capacity() {
            // The first read came: the rest at once, not doubled (and
            // copied) as it arrives.
            buf.reserve_exact(len - buf.len());
        }
        if r.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
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
    /// RabbitMQ's stream protocol (from its plain or its TLS port). A
    /// leader of an older build cannot read this header and closes the
    /// client, which reconnects.
    Stream,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_of_parts_read_back_whole_and_in_turn() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let big: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        let writer = tokio::spawn(async move {
            let parts = [&b"head"[..], &big[..100_000], &big[100_000..]];
            write_frame_parts(&mut a, APPEND_RAW, &parts).await.unwrap();
            write_frame(&mut a, 0, b"next").await.unwrap();
            write_frame(&mut a, VERSION, b"").await.unwrap();
        });
        let (kind, body) = read_frame(&mut b).await.unwrap();
        assert_eq!(kind, APPEND_RAW);
        assert_eq!(body.len(), 300_004);
        assert_eq!(&body[..4], b"head");
        assert!(body[4..].iter().enumerate().all(|(i, &x)| x == i as u8));
        assert_eq!(read_frame(&mut b).await.unwrap(), (0, b"next".to_vec()));
        assert_eq!(read_frame(&mut b).await.unwrap(), (VERSION, Vec::new()));
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn a_frame_cut_short_is_an_error() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let mut head = 100_001u32.to_be_bytes().to_vec();
        head.push(APPEND);
        let writer = tokio::spawn(async move {
            a.write_all(&head).await.unwrap();
            a.write_all(&[1u8; 70_000]).await.unwrap();
        });
        let err = read_frame(&mut b).await.unwrap_err();
        writer.await.unwrap();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
