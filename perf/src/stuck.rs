//! `--stuck-consumers N`: before the run, N consumers on the first queue,
//! each with prefetch 1, take one message and never ack it. They stay
//! subscribed for the whole run, so the broker has N consumers on that
//! queue without credit: what they cost a publish to the consumers that do
//! have credit is what the run then measures.

use std::sync::Arc;
use std::time::Duration;

use amqprs::channel::{
    BasicConsumeArguments, BasicPublishArguments, BasicQosArguments, Channel, ConsumerMessage,
};
use amqprs::connection::Connection;
use amqprs::BasicProperties;
use anyhow::{bail, Result};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::conn::{self, with_timeout, AmqpUri};
use crate::stats::Shared;

/// Consumers per channel (per-consumer prefetch 1 each).
const PER_CHANNEL: usize = 1000;

/// The stuck consumers, held until dropped with `close`.
pub struct Stuck {
    conn: Connection,
    _channels: Vec<Channel>,
    _rx: Vec<UnboundedReceiver<ConsumerMessage>>,
}

impl Stuck {
    /// Subscribes `n` consumers to `queue` and gives each its one message.
    pub async fn start(
        uri: &AmqpUri,
        queue: &str,
        n: usize,
        shared: &Arc<Shared>,
    ) -> Result<Stuck> {
        let name = "warren-perf stuck consumers";
        let conn = conn::connect(uri, name, shared, Duration::ZERO).await?;
        let mut channels = Vec::new();
        let mut rx = Vec::with_capacity(n);
        while rx.len() < n {
            let ch = conn::channel(&conn, name, shared, None).await?;
            with_timeout(ch.basic_qos(BasicQosArguments::new(0, 1, false)), || {
                format!("{name}: basic.qos")
            })
            .await?;
            for _ in 0..PER_CHANNEL.min(n - rx.len()) {
                let args = BasicConsumeArguments::new(queue, "")
                    .manual_ack(true)
                    .finish();
                let (_tag, r) = with_timeout(ch.basic_consume_rx(args), || {
                    format!("{name}: basic.consume on {queue:?}")
                })
                .await?;
                rx.push(r);
            }
            channels.push(ch);
        }
        let pch = conn::channel(&conn, name, shared, None).await?;
        for _ in 0..n {
            pch.basic_publish(
                BasicProperties::default(),
                vec![0u8; 16],
                BasicPublishArguments::new("", queue),
            )
            .await?;
        }
        for r in rx.iter_mut() {
            match tokio::time::timeout(Duration::from_secs(60), r.recv()).await {
                Ok(Some(_)) => {}
                _ => bail!("{name}: a stuck consumer never got its message"),
            }
        }
        Ok(Stuck {
            conn,
            _channels: channels,
            _rx: rx,
        })
    }

    /// Closes their connection (their messages go back to the queue).
    pub async fn close(self) {
        conn::close_quietly(self.conn).await;
    }
}
