//! Policies and operator policies, as RabbitMQ applies them: the highest
//! priority of each kind, operator caps taking the lower value, x-arguments
//! winning or taking the lower value by key; applied at once to queues and
//! exchanges that exist (a lowered max-length dead-letters, a new
//! message-ttl expires what is older), durably.

use crate::common;
use crate::helpers;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use helpers::*;
use lapin::{options::*, types::AMQPValue, types::FieldTable};
use serde_json::json;
use warren::broker::policies::PolicySpec;
use warren::broker::Broker;

fn broker(b: &TestBroker) -> &Arc<Broker> {
    &b.server.as_ref().expect("running").broker
}

fn spec(pattern: &str, apply_to: &str, priority: i64, definition: serde_json::Value) -> PolicySpec {
    PolicySpec {
        pattern: pattern.into(),
        apply_to: apply_to.into(),
        priority,
        definition: definition.as_object().unwrap().clone(),
    }
}

fn put(b: &TestBroker, name: &str, s: PolicySpec, operator: bool) {
    broker(b).put_policy("/", name, &s, operator).unwrap();
}

async fn fill(ch: &lapin::Channel, queue: &str, n: usize) {
    for i in 0..n {
        publish(ch, "", queue, format!("m{i}").as_bytes()).await;
    }
    assert_eq!(message_count(ch, queue).await, n as u32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_max_length_dead_letters_the_oldest_of_an_existing_queue_at_once() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "work").await;
    declare(&ch, "dead").await;
    fill(&ch, "work", 5).await;
    // Through the default exchange, to the queue the routing key names.
    put(
        &b,
        "cap",
        spec(
            "^work$",
            "queues",
            0,
            json!({"max-length": 2, "dead-letter-exchange": "", "dead-letter-routing-key": "dead"}),
        ),
        false,
    );
    assert_eq!(message_count(&ch, "work").await, 2);
    assert_eq!(wait_count(&_c, "dead", 3).await, 3);
    assert_eq!(get_body(&ch, "work").await.as_deref(), Some(&b"m3"[..]));
    assert_eq!(get_body(&ch, "dead").await.as_deref(), Some(&b"m0"[..]));
    // Cleared: the queue takes messages again without a limit.
    assert!(broker(&b).delete_policy("/", "cap", false).unwrap());
    for _ in 0..3 {
        publish(&ch, "", "work", b"more").await;
    }
    // One of the two was taken above: 1 + 3.
    assert_eq!(message_count(&ch, "work").await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_message_ttl_expires_what_is_older_than_it() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "old").await;
    fill(&ch, "old", 3).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    put(
        &b,
        "ttl",
        spec("^old$", "queues", 0, json!({"message-ttl": 1000})),
        false,
    );
    assert!(
        eventually_async(|| async { message_count(&ch, "old").await == 0 }).await,
        "messages older than the new TTL expire"
    );
    // A message published now lives for the TTL, then goes too.
    publish(&ch, "", "old", b"new").await;
    assert_eq!(message_count(&ch, "old").await, 1);
    assert!(eventually_async(|| async { message_count(&ch, "old").await == 0 }).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precedence_follows_rabbitmq() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    // Two policies match: the higher priority applies, not both.
    put(
        &b,
        "low",
        spec(".*", "queues", 0, json!({"max-length": 1})),
        false,
    );
    put(
        &b,
        "high",
        spec("^p\\.", "queues", 5, json!({"max-length": 3})),
        false,
    );
    // An operator policy caps at 2: the lower of the two.
    put(
        &b,
        "op",
        spec("^p\\.cap", "queues", 0, json!({"max-length": 2})),
        true,
    );
    declare(&ch, "p.q").await;
    declare(&ch, "p.cap").await;
    declare(&ch, "other").await;
    // The x-argument's lower max-length wins over the policy's.
    declare_with(
        &ch,
        "p.arg",
        QueueDeclareOptions::default(),
        table(&[("x-max-length", AMQPValue::LongInt(1))]),
    )
    .await
    .unwrap();
    for q in ["p.q", "p.cap", "other", "p.arg"] {
        for _ in 0..5 {
            publish(&ch, "", q, b"x").await;
        }
    }
    assert_eq!(message_count(&ch, "p.q").await, 3);
    assert_eq!(message_count(&ch, "p.cap").await, 2);
    assert_eq!(message_count(&ch, "other").await, 1);
    assert_eq!(message_count(&ch, "p.arg").await, 1);
    let q = broker(&b).vhost("/").unwrap().queue("p.cap").unwrap();
    assert_eq!(
        q.policies(),
        (Some("high".to_string()), Some("op".to_string()))
    );
    // The x-argument's dead-letter-exchange wins over the policy's.
    declare(&ch, "mine").await;
    declare(&ch, "theirs").await;
    put(
        &b,
        "dlx",
        spec(
            "^dl$",
            "queues",
            9,
            json!({"dead-letter-exchange": "", "dead-letter-routing-key": "theirs"}),
        ),
        false,
    );
    declare_with(
        &ch,
        "dl",
        QueueDeclareOptions::default(),
        table(&[
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s("mine")),
        ]),
    )
    .await
    .unwrap();
    publish(&ch, "", "dl", b"rejected").await;
    let m = ch
        .basic_get("dl".into(), BasicGetOptions::default())
        .await
        .unwrap()
        .expect("a message");
    m.delivery
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    assert_eq!(wait_count(&_c, "mine", 1).await, 1);
    assert_eq!(message_count(&ch, "theirs").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_policy_gives_an_alternate_exchange_and_policies_survive_a_restart() {
    let mut b = start().await;
    let (_c, ch) = b.channel().await;
    ch.exchange_declare(
        "in".into(),
        lapin::ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_declare(
        "unrouted".into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    bind(&ch, "unrouted", "amq.fanout", "", FieldTable::default()).await;
    put(
        &b,
        "ae",
        spec(
            "^in$",
            "exchanges",
            0,
            json!({"alternate-exchange": "amq.fanout"}),
        ),
        false,
    );
    put(
        &b,
        "len",
        spec("^unrouted$", "queues", 0, json!({"max-length": 2})),
        false,
    );
    publish(&ch, "in", "nowhere", b"a").await;
    assert_eq!(wait_count(&_c, "unrouted", 1).await, 1);
    drop(ch);
    drop(_c);
    b.restart().await;
    let (c, ch) = b.channel().await;
    for _ in 0..3 {
        publish(&ch, "in", "nowhere", b"b").await;
    }
    assert_eq!(
        wait_count(&c, "unrouted", 2).await,
        2,
        "both policies hold after a restart"
    );
    let vh = broker(&b).vhost("/").unwrap();
    assert_eq!(
        vh.exchange("in").unwrap().policy.read().name.as_deref(),
        Some("ae")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_expires_unused_queues_and_bad_policies_are_refused() {
    let b = start().await;
    let (c, ch) = b.channel().await;
    declare(&ch, "tmp.1").await;
    put(
        &b,
        "exp",
        spec("^tmp\\.", "queues", 0, json!({"expires": 200})),
        false,
    );
    assert!(queue_gone_eventually(&c, "tmp.1").await);
    let bad = broker(&b)
        .put_policy(
            "/",
            "x",
            &spec(".*", "queues", 0, json!({"max-length": "ten"})),
            false,
        )
        .unwrap_err();
    assert!(bad.text.contains("max-length"), "{}", bad.text);
    let bad = broker(&b)
        .put_policy(
            "/",
            "x",
            &spec(".*", "queues", 0, json!({"dead-letter-exchange": "d"})),
            true,
        )
        .unwrap_err();
    assert!(bad.text.contains("operator policy"), "{}", bad.text);
    assert!(broker(&b).vhost("/").unwrap().policies().list().len() == 1);
}

/// Polls an async condition for up to 5 s.
async fn eventually_async<F, Fut>(mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_set_after_a_restart_counts_from_when_recovered_messages_arrived() {
    let mut b = start().await;
    let (c, ch) = b.channel().await;
    ch.queue_declare(
        "kept".into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    ch.basic_publish(
        "".into(),
        "kept".into(),
        BasicPublishOptions::default(),
        b"persistent",
        persistent(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    drop(ch);
    drop(c);
    b.restart().await;
    // A day-long TTL must not expire a message a moment old.
    put(
        &b,
        "day",
        spec("^kept$", "queues", 0, json!({"message-ttl": 86_400_000})),
        false,
    );
    let (_c, ch) = b.channel().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(message_count(&ch, "kept").await, 1);
}
