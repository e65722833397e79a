//! The exchange and queues a run uses: naming, declaring, binding and deleting them.

use amqprs::channel::{
    Channel, ExchangeDeclareArguments, ExchangeDeleteArguments, QueueBindArguments,
    QueueDeclareArguments, QueueDeleteArguments,
};
use amqprs::{FieldTable, FieldValue};
use anyhow::Result;

use crate::conn::with_timeout;

/// The `--exchange-type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    /// The delayed-message exchange (Warren built-in, or RabbitMQ's plugin), routing as direct.
    XDelayedMessage,
}

impl ExchangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::XDelayedMessage => "x-delayed-message",
        }
    }
}

/// A `--queue-arg KEY=VALUE` table entry: a whole number is sent as a signed 64-bit integer
/// (x-message-ttl, x-max-length, ...), anything else as a string.
pub fn parse_queue_arg(s: &str) -> Result<(String, FieldValue), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("{s:?}: empty KEY"));
    }
    let value = match v.parse::<i64>() {
        Ok(n) => FieldValue::l(n),
        Err(_) => FieldValue::from(v),
    };
    Ok((k.to_string(), value))
}

/// Where producers publish and which queues consumers read.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Exchange to publish to; "" is the default exchange (routing key = queue name, no binding).
    pub exchange: String,
    pub kind: ExchangeKind,
    pub queues: Vec<String>,
    pub durable: bool,
    /// Arguments every queue is declared with (--queue-arg).
    pub queue_args: FieldTable,
}

impl Topology {
    /// `queue` names the only queue, or with `count > 1` is the prefix of `queue-0`, `queue-1`, ...
    pub fn new(
        exchange: Option<&str>,
        kind: ExchangeKind,
        queue: &str,
        count: usize,
        durable: bool,
    ) -> Self {
        let queues = if count <= 1 {
            vec![queue.to_string()]
        } else {
            (0..count).map(|i| format!("{queue}-{i}")).collect()
        };
        let exchange = match (exchange, kind) {
            (Some(e), _) => e.to_string(),
            (None, ExchangeKind::Direct) => String::new(),
            (None, k) => format!("warren-perf.{}", k.as_str()),
        };
        Topology {
            exchange,
            kind,
            queues,
            durable,
            queue_args: FieldTable::new(),
        }
    }

    /// Declares every queue with these arguments (`--queue-arg`).
    pub fn with_queue_args(mut self, args: &[(String, FieldValue)]) -> Result<Self> {
        for (k, v) in args {
            let key = k
                .as_str()
                .try_into()
                .map_err(|_| anyhow::anyhow!("--queue-arg key {k:?} is too long"))?;
            self.queue_args.insert(key, v.clone());
        }
        Ok(self)
    }

    /// The routing key producer number `i` publishes with.
    pub fn publish_key(&self, i: usize) -> String {
        let q = &self.queues[i % self.queues.len()];
        match self.kind {
            ExchangeKind::Direct | ExchangeKind::XDelayedMessage => q.clone(),
            ExchangeKind::Fanout => String::new(),
            ExchangeKind::Topic => format!("{q}.perf"),
        }
    }

    /// The queue consumer number `i` reads.
    pub fn consumer_queue(&self, i: usize) -> &str {
        &self.queues[i % self.queues.len()]
    }

    fn owns_exchange(&self) -> bool {
        !self.exchange.is_empty() && !self.exchange.starts_with("amq.")
    }

    /// Declares the exchange and queues and binds them; returns the messages already queued.
    pub async fn declare(&self, ch: &Channel) -> Result<u64> {
        if self.owns_exchange() {
            let mut args = ExchangeDeclareArguments::new(&self.exchange, self.kind.as_str());
            args.durable(self.durable);
            if self.kind == ExchangeKind::XDelayedMessage {
                let mut t = FieldTable::new();
                let key = "x-delayed-type".try_into().expect("a short string");
                t.insert(key, FieldValue::from("direct"));
                args.arguments(t);
            }
            with_timeout(ch.exchange_declare(args), || {
                format!("declaring exchange {:?}", self.exchange)
            })
            .await?;
        }
        let mut queued = 0u64;
        for q in &self.queues {
            let mut args = QueueDeclareArguments::new(q);
            args.durable(self.durable);
            args.arguments(self.queue_args.clone());
            let ok =
                with_timeout(ch.queue_declare(args), || format!("declaring queue {q:?}")).await?;
            if let Some((_, messages, _)) = ok {
                queued += u64::from(messages);
            }
            if !self.exchange.is_empty() {
                let key = match self.kind {
                    ExchangeKind::Direct | ExchangeKind::XDelayedMessage => q.clone(),
                    ExchangeKind::Fanout => String::new(),
                    ExchangeKind::Topic => format!("{q}.#"),
                };
                with_timeout(
                    ch.queue_bind(QueueBindArguments::new(q, &self.exchange, &key)),
                    || format!("binding queue {q:?} to {:?}", self.exchange),
                )
                .await?;
            }
        }
        Ok(queued)
    }

    /// Deletes the queues and the exchange this run declared.
    pub async fn delete(&self, ch: &Channel) -> Result<()> {
        for q in &self.queues {
            with_timeout(ch.queue_delete(QueueDeleteArguments::new(q)), || {
                format!("deleting queue {q:?}")
            })
            .await?;
        }
        if self.owns_exchange() {
            with_timeout(
                ch.exchange_delete(ExchangeDeleteArguments::new(&self.exchange)),
                || format!("deleting exchange {:?}", self.exchange),
            )
            .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_producers_and_consumers_over_queues() {
        let t = Topology::new(None, ExchangeKind::Direct, "q", 3, false);
        assert_eq!(t.exchange, "");
        assert_eq!(t.queues, ["q-0", "q-1", "q-2"]);
        assert_eq!(t.publish_key(4), "q-1");
        assert_eq!(t.consumer_queue(5), "q-2");
        let t = Topology::new(None, ExchangeKind::Fanout, "q", 1, true);
        assert_eq!(t.exchange, "warren-perf.fanout");
        assert_eq!(t.queues, ["q"]);
        assert_eq!(t.publish_key(0), "");
        let t = Topology::new(Some("amq.topic"), ExchangeKind::Topic, "q", 2, false);
        assert!(!t.owns_exchange());
        assert_eq!(t.publish_key(1), "q-1.perf");
        let t = Topology::new(None, ExchangeKind::XDelayedMessage, "q", 1, false);
        assert_eq!(t.exchange, "warren-perf.x-delayed-message");
        assert_eq!(t.publish_key(0), "q");
    }

    #[test]
    fn queue_args_are_numbers_or_strings() {
        assert_eq!(
            parse_queue_arg("x-message-ttl=60000"),
            Ok(("x-message-ttl".into(), FieldValue::l(60000)))
        );
        assert_eq!(
            parse_queue_arg("x-dead-letter-exchange="),
            Ok(("x-dead-letter-exchange".into(), FieldValue::from("")))
        );
        assert!(parse_queue_arg("nokey").is_err());
        assert!(parse_queue_arg("=1").is_err());
    }
}
