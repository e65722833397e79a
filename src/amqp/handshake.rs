//! The connection handshake, as RabbitMQ's `rabbit_reader` runs it: the
//! protocol header, start / start-ok (authentication), tune / tune-ok and
//! open, and how a handshake that fails ends (`Refusal`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use amq_protocol::protocol::{connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tracing::{debug, warn};

use super::auth;
use super::codec::{self, Frame, FRAME_MIN_SIZE};
use super::context::{client_caps, ClientCaps, ConnCtx};
use super::error::{code, ProtocolError};
use super::outbox::Outbox;
use super::transport::Reader;
use crate::broker::connections::{Info, Refused, Tracked};
use crate::broker::Broker;

/// The longest a connection refused at connection.open waits for close-ok
/// (RabbitMQ: the heartbeat interval, at most 30 s).
const OPEN_REFUSED_MAX_HOLD: Duration = Duration::from_secs(30);

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
pub(super) struct Refusal {
    /// The connection.close to send, if any.
    pub(super) close: Option<ProtocolError>,
    /// How long the socket is held (for close-ok, or silently) before it is
    /// closed; zero when the peer is gone.
    pub(super) hold: Duration,
}

impl Refusal {
    /// The peer went away (or spoke another protocol): nothing to wait for.
    pub(super) fn gone() -> Refusal {
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
pub(super) async fn handshake(
    rd: &mut Reader,
    buf: &mut BytesMut,
    outbox: &Arc<Outbox>,
    (peer, local, tls): (SocketAddr, SocketAddr, bool),
    external: Option<&str>,
    broker: &Arc<Broker>,
    node: &Arc<super::node::Node>,
) -> Result<(ConnCtx, u16, u16), Refusal> {
    while buf.len() < 8 {
        read_more(rd, buf).await?;
    }
    let header = buf.split_to(8);
    // 0-9-1, and the 0-9 header Qpid-derived clients send (RabbitMQ takes both).
    if &header[..] != b"AMQP\x00\x00\x09\x01" && &header[..] != b"AMQP\x01\x01\x00\x09" {
        if header[0] == 0x16 && header[1] == 0x03 {
            // A TLS ClientHello: the client wanted the AMQPS port.
            warn!(%peer, "a TLS handshake on a plain AMQP port: closing (use the AMQPS port)");
        } else {
            debug!(%peer, header = ?&header[..], "unsupported protocol header");
        }
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
            server_properties: server_properties(&broker.cluster_name()),
            mechanisms: LongString::from(if external.is_some() {
                auth::MECHANISMS_WITH_EXTERNAL
            } else {
                auth::MECHANISMS
            }),
            locales: LongString::from("en_US"),
        },
    )));
    let mut state = Handshake::Starting;
    let mut caps = ClientCaps::default();
    let mut user = String::new();
    let mut mechanism = String::new();
    let mut client_properties = amq_protocol::types::FieldTable::default();
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
                mechanism = ok.mechanism.as_str().to_string();
                client_properties = ok.client_properties.clone();
                let creds = match (ok.mechanism.as_str(), external) {
                    // The certificate's name; the response (an authzid, if
                    // anything) is not used, as in RabbitMQ.
                    ("EXTERNAL", Some(name)) => Ok(auth::Credentials {
                        user: name.to_string(),
                        password: String::new(),
                    }),
                    (m, _) => auth::decode(m, ok.response.as_bytes()),
                };
                let creds = match creds {
                    Ok(c) => c,
                    Err(auth::AuthError::UnknownMechanism(m)) => {
                        return Err(silent(&format!("unknown authentication mechanism '{m}'")));
                    }
                    Err(auth::AuthError::Malformed) => {
                        return Err(silent("malformed SASL response"));
                    }
                };
                let known = if external.is_some() && ok.mechanism.as_str() == "EXTERNAL" {
                    broker.authenticate_external(&creds.user, peer.ip())
                } else {
                    broker.authenticate(&creds.user, &creds.password, peer.ip())
                };
                if !known {
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
                let refused_hold = match heartbeat {
                    0 => delay,
                    hb => Duration::from_secs(hb as u64).min(OPEN_REFUSED_MAX_HOLD),
                };
                let id = broker.next_connection_id();
                let closer = Arc::new(super::context::Closer::new(outbox));
                let tracked = Tracked::new(
                    Info {
                        id,
                        protocol: crate::broker::connections::Protocol::Amqp091,
                        name: format!("{peer} -> {local}"),
                        peer,
                        local,
                        user: user.clone(),
                        vhost: name.to_string(),
                        connected_at: crate::util::now_ms(),
                        client_properties: std::mem::take(&mut client_properties),
                        frame_max,
                        channel_max,
                        heartbeat,
                        auth_mechanism: std::mem::take(&mut mechanism),
                        tls,
                    },
                    Arc::clone(&closer) as _,
                );
                // RabbitMQ's order: the vhost's limit, the user's, then
                // the permission.
                let user_max = broker
                    .users
                    .get(&user)
                    .and_then(|u| u.limit("max-connections"));
                let registration = match broker.connections.register(
                    tracked,
                    vhost.limits.max_connections(),
                    user_max,
                ) {
                    Ok(r) => r,
                    Err(Refused::VhostLimit(max)) => {
                        return Err(closed(
                            ProtocolError::not_allowed(format!(
                                "access to vhost '{name}' refused for user '{user}': \
                                 connection limit ({max}) is reached"
                            ))
                            .on(10, 40),
                            refused_hold,
                        ))
                    }
                    Err(Refused::UserLimit(max)) => {
                        return Err(closed(
                            ProtocolError::not_allowed(format!(
                                "connection refused for user '{user}': \
                                 user connection limit ({max}) is reached"
                            ))
                            .on(10, 40),
                            refused_hold,
                        ))
                    }
                };
                if !broker.may_open(&user, name) {
                    return Err(closed(
                        ProtocolError::not_allowed(format!(
                            "access to vhost '{name}' refused for user '{user}'"
                        ))
                        .on(10, 40),
                        refused_hold,
                    ));
                }
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
                    registration,
                    closer,
                    node: Arc::clone(node),
                    id,
                    broker: Arc::clone(broker),
                    vhost,
                    outbox: Arc::clone(outbox),
                    frame_max,
                    caps,
                    authz: super::authz::Authz::new(&broker.users, &user, name),
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
async fn read_more(rd: &mut Reader, buf: &mut BytesMut) -> Result<(), Refusal> {
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

fn server_properties(cluster_name: &str) -> FieldTable {
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
    p.insert("cluster_name".into(), s(cluster_name));
    p.insert("copyright".into(), s("Copyright (c) the Warren authors"));
    p.insert(
        "information".into(),
        s("Licensed under the MIT or Apache-2.0 licence"),
    );
    p.insert("capabilities".into(), AMQPValue::FieldTable(caps));
    p
}
