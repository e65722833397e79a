//! AMQP URIs, connections and the callbacks that report broker events.

use std::sync::Arc;
use std::time::Duration;

use amqprs::callbacks::{ChannelCallback, ConnectionCallback};
use amqprs::channel::Channel;
use amqprs::connection::{Connection, OpenConnectionArguments};
use amqprs::{Ack, BasicProperties, Cancel, Close, CloseChannel, Nack, Return};
use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use tokio::sync::mpsc::UnboundedSender;

use crate::stats::Shared;

type AmqpResult<T> = std::result::Result<T, amqprs::error::Error>;

/// The parts of an `amqp://user:pass@host:port/vhost` URI.
#[derive(Debug, Clone, PartialEq)]
pub struct AmqpUri {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
    /// amqps:// (TLS, verified against `tls_ca` or the webpki roots).
    pub tls: bool,
    /// PEM CA file for amqps:// (`--tls-ca`).
    pub tls_ca: Option<std::path::PathBuf>,
}

fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .with_context(|| format!("truncated %-escape in {s:?}"))?;
            out.push(
                u8::from_str_radix(hex, 16).with_context(|| format!("bad %-escape in {s:?}"))?,
            );
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).with_context(|| format!("{s:?} is not UTF-8 once decoded"))
}

impl AmqpUri {
    /// Parses `amqp[s]://[user[:pass]@]host[:port][/vhost]` (vhost `%2f` is `/`; an absent vhost
    /// is `/`; the port defaults to 5672, or 5671 for amqps).
    pub fn parse(uri: &str) -> Result<Self> {
        let (rest, tls) = match (uri.strip_prefix("amqp://"), uri.strip_prefix("amqps://")) {
            (Some(r), _) => (r, false),
            (_, Some(r)) => (r, true),
            _ => bail!("URI {uri:?} does not start with amqp:// or amqps://"),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(ui) => match ui.find(':') {
                Some(i) => (percent_decode(&ui[..i])?, percent_decode(&ui[i + 1..])?),
                None => (percent_decode(ui)?, String::new()),
            },
            None => ("guest".to_string(), "guest".to_string()),
        };
        let (host, port) = match hostport.rfind(':') {
            Some(i) if !hostport.ends_with(']') => (
                &hostport[..i],
                hostport[i + 1..]
                    .parse::<u16>()
                    .with_context(|| format!("bad port in {uri:?}"))?,
            ),
            _ => (hostport, if tls { 5671 } else { 5672 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = if host.is_empty() { "127.0.0.1" } else { host };
        let vhost = match path {
            None | Some("") => "/".to_string(),
            Some(p) => percent_decode(p)?,
        };
        Ok(AmqpUri {
            host: host.to_string(),
            port,
            user,
            password,
            vhost,
            tls,
            tls_ca: None,
        })
    }
}

/// Reports server-initiated connection close and flow-control events.
struct ConnEvents {
    name: String,
    shared: Arc<Shared>,
}

#[async_trait]
impl ConnectionCallback for ConnEvents {
    async fn close(&mut self, _c: &Connection, close: Close) -> AmqpResult<()> {
        if !self.shared.stopping() {
            self.shared.error(format!(
                "{}: broker closed the connection: {} {}",
                self.name,
                close.reply_code(),
                close.reply_text()
            ));
        }
        Ok(())
    }

    async fn blocked(&mut self, _c: &Connection, reason: String) {
        self.shared
            .blocked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "warren-perf: {}: blocked by the broker: {reason}",
            self.name
        );
    }

    async fn unblocked(&mut self, _c: &Connection) {
        eprintln!("warren-perf: {}: unblocked", self.name);
    }

    async fn secret_updated(&mut self, _c: &Connection) {}
}

/// A publisher confirm (or nack) for `tag`, covering every earlier tag when `multiple`.
#[derive(Debug, Clone, Copy)]
pub struct ConfirmEvent {
    pub tag: u64,
    pub multiple: bool,
    pub nack: bool,
}

/// Reports channel closes and forwards publisher confirms to the producer that owns the channel.
struct ChanEvents {
    name: String,
    shared: Arc<Shared>,
    confirms: Option<UnboundedSender<ConfirmEvent>>,
}

#[async_trait]
impl ChannelCallback for ChanEvents {
    async fn close(&mut self, _ch: &Channel, close: CloseChannel) -> AmqpResult<()> {
        self.shared.error(format!(
            "{}: broker closed the channel: {} {}",
            self.name,
            close.reply_code(),
            close.reply_text()
        ));
        Ok(())
    }

    async fn cancel(&mut self, _ch: &Channel, _cancel: Cancel) -> AmqpResult<()> {
        if !self.shared.stopping() {
            self.shared
                .error(format!("{}: broker cancelled the consumer", self.name));
        }
        Ok(())
    }

    async fn flow(&mut self, _ch: &Channel, active: bool) -> AmqpResult<bool> {
        Ok(active)
    }

    async fn publish_ack(&mut self, _ch: &Channel, ack: Ack) {
        if let Some(tx) = &self.confirms {
            let _ = tx.send(ConfirmEvent {
                tag: ack.delivery_tag(),
                multiple: ack.mutiple(),
                nack: false,
            });
        }
    }

    async fn publish_nack(&mut self, _ch: &Channel, nack: Nack) {
        if let Some(tx) = &self.confirms {
            let _ = tx.send(ConfirmEvent {
                tag: nack.delivery_tag(),
                multiple: nack.multiple(),
                nack: true,
            });
        }
    }

    async fn publish_return(
        &mut self,
        _ch: &Channel,
        _r: Return,
        _p: BasicProperties,
        _c: Vec<u8>,
    ) {
    }
}

/// How long one connection attempt (TCP + AMQP handshake) may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(15);

/// Opens a connection named `name`, retrying for up to `retry_for` (the broker may still be
/// booting: RabbitMQ opens its port a moment before it accepts connections).
pub async fn connect(
    uri: &AmqpUri,
    name: &str,
    shared: &Arc<Shared>,
    retry_for: Duration,
) -> Result<Connection> {
    let mut args = OpenConnectionArguments::new(&uri.host, uri.port, &uri.user, &uri.password);
    args.virtual_host(&uri.vhost).connection_name(name);
    if uri.tls {
        let tls =
            amqprs::tls::TlsAdaptor::without_client_auth(uri.tls_ca.as_deref(), uri.host.clone())
                .with_context(|| format!("reading the TLS CA file {:?}", uri.tls_ca))?;
        args.tls_adaptor(tls);
    }
    let give_up = tokio::time::Instant::now() + retry_for;
    let conn = loop {
        let attempt = tokio::time::timeout(OPEN_TIMEOUT, Connection::open(&args)).await;
        let err = match attempt {
            Ok(Ok(conn)) => break conn,
            Ok(Err(e)) => anyhow::Error::new(e),
            Err(_) => anyhow::anyhow!("timed out after {OPEN_TIMEOUT:?}"),
        };
        if tokio::time::Instant::now() >= give_up {
            return Err(err.context(format!(
                "connecting to {}:{} (vhost {:?})",
                uri.host, uri.port, uri.vhost
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    conn.register_callback(ConnEvents {
        name: name.to_string(),
        shared: shared.clone(),
    })
    .await
    .with_context(|| format!("{name}: registering connection callback"))?;
    Ok(conn)
}

/// Opens a channel on `conn`; publisher confirms, if wanted, are sent to `confirms`.
pub async fn channel(
    conn: &Connection,
    name: &str,
    shared: &Arc<Shared>,
    confirms: Option<UnboundedSender<ConfirmEvent>>,
) -> Result<Channel> {
    let ch = with_timeout(conn.open_channel(None), || {
        format!("{name}: opening a channel")
    })
    .await?;
    ch.register_callback(ChanEvents {
        name: name.to_string(),
        shared: shared.clone(),
        confirms,
    })
    .await
    .with_context(|| format!("{name}: registering channel callback"))?;
    Ok(ch)
}

/// How long a synchronous AMQP method (declare, bind, qos, ...) may take.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a synchronous AMQP request with [`RPC_TIMEOUT`], adding `what` to any error.
pub async fn with_timeout<T, F, C>(fut: F, what: C) -> Result<T>
where
    F: std::future::Future<Output = AmqpResult<T>>,
    C: FnOnce() -> String,
{
    match tokio::time::timeout(RPC_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(anyhow::Error::new(e).context(what())),
        Err(_) => Err(anyhow::anyhow!("timed out after {RPC_TIMEOUT:?}").context(what())),
    }
}

/// Closes a connection, ignoring errors (the broker may already have gone) but not waiting forever.
pub async fn close_quietly(conn: Connection) {
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.close()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_default_uri() {
        let u = AmqpUri::parse("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(u.host, "127.0.0.1");
        assert_eq!(u.port, 5672);
        assert_eq!(u.user, "guest");
        assert_eq!(u.password, "guest");
        assert_eq!(u.vhost, "/");
    }

    #[test]
    fn parses_short_forms() {
        let u = AmqpUri::parse("amqp://localhost").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.vhost.as_str()),
            ("localhost", 5672, "/")
        );
        let u = AmqpUri::parse("amqp://a%40b:p%3Aw@h:1234/v1").unwrap();
        assert_eq!((u.user.as_str(), u.password.as_str()), ("a@b", "p:w"));
        assert_eq!((u.port, u.vhost.as_str()), (1234, "v1"));
        assert!(AmqpUri::parse("http://x").is_err());
        let u = AmqpUri::parse("amqps://localhost/%2f").unwrap();
        assert!(u.tls);
        assert_eq!(u.port, 5671);
        assert!(AmqpUri::parse("amqp://h:notaport/").is_err());
    }
}
