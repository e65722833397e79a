//! The `warren` binary: configuration, logging, the server, and a clean stop
//! on SIGINT / SIGTERM.

use clap::Parser;
use tracing_subscriber::EnvFilter;
use warren::config::Cli;
use warren::Server;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Worker stack size. amq-protocol decodes nested field tables
/// recursively, and a peer may nest a table as deep as a frame allows
/// (about 18,000 levels in the default 128 KiB frame); RabbitMQ decodes
/// those, so Warren must too. The stack is virtual memory: only what is
/// touched is resident.
const WORKER_STACK: usize = 256 << 20;

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
        .thread_stack_size(WORKER_STACK)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("warren: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    // On a worker thread, not the main one: recovery decodes stored
    // messages, which needs the workers' large stack (see WORKER_STACK).
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
