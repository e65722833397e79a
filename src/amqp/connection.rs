//! One client connection after its handshake (handshake.rs): the read loop
//! that feeds channels, heartbeats, resource-alarm blocking, and orderly or
//! forced close. The reader task runs channel logic inline; the outbox's
//! writer task sends everything. What channels use of the connection is in
//! context.rs.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use amq_protocol::protocol::{connection, AMQPClass};
use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::channel::Channel;
use super::coalesce::{self, Coalescer};
use super::codec::{self, Frame, FRAME_MIN_SIZE};
use super::context::ConnCtx;
use super::error::{close_method, code, ProtocolError};
use super::flow;
use super::handshake::handshake;
use super::outbox::{Gate, Outbox};
use super::pinning::Pinning;
use super::transport::{Reader, Transport};
use crate::broker::Broker;

/// Most bytes read from the socket at a time.
const READ_CHUNK_MAX: usize = 64 * 1024;
/// How long a closing connection's writer may take to send what is left.
const WRITER_DRAIN: Duration = Duration::from_secs(5);
/// How long to wait for close-ok after sending connection.close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
/// How much a closing peer may still send before the socket is dropped.
const LINGER_MAX_BYTES: usize = 1 << 20;
/// How a client reached this node when a cluster member carried it here:
/// whether it spoke TLS to that member, and the client certificate the
/// member verified (kept only from a member that proved the cluster secret).
#[derive(Debug, Clone, Default)]
pub struct Carried {
    pub tls: bool,
    pub certificate: Option<Vec<u8>>,
}

/// Serves one connection (plain or TLS, past the TLS handshake) until it
/// closes; `carried` says how a client a member carried here connected.
pub async fn serve(
    socket: Transport,
    peer: SocketAddr,
    carried: Option<Carried>,
    broker: Arc<Broker>,
    node: Arc<super::node::Node>,
    mut shutdown: watch::Receiver<bool>,
) {
    socket.set_nodelay();
    let local = socket.local_addr().unwrap_or(peer);
    let (tls, certificate) = match carried {
        Some(c) => (c.tls, c.certificate),
        None => (socket.is_tls(), socket.peer_certificate()),
    };
    // SASL EXTERNAL's user name, from a verified client certificate.
    let external = certificate.and_then(|der| {
        crate::tls::identity::login_name(&der, &broker.config.tls)
            .map_err(|e| warn!(%peer, "no EXTERNAL login from the client certificate: {e}"))
            .ok()
    });
    let (mut rd, wr) = socket.split();
    // A replicated store's deliveries go out only under its lease.
    let gate = broker.store.delivers_after_commit().then(|| Gate {
        store: Arc::clone(&broker.store),
        patience: Duration::from_millis(broker.config.cluster.step_down_ms),
    });
    let outbox = Arc::new(Outbox::new(
        broker.config.outbox_high_water_bytes as usize,
        broker.config.send_timeout(),
        gate,
    ));
    let writer = tokio::spawn(Arc::clone(&outbox).run_writer(wr));
    // Small to start: an idle connection should cost little (see read_more).
    let mut buf = BytesMut::with_capacity(1024);
    let opened = tokio::time::timeout(
        broker.config.handshake_timeout(),
        handshake(
            &mut rd,
            &mut buf,
            &outbox,
            (peer, local, tls),
            external.as_deref(),
            &broker,
            &node,
        ),
    )
    .await;
    let (ctx, heartbeat, channel_max) = match opened {
        Ok(Ok(hs)) => hs,
        Ok(Err(refusal)) => {
            if let Some(e) = &refusal.close {
                outbox.send(|out| codec::put_method(out, 0, close_method(e)));
            }
            let wait_close_ok = refusal.close.is_some();
            linger(
                &mut rd,
                &mut buf,
                FRAME_MIN_SIZE,
                &outbox,
                wait_close_ok,
                refusal.hold,
            )
            .await;
            finish_writer(&outbox, writer).await;
            return;
        }
        Err(_) => {
            debug!(%peer, "handshake timed out");
            finish_writer(&outbox, writer).await;
            return;
        }
    };
    info!(%peer, user = %ctx.user, vhost = %ctx.vhost.name, "connection opened");
    let mut conn = Connection {
        // Coalescing reads the socket itself: never under TLS.
        coalesce: match rd.plain_fd() {
            Some(fd) => Coalescer::new(fd, Duration::from_micros(broker.config.read_pause_us)),
            None => Coalescer::new(rd.fd(), Duration::ZERO),
        },
        ctx,
        pinning: Pinning::default(),
        channels: HashMap::new(),
        channel_max,
        heartbeat,
        finished: None,
    };
    let reason = conn.run(&mut rd, &mut buf, &mut shutdown).await;
    conn.cleanup();
    info!(%peer, reason = %reason, "connection closed");
    finish_writer(&conn.ctx.outbox, writer).await;
}

/// Lets the writer send what is left, then closes the socket. A peer that
/// stopped reading would block the writer forever (and with it shutdown):
/// it gets a moment to take what is left, then the socket is dropped.
async fn finish_writer(outbox: &Outbox, writer: tokio::task::JoinHandle<()>) {
    outbox.finish();
    let abort = writer.abort_handle();
    if tokio::time::timeout(WRITER_DRAIN, writer).await.is_err() {
        abort.abort();
    }
}

/// After we sent connection.close (or refused a handshake silently): reads
/// and drops what the peer sends until its close-ok (when `close_ok` is
/// awaited), end of stream, `hold` or `LINGER_MAX_BYTES`, whichever comes
/// first. A peer that closes at the same time gets its close-ok. As
/// RabbitMQ does, this holds the socket long enough for the client to read
/// our close before it sees the socket end, and slows password guessing.
async fn linger(
    rd: &mut Reader,
    buf: &mut BytesMut,
    frame_max: u32,
    outbox: &Outbox,
    close_ok: bool,
    hold: Duration,
) {
    let mut read = 0usize;
    let wait = async {
        loop {
            loop {
                match codec::decode(buf, frame_max) {
                    Ok(Some(Frame::Method {
                        channel: 0,
                        payload,
                    })) if close_ok => match codec::method_ids(&payload) {
                        Some((10, 51)) => return,
                        // Both sides closed at once: answer theirs.
                        Some((10, 50)) => {
                            outbox.send(|out| {
                                codec::put_method(
                                    out,
                                    0,
                                    AMQPClass::Connection(connection::AMQPMethod::CloseOk(
                                        connection::CloseOk {},
                                    )),
                                )
                            });
                            return;
                        }
                        _ => {}
                    },
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    // Not frames any more: nothing we could still read.
                    Err(_) => buf.clear(),
                }
            }
            if read > LINGER_MAX_BYTES {
                return;
            }
            if buf.capacity() - buf.len() < 1024 {
                buf.reserve(4096);
            }
            match rd.read_buf(buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(hold, wait).await;
}

struct Connection {
    ctx: ConnCtx,
    /// Lets the kernel gather a streaming peer's frames (coalesce.rs).
    coalesce: Coalescer,
    /// Keeps small messages from pinning large read buffers (pinning.rs).
    pinning: Pinning,
    channels: HashMap<u16, Channel>,
    channel_max: u16,
    heartbeat: u16,
    /// Set when a close handshake completed.
    finished: Option<Closed>,
}

/// How the read loop ended.
enum Closed {
    /// The peer closed (or close/close-ok completed).
    Orderly,
    /// We closed with an error.
    Error(ProtocolError),
    /// The socket failed or went silent.
    Lost(&'static str),
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::Orderly => f.write_str("closed by client"),
            Closed::Error(e) => write!(f, "{e}"),
            Closed::Lost(why) => f.write_str(why),
        }
    }
}

impl Connection {
    async fn run(
        &mut self,
        rd: &mut Reader,
        buf: &mut BytesMut,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Closed {
        let timeout = if self.heartbeat == 0 {
            Duration::from_secs(u64::MAX / 4)
        } else {
            Duration::from_secs(self.heartbeat as u64 * 2)
        };
        let mut last_read = Instant::now();
        let mut read_chunk = 2 * 1024;
        // One timer for the missed-heartbeat check, re-armed only when it
        // fires (not per read: that would be a timer-wheel update per read).
        let silence = tokio::time::sleep_until((last_read + timeout).into());
        tokio::pin!(silence);
        // Set while a resource alarm keeps this (publishing) connection
        // from being read; see flow.rs.
        let mut blocked = false;
        // Set while the outbox is over its high-water mark: the peer is
        // not read until the writer drained it (outbox.rs).
        let mut backlogged = false;
        let mut alarm = self.ctx.broker.alarms.subscribe();
        // Set while this (publishing) connection waits for a cluster's
        // commits to catch up (store/raft/backlog.rs).
        let mut throttled = false;
        let mut congestion = self.ctx.broker.store.congestion();
        loop {
            // Everything already buffered first: many frames per read;
            // but nothing more while the peer does not take our replies.
            loop {
                if self.ctx.outbox.is_backlogged() {
                    backlogged = true;
                    break;
                }
                match codec::decode(buf, self.ctx.frame_max) {
                    Ok(Some(frame)) => {
                        self.coalesce.frame(&frame);
                        let frame = self.pinning.detach(frame);
                        if let Err(e) = self.handle_frame(frame).await {
                            return self.close_with(e, rd, buf).await;
                        }
                        if let Some(done) = self.finished.take() {
                            // After close-ok the client closes the socket
                            // (AMQP 0-9-1 1.4.2.5); frames it had already
                            // queued may still arrive: read and drop them
                            // rather than reset the connection under it.
                            self.coalesce.stop();
                            let drain = async {
                                loop {
                                    buf.clear();
                                    match rd.read_buf(buf).await {
                                        Ok(0) | Err(_) => break,
                                        Ok(_) => {}
                                    }
                                }
                            };
                            let _ = tokio::time::timeout(CLOSE_TIMEOUT, drain).await;
                            return done;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return self.close_with(e, rd, buf).await,
                }
            }
            self.after_batch();
            let published = std::mem::take(&mut self.ctx.published);
            if published && !blocked && self.ctx.broker.alarms.any() {
                blocked = true;
                flow::blocked(&self.ctx);
            }
            if published && !throttled && self.ctx.broker.store.congested() {
                throttled = true;
            }
            self.coalesce.settle();
            // Room for the next read: small while the peer is quiet, larger
            // while reads keep filling it (reserve reuses the buffer in
            // place once the frames cut from it are gone).
            if buf.capacity() - buf.len() < 1024 {
                buf.reserve(read_chunk);
            }
            let spare = buf.capacity() - buf.len();
            let waiting_flush = self.channels.values().any(|c| c.awaits_flush());
            let flushed = &mut self.ctx.flushed;
            // A read through tokio, or the direct one that ends a pause.
            let mut got = None;
            let reading = !blocked && !backlogged && !throttled;
            tokio::select! {
                read = rd.read_buf(buf), if reading && !self.coalesce.paused() => got = Some(read),
                _ = self.coalesce.pause_over(), if reading && self.coalesce.paused() => {
                    got = Some(self.coalesce.resume(buf));
                }
                _ = self.ctx.outbox.woken() => {
                    if let Some(reason) = self.ctx.closer.reason() {
                        let e = ProtocolError::new(code::CONNECTION_FORCED, reason);
                        return self.close_with(e, rd, buf).await;
                    }
                    let now = crate::util::coarse_now_ms();
                    for ch in self.channels.values_mut() {
                        ch.expire_deliveries(now, &mut self.ctx);
                    }
                }
                _ = self.ctx.outbox.drained(), if backlogged => {
                    if self.ctx.outbox.is_closed() {
                        return Closed::Lost("peer stopped reading (send_timeout)");
                    }
                    backlogged = false;
                    last_read = Instant::now();
                }
                changed = flushed.changed(), if waiting_flush => {
                    if changed.is_err() {
                        return Closed::Lost("store closed");
                    }
                }
                _ = flow::lowered(&mut congestion), if throttled => {
                    throttled = false;
                    last_read = Instant::now();
                }
                changed = alarm.changed(), if blocked => {
                    if changed.is_err() || *alarm.borrow_and_update() == 0 {
                        blocked = false;
                        flow::unblocked(&self.ctx);
                        last_read = Instant::now();
                    }
                }
                _ = &mut silence, if reading => {
                    let due = last_read + timeout;
                    if Instant::now() >= due {
                        warn!(heartbeat = self.heartbeat, "missed heartbeats from client, closing");
                        return Closed::Lost("missed heartbeats");
                    }
                    silence.as_mut().reset(due.into());
                }
                _ = shutdown.changed() => {
                    let e = ProtocolError::new(code::CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'");
                    return self.close_with(e, rd, buf).await;
                }
            }
            match got {
                None => {}
                Some(Ok(0)) => return Closed::Lost("connection lost"),
                Some(Ok(n)) => {
                    self.ctx.closer.received(n);
                    last_read = Instant::now();
                    self.pinning.after_read(buf);
                    self.coalesce.read(last_read, n == spare);
                    if n == spare {
                        read_chunk = (read_chunk * 2).min(READ_CHUNK_MAX);
                    }
                }
                Some(Err(e)) if coalesce::is_retry(&e) => {}
                Some(Err(_)) => return Closed::Lost("connection lost"),
            }
        }
    }

    /// Sends connection.close and waits (briefly) for close-ok, ignoring
    /// everything else, as the spec says.
    async fn close_with(
        &mut self,
        e: ProtocolError,
        rd: &mut Reader,
        buf: &mut BytesMut,
    ) -> Closed {
        warn!(
            code = e.code,
            class = e.class_id,
            method = e.method_id,
            "closing connection: {}",
            e.text
        );
        self.ctx.send(0, close_method(&e));
        self.cleanup();
        self.coalesce.stop();
        let (outbox, frame_max) = (&self.ctx.outbox, self.ctx.frame_max);
        linger(rd, buf, frame_max, outbox, true, CLOSE_TIMEOUT).await;
        Closed::Error(e)
    }

    async fn handle_frame(&mut self, frame: Frame) -> Result<(), ProtocolError> {
        let id = frame.channel();
        if id == 0 {
            return match frame {
                Frame::Heartbeat { .. } => Ok(()),
                Frame::Method { payload, .. } => self.connection_method(&payload),
                _ => Err(ProtocolError::unexpected_frame(
                    "content frame on channel 0",
                )),
            };
        }
        if let Frame::Heartbeat { .. } = frame {
            return Err(ProtocolError::unexpected_frame("type 8, all octets = <<>>"));
        }
        match self.channels.get_mut(&id) {
            Some(ch) => {
                let r = ch.handle(frame, &mut self.ctx).await;
                if ch.is_closed() {
                    self.channels.remove(&id);
                }
                r
            }
            None => match frame {
                Frame::Method { payload, .. } if codec::method_ids(&payload) == Some((20, 10)) => {
                    // RabbitMQ limits how many channels are open, not
                    // their numbers.
                    if self.channels.len() >= self.channel_max as usize {
                        return Err(ProtocolError::not_allowed(format!(
                            "number of channels opened ({}) has reached the negotiated channel_max ({})",
                            self.channels.len(),
                            self.channel_max
                        ))
                        .on(20, 10));
                    }
                    let max = self
                        .ctx
                        .broker
                        .users
                        .get(&self.ctx.user)
                        .and_then(|u| u.limit("max-channels"));
                    let (delivery, status) = Channel::parts(id, &self.ctx);
                    let view = Arc::clone(&status) as _;
                    let Some(slot) = self.ctx.registration.open_channel(max, id, view) else {
                        return Err(ProtocolError::not_allowed(format!(
                            "number of channels opened for user '{}' has reached \
                             the maximum allowed user limit of ({})",
                            self.ctx.user,
                            max.unwrap_or(0)
                        ))
                        .on(20, 10));
                    };
                    let ch = Channel::open(id, &self.ctx, delivery, status, slot);
                    self.channels.insert(id, ch);
                    Ok(())
                }
                Frame::Method { payload, .. } => {
                    let (c, m) = codec::method_ids(&payload).unwrap_or((0, 0));
                    Err(ProtocolError::channel_error("expected 'channel.open'").on(c, m))
                }
                Frame::Publish { .. } => {
                    Err(ProtocolError::channel_error("expected 'channel.open'").on(60, 40))
                }
                _ => Err(ProtocolError::unexpected_frame(
                    "expected method frame, got non method frame instead",
                )),
            },
        }
    }

    fn connection_method(&mut self, payload: &[u8]) -> Result<(), ProtocolError> {
        match codec::parse_method(payload)? {
            AMQPClass::Connection(connection::AMQPMethod::Close(close)) => {
                debug!(code = close.reply_code, text = %close.reply_text.as_str(), "client closed the connection");
                self.cleanup();
                self.ctx.send(
                    0,
                    AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
                );
                self.finished = Some(Closed::Orderly);
                Ok(())
            }
            AMQPClass::Connection(connection::AMQPMethod::CloseOk(_)) => {
                self.finished = Some(Closed::Orderly);
                Ok(())
            }
            AMQPClass::Connection(connection::AMQPMethod::UpdateSecret(_)) => {
                self.ctx.send(
                    0,
                    AMQPClass::Connection(connection::AMQPMethod::UpdateSecretOk(
                        connection::UpdateSecretOk {},
                    )),
                );
                Ok(())
            }
            AMQPClass::Connection(
                connection::AMQPMethod::Blocked(_) | connection::AMQPMethod::Unblocked(_),
            ) => Ok(()),
            other => {
                let (c, m) = (other.get_amqp_class_id(), other.get_amqp_method_id());
                Err(
                    ProtocolError::channel_error("unexpected method in connection state running")
                        .on(c, m),
                )
            }
        }
    }

    /// After the frames of one read: confirms that are ready go out, and
    /// what the channels counted reaches their exchanges.
    fn after_batch(&mut self) {
        let done = *self.ctx.flushed.borrow();
        for ch in self.channels.values_mut() {
            ch.send_confirms(done, &self.ctx);
            ch.flush_stats();
        }
    }

    /// Releases everything: channels (requeueing their unacked messages),
    /// exclusive queues.
    fn cleanup(&mut self) {
        for (_, mut ch) in self.channels.drain() {
            ch.release(&mut self.ctx);
        }
        for q in std::mem::take(&mut self.ctx.exclusive_queues) {
            if let Err(e) = self.ctx.vhost.remove_queue(&q) {
                warn!(queue = q.name(), "cannot delete exclusive queue: {e}");
            }
        }
    }
}
