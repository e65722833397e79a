//! A follower's AMQP clients, carried to the leader frame by frame so that
//! a consumer of a stream is served here, from this node's own copy (the
//! applied state, which holds only what is committed), while everything
//! else the client does goes to the leader as it came. Reads of a stream
//! then scale with the members, as RabbitMQ's replicas serve them.
//!
//! A `basic.consume` on a stream is served here when everything about it
//! is plain: the leader let the client in with PLAIN, AMQPLAIN or
//! EXTERNAL (so its user is known here) and owes the channel no answer; the channel has a
//! prefetch and no global one, and no delivery of the leader's yet; the
//! consumer takes acks, is not exclusive, is not tracked by the server
//! (`x-stream-automatic-offset-tracking` writes through the leader) and
//! names no argument but the offset, the filter and a priority; the
//! channel is under `consumer_max_per_channel`; the stream is one this
//! node has applied and the user may read it here. Anything else goes to
//! the leader, which serves or refuses it as before.
//!
//! The client sees one connection: consume-ok and cancel-ok for a reader
//! here are answered here, deliveries share the channel's tags with the
//! leader's (conn/settle.rs renumbers them), and acks are split between
//! the two.

mod conn;
mod frames;
mod reader;
mod streams;

pub use streams::carry as carry_streams;

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{oneshot, watch, Notify};
use tracing::debug;

use self::conn::{Asked, Conn, ToLeader};
use self::frames::Cut;
use crate::access::{Access, Permission};
use crate::cluster::{Cluster, ProxyHeader};
use crate::config::Config;
use crate::queue::stream::{tracking, Filter, Start};
use crate::store::raft::LogStore;
use crate::store::Store;
use crate::tls::identity::login_name;
use crate::wire::FRAME_MIN_SIZE;

/// Bytes for the client past which the leader's side and the readers wait.
const HIGH_WATER: usize = 1 << 20;
/// The consume arguments a reader here honours as the leader does.
const SERVED_ARGUMENTS: [&str; 4] = [
    "x-stream-offset",
    "x-stream-filter",
    "x-stream-match-unfiltered",
    "x-priority",
];

/// What a follower reads streams from.
pub struct Reads {
    store: Arc<Store>,
    applied: watch::Receiver<u64>,
    /// Counts what readers here deliver (`stream_reads`).
    cluster: Arc<Cluster>,
    /// This node's log: what is committed, for a reader's start.
    log: LogStore,
    /// The configuration the leader shares: frame_max, max_message_size,
    /// consumer_max_per_channel.
    config: Arc<Config>,
}

impl Reads {
    /// Reads from `store` (this node's applied state, read only), woken
    /// by `applied` (the last applied log index).
    pub fn new(
        store: Arc<Store>,
        applied: watch::Receiver<u64>,
        cluster: Arc<Cluster>,
        log: LogStore,
        config: Arc<Config>,
    ) -> Reads {
        Reads {
            store,
            applied,
            cluster,
            log,
            config,
        }
    }

    /// The largest frame payload read whole: the largest the leader takes
    /// (frame_max, or with none the largest message and a frame's room,
    /// as amqp/handshake.rs has it). A larger one is not AMQP the leader
    /// reads: the bytes then pass as they come.
    fn frame_limit(&self) -> usize {
        let c = &self.config;
        let unlimited = c.max_message_size.saturating_add(FRAME_MIN_SIZE.into());
        match c.frame_max {
            0 => usize::try_from(unlimited).unwrap_or(usize::MAX),
            n => n.max(FRAME_MIN_SIZE) as usize,
        }
    }

    /// The store id of stream `name` in `vhost`, if it is a stream this
    /// node applied and `user` may read it.
    fn readable(&self, user: &str, vhost: &str, name: &str) -> Option<u64> {
        let def = self.store.queue_def(vhost, name).ok()??;
        let kind = def.arguments.inner().get("x-queue-type");
        if kind.and_then(crate::wire::value::text).as_deref() != Some("stream") {
            return None;
        }
        let p = self.store.permissions().ok()?;
        let p = p.iter().find(|p| p.user == user && p.vhost == vhost)?;
        let p = Permission::new(&p.configure, &p.write, &p.read).ok()?;
        p.allows(Access::Read, name).then_some(def.id)
    }

    /// Whether stream `name` of `vhost` is still the one with id `id`.
    fn is_stream(&self, vhost: &str, name: &str, id: u64) -> bool {
        matches!(self.store.queue_def(vhost, name), Ok(Some(d)) if d.id == id)
    }
}

/// A carried connection's state, shared by its two directions and its
/// readers.
struct Shared {
    conn: parking_lot::Mutex<Conn>,
    /// Something is in `out`, or the connection ends.
    wake_writer: Notify,
    /// `out` was written.
    room: Notify,
}

impl Shared {
    /// Waits while the client has more than `HIGH_WATER` bytes to take.
    async fn room(&self) {
        loop {
            let written = self.room.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            {
                let st = self.conn.lock();
                if st.out.len() < HIGH_WATER || st.finished {
                    return;
                }
            }
            written.await;
        }
    }

    fn finish(&self) {
        let mut st = self.conn.lock();
        st.finished = true;
        st.end();
        drop(st);
        self.wake_writer.notify_one();
        self.room.notify_waiters();
    }
}

/// Carries AMQP client `client` to the leader, serving its stream readers
/// here where it can.
pub async fn carry<S>(cluster: Arc<Cluster>, client: S, header: ProxyHeader, reads: Arc<Reads>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = header.client;
    let tls = &reads.config.tls;
    let external = header
        .certificate
        .as_deref()
        .and_then(|c| login_name(c, tls).ok());
    let Some((upstream, leader)) = cluster.open_to_leader(header).await else {
        return;
    };
    let max = reads.config.consumer_max_per_channel;
    let shared = Arc::new(Shared {
        conn: parking_lot::Mutex::new(Conn::new(max, external)),
        wake_writer: Notify::new(),
        room: Notify::new(),
    });
    let (client_r, client_w) = tokio::io::split(client);
    let (up_r, up_w) = tokio::io::split(upstream);
    let writer = write_client(Arc::clone(&shared), client_w);
    let from_leader = from_leader(Arc::clone(&shared), up_r, reads.frame_limit());
    let from_client = from_client(Arc::clone(&shared), reads, client_r, up_w);
    let leader_side = async { tokio::join!(writer, from_leader) };
    tokio::pin!(leader_side, from_client);
    let moved = cluster.leader_moved(leader);
    tokio::pin!(moved);
    let mut client_done = false;
    loop {
        tokio::select! {
            _ = &mut leader_side => break,
            _ = &mut from_client, if !client_done => client_done = true,
            _ = &mut moved => {
                debug!(%peer, "the leader changed: closing the carried connection");
                break;
            }
        }
    }
    shared.finish();
}

/// Writes what is for the client, as it comes, until the leader's side
/// ended and everything is written.
async fn write_client<W: AsyncWrite + Unpin>(shared: Arc<Shared>, mut w: W) {
    let mut spare = BytesMut::new();
    loop {
        let woken = shared.wake_writer.notified();
        let finished = {
            let mut st = shared.conn.lock();
            std::mem::swap(&mut st.out, &mut spare);
            st.finished
        };
        if spare.is_empty() {
            if finished {
                let _ = w.shutdown().await;
                return;
            }
            woken.await;
            continue;
        }
        let wrote = w.write_all(&spare).await;
        spare.clear();
        shared.room.notify_waiters();
        if wrote.is_err() {
            shared.finish();
            return;
        }
    }
}

/// The leader's bytes, read frame by frame (tags renumbered where a
/// channel has readers here) into what the client is sent.
async fn from_leader<R: AsyncRead + Unpin>(shared: Arc<Shared>, mut r: R, max: usize) {
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut opaque = false;
    loop {
        buf.reserve(64 << 10);
        match r.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        {
            let mut st = shared.conn.lock();
            if st.finished {
                break;
            }
            while !opaque {
                match frames::cut(&mut buf, max) {
                    Cut::Frame(f) => st.leader_sent(f),
                    Cut::Partial => break,
                    Cut::Opaque => {
                        opaque = true;
                        st.go_raw();
                    }
                }
            }
            if opaque {
                st.out.extend_from_slice(&buf);
                buf.clear();
            }
        }
        shared.wake_writer.notify_one();
        shared.room().await;
    }
    shared.finish();
}

/// The client's bytes: its protocol header, then frame by frame; what is
/// for the leader is written to it, a stream consume this node serves
/// starts a reader here, and the frames after it wait for its consume-ok
/// (so that the answers reach the client in the order it asked).
async fn from_client<R, W>(shared: Arc<Shared>, reads: Arc<Reads>, mut r: R, mut up: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut header_left = 8usize;
    let mut opaque = false;
    let limit = reads.frame_limit();
    'reading: loop {
        buf.reserve(64 << 10);
        match r.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let mut to_leader = BytesMut::new();
        if header_left > 0 {
            let n = header_left.min(buf.len());
            to_leader.unsplit(buf.split_to(n));
            header_left -= n;
        }
        loop {
            let mut answered = None;
            let mut end = false;
            while header_left == 0 && !opaque {
                // Before tune-ok, the frames the leader takes are small.
                let max = match shared.conn.lock().frame_max {
                    0 => FRAME_MIN_SIZE as usize,
                    n => (n as usize).min(limit),
                };
                let f = match frames::cut(&mut buf, max) {
                    Cut::Frame(f) => f,
                    Cut::Partial => break,
                    Cut::Opaque => {
                        opaque = true;
                        shared.conn.lock().go_raw();
                        break;
                    }
                };
                let decided = shared.conn.lock().client_sent(&f);
                match decided {
                    ToLeader::Forward => to_leader.unsplit(f),
                    ToLeader::Drop => {}
                    ToLeader::Instead(b) => to_leader.extend_from_slice(&b),
                    ToLeader::End => {
                        end = true;
                        break;
                    }
                    ToLeader::Consume(asked) => match serve_here(&shared, &reads, &asked) {
                        Some((handle, spec, ok)) => {
                            let (shared, reads) = (Arc::clone(&shared), Arc::clone(&reads));
                            tokio::spawn(reader::serve(shared, reads, handle, spec));
                            answered = Some(ok);
                            break;
                        }
                        None => {
                            let mut st = shared.conn.lock();
                            st.forward_consume(asked.channel, &asked.tag, false, asked.nowait);
                            to_leader.unsplit(f);
                        }
                    },
                }
            }
            if opaque {
                to_leader.unsplit(buf.split());
            }
            if !shared.conn.lock().out.is_empty() {
                shared.wake_writer.notify_one();
            }
            if !to_leader.is_empty() && up.write_all(&to_leader).await.is_err() || end {
                break 'reading;
            }
            to_leader.clear();
            match answered {
                Some(ok) => {
                    let _ = ok.await;
                }
                None => break,
            }
        }
        // What is answered here waits for the client to read, as the
        // leader's answers do.
        shared.room().await;
    }
    let _ = up.shutdown().await;
}

/// Starts a reader here for `asked` if this node may serve it (see the
/// module's doc); None leaves it to the leader. The stream and the user's
/// permission are looked up without the connection's lock.
fn serve_here(
    shared: &Shared,
    reads: &Reads,
    asked: &Asked,
) -> Option<(Arc<conn::Handle>, reader::Spec, oneshot::Receiver<()>)> {
    let args = asked.arguments.inner();
    if args.keys().any(|k| !SERVED_ARGUMENTS.contains(&k.as_str())) {
        return None;
    }
    if tracking::asked(args.get(tracking::ARGUMENT)) != Ok(false) || asked.queue.is_empty() {
        return None;
    }
    let start = Start::parse(args.get("x-stream-offset"), crate::util::now_ms()).ok()?;
    let filter = Filter::parse(&asked.arguments).ok()?;
    let tag = match asked.tag.as_str() {
        "" => format!("amq.ctag-{}", crate::util::random_name()),
        t => t.to_string(),
    };
    let ch = asked.channel;
    let (user, vhost) = {
        let st = shared.conn.lock();
        if !st.may_serve(ch, &tag) {
            return None;
        }
        (st.user.clone()?, st.vhost.clone()?)
    };
    let queue_id = reads.readable(&user, &vhost, &asked.queue)?;
    let mut st = shared.conn.lock();
    if !st.may_serve(ch, &tag) {
        return None;
    }
    let (id, handle) = st.start_local(ch, &tag, asked.nowait)?;
    debug!(queue = %asked.queue, %vhost, "serving a stream reader from this follower's copy");
    let (answered, ok) = oneshot::channel();
    let spec = reader::Spec {
        channel: ch,
        tag,
        id,
        answered: Some(answered),
        committed: reads.log.committed(),
        vhost,
        queue: asked.queue.clone(),
        queue_id,
        start,
        filter,
    };
    Some((handle, spec, ok))
}
