//! A consumer: one connection, one channel, one basic.consume; counts, times and acks deliveries.

use std::sync::Arc;
use std::time::Duration;

use amqprs::channel::{
    BasicAckArguments, BasicConsumeArguments, BasicQosArguments, Channel, ConsumerMessage,
};
use amqprs::connection::Connection;
use anyhow::{bail, Context, Result};
use tokio::sync::mpsc::{error::TryRecvError, UnboundedReceiver};
use tokio::time::Instant;

use crate::conn::{self, with_timeout, AmqpUri};
use crate::payload;
use crate::stats::{Histogram, Shared};

/// What one consumer does.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub id: usize,
    pub queue: String,
    pub autoack: bool,
    /// Ack every this many deliveries with multiple=true (1 = ack each one alone).
    pub multi_ack: u64,
    /// basic.qos prefetch count; 0 = none.
    pub qos: u16,
    /// basic.consume arguments.
    pub args: Vec<(String, amqprs::FieldValue)>,
}

/// A consumer whose basic.consume has been accepted.
pub struct Consumer {
    cfg: ConsumerConfig,
    conn: Connection,
    ch: Channel,
    rx: UnboundedReceiver<ConsumerMessage>,
    shared: Arc<Shared>,
}

/// What a consumer saw.
pub struct ConsumerOutcome {
    /// Receive time - publish time.
    pub latency: Histogram,
    /// For delayed messages: receive time - (publish time + delay); early ones count as 0.
    pub lateness: Histogram,
    /// Delayed messages that arrived before their delay had passed, and the most early (ns).
    pub early: u64,
    pub early_max_ns: u64,
    /// When the run's consume target was reached (only set when there is a target).
    pub target_reached_at: Option<Instant>,
}

/// How often a consumer waiting for messages re-checks whether the consume target was reached.
const TARGET_POLL: Duration = Duration::from_millis(50);

impl Consumer {
    pub async fn connect(uri: &AmqpUri, cfg: ConsumerConfig, shared: Arc<Shared>) -> Result<Self> {
        let name = format!("warren-perf consumer {}", cfg.id);
        let conn = conn::connect(uri, &name, &shared, Duration::ZERO).await?;
        let ch = conn::channel(&conn, &name, &shared, None).await?;
        if cfg.qos > 0 {
            with_timeout(
                ch.basic_qos(BasicQosArguments::new(0, cfg.qos, false)),
                || format!("{name}: basic.qos"),
            )
            .await?;
        }
        let mut table = amqprs::FieldTable::new();
        for (k, v) in &cfg.args {
            let key = k
                .as_str()
                .try_into()
                .map_err(|_| anyhow::anyhow!("--consumer-arg key {k:?} is too long"))?;
            table.insert(key, v.clone());
        }
        let args = BasicConsumeArguments::new(&cfg.queue, "")
            .manual_ack(!cfg.autoack)
            .arguments(table)
            .finish();
        let (_tag, rx) = with_timeout(ch.basic_consume_rx(args), || {
            format!("{name}: basic.consume on {:?}", cfg.queue)
        })
        .await?;
        Ok(Consumer {
            cfg,
            conn,
            ch,
            rx,
            shared,
        })
    }

    async fn ack(&self, tag: u64, multiple: bool) -> Result<()> {
        self.ch
            .basic_ack(BasicAckArguments::new(tag, multiple))
            .await
            .with_context(|| format!("consumer {}: basic.ack", self.cfg.id))
    }

    /// Consumes until `deadline` (None = no time limit), the run's consume target, or a stop.
    pub async fn run(&mut self, deadline: Option<Instant>) -> Result<ConsumerOutcome> {
        let far = Instant::now() + Duration::from_secs(100 * 365 * 86400);
        let until = deadline.unwrap_or(far);
        let has_target = self.has_target();
        let mut latency = Histogram::default();
        let mut lateness = Histogram::default();
        let (mut early, mut early_max_ns) = (0u64, 0u64);
        let mut target_reached_at = None;
        let multi = self.cfg.multi_ack.max(1);
        let mut unacked: u64 = 0;
        let mut last_tag: u64 = 0;
        let mut n: u64 = 0;
        loop {
            let msg = match self.rx.try_recv() {
                Ok(m) => m,
                Err(TryRecvError::Empty) => {
                    if self.shared.stopping()
                        || (has_target && self.shared.consume_target_reached())
                    {
                        break;
                    }
                    let wait = if has_target {
                        until.min(Instant::now() + TARGET_POLL)
                    } else {
                        until
                    };
                    match tokio::time::timeout_at(wait, self.rx.recv()).await {
                        Ok(Some(m)) => m,
                        Ok(None) => {
                            bail!("consumer {}: channel closed by the broker", self.cfg.id)
                        }
                        Err(_) if wait >= until => break,
                        Err(_) => continue,
                    }
                }
                Err(TryRecvError::Disconnected) => {
                    bail!("consumer {}: channel closed by the broker", self.cfg.id)
                }
            };
            let now_ns = payload::now_ns();
            if let Some(content) = &msg.content {
                if let Some(st) = payload::read_stamp(content) {
                    let lat = now_ns.saturating_sub(st.sent_ns);
                    latency.record(lat);
                    match st.delay_ms {
                        Some(d) => {
                            let due = st.sent_ns + u64::from(d) * 1_000_000;
                            if now_ns < due {
                                early += 1;
                                early_max_ns = early_max_ns.max(due - now_ns);
                            }
                            let late = now_ns.saturating_sub(due);
                            lateness.record(late);
                            self.shared.record_window(late);
                        }
                        None => self.shared.record_window(lat),
                    }
                }
            }
            if !self.cfg.autoack {
                if let Some(d) = &msg.deliver {
                    last_tag = d.delivery_tag();
                    unacked += 1;
                    if unacked >= multi {
                        self.ack(last_tag, multi > 1).await?;
                        unacked = 0;
                    }
                }
            }
            n += 1;
            if self.shared.count_consumed() {
                target_reached_at = Some(Instant::now());
                break;
            }
            if n.is_multiple_of(32) && (self.shared.stopping() || Instant::now() >= until) {
                break;
            }
        }
        if unacked > 0 {
            self.ack(last_tag, true).await?;
        }
        Ok(ConsumerOutcome {
            latency,
            lateness,
            early,
            early_max_ns,
            target_reached_at,
        })
    }

    fn has_target(&self) -> bool {
        self.shared
            .consume_target
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    }

    pub async fn close(self) {
        conn::close_quietly(self.conn).await;
    }
}
