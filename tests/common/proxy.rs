//! A TCP proxy on 127.0.0.1 in front of another listener, whose
//! connections a test can cut at once, as a network fault would.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; it stops when dropped.
pub struct Proxy {
    pub port: u16,
    cut: watch::Sender<u64>,
    open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Forwards connections to a free port of 127.0.0.1 to `target`.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (cut, cuts) = watch::channel(0u64);
        let open = Arc::new(AtomicUsize::new(0));
        let live = Arc::clone(&open);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut cuts = cuts.clone();
                cuts.borrow_and_update();
                let live = Arc::clone(&live);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    live.fetch_add(1, Ordering::SeqCst);
                    let (mut client, mut server) = (client, server);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cuts.changed() => {}
                    }
                    live.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Proxy {
            port,
            cut,
            open,
            task,
        }
    }

    /// Closes every connection open through the proxy; how many there
    /// were.
    pub fn cut(&self) -> usize {
        let n = self.open.load(Ordering::SeqCst);
        self.cut.send_modify(|g| *g += 1);
        n
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
