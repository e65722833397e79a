//! The listener: accepts AMQP connections and serves each on its own task;
//! `Server::shutdown` stops accepting, closes every connection with 320
//! CONNECTION_FORCED, waits for them, and flushes the store.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::amqp::connection;
use crate::broker::Broker;
use crate::config::Config;

/// A running broker.
pub struct Server {
    /// Where AMQP listens (the real port when configured with port 0).
    pub addr: SocketAddr,
    /// The shared broker state.
    pub broker: Arc<Broker>,
    stop: watch::Sender<bool>,
    accept: JoinHandle<()>,
    connections_done: mpsc::Receiver<()>,
}

impl Server {
    /// Opens the store, recovers, binds the listener and starts accepting.
    pub async fn start(config: Config) -> Result<Server, String> {
        let bind = SocketAddr::new(config.bind, config.port);
        let broker = Broker::open(config)?;
        if let Some(path) = broker.config.load_definitions.clone() {
            let done = crate::definitions::load_file(&broker, &path).await?;
            info!(file = %path.display(), ?done, "definitions imported");
        }
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|e| format!("cannot listen on {bind}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        info!(%addr, "AMQP listener started");
        let (stop, stop_rx) = watch::channel(false);
        let (alive, connections_done) = mpsc::channel::<()>(1);
        let node = crate::amqp::node::Node::start();
        let accept = tokio::spawn(accept_loop(
            listener,
            Arc::clone(&broker),
            node,
            stop_rx,
            alive,
        ));
        Ok(Server {
            addr,
            broker,
            stop,
            accept,
            connections_done,
        })
    }

    /// Stops accepting, closes connections with 320, waits for them and
    /// flushes the store.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        let _ = self.accept.await;
        // Every connection task holds a sender; recv() ends when all are gone.
        let _ = self.connections_done.recv().await;
        if let Err(e) = self.broker.flush() {
            warn!("final store flush failed: {e}");
        }
        info!("broker stopped");
    }
}

async fn accept_loop(
    listener: TcpListener,
    broker: Arc<Broker>,
    node: Arc<crate::amqp::node::Node>,
    mut stop: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let broker = Arc::clone(&broker);
                    let node = Arc::clone(&node);
                    let stop = stop.clone();
                    let alive = alive.clone();
                    tokio::spawn(async move {
                        connection::serve(socket, peer, broker, node, stop).await;
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
