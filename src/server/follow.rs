//! A follower's listeners: the ports clients know this node by carry each
//! client to the leader (cluster/proxy.rs), so any node's address serves.
//! AMQP, the stream protocol and the management API go as they came;
//! AMQPS, the stream protocol's TLS port and HTTPS end their TLS here (this node's certificate, its client-certificate rules) and the
//! header says the client spoke TLS, with the client certificate verified
//! here for an EXTERNAL login. Prometheus is answered here, for this node:
//! its Raft series (the leader serves the broker's). An AMQP client is
//! carried frame by frame (follow_reads), so that its stream consumers
//! read this node's copy.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::follow_reads::{self, Reads};
use super::{bind, tls_handshake, ListenerTls};
use crate::cluster::{Cluster, ProxyHeader, Service, StreamEnd};
use crate::config::Config;
use crate::tls::Tls;

/// TLS handshakes in progress at most, per listener.
const MAX_HANDSHAKES: usize = 256;
/// How long closing waits for a listener's task before aborting it.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The listeners of a node while it follows.
pub struct Listeners {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    tls: Vec<Arc<Tls>>,
}

impl Listeners {
    /// Binds every configured listener; an error (a port still held by the
    /// broker that just stopped) binds none.
    pub async fn bind(
        config: &Config,
        cluster: &Arc<Cluster>,
        reads: Option<Arc<Reads>>,
    ) -> Result<Listeners, String> {
        let c = config;
        let tls = ListenerTls::load(c)?;
        let amqp = bind("AMQP", c.bind, c.port).await?;
        let amqps = match &tls.amqps {
            Some(_) => bind("AMQPS", c.bind, c.amqps_port()).await?,
            None => None,
        };
        let streams = bind("the stream protocol", c.bind, c.stream_port).await?;
        let streams_tls = match &tls.amqps {
            Some(_) => bind("the stream protocol over TLS", c.bind, c.stream_tls_port()).await?,
            None => None,
        };
        let http = bind("the management API", c.management_bind, c.management_port).await?;
        let https = match &tls.api {
            Some(_) => {
                let port = c.management_tls_port();
                bind("the HTTPS management API", c.management_bind, port).await?
            }
            None => None,
        };
        let metrics = bind("Prometheus", c.management_bind, c.prometheus_port).await?;
        let https_metrics = match &tls.metrics {
            Some(_) => {
                let port = c.prometheus_tls_port();
                bind("HTTPS Prometheus", c.management_bind, port).await?
            }
            None => None,
        };
        let addr_of = |l: &Option<TcpListener>| l.as_ref().and_then(|l| l.local_addr().ok());
        let end = StreamEnd::of(c, addr_of(&streams), addr_of(&streams_tls));
        cluster.set_stream_end(end);
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let carry = |l: TcpListener, service: Service, t: Option<Arc<Tls>>| {
            let (cluster, stop) = (Arc::clone(cluster), stop_rx.clone());
            let reads = reads.clone().filter(|_| service != Service::Http);
            tokio::spawn(carry(l, service, t, cluster, reads, stop))
        };
        if let Some(l) = amqp {
            tasks.push(carry(l, Service::Amqp, None));
        }
        if let (Some(l), Some(t)) = (amqps, &tls.amqps) {
            tasks.push(carry(l, Service::Amqp, Some(Arc::clone(t))));
        }
        if let Some(l) = streams {
            tasks.push(carry(l, Service::Stream, None));
        }
        if let (Some(l), Some(t)) = (streams_tls, &tls.amqps) {
            tasks.push(carry(l, Service::Stream, Some(Arc::clone(t))));
        }
        if let Some(l) = http {
            tasks.push(carry(l, Service::Http, None));
        }
        if let (Some(l), Some(t)) = (https, &tls.api) {
            tasks.push(carry(l, Service::Http, Some(Arc::clone(t))));
        }
        if let Some(l) = metrics {
            let s = stop_rx.clone();
            let limits = c.management.clone();
            let served = crate::http::prometheus::serve_follower(l, Arc::clone(cluster), limits, s);
            tasks.push(tokio::spawn(served));
        }
        if let (Some(l), Some(t)) = (https_metrics, &tls.metrics) {
            let l = crate::http::tls::TlsListener::new(l, Arc::clone(t), stop_rx.clone());
            let s = stop_rx.clone();
            let limits = c.management.clone();
            let served = crate::http::prometheus::serve_follower(l, Arc::clone(cluster), limits, s);
            tasks.push(tokio::spawn(served));
        }
        info!("following: client ports carry clients to the leader");
        Ok(Listeners {
            stop,
            tasks,
            tls: tls.all(),
        })
    }

    /// The TLS configurations in force (reloaded on SIGHUP).
    pub fn tls(&self) -> Vec<Arc<Tls>> {
        self.tls.clone()
    }

    /// Stops accepting and frees the ports (carried connections go on until
    /// the leader they reach stops serving them). A Prometheus client that
    /// holds its request open is cut off after a moment: a node elected
    /// leader must not wait on it.
    pub async fn close(self) {
        let _ = self.stop.send(true);
        for mut t in self.tasks {
            if tokio::time::timeout(CLOSE_WAIT, &mut t).await.is_err() {
                t.abort();
                let _ = t.await;
            }
        }
    }
}

/// Accepts on `listener` and carries each client to the leader, after a
/// TLS handshake here (bounded, on its own task) if `tls` is given.
async fn carry(
    listener: TcpListener,
    service: Service,
    tls: Option<Arc<Tls>>,
    cluster: Arc<Cluster>,
    reads: Option<Arc<Reads>>,
    mut stop: watch::Receiver<bool>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let permit = match &tls {
            Some(_) => tokio::select! {
                p = Arc::clone(&handshakes).acquire_owned() => match p {
                    Ok(p) => Some(p),
                    Err(_) => return,
                },
                _ = stop.changed() => return,
            },
            None => None,
        };
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = socket.set_nodelay(true);
        let cluster = Arc::clone(&cluster);
        let tls = tls.clone();
        let reads = reads.clone();
        tokio::spawn(async move {
            let via = cluster.id;
            let header = |tls: bool, certificate: Option<Vec<u8>>| ProxyHeader {
                client: peer,
                service,
                via,
                tls,
                certificate,
            };
            match (tls, reads) {
                (None, Some(reads)) => {
                    let header = header(false, None);
                    match service {
                        Service::Stream => {
                            follow_reads::carry_streams(cluster, socket, header, reads).await
                        }
                        _ => follow_reads::carry(cluster, socket, header, reads).await,
                    }
                }
                (None, None) => cluster.proxy(socket, header(false, None)).await,
                (Some(tls), reads) => {
                    let Some(stream) = tls_handshake(&tls, socket, peer).await else {
                        return;
                    };
                    drop(permit);
                    let certificate = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| c.to_vec());
                    let header = header(true, certificate);
                    match (reads, service) {
                        (Some(reads), Service::Stream) => {
                            follow_reads::carry_streams(cluster, stream, header, reads).await
                        }
                        (Some(reads), _) => {
                            follow_reads::carry(cluster, stream, header, reads).await
                        }
                        (None, _) => cluster.proxy(stream, header).await,
                    }
                }
            }
        });
    }
}
