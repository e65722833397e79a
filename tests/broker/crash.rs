//! Crash safety with the real `warren` binary and SIGKILL: persistent
//! messages published to a durable queue with pipelined publisher confirms
//! are killed mid-stream at a random (seeded) moment, over several rounds
//! on the same data dir; after each restart the queue holds at least every
//! confirmed message, and at the end every confirmed message id is there
//! (duplicates and unconfirmed extras are allowed). Also: a confirmed
//! message routed to two durable queues is in both after a kill, and a kill
//! while a consumer acks loses no message whose ack was never sent.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::child::ChildBroker;
use common::*;
use futures::{stream::FuturesUnordered, FutureExt, StreamExt};
use lapin::{options::*, types::FieldTable, BasicProperties, Channel, Confirmation, ExchangeKind};
use rand::{rngs::StdRng, Rng, SeedableRng};

const QUEUE: &str = "crash-q";
const ROUNDS: usize = 5;
const MAX_OUTSTANDING: usize = 1000;
const BATCH: u64 = 100;

async fn durable_queue(ch: &Channel, name: &str) -> lapin::Queue {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("queue.declare")
}

fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

/// Consumes exactly `n` messages (no-ack) from `queue`; their bodies.
async fn consume_n(ch: &Channel, queue: &str, n: usize) -> Vec<Vec<u8>> {
    let tag = format!("drain-{queue}");
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("basic.consume");
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(10), consumer.next()).await {
            Ok(Some(Ok(d))) => out.push(d.data),
            other => panic!(
                "queue {queue}: got {} of {n} messages, then {:?}",
                out.len(),
                other.map(|o| o.map(|r| r.map(|d| d.delivery_tag)))
            ),
        }
    }
    ch.basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
        .await
        .expect("basic.cancel");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_persistent_messages_survive_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("warren.log");
    let mut rng = StdRng::seed_from_u64(0x009C_4A54);
    let mut confirmed: BTreeSet<u64> = BTreeSet::new();
    let mut next_id: u64 = 0;
    let mut broker = ChildBroker::spawn(&data, &log, &[]);

    for round in 0..ROUNDS {
        let conn = broker.connect().await;
        let ch = conn.create_channel().await.unwrap();
        if round > 0 {
            // Recovered after the previous kill: nothing confirmed is missing.
            let q = ch
                .queue_declare(
                    QUEUE.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap_or_else(|e| {
                    panic!("round {round}: queue lost: {e:?}; {}", broker.log_tail())
                });
            assert!(
                q.message_count() as usize >= confirmed.len(),
                "round {round}: {} messages after restart, {} were confirmed",
                q.message_count(),
                confirmed.len()
            );
        }
        durable_queue(&ch, QUEUE).await;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();

        let delay = Duration::from_millis(rng.gen_range(50..=400));
        let killer = broker.kill_handle();
        let kill = std::thread::spawn(move || {
            std::thread::sleep(delay);
            killer.kill();
        });

        let mut pending = FuturesUnordered::new();
        let mut record = |id: u64, r: Result<Confirmation, lapin::Error>| {
            if let Ok(c) = r {
                if c.is_ack() {
                    confirmed.insert(id);
                }
            }
        };
        let round_start = next_id;
        let mut publish_failed = false;
        let mut max_outstanding = 0;
        while next_id - round_start < 2_000_000 {
            // A batch of publishes in flight at once (lapin keeps their
            // order on the channel), so hundreds of confirms are pending.
            let ids: Vec<u64> = (next_id..next_id + BATCH).collect();
            next_id += BATCH;
            let bodies: Vec<[u8; 8]> = ids.iter().map(|id| id.to_be_bytes()).collect();
            let sends = bodies.iter().map(|body| {
                ch.basic_publish(
                    "".into(),
                    QUEUE.into(),
                    BasicPublishOptions::default(),
                    body,
                    persistent(),
                )
            });
            let sent =
                tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(sends))
                    .await;
            let Ok(sent) = sent else {
                publish_failed = true;
                break;
            };
            for (id, s) in ids.into_iter().zip(sent) {
                match s {
                    Ok(confirm) => pending.push(async move { (id, confirm.await) }),
                    Err(_) => publish_failed = true,
                }
            }
            max_outstanding = max_outstanding.max(pending.len());
            if publish_failed {
                break;
            }
            while let Some(Some((id, r))) = pending.next().now_or_never() {
                record(id, r);
            }
            while pending.len() >= MAX_OUTSTANDING {
                match tokio::time::timeout(Duration::from_secs(10), pending.next()).await {
                    Ok(Some((id, r))) => record(id, r),
                    _ => break,
                }
            }
        }
        // What is still outstanding resolves (mostly with errors) now that
        // the broker is gone; anything that never resolves is unconfirmed.
        while let Ok(Some((id, r))) =
            tokio::time::timeout(Duration::from_secs(10), pending.next()).await
        {
            record(id, r);
        }
        kill.join().unwrap();
        assert!(!broker.is_running());
        assert!(
            publish_failed,
            "round {round}: publishing never failed, so the kill did not hit it"
        );
        drop(ch);
        drop(conn);
        eprintln!(
            "round {round}: killed after {delay:?}, published {} so far, {} confirmed, \
             up to {max_outstanding} confirms outstanding",
            next_id,
            confirmed.len()
        );
        // Restart on the same data dir (the old handle is already reaped).
        broker = ChildBroker::spawn(&data, &log, &[]);
    }

    assert!(!confirmed.is_empty(), "no publish was ever confirmed");
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let q = durable_queue(&ch, QUEUE).await;
    let n = q.message_count() as usize;
    assert!(
        n >= confirmed.len(),
        "{n} messages, {} confirmed",
        confirmed.len()
    );
    let bodies = consume_n(&ch, QUEUE, n).await;
    let mut seen = BTreeSet::new();
    for b in &bodies {
        let id = u64::from_be_bytes(
            <[u8; 8]>::try_from(&b[..]).unwrap_or_else(|_| panic!("corrupt body {b:?}")),
        );
        assert!(id < next_id, "id {id} was never published");
        seen.insert(id);
    }
    let missing: Vec<u64> = confirmed.difference(&seen).copied().collect();
    assert!(
        missing.is_empty(),
        "{} confirmed messages lost (of {}), first: {:?}",
        missing.len(),
        confirmed.len(),
        &missing[..missing.len().min(20)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_message_routed_to_two_durable_queues_is_in_both_after_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("warren.log");
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    ch.exchange_declare(
        "cx".into(),
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    for q in ["left", "right"] {
        durable_queue(&ch, q).await;
        ch.queue_bind(
            q.into(),
            "cx".into(),
            "k".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirms = Vec::new();
    for i in 0..300u32 {
        confirms.push(
            ch.basic_publish(
                "cx".into(),
                "k".into(),
                BasicPublishOptions::default(),
                &i.to_be_bytes(),
                persistent(),
            )
            .await
            .unwrap(),
        );
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
    broker.kill();
    drop(ch);
    drop(conn);
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let expected: Vec<Vec<u8>> = (0..300u32).map(|i| i.to_be_bytes().to_vec()).collect();
    for q in ["left", "right"] {
        let n = durable_queue(&ch, q).await.message_count();
        assert_eq!(n, 300, "queue {q}");
        assert_eq!(consume_n(&ch, q, 300).await, expected, "queue {q}");
    }
    // The binding came back too.
    let pch = conn.create_channel().await.unwrap();
    publish(&pch, "cx", "k", b"after").await;
    assert_eq!(
        get_eventually(&pch, "left").await.as_deref(),
        Some(&b"after"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_messages_survive_kill_9_during_consumption() {
    // Acks are not confirmed, so acked messages may come back; a message
    // whose ack was never sent must not be lost.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("warren.log");
    let mut rng = StdRng::seed_from_u64(0xAC49);
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    durable_queue(&ch, "acks").await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    const N: u64 = 20_000;
    let mut confirms = Vec::new();
    for id in 0..N {
        confirms.push(
            ch.basic_publish(
                "".into(),
                "acks".into(),
                BasicPublishOptions::default(),
                &id.to_be_bytes(),
                persistent(),
            )
            .await
            .unwrap(),
        );
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
    let cch = conn.create_channel().await.unwrap();
    cch.basic_qos(200, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = cch
        .basic_consume(
            "acks".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let delay = Duration::from_millis(rng.gen_range(50..=300));
    let killer = broker.kill_handle();
    let kill = std::thread::spawn(move || {
        std::thread::sleep(delay);
        killer.kill();
    });
    let mut acked = BTreeSet::new();
    while let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await
    {
        let id = u64::from_be_bytes(<[u8; 8]>::try_from(&d.data[..]).unwrap());
        // lapin's ack future can stay pending forever once the broker is
        // gone (the test hung here twice); an ack that timed out may have
        // reached the broker, so it counts as acked (allowed to be gone).
        match tokio::time::timeout(Duration::from_secs(5), d.ack(BasicAckOptions::default())).await
        {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => break,
            Err(_) => {
                acked.insert(id);
                break;
            }
        }
        acked.insert(id);
    }
    kill.join().unwrap();
    assert!(
        (acked.len() as u64) < N,
        "everything was acked before the kill ({delay:?})"
    );
    drop((consumer, cch, ch, conn));
    let broker = ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let n = durable_queue(&ch, "acks").await.message_count() as usize;
    let mut seen = BTreeSet::new();
    for b in consume_n(&ch, "acks", n).await {
        let id = u64::from_be_bytes(<[u8; 8]>::try_from(&b[..]).unwrap());
        assert!(id < N, "id {id} was never published");
        seen.insert(id);
    }
    let lost: Vec<u64> = (0..N)
        .filter(|id| !acked.contains(id) && !seen.contains(id))
        .collect();
    eprintln!(
        "killed after {delay:?}: {} acked, {} left after restart",
        acked.len(),
        seen.len()
    );
    assert!(
        lost.is_empty(),
        "{} never-acked messages lost, first: {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettering_between_durable_queues_loses_nothing_to_kill_9() {
    // Persistent messages rejected from a durable queue move to its
    // durable dead-letter queue; a SIGKILL in the middle must leave every
    // message in one of the two (RabbitMQ classic queues only promise
    // at-most-once here).
    let dir = tempfile::tempdir().unwrap();
    let (data, log) = (dir.path().join("data"), dir.path().join("warren.log"));
    let broker = common::child::ChildBroker::spawn(&data, &log, &[]);
    const N: u64 = 300;
    {
        let conn = broker.connect().await;
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare("dead".into(), durable, FieldTable::default())
            .await
            .unwrap();
        let mut args = FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            lapin::types::AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            lapin::types::AMQPValue::LongString("dead".into()),
        );
        ch.queue_declare("work".into(), durable, args)
            .await
            .unwrap();
        for id in 0..N {
            let c = ch
                .basic_publish(
                    "".into(),
                    "work".into(),
                    BasicPublishOptions::default(),
                    &id.to_be_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(c.is_ack());
        }
        ch.basic_qos(50, BasicQosOptions::default()).await.unwrap();
        let mut consumer = ch
            .basic_consume(
                "work".into(),
                "c".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        for _ in 0..N / 2 {
            let Ok(Some(Ok(d))) =
                tokio::time::timeout(Duration::from_secs(10), consumer.next()).await
            else {
                break;
            };
            let _ = d.reject(BasicRejectOptions { requeue: false }).await;
        }
    }
    broker.kill();
    let broker = common::child::ChildBroker::spawn(&data, &log, &[]);
    let conn = broker.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let mut seen = BTreeSet::new();
    for q in ["work", "dead"] {
        while let Some(m) = ch
            .basic_get(q.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            seen.insert(u64::from_be_bytes(
                <[u8; 8]>::try_from(&m.delivery.data[..]).unwrap(),
            ));
        }
    }
    let missing: Vec<u64> = (0..N).filter(|id| !seen.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "lost {missing:?}; log:\n{}",
        broker.log_tail()
    );
}
