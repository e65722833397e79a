//! RabbitMQ's stream protocol (its PROTOCOL.adoc; port 5552): the binary
//! protocol RabbitMQ's stream clients speak, serving the same streams as
//! AMQP 0-9-1's `x-queue-type=stream` queues.
//!
//! A connection (this file; plain on 5552, TLS on 5551) goes through
//! RabbitMQ's handshake: peer properties, SASL (PLAIN; EXTERNAL with a
//! verified client certificate on TLS), tune (frame max, heartbeat), open (a vhost
//! the user has a permission on); then conn/ serves its commands:
//! streams created and deleted, metadata, publishers (publish.rs:
//! confirms once the group commit covers a batch, deduplication by
//! publishing id for a named publisher), subscriptions (subscribe.rs:
//! chunks by credit; groups.rs: single active consumers) and stored
//! offsets. Frames are read whole up to the
//! negotiated frame max (wire.rs), and what is written goes through one
//! bounded queue (out.rs). Every bad frame gets the protocol's response
//! code, or ends the connection where the protocol has no answer for it.

pub(crate) mod chunk;
pub(crate) mod codes;
mod conn;
mod groups;
pub mod out;
mod publish;
pub(crate) mod subscribe;
mod super_streams;
mod view;
pub(crate) mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BufMut;
use tokio::io::AsyncRead;
use tokio::sync::watch;
use tracing::{debug, warn};

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::broker::connections::{Info, Protocol, Refused, Tracked};
use crate::broker::Broker;
use crate::vhost::VHost;
use codes::*;
pub use groups::Groups;
use out::Out;
use wire::{Fields, Malformed, ReadError};

/// The largest frame read before tune (RabbitMQ's initial frame max is
/// lower; the handshake's frames are small).
pub(crate) const HANDSHAKE_FRAME_MAX: u32 = 64 << 10;
/// The frame max proposed at tune (RabbitMQ's default).
pub const FRAME_MAX: u32 = 1 << 20;
/// The heartbeat proposed at tune, seconds (RabbitMQ's default).
const HEARTBEAT_SECS: u32 = 60;
/// The version RabbitMQ's stream clients are told (they turn on what
/// they use by it: 3.13 speaks everything Warren serves here).
const COMPATIBLE_VERSION: &str = "3.13.0";

/// Who the connection is, once open.
pub struct Session {
    pub peer: SocketAddr,
    pub user: String,
    pub vhost: Arc<VHost>,
    pub frame_max: u32,
    pub heartbeat: u32,
    /// The host and port Metadata names for this node.
    pub advertised: (String, u16),
    /// The client spoke TLS (Metadata names the members' TLS ports).
    pub tls: bool,
    /// Its publishers and subscriptions as the management API lists them,
    /// and how the API closes it.
    pub view: Arc<view::View>,
    pub closer: Arc<view::Closer>,
    /// Keeps it in the registry (and counted against the limits).
    pub _registration: crate::broker::connections::Registration,
    /// Counts it against `connection_max` while it is open.
    pub _slot: crate::broker::ConnectionSlot,
}

/// How a connection reached this node.
struct Reached {
    peer: SocketAddr,
    /// The address it connected to (for a carried one, this node's end of
    /// the member's link, as AMQP's carried connections have it).
    local: SocketAddr,
    tls: bool,
    /// What Metadata names this node as.
    advertised: (String, u16),
}

/// Serves one connection to the stream port until it ends or `stop`.
pub async fn serve(
    socket: tokio::net::TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    broker: Arc<Broker>,
    groups: Arc<Groups>,
    stop: watch::Receiver<bool>,
) {
    let advertised = advertised(&broker, local, false);
    let (rd, wr) = socket.into_split();
    let from = Reached {
        peer,
        local,
        tls: false,
        advertised,
    };
    run(rd, wr, from, None, (broker, groups), stop).await;
}

/// Serves one connection to the stream protocol's TLS port (past the TLS
/// handshake) until it ends or `stop`. A client certificate verified in
/// the handshake offers SASL `EXTERNAL`, with the user name taken from
/// it as on AMQPS.
pub async fn serve_tls(
    socket: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    peer: SocketAddr,
    local: SocketAddr,
    broker: Arc<Broker>,
    groups: Arc<Groups>,
    stop: watch::Receiver<bool>,
) {
    let certificate = socket
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec());
    let external = certificate.and_then(|der| external_login(&der, &broker, peer));
    let advertised = advertised(&broker, local, true);
    let (rd, wr) = tokio::io::split(socket);
    let from = Reached {
        peer,
        local,
        tls: true,
        advertised,
    };
    run(rd, wr, from, external, (broker, groups), stop).await;
}

/// Serves one connection a cluster member accepted on its stream port
/// and carried here (`tls`: whether the client spoke TLS to it, and the
/// client certificate it verified). Metadata names this node at
/// `advertised`: the address every member's clients can reach it by.
pub async fn serve_carried<S>(
    link: S,
    (peer, local): (SocketAddr, SocketAddr),
    (tls, certificate): (bool, Option<Vec<u8>>),
    advertised: (String, u16),
    (broker, groups): (Arc<Broker>, Arc<Groups>),
    stop: watch::Receiver<bool>,
) where
    S: AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let external = certificate.and_then(|der| external_login(&der, &broker, peer));
    let (rd, wr) = tokio::io::split(link);
    run(
        rd,
        wr,
        Reached {
            peer,
            local,
            tls,
            advertised,
        },
        external,
        (broker, groups),
        stop,
    )
    .await;
}

/// The user a verified client certificate names (logged if none).
fn external_login(der: &[u8], broker: &Broker, peer: SocketAddr) -> Option<String> {
    crate::tls::identity::login_name(der, &broker.config.tls)
        .map_err(|e| warn!(%peer, "no EXTERNAL login from the client certificate: {e}"))
        .ok()
}

/// What Metadata names this node as, for a client that reached it at
/// `local` (over TLS or not): the configured advertised host, else in a
/// cluster its host in `--peers` (as Metadata names it to a member's
/// clients, so that a client reconnecting until it reaches the node
/// Metadata named can tell), else that address; the configured advertised
/// port, else that port.
fn advertised(broker: &Broker, local: SocketAddr, tls: bool) -> (String, u16) {
    let c = &broker.config;
    let host = c.stream_advertised_host.clone();
    let host = host.or_else(|| c.cluster.own_host());
    let host = host.unwrap_or_else(|| local.ip().to_string());
    let set = match tls {
        true => c.stream_advertised_tls_port,
        false => c.stream_advertised_port,
    };
    (host, set.unwrap_or(local.port()))
}

/// A connection on either listener (or carried here): who it is from,
/// whether it spoke TLS, and what Metadata names this node as; `external`
/// is the user a verified client certificate names (TLS only).
async fn run<R, W>(
    mut rd: R,
    wr: W,
    from: Reached,
    external: Option<String>,
    (broker, groups): (Arc<Broker>, Arc<Groups>),
    mut stop: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin + Send,
    W: out::Sink,
{
    let (out, writer) = out::start(wr, broker.config.send_timeout());
    let limit = Duration::from_millis(broker.config.handshake_timeout);
    let session = tokio::select! {
        s = tokio::time::timeout(limit, handshake(&mut rd, &out, &from, external, &broker)) => s,
        _ = stop.changed() => return,
    };
    let peer = from.peer;
    let session = match session {
        Ok(Ok(s)) => s,
        Ok(Err(why)) => {
            warn!(%peer, "stream protocol handshake failed: {why}");
            // Held a little (the client reads the answer first; guessing
            // passwords slows down), as the AMQP port does.
            tokio::time::sleep(Duration::from_millis(
                broker.config.handshake_close_delay_ms,
            ))
            .await;
            drop(out);
            let _ = writer.await;
            return;
        }
        Err(_) => {
            warn!(%peer, "stream protocol handshake timed out");
            return;
        }
    };
    debug!(%peer, user = %session.user, vhost = %session.vhost.name, "stream connection open");
    conn::run(rd, out, session, broker, groups, stop).await;
    let _ = writer.await;
}

/// What a tune settles between the server's value and the client's (0:
/// none).
pub(crate) fn tuned_value(ours: u32, theirs: u32) -> u32 {
    match (ours, theirs) {
        (0, t) => t,
        (o, 0) => o,
        (o, t) => o.min(t),
    }
}

/// The handshake: what it refused, as the log says it.
async fn handshake<R: AsyncRead + Unpin>(
    rd: &mut R,
    out: &Out,
    from: &Reached,
    external: Option<String>,
    broker: &Arc<Broker>,
) -> Result<Session, String> {
    let (peer, advertised) = (from.peer, from.advertised.clone());
    // What the client said of itself, and how it logged in.
    let mut client_properties = FieldTable::default();
    let mut mechanism_used = "";
    let mut buf = Vec::new();
    let mut user: Option<String> = None;
    let mut tuned: Option<(u32, u32)> = None;
    loop {
        match wire::read_frame(rd, &mut buf, HANDSHAKE_FRAME_MAX).await {
            Ok(()) => {}
            Err(ReadError::Io(e)) => return Err(format!("connection ended: {e}")),
            Err(ReadError::TooLarge(n)) => return Err(format!("a frame of {n} bytes")),
        }
        let mut f = Fields::new(&buf);
        let head = (|| Ok::<_, Malformed>((f.u16()?, f.u16()?)))();
        let Ok((key, _version)) = head else {
            return Err("a frame too short for its key".into());
        };
        // The client answers the server's tune with the same command.
        if key & !RESPONSE == TUNE {
            let (Ok(frame_max), Ok(heartbeat)) = (f.u32(), f.u32()) else {
                return Err("a malformed tune".into());
            };
            if user.is_none() {
                return Err("tune before authentication".into());
            }
            let frame_max = tuned_value(FRAME_MAX, frame_max);
            tuned = Some((frame_max, tuned_value(HEARTBEAT_SECS, heartbeat)));
            continue;
        }
        if key == HEARTBEAT {
            continue;
        }
        let Ok(correlation) = f.u32() else {
            return Err(format!("command {key} cut short"));
        };
        match key {
            PEER_PROPERTIES => {
                let Ok(pairs) = f.pairs() else {
                    return Err("malformed peer properties".into());
                };
                for (k, v) in pairs {
                    let v = AMQPValue::LongString(v.as_bytes().to_vec().into());
                    client_properties.insert(k.into(), v);
                }
                let props = [
                    ("product", "Warren"),
                    ("version", COMPATIBLE_VERSION),
                    ("warren_version", env!("CARGO_PKG_VERSION")),
                    ("platform", "Rust"),
                    ("copyright", "Copyright (c) the Warren authors"),
                    (
                        "information",
                        "Licensed under the MIT or Apache-2.0 licence",
                    ),
                ];
                out.write(|o| {
                    wire::response(o, key, correlation, OK, |o| {
                        wire::put_pairs(o, props.into_iter())
                    })
                })
                .await;
            }
            SASL_HANDSHAKE => {
                let mechanisms: &[&str] = match external {
                    Some(_) => &["PLAIN", "EXTERNAL"],
                    None => &["PLAIN"],
                };
                out.write(|o| {
                    wire::response(o, key, correlation, OK, |o| {
                        o.put_u32(mechanisms.len() as u32);
                        for m in mechanisms {
                            wire::put_str(o, m);
                        }
                    })
                })
                .await;
            }
            SASL_AUTHENTICATE => {
                let (Ok(mechanism), Ok(data)) = (f.string(), f.bytes()) else {
                    return Err("a malformed SASL authenticate".into());
                };
                if let ("EXTERNAL", Some(name)) = (mechanism, &external) {
                    // The certificate's name; the response (an authzid,
                    // if anything) is not used, as in RabbitMQ.
                    if !broker.authenticate_external(name, peer.ip()) {
                        out.write(|o| {
                            wire::response(o, key, correlation, AUTHENTICATION_FAILURE, |_| {})
                        })
                        .await;
                        return Err(format!("EXTERNAL login refused for user '{name}'"));
                    }
                    user = Some(name.clone());
                    mechanism_used = "EXTERNAL";
                    out.write(|o| {
                        wire::response(o, key, correlation, OK, |_| {});
                        put_tune(o);
                    })
                    .await;
                    continue;
                }
                if mechanism != "PLAIN" {
                    out.write(|o| {
                        wire::response(o, key, correlation, SASL_MECHANISM_NOT_SUPPORTED, |_| {})
                    })
                    .await;
                    return Err(format!("unknown mechanism {mechanism}"));
                }
                // authzid \0 authcid \0 password
                let mut parts = data.splitn(3, |&b| b == 0);
                let (Some(_), Some(name), Some(pass)) = (parts.next(), parts.next(), parts.next())
                else {
                    out.write(|o| wire::response(o, key, correlation, SASL_ERROR, |_| {}))
                        .await;
                    return Err("a malformed PLAIN response".into());
                };
                let name = String::from_utf8_lossy(name).into_owned();
                let pass = String::from_utf8_lossy(pass);
                if !broker.authenticate(&name, &pass, peer.ip()) {
                    let loopback = broker.config.loopback_users.contains(&name)
                        && !peer.ip().is_loopback()
                        && broker.users.authenticate(&name, &pass).is_some();
                    let code = if loopback {
                        AUTHENTICATION_FAILURE_LOOPBACK
                    } else {
                        AUTHENTICATION_FAILURE
                    };
                    out.write(|o| wire::response(o, key, correlation, code, |_| {}))
                        .await;
                    return Err(format!("login refused for user '{name}'"));
                }
                user = Some(name);
                mechanism_used = "PLAIN";
                out.write(|o| {
                    wire::response(o, key, correlation, OK, |_| {});
                    put_tune(o);
                })
                .await;
            }
            OPEN => {
                let Ok(name) = f.string() else {
                    return Err("a malformed open".into());
                };
                let (Some(who), Some((frame_max, heartbeat))) = (user.clone(), tuned) else {
                    return Err("open before authentication and tune".into());
                };
                let vhost = broker.vhost(name).filter(|_| broker.may_open(&who, name));
                let Some(vhost) = vhost else {
                    out.write(|o| {
                        wire::response(o, key, correlation, VIRTUAL_HOST_ACCESS_FAILURE, |_| {})
                    })
                    .await;
                    return Err(format!("access to vhost '{name}' refused for user '{who}'"));
                };
                // The node's connection limit counts every protocol's.
                let Some(slot) = broker.admit_connection() else {
                    out.write(|o| {
                        wire::response(o, key, correlation, VIRTUAL_HOST_ACCESS_FAILURE, |_| {})
                    })
                    .await;
                    return Err(format!(
                        "node connection limit ({}) is reached",
                        broker.config.connection_max
                    ));
                };
                // Listed with the node's connections, and counted against
                // the vhost's and the user's limits as AMQP's are.
                let closer = Arc::new(view::Closer::default());
                let view = Arc::new(view::View::default());
                let tracked = Tracked::new(
                    Info {
                        id: broker.next_connection_id(),
                        protocol: Protocol::Stream,
                        name: format!("{peer} -> {}", from.local),
                        peer,
                        local: from.local,
                        user: who.clone(),
                        vhost: name.to_string(),
                        connected_at: crate::util::now_ms(),
                        client_properties: std::mem::take(&mut client_properties),
                        frame_max,
                        channel_max: 0,
                        heartbeat: heartbeat.min(u16::MAX as u32) as u16,
                        auth_mechanism: mechanism_used.to_string(),
                        tls: from.tls,
                    },
                    Arc::clone(&closer) as _,
                )
                .with_stream(Arc::clone(&view) as _);
                let user_max = broker
                    .users
                    .get(&who)
                    .and_then(|u| u.limit("max-connections"));
                let vhost_max = vhost.limits.max_connections();
                let registration = match broker.connections.register(tracked, vhost_max, user_max) {
                    Ok(r) => r,
                    Err(refused) => {
                        out.write(|o| {
                            wire::response(o, key, correlation, VIRTUAL_HOST_ACCESS_FAILURE, |_| {})
                        })
                        .await;
                        return Err(match refused {
                            Refused::VhostLimit(max) => {
                                format!("vhost '{name}' connection limit ({max}) is reached")
                            }
                            Refused::UserLimit(max) => {
                                format!("user '{who}' connection limit ({max}) is reached")
                            }
                        });
                    }
                };
                let port = advertised.1.to_string();
                out.write(|o| {
                    wire::response(o, key, correlation, OK, |o| {
                        wire::put_pairs(
                            o,
                            [
                                ("advertised_host", advertised.0.as_str()),
                                ("advertised_port", port.as_str()),
                            ]
                            .into_iter(),
                        )
                    })
                })
                .await;
                return Ok(Session {
                    peer,
                    user: who,
                    vhost,
                    frame_max,
                    heartbeat,
                    advertised,
                    tls: from.tls,
                    view,
                    closer,
                    _registration: registration,
                    _slot: slot,
                });
            }
            CLOSE => {
                out.write(|o| wire::response(o, key, correlation, OK, |_| {}))
                    .await;
                return Err("closed by the client".into());
            }
            other => {
                return Err(format!("command {other} during the handshake"));
            }
        }
    }
}

/// The server's tune, sent after a successful authentication.
fn put_tune(o: &mut bytes::BytesMut) {
    wire::frame(o, TUNE, 1, |o| {
        o.put_u32(FRAME_MAX);
        o.put_u32(HEARTBEAT_SECS);
    });
}
