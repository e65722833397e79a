//! warren-perf: a PerfTest-style AMQP 0-9-1 load generator for comparing Warren with RabbitMQ.
//!
//! The whole client runs on one thread (a current-thread tokio runtime) so that it takes at most
//! one core from the broker under test; it reports its own CPU use so a reader can tell when the
//! client, not the broker, is the bottleneck.

mod conn;
mod consumer;
mod idle;
mod payload;
mod producer;
mod range;
mod report;
mod run;
mod stats;
mod stuck;
mod topology;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;

use crate::conn::AmqpUri;
use crate::idle::IdleConfig;
use crate::range::MsRange;
use crate::run::RunConfig;
use crate::topology::{parse_queue_arg, ExchangeKind, Topology};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "warren-perf",
    version,
    about = "PerfTest-style AMQP 0-9-1 load generator (one-thread client; reports its own CPU use)"
)]
struct Args {
    /// Broker URI.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    uri: String,
    /// Number of producers (each has its own connection).
    #[arg(short = 'x', long, default_value_t = 1)]
    producers: usize,
    /// Number of consumers (each has its own connection); default 1, or one per queue with --fanout.
    #[arg(short = 'y', long)]
    consumers: Option<usize>,
    /// Message body size in bytes (at least 16: the body carries a timestamp).
    #[arg(short = 's', long, default_value_t = 16)]
    size: usize,
    /// Run time in seconds; 0 = until --pmessages / --cmessages / --drain are done.
    #[arg(short = 'z', long, default_value_t = 10.0)]
    time: f64,
    /// Publish persistent messages (delivery mode 2).
    #[arg(short = 'f', long)]
    persistent: bool,
    /// Publisher confirms with at most N unconfirmed messages per producer; 0 = off.
    #[arg(short = 'c', long, default_value_t = 0)]
    confirm: usize,
    /// Consume with auto-ack (default: manual acks).
    #[arg(short = 'a', long)]
    autoack: bool,
    /// With manual acks, ack every N deliveries at once (multiple=true); 1 = ack each.
    #[arg(short = 'A', long, default_value_t = 1)]
    multi_ack: u64,
    /// Consumer prefetch (basic.qos); 0 = unlimited.
    #[arg(short = 'q', long, default_value_t = 0)]
    qos: u16,
    /// Queue name, or the prefix of NAME-0..NAME-{N-1} with --queues N / --fanout N.
    #[arg(short = 'u', long, default_value = "warren-perf")]
    queue: String,
    /// Spread producers and consumers round-robin over N queues.
    #[arg(long, default_value_t = 1)]
    queues: usize,
    /// Exchange to publish to (default: the default exchange for direct, warren-perf.TYPE otherwise).
    #[arg(short = 'e', long)]
    exchange: Option<String>,
    /// Exchange type.
    #[arg(short = 't', long, value_enum, default_value = "direct")]
    exchange_type: ExchangeKind,
    /// Random x-delay per message, MIN[-MAX] ms, uniform (needs -t x-delayed-message); the
    /// consumer reports lateness = receive time - (publish time + delay).
    #[arg(long, value_name = "MIN[-MAX]")]
    delay: Option<MsRange>,
    /// Random per-message TTL (expiration property), MIN[-MAX] ms, uniform.
    #[arg(long, value_name = "MIN[-MAX]")]
    ttl: Option<MsRange>,
    /// Declare the queues with this argument (repeatable); a whole number is sent as an integer,
    /// anything else as a string, e.g. x-dead-letter-exchange= x-message-ttl=60000.
    #[arg(long = "queue-arg", value_name = "KEY=VALUE", value_parser = parse_queue_arg)]
    queue_args: Vec<(String, amqprs::FieldValue)>,
    /// Consume with this argument (repeatable; read as --queue-arg is), e.g.
    /// x-stream-offset=first for a stream's consumers.
    #[arg(long = "consumer-arg", value_name = "KEY=VALUE", value_parser = parse_queue_arg)]
    consumer_args: Vec<(String, amqprs::FieldValue)>,
    /// N queues bound to one fanout exchange (implies --exchange-type fanout --queues N).
    #[arg(long)]
    fanout: Option<usize>,
    /// Publish rate per producer in msg/s; 0 = unlimited.
    #[arg(short = 'r', long, default_value_t = 0.0)]
    rate: f64,
    /// Each producer publishes exactly N messages (and waits for their confirms) then stops.
    #[arg(short = 'C', long, default_value_t = 0)]
    pmessages: u64,
    /// Stop consuming after N messages in total across all consumers.
    #[arg(short = 'D', long, default_value_t = 0)]
    cmessages: u64,
    /// Consume what is already queued (the queues' message count when declared), then stop.
    #[arg(long)]
    drain: bool,
    /// Only produce: same as --consumers 0.
    #[arg(long, conflicts_with = "consumer_only")]
    producer_only: bool,
    /// Only consume: same as --producers 0.
    #[arg(long)]
    consumer_only: bool,
    /// Declare durable queues (and exchange).
    #[arg(long)]
    durable_queues: bool,
    /// Keep the queues and exchange at the end (default: delete them).
    #[arg(long)]
    keep: bool,
    /// Print one JSON object with the results instead of the summary.
    #[arg(long)]
    json: bool,
    /// Seconds between progress lines on stderr; 0 = none.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Note the time every N published messages (rates per interval, e.g. per million).
    #[arg(long, default_value_t = 0)]
    progress_every: u64,
    /// Before the run: N consumers on the first queue with prefetch 1 that take one message each
    /// and never ack (what many consumers without credit cost a publish).
    #[arg(long, default_value_t = 0)]
    stuck_consumers: usize,
    /// Instead of a load run: open N idle connections, each consuming from its own queue.
    #[arg(long)]
    idle_connections: Option<usize>,
    /// With --idle-connections: also declare N queues without consumers first (perf/scale.sh).
    #[arg(long, default_value_t = 0)]
    idle_queues: usize,
    /// With --idle-connections: seconds to hold them open.
    #[arg(long, default_value_t = 30.0)]
    hold: f64,
    /// PEM CA file that an amqps:// broker's certificate must chain to.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// Only check that the broker accepts a connection (retrying for --connect-timeout).
    #[arg(long)]
    check: bool,
    /// Seconds to keep retrying the first connection while the broker boots.
    #[arg(long, default_value_t = 10.0)]
    connect_timeout: f64,
}

enum Mode {
    Load(Box<RunConfig>),
    Idle(IdleConfig),
    Check(AmqpUri, f64),
}

fn resolve(a: Args) -> Result<Mode> {
    let mut uri = AmqpUri::parse(&a.uri)?;
    uri.tls_ca = a.tls_ca.clone();
    if a.check {
        return Ok(Mode::Check(uri, a.connect_timeout));
    }
    if let Some(n) = a.idle_connections {
        if n == 0 {
            bail!("--idle-connections must be at least 1");
        }
        return Ok(Mode::Idle(IdleConfig {
            uri,
            connections: n,
            extra_queues: a.idle_queues,
            hold: a.hold,
            queue: a.queue,
            durable: a.durable_queues,
            keep: a.keep,
            connect_timeout: a.connect_timeout,
        }));
    }
    let (kind, queues) = match a.fanout {
        Some(0) => bail!("--fanout must be at least 1"),
        Some(n) => (ExchangeKind::Fanout, n),
        None => (a.exchange_type, a.queues.max(1)),
    };
    let producers = if a.consumer_only { 0 } else { a.producers };
    let consumers = if a.producer_only {
        0
    } else {
        a.consumers
            .unwrap_or(if a.fanout.is_some() { queues } else { 1 })
    };
    if a.rate < 0.0 || a.time < 0.0 || a.interval < 0.0 {
        bail!("--rate, --time and --interval must not be negative");
    }
    if let Some(d) = a.delay {
        if kind != ExchangeKind::XDelayedMessage {
            bail!("--delay needs --exchange-type x-delayed-message");
        }
        if d.max > u64::from(u32::MAX) {
            bail!(
                "--delay is at most {} ms (x-delay is a 32-bit value)",
                u32::MAX
            );
        }
    }
    Ok(Mode::Load(Box::new(RunConfig {
        uri,
        producers,
        consumers,
        size: a.size,
        time: a.time,
        persistent: a.persistent,
        confirm: a.confirm,
        autoack: a.autoack,
        multi_ack: a.multi_ack,
        qos: a.qos,
        consumer_args: a.consumer_args.clone(),
        topology: Topology::new(
            a.exchange.as_deref(),
            kind,
            &a.queue,
            queues,
            a.durable_queues,
        )
        .with_queue_args(&a.queue_args)?,
        rate: a.rate,
        pmessages: a.pmessages,
        cmessages: a.cmessages,
        drain: a.drain,
        keep: a.keep,
        interval: a.interval,
        progress_every: a.progress_every,
        connect_timeout: a.connect_timeout,
        delay: a.delay,
        ttl: a.ttl,
        stuck_consumers: a.stuck_consumers,
    })))
}

/// Lets one process hold many sockets (--idle-connections): soft RLIMIT_NOFILE up to the hard one.
fn raise_fd_limit() {
    // SAFETY: plain get/setrlimit on a local, fully initialised struct.
    unsafe {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
    }
}

async fn check(uri: AmqpUri, timeout: f64) -> Result<()> {
    let shared = std::sync::Arc::new(stats::Shared::new(0));
    let c = conn::connect(
        &uri,
        "warren-perf check",
        &shared,
        Duration::from_secs_f64(timeout),
    )
    .await?;
    let ch = conn::channel(&c, "warren-perf check", &shared, None).await?;
    shared
        .stop
        .store(true, std::sync::atomic::Ordering::Relaxed);
    drop(ch);
    conn::close_quietly(c).await;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let json = args.json;
    raise_fd_limit();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warren-perf: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = rt.block_on(async move {
        match resolve(args)? {
            Mode::Check(uri, t) => check(uri, t).await.map(|()| {
                (
                    serde_json::json!({"mode": "check", "ok": true}),
                    "ok\n".to_string(),
                )
            }),
            Mode::Idle(cfg) => idle::run(cfg).await.map(|r| (r.to_json(), r.to_text())),
            Mode::Load(cfg) => run::run(*cfg).await.map(|r| (r.to_json(), r.to_text())),
        }
    });
    match outcome {
        Ok((j, text)) => {
            let failed = j["errors"].as_array().is_some_and(|e| !e.is_empty());
            if json {
                println!("{j}");
            } else {
                print!("{text}");
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("warren-perf: error: {e:#}");
            if json {
                println!("{}", serde_json::json!({"error": format!("{e:#}")}));
            }
            ExitCode::FAILURE
        }
    }
}
