//! The `warren` binary: configuration, logging, the server, and a clean stop
//! on SIGINT / SIGTERM.

use clap::Parser;
use tracing_subscriber::EnvFilter;
use warren::config::Cli;
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
    tracing_subscriber::fmt().with_env_filter(filter).init();
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
            let server = match Server::start(config).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("{e}");
                    return 1;
                }
            };
            wait_for_signal().await;
            tracing::info!("shutting down");
            server.shutdown().await;
            0
        });
        run.await.unwrap_or(1)
    });
    std::process::exit(code);
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
