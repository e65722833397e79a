//! Connecting to an AMQP 0-9-1 broker as a client, for shovels and
//! federation links: lapin (the AMQP client Warren's tests already drive)
//! with a URI's settings and TLS options (tls.rs), the URIs tried in turn,
//! the handshake bounded; and the server properties a broker announces
//! (lapin keeps them to itself), read from a connection.start of their
//! own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use amq_protocol::types::{AMQPValue, FieldTable, LongString};
use lapin::tcp::{AsyncTcpStream, RustlsConnector};
use lapin::uri::{AMQPAuthority, AMQPQueryString, AMQPScheme, AMQPUri, AMQPUserInfo};
use lapin::{Connection, ConnectionProperties};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::uri::Uri;

/// What a link's URIs reach on this broker: its own AMQP listener (a URI
/// without a host) and the directory a URI's TLS files must be under.
#[derive(Debug, Clone, Default)]
pub struct Reach {
    /// Loopback when the listener takes every address.
    pub own: Option<SocketAddr>,
    /// The config's `link_tls_dir`; none: no URI may name a file.
    pub tls_dir: Option<Arc<Path>>,
}

impl Reach {
    pub fn new(own: Option<SocketAddr>, tls_dir: Option<&PathBuf>) -> Reach {
        let own = own.map(|mut a| {
            if a.ip().is_unspecified() {
                a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            a
        });
        Reach {
            own,
            tls_dir: tls_dir.map(|d| Arc::from(d.as_path())),
        }
    }

    fn dir(&self) -> Option<&Path> {
        self.tls_dir.as_deref()
    }
}

/// The connection lapin makes for `uri`; `own` is this broker's AMQP
/// listener (a URI without a host).
pub fn lapin_uri(uri: &Uri, own: Option<SocketAddr>) -> Result<AMQPUri, String> {
    let (host, port) = endpoint(uri, own)?;
    let auth_mechanism = match uri.auth_mechanism.as_deref() {
        Some(m) => Some(m.parse()?),
        None => None,
    };
    Ok(AMQPUri {
        scheme: if uri.tls && uri.host.is_some() {
            AMQPScheme::AMQPS
        } else {
            AMQPScheme::AMQP
        },
        authority: AMQPAuthority {
            userinfo: AMQPUserInfo {
                username: uri.user.clone().unwrap_or_else(|| "guest".into()),
                password: uri.pass.clone().unwrap_or_else(|| "guest".into()),
            },
            host,
            port,
        },
        vhost: uri.vhost.clone(),
        query: AMQPQueryString {
            frame_max: uri.frame_max,
            channel_max: uri.channel_max,
            heartbeat: uri.heartbeat.or(Some(10)),
            connection_timeout: uri.connection_timeout,
            auth_mechanism,
        },
    })
}

/// Where `uri` connects: its host and port, or this broker's listener.
fn endpoint(uri: &Uri, own: Option<SocketAddr>) -> Result<(String, u16), String> {
    match (&uri.host, own) {
        (Some(h), _) => Ok((
            h.clone(),
            uri.port.unwrap_or(if uri.tls { 5671 } else { 5672 }),
        )),
        (None, Some(a)) => Ok((a.ip().to_string(), a.port())),
        (None, None) => {
            Err("a URI without a host means this broker, whose plain AMQP listener is off".into())
        }
    }
}

/// How long a handshake may take (a peer that accepts and then says
/// nothing must not hold a link up).
fn within(uri: &Uri) -> Duration {
    Duration::from_millis(uri.connection_timeout.unwrap_or(60_000))
}

/// Connects to the first of `uris` that answers (in a random order, as
/// RabbitMQ tries them), naming the connection `name`; the one it reached.
pub async fn connect(uris: &[Uri], reach: &Reach, name: &str) -> Result<(Connection, Uri), String> {
    let mut order: Vec<&Uri> = uris.iter().collect();
    let start = (crate::util::now_ms() as usize) % order.len().max(1);
    order.rotate_left(start);
    let mut last = String::from("no URI");
    for uri in order {
        let props = ConnectionProperties::default().with_connection_name(LongString::from(name));
        // lapin bounds only a plain connection's TCP connect.
        let within = within(uri);
        match tokio::time::timeout(within, open(uri, reach, props)).await {
            Ok(Ok(c)) => return Ok((c, uri.clone())),
            Ok(Err(e)) => last = format!("{}: {e}", uri.redacted()),
            Err(_) => last = format!("{}: no handshake within {within:?}", uri.redacted()),
        }
    }
    Err(last)
}

/// Opens a connection to `uri`: plain, or over TLS as its options say.
async fn open(uri: &Uri, reach: &Reach, props: ConnectionProperties) -> Result<Connection, String> {
    let target = lapin_uri(uri, reach.own)?;
    let Some((config, name)) = tls_config(uri, reach)? else {
        return Connection::connect_uri(target, props)
            .await
            .map_err(|e| e.to_string());
    };
    let connector = RustlsConnector::from(config);
    let domain = name.to_str().into_owned();
    let runtime = lapin::runtime::default_runtime().map_err(|e| e.to_string())?;
    // lapin runs this on its own I/O thread, which the caller's timeout
    // does not stop: it is bounded here too.
    let within = within(uri);
    Connection::connector(
        target,
        runtime,
        async move |to: AMQPUri, rt| {
            let dial = async {
                let addrs: Vec<SocketAddr> =
                    tokio::net::lookup_host((to.authority.host.as_str(), to.authority.port))
                        .await?
                        .collect();
                let tcp = AsyncTcpStream::connect(&rt, addrs).await?;
                tcp.into_rustls(&connector, &domain).await
            };
            match tokio::time::timeout(within, dial).await {
                Ok(r) => Ok(r?),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no TLS connection within {within:?}"),
                )
                .into()),
            }
        },
        props,
    )
    .await
    .map_err(|e| e.to_string())
}

/// The TLS configuration and server name of a connection to `uri`; none
/// for plain AMQP (a URI without a host reaches this broker over
/// loopback, without TLS).
fn tls_config(
    uri: &Uri,
    reach: &Reach,
) -> Result<
    Option<(
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
    String,
> {
    match (&uri.host, uri.tls) {
        (Some(host), true) => uri.tls_options.client_config(host, reach.dir()).map(Some),
        _ => Ok(None),
    }
}

/// The server properties the broker at `uri` announces in its
/// connection.start (a connection of its own, closed at once).
pub async fn server_properties(uri: &Uri, reach: &Reach) -> Result<FieldTable, String> {
    let (host, port) = endpoint(uri, reach.own)?;
    let read = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| e.to_string())?;
        let Some((config, name)) = tls_config(uri, reach)? else {
            return start_properties(tcp).await;
        };
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        start_properties(tls).await
    };
    match tokio::time::timeout(within(uri), read).await {
        Ok(r) => r.map_err(|e| format!("{}: {e}", uri.redacted())),
        Err(_) => Err(format!("{}: no connection.start", uri.redacted())),
    }
}

/// The most a connection.start may take before tuning (AMQP's minimum
/// frame size, as RabbitMQ bounds it).
const START_MAX: usize = 4096;

/// Sends the protocol header and reads connection.start's properties.
async fn start_properties<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
) -> Result<FieldTable, String> {
    let io = |e: std::io::Error| e.to_string();
    s.write_all(b"AMQP\x00\x00\x09\x01").await.map_err(io)?;
    let mut head = [0u8; 7];
    s.read_exact(&mut head).await.map_err(io)?;
    let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
    if head[0] != 1 || !(6..=START_MAX).contains(&size) {
        return Err("not an AMQP 0-9-1 connection.start".into());
    }
    let mut body = vec![0u8; size + 1];
    s.read_exact(&mut body).await.map_err(io)?;
    // class 10 (connection), method 10 (start), version 0-9, properties.
    if body[..4] != [0, 10, 0, 10] {
        return Err("not an AMQP 0-9-1 connection.start".into());
    }
    let (_, table) = amq_protocol::types::parsing::parse_field_table(&body[6..size])
        .map_err(|_| "a connection.start that does not parse".to_string())?;
    let _ = s.shutdown().await;
    Ok(table)
}

/// A server property's text (`cluster_name`, say).
pub fn text_property(props: &FieldTable, key: &str) -> Option<String> {
    match props.inner().get(key)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}
