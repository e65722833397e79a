//! A producer: one connection, one channel, publishing timestamped bodies as fast as allowed.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use amqprs::channel::{BasicPublishArguments, Channel, ConfirmSelectArguments};
use amqprs::connection::Connection;
use amqprs::{BasicProperties, FieldTable, FieldValue};
use anyhow::{bail, Context, Result};
use tokio::sync::mpsc::{self, error::TryRecvError, UnboundedReceiver};
use tokio::time::Instant;

use crate::conn::{self, with_timeout, AmqpUri, ConfirmEvent};
use crate::payload;
use crate::range::{MsRange, Rng};
use crate::stats::Shared;

/// What one producer does.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    pub id: usize,
    pub exchange: String,
    pub routing_key: String,
    pub size: usize,
    pub persistent: bool,
    /// Maximum unconfirmed messages in flight; 0 = no publisher confirms.
    pub confirm: usize,
    /// Messages per second; 0 = as fast as possible.
    pub rate: f64,
    /// Publish exactly this many and stop (0 = until the deadline).
    pub pmessages: u64,
    /// A random `x-delay` header per message (ms), also written into the body.
    pub delay: Option<MsRange>,
    /// A random per-message TTL (`expiration`, ms).
    pub ttl: Option<MsRange>,
}

/// Tracks unconfirmed delivery tags; the window holds one flag per tag from `base` on.
#[derive(Default)]
pub struct ConfirmTracker {
    base: u64,
    done: VecDeque<bool>,
}

impl ConfirmTracker {
    pub fn new() -> Self {
        ConfirmTracker {
            base: 1,
            done: VecDeque::new(),
        }
    }

    pub fn published(&mut self) {
        self.done.push_back(false);
    }

    pub fn outstanding(&self) -> usize {
        self.done.len()
    }

    /// Applies a confirm; returns how many messages it resolved for the first time.
    pub fn confirm(&mut self, tag: u64, multiple: bool) -> u64 {
        if tag < self.base {
            return 0;
        }
        let idx = (tag - self.base) as usize;
        if idx >= self.done.len() {
            return 0; // a tag we never published: ignore rather than trust it
        }
        let mut newly = 0;
        if multiple {
            for d in self.done.iter_mut().take(idx + 1) {
                if !*d {
                    *d = true;
                    newly += 1;
                }
            }
        } else if !self.done[idx] {
            self.done[idx] = true;
            newly = 1;
        }
        while self.done.front() == Some(&true) {
            self.done.pop_front();
            self.base += 1;
        }
        newly
    }
}

/// A producer whose connection and channel are open and ready to publish.
pub struct Producer {
    cfg: ProducerConfig,
    conn: Connection,
    ch: Channel,
    confirms: Option<UnboundedReceiver<ConfirmEvent>>,
    shared: Arc<Shared>,
}

/// How a producer ended.
pub struct ProducerOutcome {
    pub finished_at: Instant,
}

/// How long a producer waits for a confirm before giving up on the broker.
const CONFIRM_STALL: Duration = Duration::from_secs(120);

impl Producer {
    pub async fn connect(uri: &AmqpUri, cfg: ProducerConfig, shared: Arc<Shared>) -> Result<Self> {
        let name = format!("warren-perf producer {}", cfg.id);
        let conn = conn::connect(uri, &name, &shared, Duration::ZERO).await?;
        let (tx, rx) = if cfg.confirm > 0 {
            let (tx, rx) = mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let ch = conn::channel(&conn, &name, &shared, tx).await?;
        if cfg.confirm > 0 {
            with_timeout(ch.confirm_select(ConfirmSelectArguments::default()), || {
                format!("{name}: confirm.select")
            })
            .await?;
        }
        Ok(Producer {
            cfg,
            conn,
            ch,
            confirms: rx,
            shared,
        })
    }

    fn apply(&self, tracker: &mut ConfirmTracker, ev: ConfirmEvent) {
        let n = tracker.confirm(ev.tag, ev.multiple);
        let counter = if ev.nack {
            &self.shared.nacked
        } else {
            &self.shared.confirmed
        };
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Takes every confirm already received without waiting.
    fn drain_confirms(&mut self, tracker: &mut ConfirmTracker) -> Result<()> {
        let Some(mut rx) = self.confirms.take() else {
            return Ok(());
        };
        let res = loop {
            match rx.try_recv() {
                Ok(ev) => self.apply(tracker, ev),
                Err(TryRecvError::Empty) => break Ok(()),
                Err(TryRecvError::Disconnected) => break Err(anyhow::anyhow!("channel closed")),
            }
        };
        self.confirms = Some(rx);
        res.with_context(|| format!("producer {}: waiting for confirms", self.cfg.id))
    }

    /// Waits for one confirm, until `until` at most; returns false if the time ran out.
    async fn wait_confirm(&mut self, tracker: &mut ConfirmTracker, until: Instant) -> Result<bool> {
        let Some(mut rx) = self.confirms.take() else {
            return Ok(true);
        };
        let stall = Instant::now() + CONFIRM_STALL;
        let res = tokio::time::timeout_at(until.min(stall), rx.recv()).await;
        self.confirms = Some(rx);
        match res {
            Ok(Some(ev)) => {
                self.apply(tracker, ev);
                Ok(true)
            }
            Ok(None) => bail!(
                "producer {}: channel closed while waiting for confirms",
                self.cfg.id
            ),
            Err(_) if until <= stall => Ok(false),
            Err(_) => bail!(
                "producer {}: no publisher confirm for {CONFIRM_STALL:?} ({} unconfirmed)",
                self.cfg.id,
                tracker.outstanding()
            ),
        }
    }

    /// Publishes until `deadline` (None = no time limit), `pmessages` or a stop request.
    pub async fn run(
        &mut self,
        start: Instant,
        deadline: Option<Instant>,
    ) -> Result<ProducerOutcome> {
        let far = Instant::now() + Duration::from_secs(100 * 365 * 86400);
        let until = deadline.unwrap_or(far);
        let mut props = BasicProperties::default();
        if self.cfg.persistent {
            props.with_delivery_mode(2);
        }
        let args = BasicPublishArguments::new(&self.cfg.exchange, &self.cfg.routing_key);
        let template = payload::template(self.cfg.size);
        let mut rng = Rng::new(payload::now_ns() ^ (self.cfg.id as u64).wrapping_mul(0x9e37_79b9));
        let x_delay: amqprs::FieldName = "x-delay".try_into().expect("a short string");
        let mut tracker = ConfirmTracker::new();
        let mut sent: u64 = 0;
        let mut by_count = false;
        let interval = if self.cfg.rate > 0.0 {
            Some(Duration::from_secs_f64(1.0 / self.cfg.rate))
        } else {
            None
        };
        'publish: loop {
            if self.cfg.pmessages > 0 && sent >= self.cfg.pmessages {
                by_count = true;
                break;
            }
            if sent.is_multiple_of(32) && (self.shared.stopping() || Instant::now() >= until) {
                break;
            }
            if let Some(iv) = interval {
                let due = start + iv.mul_f64(sent as f64);
                if due >= until {
                    break;
                }
                if due > Instant::now() {
                    tokio::time::sleep_until(due).await;
                }
            }
            if self.cfg.confirm > 0 {
                self.drain_confirms(&mut tracker)?;
                while tracker.outstanding() >= self.cfg.confirm {
                    if !self.wait_confirm(&mut tracker, until).await? {
                        break 'publish;
                    }
                }
            }
            let mut body = template.clone();
            let mut p = props.clone();
            match self.cfg.delay {
                Some(range) => {
                    let delay = range.sample(&mut rng);
                    let mut headers = FieldTable::new();
                    headers.insert(x_delay.clone(), FieldValue::l(delay as i64));
                    p.with_headers(headers);
                    payload::stamp_delayed(&mut body, delay as u32);
                }
                None => payload::stamp(&mut body),
            }
            if let Some(range) = self.cfg.ttl {
                p.with_expiration(&range.sample(&mut rng).to_string());
            }
            self.ch
                .basic_publish(p, body, args.clone())
                .await
                .with_context(|| format!("producer {}: basic.publish", self.cfg.id))?;
            sent += 1;
            if self.cfg.confirm > 0 {
                tracker.published();
            }
            self.shared.count_published();
        }
        let mut finished_at = Instant::now();
        // A pre-fill is only done once the broker has confirmed all of it.
        if by_count && self.cfg.confirm > 0 {
            self.drain_confirms(&mut tracker)?;
            while tracker.outstanding() > 0 {
                self.wait_confirm(&mut tracker, far).await?;
            }
            finished_at = Instant::now();
        }
        Ok(ProducerOutcome { finished_at })
    }

    /// Closes the connection (after the run, so in-flight confirms are not lost mid-measurement).
    pub async fn close(self) {
        conn::close_quietly(self.conn).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracker_handles_single_multiple_and_out_of_order_confirms() {
        let mut t = ConfirmTracker::new();
        for _ in 0..5 {
            t.published();
        }
        assert_eq!(t.confirm(2, false), 1);
        assert_eq!(t.outstanding(), 5);
        assert_eq!(t.confirm(3, true), 2);
        assert_eq!(t.outstanding(), 2);
        assert_eq!(t.confirm(3, true), 0);
        assert_eq!(t.confirm(9, false), 0);
        assert_eq!(t.confirm(5, false), 1);
        assert_eq!(t.outstanding(), 2);
        assert_eq!(t.confirm(4, false), 1);
        assert_eq!(t.outstanding(), 0);
    }
}
