//! Counting a queue's messages, and publishing numbered ones, as the
//! tests of messages moving between brokers (shovels, federation) do.

use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};

/// Messages ready in `queue`; 0 while it does not exist (a passive
/// declare on a channel of its own, which a 404 closes).
pub async fn count(conn: &Connection, queue: &str) -> u32 {
    let ch = conn.create_channel().await.expect("channel");
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let n = match ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
    {
        Ok(q) => q.message_count(),
        Err(_) => return 0,
    };
    let _ = ch.close(200, "".into()).await;
    n
}

/// Waits until `queue` holds `n` messages or more (or 60 s pass); how
/// many it holds.
pub async fn wait_count(conn: &Connection, queue: &str, n: u32) -> u32 {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let c = count(conn, queue).await;
        if c >= n || Instant::now() > until {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes ids `0..n` (8-byte bodies) persistent to `exchange` with
/// `key`, confirmed.
pub async fn publish_ids(ch: &Channel, exchange: &str, key: &str, n: u64) {
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut pending = Vec::new();
    for id in 0..n {
        let c = ch
            .basic_publish(
                exchange.into(),
                key.into(),
                BasicPublishOptions::default(),
                &id.to_be_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish");
        pending.push(c);
    }
    for c in pending {
        assert!(c.await.expect("confirm").is_ack());
    }
}
