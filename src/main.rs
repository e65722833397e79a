//! The `warren` binary: configuration, logging, the server (a single node
//! or a cluster member), a clean stop on SIGINT / SIGTERM, and SIGHUP to
//! reload the TLS certificate files; or `warren cluster ...` (admin.rs).

use clap::Parser;
use tracing_subscriber::EnvFilter;
use warren::config::{Cli, Command};
use warren::server::ClusterNode;
use warren::Server;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let mut cli = Cli::parse();
    if let Some(Command::Cluster(cmd)) = cli.command.take() {
        match warren::admin::run(cmd) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("warren: {e}");
                std::process::exit(1);
            }
        }
    }
    let config = match cli.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("warren: {e}");
            std::process::exit(2);
        }
    };
    // Before anything starts: a cluster member serves its static shovels
    // only once it leads.
    if let Err(e) = warren::shovel::check_static(&config) {
        eprintln!("warren: {e}");
        std::process::exit(2);
    }
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
    // Fail points named in FAILPOINTS (tests only: the `failpoints`
    // feature), for as long as the process runs.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let code = runtime.block_on(async move {
        let run = tokio::spawn(async move {
            // From the start, so that no signal is missed while the
            // server starts, stops or reopens its store.
            let mut signals = listen_for_signals();
            if config.cluster.enabled() {
                let node = match ClusterNode::start(config).await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!("{e}");
                        return 1;
                    }
                };
                // A node whose log or state machine failed stops (an
                // entry that cannot be applied is never skipped).
                let failed = tokio::select! {
                    _ = until_stopped(&mut signals, || node.reload_tls()) => None,
                    e = node.failed() => Some(e),
                };
                if let Some(e) = &failed {
                    tracing::error!("stopping: this node cannot go on: {e}");
                }
                tracing::info!("shutting down");
                node.shutdown().await;
                return if failed.is_some() { 70 } else { 0 };
            }
            let mut server = match Server::start(config).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("{e}");
                    return 1;
                }
            };
            // A store that failed a commit is opened again from disk
            // (server/reopen.rs); a signal stops the node.
            loop {
                let failed = tokio::select! {
                    _ = until_stopped(&mut signals, || server.reload_tls()) => false,
                    _ = server.store_failed() => true,
                };
                let config = server.bound_config();
                tracing::info!("shutting down");
                server.shutdown().await;
                if !failed {
                    return 0;
                }
                let stop = until_stopped(&mut signals, || Ok(()));
                match warren::server::restart(&config, stop).await {
                    Ok(Some(s)) => server = s,
                    Ok(None) => return 0,
                    Err(e) => {
                        tracing::error!("stopping: {e}");
                        return 70;
                    }
                }
            }
        });
        run.await.unwrap_or(1)
    });
    std::process::exit(code);
}

/// What a signal asks for.
enum Signal {
    /// SIGINT, SIGTERM: stop.
    Stop,
    /// SIGHUP: read the TLS certificate files again.
    Reload,
}

/// Listens for signals for the life of the process.
fn listen_for_signals() -> tokio::sync::mpsc::UnboundedReceiver<Signal> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            if let (Ok(mut term), Ok(mut hup)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::hangup()),
            ) {
                loop {
                    let s = tokio::select! {
                        _ = tokio::signal::ctrl_c() => Signal::Stop,
                        _ = term.recv() => Signal::Stop,
                        _ = hup.recv() => Signal::Reload,
                    };
                    if tx.send(s).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tokio::signal::ctrl_c().await;
        let _ = tx.send(Signal::Stop);
    });
    rx
}

/// Returns at a stop signal; reloads TLS at each SIGHUP meanwhile.
async fn until_stopped(
    signals: &mut tokio::sync::mpsc::UnboundedReceiver<Signal>,
    reload_tls: impl Fn() -> Result<(), String>,
) {
    while let Some(Signal::Reload) = signals.recv().await {
        match reload_tls() {
            Ok(()) => tracing::info!("SIGHUP: TLS certificate files reloaded"),
            Err(e) => tracing::warn!("SIGHUP: TLS not reloaded, the old files stay in force: {e}"),
        }
    }
}
