//! One client connection: protocol header, the start / tune / open
//! handshake, the read loop that feeds channels, heartbeats, and orderly or
//! forced close. The reader task runs channel logic inline; the outbox's
//! writer task sends everything.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use amq_protocol::protocol::{connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::auth;
use super::channel::Channel;
use super::coalesce::{self, Coalescer};
use super::codec::{self, Frame, FRAME_MIN_SIZE};
use super::error::{code, ProtocolError};
use super::flow;
use super::outbox::Outbox;
use super::pinning::Pinning;
use crate::broker::Broker;
use crate::queue::Queue;
use crate::vhost::VHost;

/// How long a client may take from TCP accept to connection.open.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes read from the socket at a time.
const READ_CHUNK_MAX: usize = 64 * 1024;
/// How long a closing connection's writer may take to send what is left.
const WRITER_DRAIN: Duration = Duration::from_secs(5);
/// How long to wait for close-ok after sending connection.close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
/// How much a closing peer may still send before the socket is dropped.
const LINGER_MAX_BYTES: usize = 1 << 20;
/// The longest a connection refused at connection.open waits for close-ok
/// (RabbitMQ: the heartbeat interval, at most 30 s).
const OPEN_REFUSED_MAX_HOLD: Duration = Duration::from_secs(30);

/// What the client said it can do (client-properties capabilities).
#[derive(Debug, Default, Clone, Copy)]
pub struct ClientCaps {
    pub consumer_cancel_notify: bool,
    pub authentication_failure_close: bool,
    pub connection_blocked: bool,
}

/// Connection state every channel handler may use.
pub struct ConnCtx {
    /// This connection's place under connection_max, given back on drop.
    _slot: crate::broker::ConnectionSlot,
    /// What all connections share (reply-to consumers, timeouts).
    pub node: Arc<super::node::Node>,
    pub id: u64,
    pub broker: Arc<Broker>,
    pub vhost: Arc<VHost>,
    pub outbox: Arc<Outbox>,
    pub frame_max: u32,
    pub caps: ClientCaps,
    pub user: String,
    /// Exclusive queues this connection declared (deleted when it closes).
    pub exclusive_queues: Vec<Arc<Queue>>,
    /// The store's completed-flush epoch, for confirms.
    pub flushed: watch::Receiver<u64>,
    /// Whether this connection published since the read loop last looked
    /// (the memory alarm blocks a connection when it publishes).
    pub published: bool,
}

impl ConnCtx {
    /// Waits for a flush if definitions changed since `version` (durable
    /// declare / bind / delete answer only once they are on disk).
    pub async fn sync_definitions(&self, version: u64) -> crate::store::Result<()> {
        if self.broker.store.defs_version() != version {
            self.broker.store.sync().await?;
        }
        Ok(())
    }

    /// Sends a method frame on `channel`.
    pub fn send(&self, channel: u16, method: AMQPClass) {
        self.outbox
            .send(|out| codec::put_method(out, channel, method));
    }
}

/// Serves one TCP connection until it closes.
pub async fn serve(
    socket: TcpStream,
    peer: SocketAddr,
    broker: Arc<Broker>,
    node: Arc<super::node::Node>,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = socket.set_nodelay(true);
    let (mut rd, wr) = socket.into_split();
    let outbox = Arc::new(Outbox::new(
        broker.config.outbox_high_water_bytes as usize,
        broker.config.send_timeout(),
    ));
    let writer = tokio::spawn(Arc::clone(&outbox).run_writer(wr));
    // Small to start: an idle connection should cost little (see read_more).
    let mut buf = BytesMut::with_capacity(1024);
    let opened = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        handshake(&mut rd, &mut buf, &outbox, peer, &broker, &node),
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
        coalesce: Coalescer::new(
            std::os::fd::AsRawFd::as_raw_fd(rd.as_ref()),
            Duration::from_micros(broker.config.read_pause_us),
        ),
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
    rd: &mut OwnedReadHalf,
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

/// Where the handshake is, as in RabbitMQ's `rabbit_reader`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handshake {
    /// connection.start sent; waiting for start-ok.
    Starting,
    /// connection.tune sent; waiting for tune-ok.
    Tuning,
    /// Tuned; waiting for connection.open.
    Opening,
}

/// How a handshake that did not open a connection ends.
struct Refusal {
    /// The connection.close to send, if any.
    close: Option<ProtocolError>,
    /// How long the socket is held (for close-ok, or silently) before it is
    /// closed; zero when the peer is gone.
    hold: Duration,
}

impl Refusal {
    /// The peer went away (or spoke another protocol): nothing to wait for.
    fn gone() -> Refusal {
        Refusal {
            close: None,
            hold: Duration::ZERO,
        }
    }
}

/// Reads the protocol header and runs start / tune / open. Returns the
/// connection context, heartbeat and channel_max, or how to end the
/// connection. As in RabbitMQ, most errors before tune-ok close the socket
/// without a close method (after a delay); a refused login sends
/// connection.close 403 to clients that announced
/// authentication_failure_close, a frame too large for the 4096-octet
/// limit before tuning is 501; from tune-ok on, errors are
/// connection.close. Refused sockets are held for
/// `handshake_close_delay_ms` (see `linger`).
async fn handshake(
    rd: &mut OwnedReadHalf,
    buf: &mut BytesMut,
    outbox: &Arc<Outbox>,
    peer: SocketAddr,
    broker: &Arc<Broker>,
    node: &Arc<super::node::Node>,
) -> Result<(ConnCtx, u16, u16), Refusal> {
    while buf.len() < 8 {
        read_more(rd, buf).await?;
    }
    let header = buf.split_to(8);
    // 0-9-1, and the 0-9 header Qpid-derived clients send (RabbitMQ takes both).
    if &header[..] != b"AMQP\x00\x00\x09\x01" && &header[..] != b"AMQP\x01\x01\x00\x09" {
        debug!(%peer, header = ?&header[..], "unsupported protocol header");
        outbox.send(|out| out.extend_from_slice(b"AMQP\x00\x00\x09\x01"));
        return Err(Refusal::gone());
    }
    let config = &broker.config;
    let delay = Duration::from_millis(config.handshake_close_delay_ms);
    let send = |m: AMQPClass| outbox.send(|out| codec::put_method(out, 0, m));
    send(AMQPClass::Connection(connection::AMQPMethod::Start(
        connection::Start {
            version_major: 0,
            version_minor: 9,
            server_properties: server_properties(),
            mechanisms: LongString::from(auth::MECHANISMS),
            locales: LongString::from("en_US"),
        },
    )));
    let mut state = Handshake::Starting;
    let mut caps = ClientCaps::default();
    let mut user = String::new();
    // Until tune-ok the peer may send frames of at most the spec's minimum.
    let mut frame_max = FRAME_MIN_SIZE;
    let mut heartbeat = 0;
    let mut channel_max = config.channel_max;
    // Errors once tuned are reported with connection.close.
    let closed = |e: ProtocolError, hold: Duration| {
        warn!(%peer, code = e.code, "handshake failed: {}", e.text);
        Refusal {
            close: Some(e),
            hold,
        }
    };
    let silent = |why: &str| {
        warn!(%peer, "handshake failed: {why}");
        Refusal {
            close: None,
            hold: delay,
        }
    };
    loop {
        let frame = loop {
            match codec::decode(buf, frame_max) {
                Ok(Some(f)) => break f,
                Ok(None) => read_more(rd, buf).await?,
                Err(e) => return Err(closed(e, delay)),
            }
        };
        let payload = match frame {
            Frame::Heartbeat { channel: 0 } => continue,
            Frame::Method {
                channel: 0,
                payload,
            } => payload,
            _ => {
                return Err(silent(
                    "a frame other than a connection method during the handshake",
                ))
            }
        };
        let method = match codec::parse_method(&payload) {
            Ok(m) => m,
            // A table nested too deep is our own limit: say so (502).
            Err(e) if state == Handshake::Opening || e.code == code::SYNTAX_ERROR => {
                return Err(closed(e, delay))
            }
            Err(e) => return Err(silent(&e.text)),
        };
        match (state, method) {
            (Handshake::Starting, AMQPClass::Connection(connection::AMQPMethod::StartOk(ok))) => {
                caps = client_caps(&ok.client_properties);
                let creds = match auth::decode(ok.mechanism.as_str(), ok.response.as_bytes()) {
                    Ok(c) => c,
                    Err(auth::AuthError::UnknownMechanism(m)) => {
                        return Err(silent(&format!("unknown authentication mechanism '{m}'")));
                    }
                    Err(auth::AuthError::Malformed) => {
                        return Err(silent("malformed SASL response"));
                    }
                };
                if !broker.authenticate(&creds.user, &creds.password, peer.ip()) {
                    warn!(%peer, user = %creds.user, "login refused");
                    // Without the capability the client gets no close,
                    // only the end of the socket, as from RabbitMQ.
                    let close = caps.authentication_failure_close.then(|| {
                        ProtocolError::access_refused(format!(
                            "Login was refused using authentication mechanism {}. \
                             For details see the broker logfile.",
                            ok.mechanism.as_str()
                        ))
                        .hard()
                    });
                    return Err(Refusal { close, hold: delay });
                }
                user = creds.user;
                send(AMQPClass::Connection(connection::AMQPMethod::Tune(
                    connection::Tune {
                        channel_max: config.channel_max,
                        frame_max: config.frame_max,
                        heartbeat: config.heartbeat,
                    },
                )));
                state = Handshake::Tuning;
            }
            (Handshake::Tuning, AMQPClass::Connection(connection::AMQPMethod::TuneOk(ok))) => {
                if let Err(e) = check_tune_ok(&ok, config) {
                    return Err(closed(e, delay));
                }
                frame_max = effective_frame_max(ok.frame_max, config);
                channel_max = ok.channel_max;
                heartbeat = ok.heartbeat;
                outbox.set_heartbeat(ok.heartbeat);
                state = Handshake::Opening;
            }
            (Handshake::Opening, AMQPClass::Connection(connection::AMQPMethod::Open(open))) => {
                let name = open.virtual_host.as_str();
                let Some(vhost) = broker.vhost(name) else {
                    // RabbitMQ waits for close-ok up to the heartbeat
                    // interval here (at most 30 s).
                    let hold = match heartbeat {
                        0 => delay,
                        hb => Duration::from_secs(hb as u64).min(OPEN_REFUSED_MAX_HOLD),
                    };
                    return Err(closed(
                        ProtocolError::not_allowed(format!("vhost {name} not found")).on(10, 40),
                        hold,
                    ));
                };
                let Some(slot) = broker.admit_connection() else {
                    return Err(closed(
                        ProtocolError::not_allowed(format!(
                            "connection refused: node connection limit ({}) is reached",
                            config.connection_max
                        ))
                        .on(10, 40),
                        delay,
                    ));
                };
                send(AMQPClass::Connection(connection::AMQPMethod::OpenOk(
                    connection::OpenOk {},
                )));
                let ctx = ConnCtx {
                    _slot: slot,
                    node: Arc::clone(node),
                    id: broker.next_connection_id(),
                    broker: Arc::clone(broker),
                    vhost,
                    outbox: Arc::clone(outbox),
                    frame_max,
                    caps,
                    user,
                    exclusive_queues: Vec::new(),
                    flushed: broker.store.flushed(),
                    published: false,
                };
                return Ok((ctx, heartbeat, channel_max));
            }
            (Handshake::Opening, AMQPClass::Connection(connection::AMQPMethod::Close(_))) => {
                send(AMQPClass::Connection(connection::AMQPMethod::CloseOk(
                    connection::CloseOk {},
                )));
                return Err(Refusal::gone());
            }
            (Handshake::Opening, other) => {
                let (c, m) = (other.get_amqp_class_id(), other.get_amqp_method_id());
                return Err(closed(
                    ProtocolError::channel_error("unexpected method in connection state opening")
                        .on(c, m),
                    delay,
                ));
            }
            (_, _) => return Err(silent("method out of order during the handshake")),
        }
    }
}

/// One read during the handshake; the end of the stream ends it.
async fn read_more(rd: &mut OwnedReadHalf, buf: &mut BytesMut) -> Result<(), Refusal> {
    match rd.read_buf(buf).await {
        Ok(0) | Err(_) => Err(Refusal::gone()),
        Ok(_) => Ok(()),
    }
}

/// RabbitMQ's validate_negotiated_integer_value: a value the server limits
/// (non-zero) may not be 0 ("no limit") or above it.
fn check_tune_ok(
    ok: &connection::TuneOk,
    config: &crate::config::Config,
) -> Result<(), ProtocolError> {
    let too_high = |what: &str, v: u64, max: u64| {
        ProtocolError::not_allowed(format!(
            "negotiated {what} = {v} is higher than the maximum allowed value ({max})"
        ))
        .on(10, 30)
    };
    if ok.frame_max != 0 && ok.frame_max < FRAME_MIN_SIZE {
        return Err(ProtocolError::not_allowed(format!(
            "negotiated frame_max = {} is lower than the minimum allowed value ({FRAME_MIN_SIZE})",
            ok.frame_max
        ))
        .on(10, 30));
    }
    if config.frame_max != 0 && (ok.frame_max == 0 || ok.frame_max > config.frame_max) {
        return Err(too_high(
            "frame_max",
            ok.frame_max as u64,
            config.frame_max as u64,
        ));
    }
    if ok.channel_max == 0 || ok.channel_max > config.channel_max {
        return Err(too_high(
            "channel_max",
            ok.channel_max as u64,
            config.channel_max as u64,
        ));
    }
    Ok(())
}

/// The frame size limit a connection works with: what tune-ok agreed, or,
/// where both sides said 0 ("no limit"), the largest frame a message
/// could need, so one frame header cannot make the broker reserve 4 GiB.
fn effective_frame_max(negotiated: u32, config: &crate::config::Config) -> u32 {
    let unlimited = config
        .max_message_size
        .saturating_add(FRAME_MIN_SIZE as u64)
        .min(u32::MAX as u64) as u32;
    if negotiated == 0 {
        unlimited
    } else {
        negotiated
    }
}

fn server_properties() -> FieldTable {
    let mut caps = FieldTable::default();
    for cap in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ] {
        caps.insert(ShortString::from(cap), AMQPValue::Boolean(true));
    }
    let mut p = FieldTable::default();
    let s = |v: &str| AMQPValue::LongString(LongString::from(v));
    p.insert("product".into(), s("Warren"));
    p.insert("version".into(), s(env!("CARGO_PKG_VERSION")));
    p.insert("platform".into(), s("Rust"));
    p.insert("cluster_name".into(), s("warren"));
    p.insert("copyright".into(), s("Copyright (c) the Warren authors"));
    p.insert(
        "information".into(),
        s("Licensed under the MIT or Apache-2.0 licence"),
    );
    p.insert("capabilities".into(), AMQPValue::FieldTable(caps));
    p
}

fn client_caps(props: &FieldTable) -> ClientCaps {
    let mut caps = ClientCaps::default();
    if let Some(AMQPValue::FieldTable(t)) = props.inner().get("capabilities") {
        let on = |k: &str| matches!(t.inner().get(k), Some(AMQPValue::Boolean(true)));
        caps.consumer_cancel_notify = on("consumer_cancel_notify");
        caps.authentication_failure_close = on("authentication_failure_close");
        caps.connection_blocked = on("connection.blocked");
    }
    caps
}

/// The connection.close method for a hard error.
pub fn close_method(e: &ProtocolError) -> AMQPClass {
    AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
        reply_code: e.code,
        reply_text: ShortString::from(truncate(&e.text)),
        class_id: e.class_id,
        method_id: e.method_id,
    }))
}

/// Reply texts are short strings: at most 255 bytes, cut at a char boundary.
pub fn truncate(s: &str) -> String {
    if s.len() <= 255 {
        return s.to_string();
    }
    let mut end = 255;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
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
        rd: &mut OwnedReadHalf,
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
        // Set while the memory alarm keeps this (publishing) connection
        // from being read; see flow.rs.
        let mut blocked = false;
        // Set while the outbox is over its high-water mark: the peer is
        // not read until the writer drained it (outbox.rs).
        let mut backlogged = false;
        let mut alarm = self.ctx.broker.memory.subscribe();
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
            self.flush_confirms();
            if std::mem::take(&mut self.ctx.published)
                && !blocked
                && self.ctx.broker.memory.is_raised()
            {
                blocked = true;
                flow::blocked(&self.ctx);
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
            let reading = !blocked && !backlogged;
            tokio::select! {
                read = rd.read_buf(buf), if reading && !self.coalesce.paused() => got = Some(read),
                _ = self.coalesce.pause_over(), if reading && self.coalesce.paused() => {
                    got = Some(self.coalesce.resume(buf));
                }
                _ = self.ctx.outbox.woken() => {
                    let now = super::consumer_timeout::coarse_now_ms();
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
                changed = alarm.changed(), if blocked => {
                    if changed.is_err() || !*alarm.borrow_and_update() {
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
        rd: &mut OwnedReadHalf,
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
                    let ch = Channel::open(id, &self.ctx);
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

    fn flush_confirms(&mut self) {
        let done = *self.ctx.flushed.borrow();
        for ch in self.channels.values_mut() {
            ch.send_confirms(done, &self.ctx);
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
