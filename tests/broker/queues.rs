//! Queues: declare (server-named, counts, passive, equivalence, reserved
//! names, argument validation), exclusive and auto-delete queues, purge,
//! delete (if-unused / if-empty) and "" as the channel's last queue.

use crate::common;
use crate::helpers;

use common::*;
use helpers::{
    bind, channel_closed, consumer, declare_with, drain, expect_code, queue_exists,
    queue_gone_eventually, s, table, wait_count,
};
use lapin::{
    options::*,
    types::{AMQPValue, FieldTable},
};

fn passive() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_named_queues() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let q1 = declare(&ch, "").await;
    let q2 = declare(&ch, "").await;
    let (n1, n2) = (q1.name().as_str(), q2.name().as_str());
    assert!(n1.starts_with("amq.gen-"), "{n1}");
    assert!(n2.starts_with("amq.gen-"), "{n2}");
    assert!(n1.len() > "amq.gen-".len());
    assert_ne!(n1, n2);
    assert_eq!(q1.message_count(), 0);
    assert_eq!(q1.consumer_count(), 0);
    // Usable through the default exchange, and passive declare finds it.
    publish(&ch, "", n1, b"hi").await;
    let q = declare_with(&ch, n1, passive(), FieldTable::default())
        .await
        .unwrap();
    assert_eq!(q.message_count(), 1);
    assert_eq!(get_body(&ch, n1).await.as_deref(), Some(&b"hi"[..]));

    // A server-named queue becomes the channel's last declared queue.
    let ch = c.create_channel().await.unwrap();
    let q = declare(&ch, "").await;
    publish(&ch, "", q.name().as_str(), b"7").await;
    assert_eq!(get_body(&ch, "").await.as_deref(), Some(&b"7"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeclaring_a_server_named_queue_by_name_is_403() {
    // RabbitMQ refuses every non-passive declare of a name starting with
    // "amq.", even one it generated itself.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let q = declare(&ch, "").await;
    let name = q.name().as_str().to_string();
    let r = declare_with(
        &ch,
        &name,
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await;
    let text = expect_code(r, 403);
    assert!(text.contains("reserved prefix 'amq.*'"), "{text}");
    assert!(queue_exists(&c, &name).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_ok_counts_ready_messages_and_consumers() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    for i in 0..3u8 {
        publish(&ch, "", "q", &[i]).await;
    }
    let q = declare(&ch, "q").await;
    assert_eq!((q.message_count(), q.consumer_count()), (3, 0));

    // One unacked delivery: not counted as a message.
    let cch = c.create_channel().await.unwrap();
    cch.basic_qos(1, BasicQosOptions::default()).await.unwrap();
    let mut cons = consumer(&cch, "q", "c1").await;
    let _d = next(&mut cons).await.expect("delivery");
    assert_eq!(wait_count(&c, "q", 2).await, 2);
    let q = declare(&ch, "q").await;
    assert_eq!((q.message_count(), q.consumer_count()), (2, 1));
    let _cons2 = consumer(&cch, "q", "c2").await;
    let q = declare_with(&ch, "q", passive(), FieldTable::default())
        .await
        .unwrap();
    assert_eq!(q.consumer_count(), 2);

    // Empty queue with consumers.
    declare(&ch, "empty").await;
    let _e1 = consumer(&cch, "empty", "e1").await;
    let q = declare(&ch, "empty").await;
    assert_eq!((q.message_count(), q.consumer_count()), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_declare_of_missing_queue_is_404() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = declare_with(&ch, "nope", passive(), FieldTable::default()).await;
    let text = expect_code(r, 404);
    assert_eq!(text, "NOT_FOUND - no queue 'nope' in vhost '/'");
    assert!(channel_closed(&ch).await);
    assert!(c.status().connected());
    // The connection keeps working and nothing was created.
    assert!(!queue_exists(&c, "nope").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeclare_with_different_properties_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "q",
        QueueDeclareOptions::default(),
        table(&[("x-message-ttl", AMQPValue::LongInt(1000))]),
    )
    .await
    .unwrap();
    // The same declaration again is fine; an integer of another width too.
    declare_with(
        &ch,
        "q",
        QueueDeclareOptions::default(),
        table(&[("x-message-ttl", AMQPValue::LongLongInt(1000))]),
    )
    .await
    .unwrap();

    let cases: Vec<(&str, QueueDeclareOptions, FieldTable)> = vec![
        (
            "durable",
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            table(&[("x-message-ttl", AMQPValue::LongInt(1000))]),
        ),
        (
            "auto_delete",
            QueueDeclareOptions {
                auto_delete: true,
                ..Default::default()
            },
            table(&[("x-message-ttl", AMQPValue::LongInt(1000))]),
        ),
        (
            "x-message-ttl",
            QueueDeclareOptions::default(),
            table(&[("x-message-ttl", AMQPValue::LongInt(2000))]),
        ),
        (
            "x-message-ttl",
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
        (
            "x-max-length",
            QueueDeclareOptions::default(),
            table(&[
                ("x-message-ttl", AMQPValue::LongInt(1000)),
                ("x-max-length", AMQPValue::LongInt(10)),
            ]),
        ),
    ];
    for (field, opts, args) in cases {
        let ch = c.create_channel().await.unwrap();
        let r = declare_with(&ch, "q", opts, args).await;
        let text = expect_code(r, 406);
        assert!(
            text.contains(&format!("inequivalent arg '{field}'")),
            "{field}: {text}"
        );
        assert!(c.status().connected());
    }
    // Arguments RabbitMQ does not compare may differ.
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "q",
        QueueDeclareOptions::default(),
        table(&[
            ("x-message-ttl", AMQPValue::LongInt(1000)),
            ("x-custom", s("anything")),
        ]),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeclare_exclusive_flag_mismatch_is_405() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "shared").await;
    let r = declare_with(
        &ch,
        "shared",
        QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await;
    expect_code(r, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_queue_ignores_durable_on_redeclare() {
    // RabbitMQ declares an exclusive queue as non-durable whatever the
    // durable flag says, so redeclaring it with either flag is equivalent.
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let excl = |durable| QueueDeclareOptions {
        exclusive: true,
        durable,
        ..Default::default()
    };
    declare_with(&ch, "ex", excl(true), FieldTable::default())
        .await
        .unwrap();
    declare_with(&ch, "ex", excl(false), FieldTable::default())
        .await
        .expect("redeclare exclusive queue with durable=false");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_queue_is_locked_to_its_connection() {
    let b = start().await;
    let owner = b.connect().await;
    let och = owner.create_channel().await.unwrap();
    declare_with(
        &och,
        "ex",
        QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    publish(&och, "", "ex", b"m").await;

    let other = b.connect().await;
    // declare (non-passive and passive)
    let ch = other.create_channel().await.unwrap();
    let text = expect_code(
        declare_with(
            &ch,
            "ex",
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await,
        405,
    );
    assert!(text.contains("exclusive"), "{text}");
    let ch = other.create_channel().await.unwrap();
    expect_code(
        declare_with(&ch, "ex", passive(), FieldTable::default()).await,
        405,
    );
    // consume
    let ch = other.create_channel().await.unwrap();
    let r = ch
        .basic_consume(
            "ex".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
    expect_code(r, 405);
    // get
    let ch = other.create_channel().await.unwrap();
    let r = ch.basic_get("ex".into(), BasicGetOptions::default()).await;
    expect_code(r, 405);
    // bind / unbind
    let ch = other.create_channel().await.unwrap();
    let r = ch
        .queue_bind(
            "ex".into(),
            "amq.direct".into(),
            "k".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await;
    expect_code(r, 405);
    // Unbinding a binding that does not exist is unbind-ok, even here
    // (RabbitMQ 3.10 checks exclusivity only for a binding it found; see
    // tests/broker/unbind.rs for the 405).
    let ch = other.create_channel().await.unwrap();
    ch.queue_unbind(
        "ex".into(),
        "amq.direct".into(),
        "k".into(),
        FieldTable::default(),
    )
    .await
    .expect("no such binding");
    // purge
    let ch = other.create_channel().await.unwrap();
    let r = ch
        .queue_purge("ex".into(), QueuePurgeOptions::default())
        .await;
    expect_code(r, 405);
    // delete
    let ch = other.create_channel().await.unwrap();
    let r = ch
        .queue_delete("ex".into(), QueueDeleteOptions::default())
        .await;
    expect_code(r, 405);
    assert!(other.status().connected());

    // Publishing to it from another connection is allowed.
    let ch = other.create_channel().await.unwrap();
    publish(&ch, "", "ex", b"m2").await;
    // The owner still has it, untouched.
    assert_eq!(wait_count(&owner, "ex", 2).await, 2);
    assert_eq!(drain(&och, "ex").await, ["m", "m2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_queue_disappears_with_its_connection() {
    let b = start().await;
    let owner = b.connect().await;
    let och = owner.create_channel().await.unwrap();
    declare_with(
        &och,
        "ex",
        QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    bind(&och, "ex", "amq.fanout", "", FieldTable::default()).await;
    // Closing a channel does not delete it.
    och.close(200, "bye".into()).await.unwrap();
    assert!(queue_exists(&owner, "ex").await);

    let other = b.connect().await;
    owner.close(200, "bye".into()).await.unwrap();
    assert!(queue_gone_eventually(&other, "ex").await);
    // Its name is free again, and its bindings went with it.
    let ch = other.create_channel().await.unwrap();
    declare(&ch, "ex").await;
    publish(&ch, "amq.fanout", "", b"m").await;
    assert!(drain(&ch, "ex").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_delete_queue_goes_when_its_last_consumer_cancels() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let ad = QueueDeclareOptions {
        auto_delete: true,
        ..Default::default()
    };
    declare_with(&ch, "ad", ad, FieldTable::default())
        .await
        .unwrap();
    // Never consumed from: it stays, messages and all.
    publish(&ch, "", "ad", b"m").await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(queue_exists(&c, "ad").await);
    assert_eq!(get_body(&ch, "ad").await.as_deref(), Some(&b"m"[..]));

    let _c1 = consumer(&ch, "ad", "c1").await;
    let _c2 = consumer(&ch, "ad", "c2").await;
    ch.basic_cancel("c1".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    assert!(queue_exists(&c, "ad").await, "one consumer is left");
    ch.basic_cancel("c2".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    assert!(queue_gone_eventually(&c, "ad").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_delete_queue_goes_when_its_consumer_channel_closes() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let ad = QueueDeclareOptions {
        auto_delete: true,
        ..Default::default()
    };
    declare_with(&ch, "ad", ad, FieldTable::default())
        .await
        .unwrap();
    let c2 = b.connect().await;
    let ch2 = c2.create_channel().await.unwrap();
    let _cons = consumer(&ch2, "ad", "c").await;
    c2.close(200, "bye".into()).await.unwrap();
    assert!(queue_gone_eventually(&c, "ad").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_returns_the_number_of_ready_messages() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    for i in 0..5u8 {
        publish(&ch, "", "q", &[i]).await;
    }
    // One message is out, unacked: purge leaves it alone.
    let got = ch
        .basic_get("q".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("message");
    assert_eq!(got.delivery.data, [0]);
    let n = ch
        .queue_purge("q".into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    assert_eq!(n, 4);
    let n = ch
        .queue_purge("q".into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    assert_eq!(n, 0);
    // Closing the channel requeues the unacked one.
    ch.close(200, "bye".into()).await.unwrap();
    let ch = c.create_channel().await.unwrap();
    assert_eq!(wait_count(&c, "q", 1).await, 1);
    let m = ch
        .basic_get("q".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("requeued message");
    assert_eq!(m.delivery.data, [0]);
    assert!(m.delivery.redelivered);
    // Purging a missing queue is 404.
    let r = ch
        .queue_purge("nope".into(), QueuePurgeOptions::default())
        .await;
    expect_code(r, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_returns_the_number_of_messages() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    bind(&ch, "q", "amq.direct", "k", FieldTable::default()).await;
    for i in 0..3u8 {
        publish(&ch, "", "q", &[i]).await;
    }
    let n = ch
        .queue_delete("q".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(n, 3);
    assert!(!queue_exists(&c, "q").await);
    // Deleting a queue that does not exist succeeds with 0 (RabbitMQ 3.x).
    let n = ch
        .queue_delete("q".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(n, 0);
    // A new queue of the same name is empty and unbound.
    declare(&ch, "q").await;
    publish(&ch, "amq.direct", "k", b"x").await;
    assert!(drain(&ch, "q").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_if_unused_and_if_empty() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let cch = c.create_channel().await.unwrap();
    let _cons = consumer(&cch, "q", "c").await;
    let r = ch
        .queue_delete(
            "q".into(),
            QueueDeleteOptions {
                if_unused: true,
                ..Default::default()
            },
        )
        .await;
    let text = expect_code(r, 406);
    assert!(text.contains("in use"), "{text}");
    assert!(queue_exists(&c, "q").await);

    let ch = c.create_channel().await.unwrap();
    declare(&ch, "full").await;
    publish(&ch, "", "full", b"m").await;
    let r = ch
        .queue_delete(
            "full".into(),
            QueueDeleteOptions {
                if_empty: true,
                ..Default::default()
            },
        )
        .await;
    let text = expect_code(r, 406);
    assert!(text.contains("not empty"), "{text}");
    assert!(queue_exists(&c, "full").await);
    assert!(c.status().connected());

    // The conditions met: deleted.
    let ch = c.create_channel().await.unwrap();
    assert_eq!(get_body(&ch, "full").await.as_deref(), Some(&b"m"[..]));
    ch.queue_delete(
        "full".into(),
        QueueDeleteOptions {
            if_empty: true,
            if_unused: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(!queue_exists(&c, "full").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_name_means_the_last_declared_queue() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "other").await;
    declare(&ch, "last").await;
    // bind: "" queue and "" key -> the queue's name as the key.
    ch.queue_bind(
        "".into(),
        "amq.direct".into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    publish(&ch, "amq.direct", "last", b"1").await;
    assert_eq!(drain(&ch, "last").await, ["1"]);
    // get ""
    publish(&ch, "", "last", b"2").await;
    assert_eq!(get_body(&ch, "").await.as_deref(), Some(&b"2"[..]));
    // purge ""
    publish(&ch, "", "last", b"3").await;
    publish(&ch, "", "last", b"4").await;
    let n = ch
        .queue_purge("".into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    assert_eq!(n, 2);
    // consume ""
    let mut cons = consumer(&ch, "", "c").await;
    publish(&ch, "", "last", b"5").await;
    let d = next(&mut cons).await.expect("delivery");
    assert_eq!(d.data, b"5");
    assert_eq!(d.routing_key.as_str(), "last");
    d.ack(BasicAckOptions::default()).await.unwrap();
    ch.basic_cancel("c".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    // delete ""
    publish(&ch, "", "last", b"6").await;
    let n = ch
        .queue_delete("".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert!(!queue_exists(&c, "last").await);
    assert!(queue_exists(&c, "other").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_name_without_a_declared_queue_is_404() {
    let b = start().await;
    let c = b.connect().await;
    declare(&c.create_channel().await.unwrap(), "q").await;
    // The last declared queue is per channel.
    let ch = c.create_channel().await.unwrap();
    let r = ch.basic_get("".into(), BasicGetOptions::default()).await;
    expect_code(r, 404);
    let ch = c.create_channel().await.unwrap();
    let r = ch
        .basic_consume(
            "".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
    expect_code(r, 404);
    let ch = c.create_channel().await.unwrap();
    let r = ch
        .queue_purge("".into(), QueuePurgeOptions::default())
        .await;
    expect_code(r, 404);
    assert!(c.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amq_prefixed_queue_name_is_403() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = declare_with(
        &ch,
        "amq.x",
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await;
    let text = expect_code(r, 403);
    assert_eq!(
        text,
        "ACCESS_REFUSED - queue name 'amq.x' contains reserved prefix 'amq.*'"
    );
    assert!(c.status().connected());
    // A passive declare of such a name is just 404.
    let ch = c.create_channel().await.unwrap();
    expect_code(
        declare_with(&ch, "amq.x", passive(), FieldTable::default()).await,
        404,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_queue_arguments_are_406() {
    let b = start().await;
    let c = b.connect().await;
    let cases: Vec<(&str, AMQPValue)> = vec![
        ("x-message-ttl", s("1000")),
        ("x-message-ttl", AMQPValue::LongInt(-1)),
        ("x-expires", AMQPValue::LongInt(0)),
        ("x-expires", s("10")),
        ("x-max-length", AMQPValue::LongInt(-5)),
        ("x-max-length", s("10")),
        ("x-max-length-bytes", AMQPValue::LongInt(-1)),
        ("x-max-priority", AMQPValue::LongInt(256)),
        ("x-max-priority", AMQPValue::LongInt(-1)),
        ("x-overflow", s("drop-tail")),
        ("x-single-active-consumer", s("true")),
    ];
    for (arg, value) in cases {
        let ch = c.create_channel().await.unwrap();
        let r = declare_with(
            &ch,
            "q",
            QueueDeclareOptions::default(),
            table(&[(arg, value.clone())]),
        )
        .await;
        let text = expect_code(r, 406);
        assert!(text.contains(arg), "{arg}={value:?}: {text}");
        assert!(c.status().connected());
        assert!(!queue_exists(&c, "q").await, "{arg}={value:?} created q");
    }
    // Valid values are accepted.
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "q",
        QueueDeclareOptions::default(),
        table(&[
            ("x-message-ttl", AMQPValue::LongInt(0)),
            ("x-max-length", AMQPValue::ShortShortUInt(3)),
            ("x-max-priority", AMQPValue::LongInt(10)),
            ("x-overflow", s("reject-publish")),
            ("x-single-active-consumer", AMQPValue::Boolean(false)),
        ]),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_queue_mode_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = declare_with(
        &ch,
        "q",
        QueueDeclareOptions::default(),
        table(&[("x-queue-mode", s("bogus"))]),
    )
    .await;
    expect_code(r, 406);
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "q",
        QueueDeclareOptions::default(),
        table(&[("x-queue-mode", s("lazy"))]),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_routing_key_without_exchange_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = declare_with(
        &ch,
        "q",
        QueueDeclareOptions::default(),
        table(&[("x-dead-letter-routing-key", s("k"))]),
    )
    .await;
    expect_code(r, 406);
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "q",
        QueueDeclareOptions::default(),
        table(&[
            ("x-dead-letter-exchange", s("dlx")),
            ("x-dead-letter-routing-key", s("k")),
        ]),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_ttl_expires_messages() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "ttl",
        QueueDeclareOptions::default(),
        table(&[("x-message-ttl", AMQPValue::LongInt(50))]),
    )
    .await
    .unwrap();
    publish(&ch, "", "ttl", b"old").await;
    assert_eq!(
        wait_count(&c, "ttl", 0).await,
        0,
        "message outlived x-message-ttl"
    );
    assert!(get_body(&ch, "ttl").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_length_drops_from_the_head() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare_with(
        &ch,
        "short",
        QueueDeclareOptions::default(),
        table(&[("x-max-length", AMQPValue::LongInt(2))]),
    )
    .await
    .unwrap();
    for m in ["1", "2", "3", "4"] {
        publish(&ch, "", "short", m.as_bytes()).await;
    }
    assert_eq!(drain(&ch, "short").await, ["3", "4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_messages_are_dead_lettered() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "dead").await;
    bind(&ch, "dead", "amq.direct", "dl", FieldTable::default()).await;
    declare_with(
        &ch,
        "work",
        QueueDeclareOptions::default(),
        table(&[
            ("x-dead-letter-exchange", s("amq.direct")),
            ("x-dead-letter-routing-key", s("dl")),
        ]),
    )
    .await
    .unwrap();
    publish(&ch, "", "work", b"bad").await;
    let m = ch
        .basic_get("work".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .unwrap();
    m.delivery
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    assert_eq!(
        get_eventually(&ch, "dead").await.as_deref(),
        Some(&b"bad"[..]),
        "rejected message not dead-lettered"
    );
}
