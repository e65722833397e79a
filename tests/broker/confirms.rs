//! Publisher confirms: confirm.select, acks for routed, unroutable and
//! persistent messages, pipelined publishes, returns before acks, and
//! confirm / tx mode exclusion.

use crate::common;
use crate::helpers;

use common::*;
use helpers::{
    bind, channel_closed, declare_with, drain, exchange, expect_code, persistent, publish_with, s,
    table, wait_count,
};
use lapin::{
    options::*,
    types::{AMQPValue, FieldTable},
    BasicProperties, ExchangeKind,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_after_confirm_select_is_acked() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    assert!(ch.status().confirm());
    declare(&ch, "q").await;
    let confirm = publish_with(
        &ch,
        "",
        "q",
        BasicPublishOptions::default(),
        b"m",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    assert!(confirm.is_ack());
    assert!(confirm.take_message().is_none());
    assert_eq!(get_body(&ch, "q").await.as_deref(), Some(&b"m"[..]));
    // Selecting again is harmless.
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let confirm = publish_with(
        &ch,
        "",
        "q",
        BasicPublishOptions::default(),
        b"m2",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    assert!(confirm.is_ack());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_publishes_are_all_confirmed() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare(&ch, "q").await;
    let mut confirms = Vec::new();
    for i in 0..500u32 {
        // Routed, unroutable and to a missing queue, interleaved.
        let key = if i % 3 == 0 { "nowhere" } else { "q" };
        confirms.push(
            publish_with(
                &ch,
                "",
                key,
                BasicPublishOptions::default(),
                &i.to_be_bytes(),
                BasicProperties::default(),
            )
            .await,
        );
    }
    for (i, c) in confirms.into_iter().enumerate() {
        let c = tokio::time::timeout(std::time::Duration::from_secs(10), c)
            .await
            .unwrap_or_else(|_| panic!("confirm {i} never came"))
            .unwrap();
        assert!(c.is_ack(), "publish {i} nacked");
    }
    let returned = ch.wait_for_confirms().await.unwrap();
    assert!(returned.is_empty());
    let q = declare(&ch, "q").await;
    assert_eq!(q.message_count(), 333);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_channels_confirm_independently() {
    let b = start().await;
    let c = b.connect().await;
    let ch1 = c.create_channel().await.unwrap();
    let ch2 = c.create_channel().await.unwrap();
    declare(&ch1, "q").await;
    for ch in [&ch1, &ch2] {
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
    }
    for i in 0..50u8 {
        let ch = if i % 2 == 0 { &ch1 } else { &ch2 };
        publish_with(
            ch,
            "",
            "q",
            BasicPublishOptions::default(),
            &[i],
            BasicProperties::default(),
        )
        .await;
    }
    assert!(ch1.wait_for_confirms().await.unwrap().is_empty());
    assert!(ch2.wait_for_confirms().await.unwrap().is_empty());
    assert_eq!(wait_count(&c, "q", 50).await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_messages_to_a_durable_queue_are_confirmed() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare_with(
        &ch,
        "dq",
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    declare(&ch, "tq").await;
    exchange(
        &ch,
        "fan",
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    bind(&ch, "dq", "fan", "", FieldTable::default()).await;
    bind(&ch, "tq", "fan", "", FieldTable::default()).await;
    let mut confirms = Vec::new();
    for i in 0..100u32 {
        let (x, key) = if i % 2 == 0 { ("", "dq") } else { ("fan", "") };
        confirms.push(
            publish_with(
                &ch,
                x,
                key,
                BasicPublishOptions::default(),
                &i.to_be_bytes(),
                persistent(),
            )
            .await,
        );
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
    let q = declare_with(
        &ch,
        "dq",
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    assert_eq!(q.message_count(), 100);
    assert_eq!(declare(&ch, "tq").await.message_count(), 50);
    let m = ch
        .basic_get("dq".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.delivery.properties.delivery_mode(), &Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_select_on_a_confirm_channel_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let text = expect_code(ch.tx_select().await, 406);
    assert_eq!(
        text,
        "PRECONDITION_FAILED - cannot switch from confirm to tx mode"
    );
    assert!(channel_closed(&ch).await);
    assert!(c.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_unroutable_with_confirms_is_returned_then_acked() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare(&ch, "q").await;
    let mandatory = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    // One at a time: each return arrives before its ack.
    for (x, key, body, returned) in [
        ("amq.direct", "none", &b"r1"[..], true),
        ("", "q", &b"ok"[..], false),
        ("", "none", &b"r2"[..], true),
    ] {
        let c = publish_with(&ch, x, key, mandatory, body, BasicProperties::default())
            .await
            .await
            .unwrap();
        assert!(c.is_ack());
        match c.take_message() {
            Some(r) => {
                assert!(returned, "{key} was returned");
                assert_eq!(r.reply_code, 312);
                assert_eq!(r.reply_text.as_str(), "NO_ROUTE");
                assert_eq!(r.delivery.data, body);
            }
            None => assert!(!returned, "{key} was not returned before its ack"),
        }
    }
    // Pipelined: every return is delivered, and every publish acked.
    let mut confirms = Vec::new();
    for i in 0..20u8 {
        let key = if i % 2 == 0 { "none" } else { "q" };
        confirms
            .push(publish_with(&ch, "", key, mandatory, &[i], BasicProperties::default()).await);
    }
    let mut returned = Vec::new();
    for c in confirms {
        let c = c.await.unwrap();
        assert!(c.is_ack());
        if let Some(r) = c.take_message() {
            returned.push(r.delivery.data[0]);
        }
    }
    returned.extend(
        ch.wait_for_confirms()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.delivery.data[0]),
    );
    returned.sort();
    assert_eq!(returned, (0..20).step_by(2).collect::<Vec<u8>>());
    assert_eq!(drain(&ch, "q").await.len(), 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_persistent_unroutable_with_confirms() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let c = publish_with(
        &ch,
        "",
        "none",
        BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        },
        b"p",
        persistent(),
    )
    .await
    .await
    .unwrap();
    assert!(c.is_ack());
    assert_eq!(c.take_message().expect("returned").reply_code, 312);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_publish_overflow_nacks() {
    // x-overflow=reject-publish: a publish to a full queue is nacked.
    let b = start().await;
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare_with(
        &ch,
        "small",
        QueueDeclareOptions::default(),
        table(&[
            ("x-max-length", AMQPValue::LongInt(1)),
            ("x-overflow", s("reject-publish")),
        ]),
    )
    .await
    .unwrap();
    let first = publish_with(
        &ch,
        "",
        "small",
        BasicPublishOptions::default(),
        b"1",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    assert!(first.is_ack());
    let second = publish_with(
        &ch,
        "",
        "small",
        BasicPublishOptions::default(),
        b"2",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    assert!(
        second.is_nack(),
        "publish to a full reject-publish queue was acked"
    );
    assert_eq!(drain(&ch, "small").await, ["1"]);
}
