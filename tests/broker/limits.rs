//! Caps a hostile or broken peer hits, with RabbitMQ's errors: consumers
//! per channel (consumer_max_per_channel, 530), connections per node
//! (connection_max, 530 at connection.open), queues per vhost (406). And
//! 10,000 consumers out of credit on one queue do not keep a publish from
//! the one consumer that has credit.

use crate::common;
use crate::helpers;

use common::*;
use helpers::*;
use lapin::{options::*, types::FieldTable, Connection, ConnectionProperties};

async fn broker_with(f: impl FnOnce(&mut warren::Config)) -> (TestBroker, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    f(&mut c);
    (start_with(c).await, tmp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_per_channel_are_capped_with_530() {
    let (b, _t) = broker_with(|c| c.consumer_max_per_channel = 3).await;
    let (conn, ch) = b.channel().await;
    declare(&ch, "q").await;
    // Kept: lapin cancels a consumer it drops.
    let mut kept = Vec::new();
    for i in 0..3 {
        kept.push(consumer(&ch, "q", &format!("c{i}")).await);
    }
    let e = ch
        .basic_consume(
            "q".into(),
            "c3".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(reply_code(&e), Some(530), "{e:?}");
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("NOT_ALLOWED - reached maximum (3) of consumers per channel")
    );
    assert!(connection_closed(&conn).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_node_are_capped_with_530() {
    let (b, _t) = broker_with(|c| c.connection_max = 2).await;
    let first = b.connect().await;
    let _second = b.connect().await;
    let e = Connection::connect(&b.uri(), ConnectionProperties::default())
        .await
        .expect_err("over connection_max");
    assert_eq!(reply_code(&e), Some(530), "{e:?}");
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("NOT_ALLOWED - connection refused: node connection limit (2) is reached")
    );
    first.close(200, "bye".into()).await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match Connection::connect(&b.uri(), ConnectionProperties::default()).await {
            Ok(c) => {
                assert_connection_works(&c).await;
                break;
            }
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            Err(e) => panic!("a slot was given back, still refused: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_per_vhost_are_capped_with_406() {
    let (b, _t) = broker_with(|c| c.vhost_max_queues = 2).await;
    let conn = b.connect().await;
    let ch = conn.create_channel().await.unwrap();
    declare(&ch, "a").await;
    declare(&ch, "b").await;
    declare(&ch, "a").await; // redeclaring is fine
    let e = ch
        .queue_declare(
            "c".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(reply_code(&e), Some(406), "{e:?}");
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("PRECONDITION_FAILED - cannot declare queue 'c': queue limit in vhost '/' (2) is reached")
    );
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete("b".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    declare(&ch, "c").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_consumers_without_credit_leave_the_flow_to_the_one_with_credit() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "many").await;
    // 10,000 consumers with prefetch 1, on 10 channels, that never ack.
    let conn = b.connect().await;
    let mut stuck = Vec::new();
    for _ in 0..10 {
        let sch = conn.create_channel().await.unwrap();
        sch.basic_qos(1, BasicQosOptions::default()).await.unwrap();
        for _ in 0..1000 {
            stuck.push(
                sch.basic_consume(
                    "many".into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap(),
            );
        }
    }
    for i in 0..10_000u32 {
        publish(&ch, "", "many", &i.to_be_bytes()).await;
    }
    // Each took one and holds it.
    assert_eq!(message_count(&ch, "many").await, 0);
    let (_c2, ch2) = b.channel().await;
    let mut free = consumer(&ch2, "many", "free").await;
    for i in 0..1000u32 {
        publish(&ch, "", "many", &(100_000 + i).to_be_bytes()).await;
    }
    let got = take(&mut free, 1000).await;
    assert_eq!(
        got.len(),
        1000,
        "every later message went to the free consumer"
    );
    assert_eq!(message_count(&ch, "many").await, 0);
}
