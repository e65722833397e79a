//! One load run: declare the topology, connect everyone, measure, clean up.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::conn::{self, AmqpUri};
use crate::consumer::{Consumer, ConsumerConfig, ConsumerOutcome};
use crate::producer::{Producer, ProducerConfig, ProducerOutcome};
use crate::range::MsRange;
use crate::stats::{cpu_time_us, Histogram, Shared};
use crate::topology::{ExchangeKind, Topology};

/// Everything a load run needs, resolved from the command line.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub uri: AmqpUri,
    pub producers: usize,
    pub consumers: usize,
    pub size: usize,
    /// Seconds; 0 = no limit (the run ends on --pmessages / --cmessages / --drain).
    pub time: f64,
    pub persistent: bool,
    pub confirm: usize,
    pub autoack: bool,
    pub multi_ack: u64,
    pub qos: u16,
    /// basic.consume arguments (--consumer-arg).
    pub consumer_args: Vec<(String, amqprs::FieldValue)>,
    pub topology: Topology,
    pub rate: f64,
    pub pmessages: u64,
    pub cmessages: u64,
    pub drain: bool,
    pub keep: bool,
    pub interval: f64,
    pub progress_every: u64,
    pub connect_timeout: f64,
    /// Random x-delay per message (needs the x-delayed-message exchange type).
    pub delay: Option<MsRange>,
    /// Random per-message TTL (expiration).
    pub ttl: Option<MsRange>,
    /// Consumers without credit held on the first queue during the run.
    pub stuck_consumers: usize,
}

/// What a load run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub producers: usize,
    pub consumers: usize,
    pub queues: usize,
    pub size: usize,
    pub kind: ExchangeKind,
    pub persistent: bool,
    pub confirm: usize,
    pub autoack: bool,
    pub rate_limit: f64,
    pub queued_at_start: u64,
    pub published: u64,
    pub confirmed: u64,
    pub nacked: u64,
    pub consumed: u64,
    /// Seconds from the start to the last producer's end.
    pub publish_secs: f64,
    /// Seconds from the start to the consumers' end (time up, or the consume target reached).
    pub consume_secs: f64,
    /// Seconds from the start until every producer and consumer had finished.
    pub wall_secs: f64,
    pub latency: Histogram,
    /// Receive time - (publish time + x-delay), for messages published with a delay.
    pub lateness: Histogram,
    /// Delayed messages delivered before their delay had passed, and the most early (ns).
    pub early: u64,
    pub early_max_ns: u64,
    pub delay: Option<MsRange>,
    pub ttl: Option<MsRange>,
    /// CPU time (user + system) this process used during the measurement.
    pub cpu_us: u64,
    /// (published so far, seconds since start) every --progress-every messages.
    pub progress: Vec<(u64, f64)>,
    pub blocked: u64,
    pub errors: Vec<String>,
}

/// Awaits a task, giving up (and aborting it) at `limit`.
async fn join<T>(h: JoinHandle<T>, limit: Option<Instant>) -> Option<T> {
    let abort = h.abort_handle();
    let res = match limit {
        Some(l) => match tokio::time::timeout_at(l, h).await {
            Ok(r) => r.ok(),
            Err(_) => {
                abort.abort();
                None
            }
        },
        None => h.await.ok(),
    };
    res
}

/// Progress lines; `what` names the per-interval figure (latency, or lateness with --delay).
fn report_progress(
    shared: Arc<Shared>,
    every: f64,
    start: Instant,
    what: &'static str,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(
            start + Duration::from_secs_f64(every),
            Duration::from_secs_f64(every),
        );
        let (mut p0, mut c0, mut k0) = (0u64, 0u64, 0u64);
        loop {
            tick.tick().await;
            if shared.stopping() {
                break;
            }
            let p = shared.published.load(Ordering::Relaxed);
            let c = shared.confirmed.load(Ordering::Relaxed);
            let k = shared.consumed.load(Ordering::Relaxed);
            let w = shared.take_window();
            let timing = if w.count() > 0 {
                format!(
                    "  {what} p50 {:.1} p99 {:.1} max {:.1} ms",
                    w.quantile(0.5) as f64 / 1e6,
                    w.quantile(0.99) as f64 / 1e6,
                    w.max() as f64 / 1e6
                )
            } else {
                String::new()
            };
            eprintln!(
                "warren-perf: {:6.1} s  published {:8.0} msg/s  confirmed {:8.0} msg/s  consumed {:8.0} msg/s{timing}",
                start.elapsed().as_secs_f64(),
                (p - p0) as f64 / every,
                (c - c0) as f64 / every,
                (k - k0) as f64 / every
            );
            (p0, c0, k0) = (p, c, k);
        }
    })
}

pub async fn run(cfg: RunConfig) -> Result<RunResult> {
    if cfg.time <= 0.0 {
        if cfg.producers > 0 && cfg.pmessages == 0 {
            bail!("--time 0 (no limit) needs --pmessages for the producers");
        }
        if cfg.consumers > 0 && cfg.cmessages == 0 && !cfg.drain {
            bail!("--time 0 (no limit) needs --cmessages or --drain for the consumers");
        }
    }
    let shared = Arc::new(Shared::new(cfg.progress_every));
    let setup = conn::connect(
        &cfg.uri,
        "warren-perf setup",
        &shared,
        Duration::from_secs_f64(cfg.connect_timeout),
    )
    .await?;
    let setup_ch = conn::channel(&setup, "warren-perf setup", &shared, None).await?;
    let queued_at_start = cfg.topology.declare(&setup_ch).await?;
    let target = if cfg.drain {
        if queued_at_start == 0 {
            eprintln!("warren-perf: --drain: the queues are empty, nothing to consume");
            shared.stop.store(true, Ordering::Relaxed);
        }
        queued_at_start
    } else {
        cfg.cmessages
    };
    shared.consume_target.store(target, Ordering::Relaxed);
    let stuck = match cfg.stuck_consumers {
        0 => None,
        n => Some(
            crate::stuck::Stuck::start(&cfg.uri, cfg.topology.consumer_queue(0), n, &shared)
                .await?,
        ),
    };
    let mut result = measure(&cfg, &shared, queued_at_start).await;
    if let Some(s) = stuck {
        s.close().await;
    }
    shared.stop.store(true, Ordering::Relaxed);
    if !cfg.keep {
        let deleted = cfg.topology.delete(&setup_ch).await;
        if let Err(e) = deleted {
            eprintln!("warren-perf: cleanup failed: {e:#}");
        }
    }
    conn::close_quietly(setup).await;
    if let Ok(r) = &mut result {
        r.errors = shared.errors();
    }
    result
}

async fn measure(cfg: &RunConfig, shared: &Arc<Shared>, queued_at_start: u64) -> Result<RunResult> {
    let mut consumers = Vec::with_capacity(cfg.consumers);
    for id in 0..cfg.consumers {
        let c = ConsumerConfig {
            id,
            queue: cfg.topology.consumer_queue(id).to_string(),
            autoack: cfg.autoack,
            multi_ack: cfg.multi_ack,
            qos: cfg.qos,
            args: cfg.consumer_args.clone(),
        };
        consumers.push(Consumer::connect(&cfg.uri, c, shared.clone()).await?);
    }
    let mut producers = Vec::with_capacity(cfg.producers);
    for id in 0..cfg.producers {
        let p = ProducerConfig {
            id,
            exchange: cfg.topology.exchange.clone(),
            routing_key: cfg.topology.publish_key(id),
            size: cfg.size,
            persistent: cfg.persistent,
            confirm: cfg.confirm,
            rate: cfg.rate,
            pmessages: cfg.pmessages,
            delay: cfg.delay,
            ttl: cfg.ttl,
        };
        producers.push(Producer::connect(&cfg.uri, p, shared.clone()).await?);
    }

    let cpu0 = cpu_time_us();
    let start = Instant::now();
    shared.set_start(start.into_std());
    let deadline = (cfg.time > 0.0).then(|| start + Duration::from_secs_f64(cfg.time));
    // Tasks stuck past the deadline (e.g. a publish blocked by broker flow control) are aborted.
    let limit = deadline.map(|d| d + Duration::from_secs(10));
    let what = if cfg.delay.is_some() {
        "lateness"
    } else {
        "latency"
    };
    let progress =
        (cfg.interval > 0.0).then(|| report_progress(shared.clone(), cfg.interval, start, what));

    let consumer_tasks: Vec<JoinHandle<(Consumer, Result<ConsumerOutcome>)>> = consumers
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let r = c.run(deadline).await;
                (c, r)
            })
        })
        .collect();
    let producer_tasks: Vec<JoinHandle<(Producer, Result<ProducerOutcome>)>> = producers
        .into_iter()
        .map(|mut p| {
            tokio::spawn(async move {
                let r = p.run(start, deadline).await;
                (p, r)
            })
        })
        .collect();

    let mut first_error: Option<anyhow::Error> = None;
    let mut publish_end = start;
    let mut open_producers = Vec::new();
    for h in producer_tasks {
        match join(h, limit).await {
            Some((p, r)) => {
                match r {
                    Ok(o) => publish_end = publish_end.max(o.finished_at),
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
                open_producers.push(p);
            }
            None => publish_end = publish_end.max(deadline.unwrap_or(start)),
        }
    }
    if cfg.consumers == 0 {
        shared.stop.store(true, Ordering::Relaxed);
    }
    let mut latency = Histogram::default();
    let mut lateness = Histogram::default();
    let (mut early, mut early_max_ns) = (0u64, 0u64);
    let mut target_reached: Option<Instant> = None;
    let mut open_consumers = Vec::new();
    for h in consumer_tasks {
        if let Some((c, r)) = join(h, limit).await {
            match r {
                Ok(o) => {
                    latency.merge(&o.latency);
                    lateness.merge(&o.lateness);
                    early += o.early;
                    early_max_ns = early_max_ns.max(o.early_max_ns);
                    if let Some(t) = o.target_reached_at {
                        target_reached = Some(target_reached.map_or(t, |x: Instant| x.min(t)));
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            open_consumers.push(c);
        }
    }
    let end = Instant::now();
    let cpu_us = cpu_time_us().saturating_sub(cpu0);
    shared.stop.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        p.abort();
    }
    let consume_end = match (target_reached, deadline) {
        (Some(t), _) => t,
        (None, Some(d)) => d.min(end),
        (None, None) => end,
    };
    for p in open_producers {
        p.close().await;
    }
    for c in open_consumers {
        c.close().await;
    }
    if let Some(e) = first_error {
        return Err(e).context("the run failed");
    }
    let secs = |t: Instant| t.saturating_duration_since(start).as_secs_f64();
    Ok(RunResult {
        producers: cfg.producers,
        consumers: cfg.consumers,
        queues: cfg.topology.queues.len(),
        size: cfg.size.max(crate::payload::MIN_SIZE),
        kind: cfg.topology.kind,
        persistent: cfg.persistent,
        confirm: cfg.confirm,
        autoack: cfg.autoack,
        rate_limit: cfg.rate,
        queued_at_start,
        published: shared.published.load(Ordering::Relaxed),
        confirmed: shared.confirmed.load(Ordering::Relaxed),
        nacked: shared.nacked.load(Ordering::Relaxed),
        consumed: shared.consumed.load(Ordering::Relaxed),
        publish_secs: secs(publish_end),
        consume_secs: secs(consume_end),
        wall_secs: secs(end),
        latency,
        lateness,
        early,
        early_max_ns,
        delay: cfg.delay,
        ttl: cfg.ttl,
        cpu_us,
        progress: shared
            .progress
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default(),
        blocked: shared.blocked.load(Ordering::Relaxed),
        errors: Vec::new(),
    })
}
