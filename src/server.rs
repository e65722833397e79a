//! The listeners: AMQP and AMQPS (each connection served on its own task;
//! AMQPS after a TLS handshake bounded by ssl_handshake_timeout) and the
//! management HTTP API, each on its configured port (0: any free one;
//! off: none); a port that cannot be bound stops the start.
//! `Server::reload_tls` reads the certificate files again.
//! `Server::shutdown` stops accepting, closes every connection with 320
//! CONNECTION_FORCED, waits for them, and flushes the store.

mod follow;
mod follow_reads;
mod mirror;
mod reopen;

pub use mirror::ClusterNode;
pub use reopen::restart;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::amqp::connection;
use crate::amqp::transport::Transport;
use crate::broker::Broker;
use crate::cluster::StreamEnd;
use crate::config::{Config, Port};

/// A running broker.
pub struct Server {
    /// Where AMQP listens (the real port when configured with port 0);
    /// 0.0.0.0:0 when the AMQP listener is off.
    pub addr: SocketAddr,
    /// Where AMQPS listens, if it is on.
    pub amqps_addr: Option<SocketAddr>,
    /// Where RabbitMQ's stream protocol listens, if it is on.
    pub stream_addr: Option<SocketAddr>,
    /// Where the stream protocol over TLS listens, if it is on.
    pub stream_tls_addr: Option<SocketAddr>,
    /// The TLS configuration, if a certificate is configured.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// Where the HTTPS management API listens, if it is on.
    pub management_tls_addr: Option<SocketAddr>,
    /// Where HTTPS metrics are served, if they are.
    pub prometheus_tls_addr: Option<SocketAddr>,
    /// Every TLS configuration in force (AMQPS, HTTPS API, HTTPS metrics),
    /// for reloading.
    all_tls: Vec<Arc<crate::tls::Tls>>,
    /// Where the management HTTP API listens, if it is on.
    pub management_addr: Option<SocketAddr>,
    /// Where Prometheus metrics are served, if they are.
    pub prometheus_addr: Option<SocketAddr>,
    /// The shared broker state.
    pub broker: Arc<Broker>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    connections_done: mpsc::Receiver<()>,
    /// What serves connections from elsewhere (a cluster follower's
    /// proxied clients); dropped at shutdown.
    accepted: Option<Accepted>,
}

/// What a connection accepted elsewhere needs to be served here.
#[derive(Clone)]
pub struct Accepted {
    broker: Arc<Broker>,
    node: Arc<crate::amqp::node::Node>,
    stop: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
    /// The management API's proxied connections, if it is served.
    http: Option<mpsc::Sender<(crate::cluster::Link, crate::http::Carried)>>,
    /// The stream protocol's, if it is served.
    streams: Option<CarriedStreams>,
}

/// What a stream protocol connection carried here needs.
#[derive(Clone)]
struct CarriedStreams {
    groups: Arc<crate::stream_protocol::Groups>,
    /// What Metadata names this node as (cluster/stream_ends.rs): a
    /// client carried here cannot be told which of this node's addresses
    /// it can reach, so its host is the members' name for it.
    end: crate::cluster::StreamEnd,
}

impl Accepted {
    /// Serves one connection a cluster member carried here, as `header`
    /// says (AMQP on its own task, or the management API). A TLS link
    /// between members is not the client's TLS: what the client spoke to
    /// the member is in the header, with the client certificate the member
    /// verified (cluster/mod.rs keeps it only from a member that proved
    /// the cluster secret).
    pub fn serve(&self, link: crate::cluster::Link, header: crate::cluster::ProxyHeader) {
        let peer = header.client;
        if header.service == crate::cluster::Service::Http {
            if let Some(http) = &self.http {
                // Full: the API is swamped; the client is closed and retries.
                let from = crate::http::Carried {
                    client: peer,
                    via: header.via,
                };
                let _ = http.try_send((link, from));
            }
            return;
        }
        if header.service == crate::cluster::Service::Stream {
            // A client of a listener that is off here is closed.
            let Some(streams) = &self.streams else { return };
            let Some(port) = streams.end.port_for(header.tls) else {
                return;
            };
            let advertised = (streams.end.host.clone(), port);
            let a = self.clone();
            let groups = Arc::clone(&streams.groups);
            tokio::spawn(async move {
                let local = link.local_addr().unwrap_or(peer);
                let tls = (header.tls, header.certificate);
                let served = (a.broker, groups);
                let from = (peer, local);
                crate::stream_protocol::serve_carried(link, from, tls, advertised, served, a.stop)
                    .await;
                drop(a.alive);
            });
            return;
        }
        let socket = match link {
            crate::cluster::Link::Plain(s) => Transport::Plain(s),
            crate::cluster::Link::Server(s) => Transport::Link(s),
            crate::cluster::Link::Client(_) => return,
        };
        let carried = connection::Carried {
            tls: header.tls,
            certificate: header.certificate,
        };
        let a = self.clone();
        tokio::spawn(async move {
            connection::serve(socket, peer, Some(carried), a.broker, a.node, a.stop).await;
            drop(a.alive);
        });
    }
}

/// The management API's connections carried here by cluster members, as
/// an axum listener.
struct Carried {
    incoming: mpsc::Receiver<(crate::cluster::Link, crate::http::Carried)>,
    local: crate::http::Carried,
}

impl axum::serve::Listener for Carried {
    type Io = crate::cluster::Link;
    type Addr = crate::http::Carried;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(c) => c,
            // Every sender is gone (shutdown): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The TLS configurations of a node's listeners, each if it is on.
pub(crate) struct ListenerTls {
    /// AMQPS: `[tls]`.
    pub amqps: Option<Arc<crate::tls::Tls>>,
    /// HTTPS for the API: `[management_tls]`, else `[tls]` without its
    /// client-certificate rules (browsers, scrapers and rabbitmqadmin
    /// present none), as RabbitMQ's management.ssl has options of its own.
    pub api: Option<Arc<crate::tls::Tls>>,
    /// HTTPS for /metrics: `[prometheus_tls]`, else as the API's.
    pub metrics: Option<Arc<crate::tls::Tls>>,
}

impl ListenerTls {
    /// Reads the certificate files the configuration names.
    pub(crate) fn load(c: &Config) -> Result<ListenerTls, String> {
        let https = |own: &Option<crate::config::TlsConfig>| -> Result<_, String> {
            match own {
                Some(t) if t.enabled() => crate::tls::Tls::load(t).map(Some),
                Some(_) => Ok(None),
                None if c.tls.enabled() => {
                    let shared = crate::config::TlsConfig {
                        verify: Some(crate::config::Verify::None),
                        fail_if_no_peer_cert: false,
                        ..c.tls.clone()
                    };
                    crate::tls::Tls::load(&shared).map(Some)
                }
                None => Ok(None),
            }
        };
        Ok(ListenerTls {
            amqps: match c.tls.enabled() {
                true => Some(crate::tls::Tls::load(&c.tls)?),
                false => None,
            },
            api: https(&c.management_tls)?,
            metrics: https(&c.prometheus_tls)?,
        })
    }

    /// Each configuration once (the API's and the metrics' may be one).
    pub(crate) fn all(&self) -> Vec<Arc<crate::tls::Tls>> {
        let mut all: Vec<Arc<crate::tls::Tls>> = Vec::new();
        for t in [&self.amqps, &self.api, &self.metrics]
            .into_iter()
            .flatten()
        {
            if !all.iter().any(|x| Arc::ptr_eq(x, t)) {
                all.push(Arc::clone(t));
            }
        }
        all
    }
}

async fn bind(what: &str, ip: std::net::IpAddr, port: Port) -> Result<Option<TcpListener>, String> {
    let Some(port) = port.get() else {
        return Ok(None);
    };
    let at = SocketAddr::new(ip, port);
    TcpListener::bind(at)
        .await
        .map(Some)
        .map_err(|e| format!("cannot listen for {what} on {at}: {e}"))
}

impl Server {
    /// Opens the store, recovers, imports `load_definitions`, binds the
    /// listeners and starts serving.
    pub async fn start(config: Config) -> Result<Server, String> {
        Self::serve(Broker::open(config)?).await
    }

    /// Imports `load_definitions` into `broker`, binds the listeners and
    /// starts serving.
    pub async fn serve(broker: Arc<Broker>) -> Result<Server, String> {
        let static_shovels = crate::shovel::check_static(&broker.config)?;
        if let Some(path) = broker.config.load_definitions.clone() {
            let done = crate::definitions::load_file(&broker, &path).await?;
            info!(file = %path.display(), ?done, "definitions imported");
        }
        let c = &broker.config;
        let loaded = ListenerTls::load(c)?;
        let all_tls = loaded.all();
        let ListenerTls {
            amqps: tls,
            api: api_tls,
            metrics: metrics_tls,
        } = loaded;
        let amqp = bind("AMQP", c.bind, c.port).await?;
        let amqps = match &tls {
            Some(_) => bind("AMQPS", c.bind, c.amqps_port()).await?,
            None => None,
        };
        let streams = bind("the stream protocol", c.bind, c.stream_port).await?;
        let streams_tls = match &tls {
            Some(_) => bind("the stream protocol over TLS", c.bind, c.stream_tls_port()).await?,
            None => None,
        };
        let http = bind("the management API", c.management_bind, c.management_port).await?;
        let metrics = bind("Prometheus", c.management_bind, c.prometheus_port).await?;
        // HTTPS: the listener's own section, else the [tls] certificate
        // without its client-certificate rules (browsers, scrapers and
        // rabbitmqadmin present none), as RabbitMQ's management.ssl has
        // options of its own.
        let https = match &api_tls {
            Some(_) => {
                bind(
                    "the HTTPS management API",
                    c.management_bind,
                    c.management_tls_port(),
                )
                .await?
            }
            None => None,
        };
        let https_metrics = match &metrics_tls {
            Some(_) => {
                bind(
                    "HTTPS Prometheus",
                    c.management_bind,
                    c.prometheus_tls_port(),
                )
                .await?
            }
            None => None,
        };
        let addr_of = |l: &Option<TcpListener>| l.as_ref().and_then(|l| l.local_addr().ok());
        let (amqp_addr, management_addr) = (addr_of(&amqp), addr_of(&http));
        let amqps_addr = addr_of(&amqps);
        let stream_addr = addr_of(&streams);
        let stream_tls_addr = addr_of(&streams_tls);
        let prometheus_addr = addr_of(&metrics);
        let (management_tls_addr, prometheus_tls_addr) = (addr_of(&https), addr_of(&https_metrics));
        let (stop, stop_rx) = watch::channel(false);
        let (alive, connections_done) = mpsc::channel::<()>(1);
        let mut tasks = Vec::new();
        let mut listeners = Vec::new();
        let node = crate::amqp::node::Node::start();
        if let Some(l) = amqp {
            let addr = amqp_addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            info!(%addr, "AMQP listener started");
            listeners.push(("amqp", addr));
            let (b, n, s) = (Arc::clone(&broker), Arc::clone(&node), stop_rx.clone());
            tasks.push(tokio::spawn(accept_loop(l, None, b, n, s, alive.clone())));
        }
        if let (Some(l), Some(addr), Some(t)) = (amqps, amqps_addr, &tls) {
            info!(%addr, "AMQPS listener started");
            listeners.push(("amqp/ssl", addr));
            let (b, n, s) = (Arc::clone(&broker), Arc::clone(&node), stop_rx.clone());
            let t = Some(Arc::clone(t));
            tasks.push(tokio::spawn(accept_loop(l, t, b, n, s, alive.clone())));
        }
        // Single active consumer groups span both stream listeners.
        let groups = Arc::new(crate::stream_protocol::Groups::default());
        if let (Some(l), Some(addr)) = (streams, stream_addr) {
            info!(%addr, "stream protocol listener started");
            listeners.push(("stream", addr));
            let (b, g, s) = (Arc::clone(&broker), Arc::clone(&groups), stop_rx.clone());
            let accepting = stream_accept_loop(l, None, b, g, s, alive.clone());
            tasks.push(tokio::spawn(accepting));
        }
        if let (Some(l), Some(addr), Some(t)) = (streams_tls, stream_tls_addr, &tls) {
            info!(%addr, "stream protocol TLS listener started");
            listeners.push(("stream/ssl", addr));
            let (b, g, s) = (Arc::clone(&broker), Arc::clone(&groups), stop_rx.clone());
            let accepting = stream_accept_loop(l, Some(Arc::clone(t)), b, g, s, alive.clone());
            tasks.push(tokio::spawn(accepting));
        }
        // The API's connections carried here by followers (served as the
        // API's own, with the client's address).
        let api_local = management_addr.or(management_tls_addr);
        let (http_tx, http_rx) = match api_local {
            Some(_) => {
                let (t, r) = mpsc::channel(256);
                (Some(t), Some(r))
            }
            None => (None, None),
        };
        let accepted = Accepted {
            broker: Arc::clone(&broker),
            node: Arc::clone(&node),
            stop: stop_rx.clone(),
            alive: alive.clone(),
            http: http_tx,
            streams: StreamEnd::of(c, stream_addr, stream_tls_addr).map(|end| CarriedStreams {
                groups: Arc::clone(&groups),
                end,
            }),
        };
        if let Some(cluster) = &broker.cluster {
            cluster.set_stream_end(StreamEnd::of(c, stream_addr, stream_tls_addr));
        }
        drop(alive);
        if let Some(addr) = management_addr {
            listeners.push(("http", addr));
        }
        if let Some(addr) = prometheus_addr {
            listeners.push(("http/prometheus", addr));
        }
        if let Some(addr) = management_tls_addr {
            listeners.push(("https", addr));
        }
        if let Some(addr) = prometheus_tls_addr {
            listeners.push(("https/prometheus", addr));
        }
        let api = crate::http::Api::new(Arc::clone(&broker), listeners, all_tls.clone());
        // Shovels start once this broker listens: a URI without a host
        // connects to its own AMQP listener.
        let reach =
            crate::shovel::client::Reach::new(amqp_addr, broker.config.link_tls_dir.as_ref());
        broker.shovels.configure(
            reach.clone(),
            &api.node,
            &crate::http::cluster_name(&api),
            Broker::shovel_finished(&Arc::downgrade(&broker)),
        );
        if let Err(e) = broker.start_shovels() {
            warn!("cannot start the shovels: {e}");
        }
        broker.set_cluster_name(&crate::http::cluster_name(&api));
        broker.federation.start(
            Broker::federation_side(&broker),
            &api.node,
            reach,
            broker.vhosts().iter().map(|v| v.name.clone()).collect(),
        );
        for (name, spec) in static_shovels {
            broker.shovels.start_static(&name, spec);
        }
        if management_addr.is_some() || management_tls_addr.is_some() {
            crate::http::start_sampler(&api, stop_rx.clone());
        }
        if let (Some(l), Some(addr), Some(t)) = (https, management_tls_addr, &api_tls) {
            info!(%addr, "HTTPS management API listener started");
            let l = crate::http::tls::TlsListener::new(l, Arc::clone(t), stop_rx.clone());
            tasks.push(tokio::spawn(crate::http::serve(
                l,
                Arc::clone(&api),
                stop_rx.clone(),
            )));
        }
        if let (Some(l), Some(addr), Some(t)) = (https_metrics, prometheus_tls_addr, &metrics_tls) {
            info!(%addr, "HTTPS Prometheus listener started");
            let l = crate::http::tls::TlsListener::new(l, Arc::clone(t), stop_rx.clone());
            tasks.push(tokio::spawn(crate::http::serve_metrics(
                l,
                Arc::clone(&api),
                stop_rx.clone(),
            )));
        }
        if let (Some(incoming), Some(local)) = (http_rx, api_local) {
            let local = crate::http::Carried {
                client: local,
                via: broker.cluster.as_ref().map_or(0, |c| c.id),
            };
            tasks.push(tokio::spawn(crate::http::serve_carried(
                Carried { incoming, local },
                Arc::clone(&api),
                stop_rx.clone(),
            )));
        }
        if let (Some(l), Some(addr)) = (http, management_addr) {
            info!(%addr, "management API listener started");
            tasks.push(tokio::spawn(crate::http::serve(
                l,
                Arc::clone(&api),
                stop_rx.clone(),
            )));
        }
        if let (Some(l), Some(addr)) = (metrics, prometheus_addr) {
            info!(%addr, "Prometheus listener started");
            tasks.push(tokio::spawn(crate::http::serve_metrics(
                l,
                api,
                stop_rx.clone(),
            )));
        }
        Ok(Server {
            addr: amqp_addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
            amqps_addr,
            stream_addr,
            stream_tls_addr,
            tls,
            management_tls_addr,
            prometheus_tls_addr,
            all_tls,
            management_addr,
            prometheus_addr,
            broker,
            stop,
            tasks,
            connections_done,
            accepted: Some(accepted),
        })
    }

    /// Serves connections accepted elsewhere (until shutdown).
    pub fn accepted(&self) -> Option<Accepted> {
        self.accepted.clone()
    }

    /// The TLS configurations in force (reloaded by `reload_tls`).
    pub fn tls_in_force(&self) -> Vec<Arc<crate::tls::Tls>> {
        self.all_tls.clone()
    }

    /// Reads the TLS certificate, key and CA files again: new handshakes
    /// use them, established connections keep theirs. An error keeps the
    /// configuration in force.
    pub fn reload_tls(&self) -> Result<(), String> {
        crate::tls::reload_all(&self.all_tls)
    }

    /// Stops accepting, closes connections with 320, waits for them and
    /// flushes the store.
    pub async fn shutdown(mut self) {
        self.accepted = None;
        self.broker.shovels.stop_all();
        self.broker.federation.stop_all();
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        // Every connection task holds a sender; recv() ends when all are gone.
        let _ = self.connections_done.recv().await;
        if let Err(e) = self.broker.flush() {
            warn!("final store flush failed: {e}");
        }
        info!("broker stopped");
    }
}

/// Accepts on `listener`; with `tls`, each connection's TLS handshake
/// runs on its own task, bounded by ssl_handshake_timeout.
async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<crate::tls::Tls>>,
    broker: Arc<Broker>,
    node: Arc<crate::amqp::node::Node>,
    mut stop: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    // Handshakes in progress hold a permit: a flood of them waits in the
    // listen backlog instead of growing memory here.
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_TLS_HANDSHAKES));
    loop {
        let permit = match &tls {
            Some(_) => tokio::select! {
                p = Arc::clone(&handshakes).acquire_owned() => match p {
                    Ok(p) => Some(p),
                    Err(_) => break,
                },
                _ = stop.changed() => break,
            },
            None => None,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let broker = Arc::clone(&broker);
                    let node = Arc::clone(&node);
                    let stop = stop.clone();
                    let alive = alive.clone();
                    let tls = tls.clone();
                    tokio::spawn(async move {
                        let transport = match tls {
                            None => Transport::Plain(socket),
                            Some(tls) => match tls_handshake(&tls, socket, peer).await {
                                Some(t) => Transport::Tls(Box::new(t)),
                                None => return,
                            },
                        };
                        drop(permit);
                        connection::serve(transport, peer, None, broker, node, stop).await;
                        drop(alive);
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off, go on.
                    warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = stop.changed() => break,
        }
    }
}

/// Accepts on a stream protocol listener; with `tls`, each connection's
/// TLS handshake runs on its own task, as on the AMQPS listener.
async fn stream_accept_loop(
    listener: TcpListener,
    tls: Option<Arc<crate::tls::Tls>>,
    broker: Arc<Broker>,
    groups: Arc<crate::stream_protocol::Groups>,
    mut stop: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_TLS_HANDSHAKES));
    loop {
        let permit = match &tls {
            Some(_) => tokio::select! {
                p = Arc::clone(&handshakes).acquire_owned() => match p {
                    Ok(p) => Some(p),
                    Err(_) => break,
                },
                _ = stop.changed() => break,
            },
            None => None,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let _ = socket.set_nodelay(true);
                    let Ok(local) = socket.local_addr() else { continue };
                    let (broker, stop, alive) = (Arc::clone(&broker), stop.clone(), alive.clone());
                    let (tls, groups) = (tls.clone(), Arc::clone(&groups));
                    tokio::spawn(async move {
                        use crate::stream_protocol::{serve, serve_tls};
                        match tls {
                            None => serve(socket, peer, local, broker, groups, stop).await,
                            Some(tls) => {
                                let Some(t) = tls_handshake(&tls, socket, peer).await else {
                                    return;
                                };
                                drop(permit);
                                serve_tls(t, peer, local, broker, groups, stop).await;
                            }
                        }
                        drop(alive);
                    });
                }
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = stop.changed() => break,
        }
    }
}

/// TLS handshakes in progress at most on the AMQPS listener.
const MAX_TLS_HANDSHAKES: usize = 1024;

/// The TLS handshake of a connection to the AMQPS port; None (logged) if
/// it failed or took longer than allowed. A client speaking plain AMQP
/// here fails at its first bytes.
async fn tls_handshake(
    tls: &crate::tls::Tls,
    socket: tokio::net::TcpStream,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let _ = socket.set_nodelay(true);
    match tokio::time::timeout(tls.handshake_timeout(), tls.acceptor().accept(socket)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            warn!(%peer, "TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            warn!(%peer, "TLS handshake timed out");
            None
        }
    }
}
