//! The `warren` binary: configuration, logging, the server, a clean stop
//! on SIGINT / SIGTERM, and SIGHUP to reload the TLS certificate files.

use clap::Parser;
use tracing_subscriber::EnvFilter;
use warren::config::Cli;
use warren::server::ClusterNode;
use warren::Server;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let config = match Cli::parse().into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("warren: {e}");
            std::process::exit(2);
        }
    };
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.log_level));
    // Colours only on a terminal: a log file gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("warren: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async move {
        let run = tokio::spawn(async move {
            if config.cluster.enabled() {
                let node = match ClusterNode::start(config).await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!("{e}");
                        return 1;
                    }
                };
                wait_for_stop().await;
                tracing::info!("shutting down");
                node.shutdown().await;
                return 0;
            }
            let server = match Server::start(config).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("{e}");
                    return 1;
                }
            };
            wait_for_signal(&server).await;
            tracing::info!("shutting down");
            server.shutdown().await;
            0
        });
        run.await.unwrap_or(1)
    });
    std::process::exit(code);
}

/// Waits for SIGINT or SIGTERM (a cluster node).
async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// Waits for SIGINT or SIGTERM; a SIGHUP meanwhile reloads TLS.
async fn wait_for_signal(server: &Server) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return,
                _ = term.recv() => return,
                _ = hup.recv() => match server.reload_tls() {
                    Ok(()) => tracing::info!("SIGHUP: TLS certificate files reloaded"),
                    Err(e) => tracing::warn!("SIGHUP: TLS not reloaded, the old files stay in force: {e}"),
                },
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = server;
        let _ = tokio::signal::ctrl_c().await;
    }
}
