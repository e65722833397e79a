//! Publish and consume end to end: default exchange, consumers, acks,
//! requeue order, redelivered flag, round-robin, prefetch.

use crate::common;

use common::*;
use lapin::{options::*, types::FieldTable};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_then_get_and_consume() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    publish(&ch, "", "q", b"one").await;
    assert_eq!(get_eventually(&ch, "q").await.as_deref(), Some(&b"one"[..]));
    assert_eq!(get_body(&ch, "q").await, None);

    let mut consumer = ch
        .basic_consume(
            "q".into(),
            "c1".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for i in 0..100u32 {
        publish(&ch, "", "q", &i.to_be_bytes()).await;
    }
    for i in 0..100u32 {
        let d = next(&mut consumer).await.expect("delivery");
        assert_eq!(d.data, i.to_be_bytes());
        assert!(!d.redelivered);
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
}
