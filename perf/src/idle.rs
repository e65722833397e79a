//! Idle-connection mode: many connections, each with a consumer on its own queue, doing nothing.

use std::sync::Arc;
use std::time::Duration;

use amqprs::channel::{BasicConsumeArguments, Channel, ConsumerMessage};
use amqprs::connection::Connection;
use anyhow::Result;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use crate::conn::{self, with_timeout, AmqpUri};
use crate::stats::{cpu_time_us, Shared};
use crate::topology::{ExchangeKind, Topology};

#[derive(Debug, Clone)]
pub struct IdleConfig {
    pub uri: AmqpUri,
    pub connections: usize,
    /// Queues without consumers, declared before the connections open.
    pub extra_queues: usize,
    pub hold: f64,
    pub queue: String,
    pub durable: bool,
    pub keep: bool,
    pub connect_timeout: f64,
}

#[derive(Debug, Clone)]
pub struct IdleResult {
    pub connections: usize,
    /// Seconds it took to open every connection, declare its queue and start its consumer.
    pub open_secs: f64,
    pub hold_secs: f64,
    /// CPU this process used while opening and holding the connections.
    pub cpu_us: u64,
    pub errors: Vec<String>,
}

struct Idle {
    conn: Connection,
    // Dropping a channel closes it, so it lives as long as the connection.
    _ch: Channel,
    _rx: UnboundedReceiver<ConsumerMessage>,
}

pub async fn run(cfg: IdleConfig) -> Result<IdleResult> {
    let shared = Arc::new(Shared::new(0));
    let setup = conn::connect(
        &cfg.uri,
        "warren-perf setup",
        &shared,
        Duration::from_secs_f64(cfg.connect_timeout),
    )
    .await?;
    let setup_ch = conn::channel(&setup, "warren-perf setup", &shared, None).await?;
    let topo = Topology::new(
        None,
        ExchangeKind::Direct,
        &format!("{}-idle", cfg.queue),
        cfg.connections.max(2),
        cfg.durable,
    );
    let topo = Topology {
        queues: topo.queues[..cfg.connections].to_vec(),
        ..topo
    };
    let extra = Topology::new(
        None,
        ExchangeKind::Direct,
        &format!("{}-idle-extra", cfg.queue),
        cfg.extra_queues.max(2),
        cfg.durable,
    );
    let extra = Topology {
        queues: extra.queues[..cfg.extra_queues].to_vec(),
        ..extra
    };
    if !extra.queues.is_empty() {
        extra.declare(&setup_ch).await?;
        eprintln!(
            "warren-perf: {} queues without consumers declared",
            extra.queues.len()
        );
    }
    let cpu0 = cpu_time_us();
    let start = Instant::now();
    let opened = open_all(&cfg, &topo, &shared).await;
    let open_secs = start.elapsed().as_secs_f64();
    let mut result = match opened {
        Ok(idle) => {
            eprintln!(
                "warren-perf: holding {} idle connections for {} s (opened in {open_secs:.1} s)",
                idle.len(),
                cfg.hold
            );
            let held = Instant::now();
            tokio::time::sleep(Duration::from_secs_f64(cfg.hold)).await;
            let hold_secs = held.elapsed().as_secs_f64();
            let cpu_us = cpu_time_us().saturating_sub(cpu0);
            shared
                .stop
                .store(true, std::sync::atomic::Ordering::Relaxed);
            eprintln!("warren-perf: closing the idle connections");
            for c in idle {
                conn::close_quietly(c.conn).await;
            }
            Ok(IdleResult {
                connections: cfg.connections,
                open_secs,
                hold_secs,
                cpu_us,
                errors: Vec::new(),
            })
        }
        Err(e) => Err(e),
    };
    shared
        .stop
        .store(true, std::sync::atomic::Ordering::Relaxed);
    if !cfg.keep {
        for t in [&topo, &extra] {
            if let Err(e) = t.delete(&setup_ch).await {
                eprintln!("warren-perf: cleanup failed: {e:#}");
            }
        }
    }
    conn::close_quietly(setup).await;
    if let Ok(r) = &mut result {
        r.errors = shared.errors();
    }
    result
}

async fn open_all(cfg: &IdleConfig, topo: &Topology, shared: &Arc<Shared>) -> Result<Vec<Idle>> {
    let mut idle = Vec::with_capacity(cfg.connections);
    for (i, q) in topo.queues.iter().enumerate() {
        let name = format!("warren-perf idle {i}");
        let conn = conn::connect(&cfg.uri, &name, shared, Duration::ZERO).await?;
        let ch = conn::channel(&conn, &name, shared, None).await?;
        let one = Topology::new(None, ExchangeKind::Direct, q, 1, topo.durable);
        one.declare(&ch).await?;
        let args = BasicConsumeArguments::new(q, "").manual_ack(false).finish();
        let (_tag, rx) = with_timeout(ch.basic_consume_rx(args), || {
            format!("{name}: basic.consume")
        })
        .await?;
        idle.push(Idle {
            conn,
            _ch: ch,
            _rx: rx,
        });
        if (i + 1) % 250 == 0 {
            eprintln!("warren-perf: {} idle connections open", i + 1);
        }
    }
    Ok(idle)
}
