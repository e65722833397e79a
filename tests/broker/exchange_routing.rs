//! Exchanges and routing: direct, fanout, topic, headers, the default and
//! amq.* exchanges, exchange-to-exchange bindings, alternate exchanges,
//! auto-delete, mandatory returns, and the errors exchange methods raise.

use crate::common;
use crate::helpers;

use common::*;
use helpers::{
    bind, channel_closed, connection_closed, drain, exchange, exchange_exists, expect_code,
    publish_with, queue_exists, reply_text, s, table, Errors,
};
use lapin::{
    options::*,
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, ExchangeKind,
};

fn xopts() -> ExchangeDeclareOptions {
    ExchangeDeclareOptions::default()
}

/// Publishes `body` and returns, per queue in `queues`, whether it got it
/// (basic.get on the same channel, which is ordered after the publish).
async fn routed_to(
    ch: &Channel,
    exchange: &str,
    key: &str,
    props: BasicProperties,
    queues: &[&str],
) -> Vec<String> {
    publish_with(
        ch,
        exchange,
        key,
        BasicPublishOptions::default(),
        key.as_bytes(),
        props,
    )
    .await;
    let mut got = Vec::new();
    for q in queues {
        let bodies = drain(ch, q).await;
        assert!(
            bodies.len() <= 1,
            "queue {q} got {bodies:?} for one publish"
        );
        if !bodies.is_empty() {
            got.push(q.to_string());
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_exchange_routes_by_exact_key() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "d",
        ExchangeKind::Direct,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    for q in ["q1", "q2", "q3"] {
        declare(&ch, q).await;
    }
    bind(&ch, "q1", "d", "a", FieldTable::default()).await;
    bind(&ch, "q2", "d", "b", FieldTable::default()).await;
    bind(&ch, "q3", "d", "a", FieldTable::default()).await;
    // The same binding twice is one binding.
    bind(&ch, "q3", "d", "a", FieldTable::default()).await;
    let all = ["q1", "q2", "q3"];
    let p = BasicProperties::default;
    assert_eq!(routed_to(&ch, "d", "a", p(), &all).await, ["q1", "q3"]);
    assert_eq!(routed_to(&ch, "d", "b", p(), &all).await, ["q2"]);
    assert!(routed_to(&ch, "d", "c", p(), &all).await.is_empty());
    assert!(routed_to(&ch, "d", "A", p(), &all).await.is_empty());
    assert!(routed_to(&ch, "d", "", p(), &all).await.is_empty());

    // Unbinding stops the routing.
    ch.queue_unbind("q1".into(), "d".into(), "a".into(), FieldTable::default())
        .await
        .unwrap();
    assert_eq!(routed_to(&ch, "d", "a", p(), &all).await, ["q3"]);
    // Unbinding something that is not bound is fine.
    ch.queue_unbind("q1".into(), "d".into(), "zz".into(), FieldTable::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_message_carries_exchange_and_routing_key() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    bind(&ch, "q", "amq.direct", "k1", FieldTable::default()).await;
    publish(&ch, "amq.direct", "k1", b"m").await;
    let m = ch
        .basic_get("q".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("message");
    assert_eq!(m.delivery.exchange.as_str(), "amq.direct");
    assert_eq!(m.delivery.routing_key.as_str(), "k1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_exchange_ignores_the_key() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "f",
        ExchangeKind::Fanout,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    for q in ["q1", "q2", "other"] {
        declare(&ch, q).await;
    }
    bind(&ch, "q1", "f", "", FieldTable::default()).await;
    bind(&ch, "q2", "f", "whatever", FieldTable::default()).await;
    let all = ["q1", "q2", "other"];
    for key in ["", "x", "a.b.c"] {
        assert_eq!(
            routed_to(&ch, "f", key, BasicProperties::default(), &all).await,
            ["q1", "q2"],
            "key {key:?}"
        );
    }
    // amq.fanout works the same.
    bind(&ch, "other", "amq.fanout", "", FieldTable::default()).await;
    assert_eq!(
        routed_to(&ch, "amq.fanout", "zz", BasicProperties::default(), &all).await,
        ["other"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_exchange_wildcards() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "t",
        ExchangeKind::Topic,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let patterns = [
        "a.*", "a.#", "#", "*.b.*", "#.z", "*", "a.*.c", "a.#.c", "a.b",
    ];
    for p in patterns {
        declare(&ch, p).await;
        bind(&ch, p, "t", p, FieldTable::default()).await;
    }
    let cases: &[(&str, &[&str])] = &[
        ("a.b", &["a.*", "a.#", "#", "a.b"]),
        ("a", &["a.#", "#", "*"]),
        ("a.b.c", &["a.#", "#", "*.b.*", "a.*.c", "a.#.c"]),
        ("x.b.z", &["#", "*.b.*", "#.z"]),
        ("z", &["#", "#.z", "*"]),
        ("a.c", &["a.*", "a.#", "#", "a.#.c"]),
        ("a.x.y.c", &["a.#", "#", "a.#.c"]),
        ("b.a.c", &["#"]),
        ("", &["#"]),
        ("A.b", &["#"]),
        ("a.b.c.z", &["a.#", "#", "#.z"]),
    ];
    for (key, expected) in cases {
        let got = routed_to(&ch, "t", key, BasicProperties::default(), &patterns).await;
        let mut expected: Vec<&str> = expected.to_vec();
        let order = |s: &str| patterns.iter().position(|p| *p == s).unwrap();
        expected.sort_by_key(|s| order(s));
        assert_eq!(got, expected, "routing key {key:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_several_bindings_deliver_once() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    for p in ["a.*", "*.b", "#", "a.b"] {
        bind(&ch, "q", "amq.topic", p, FieldTable::default()).await;
    }
    publish(&ch, "amq.topic", "a.b", b"once").await;
    assert_eq!(drain(&ch, "q").await, ["once"]);

    // Unbinding one of them leaves the others working.
    ch.queue_unbind(
        "q".into(),
        "amq.topic".into(),
        "#".into(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    publish(&ch, "amq.topic", "x.y", b"none").await;
    publish(&ch, "amq.topic", "a.x", b"ax").await;
    assert_eq!(drain(&ch, "q").await, ["ax"]);
}

fn headers(pairs: &[(&str, &str)]) -> BasicProperties {
    let t = table(&pairs.iter().map(|(k, v)| (*k, s(v))).collect::<Vec<_>>());
    BasicProperties::default().with_headers(t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_exchange_all_and_any() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "h",
        ExchangeKind::Headers,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let bindings: [(&str, FieldTable); 5] = [
        (
            "all",
            table(&[("x-match", s("all")), ("a", s("1")), ("b", s("2"))]),
        ),
        (
            "any",
            table(&[("x-match", s("any")), ("a", s("1")), ("b", s("2"))]),
        ),
        ("default", table(&[("a", s("1")), ("b", s("2"))])),
        ("empty", table(&[("x-match", s("all"))])),
        (
            "xkeys",
            table(&[("x-match", s("all")), ("x-other", s("z")), ("a", s("1"))]),
        ),
    ];
    let names: Vec<&str> = bindings.iter().map(|(n, _)| *n).collect();
    for (q, args) in &bindings {
        declare(&ch, q).await;
        bind(&ch, q, "h", "", args.clone()).await;
    }
    // (message headers, queues expected to receive it)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: &[Case] = &[
        (
            &[("a", "1"), ("b", "2")],
            &["all", "any", "default", "empty", "xkeys"],
        ),
        (
            &[("a", "1"), ("b", "2"), ("c", "3")],
            &["all", "any", "default", "empty", "xkeys"],
        ),
        (&[("a", "1")], &["any", "empty", "xkeys"]),
        (&[("b", "2")], &["any", "empty"]),
        (&[("a", "1"), ("b", "3")], &["any", "empty", "xkeys"]),
        (&[("a", "2"), ("b", "1")], &["empty"]),
        (&[("c", "1")], &["empty"]),
    ];
    for (hdrs, expected) in cases {
        let got = routed_to(&ch, "h", "ignored", headers(hdrs), &names).await;
        assert_eq!(got, *expected, "headers {hdrs:?}");
    }
    // No headers at all: only the binding without keys matches.
    let got = routed_to(&ch, "h", "k", BasicProperties::default(), &names).await;
    assert_eq!(got, ["empty"]);
    // The value's type matters: the integer 1 is not the string "1".
    let p = BasicProperties::default()
        .with_headers(table(&[("a", AMQPValue::LongInt(1)), ("b", s("2"))]));
    let got = routed_to(&ch, "h", "k", p, &names).await;
    assert_eq!(got, ["any", "empty"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_unbind_needs_the_same_arguments() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    let args = table(&[("x-match", s("any")), ("k", s("v"))]);
    bind(&ch, "q", "amq.headers", "", args.clone()).await;
    let p = || headers(&[("k", "v")]);
    assert_eq!(routed_to(&ch, "amq.headers", "", p(), &["q"]).await, ["q"]);
    // Other arguments name another binding: nothing is removed.
    ch.queue_unbind(
        "q".into(),
        "amq.headers".into(),
        "".into(),
        table(&[("x-match", s("any")), ("k", s("w"))]),
    )
    .await
    .unwrap();
    assert_eq!(routed_to(&ch, "amq.headers", "", p(), &["q"]).await, ["q"]);
    ch.queue_unbind("q".into(), "amq.headers".into(), "".into(), args)
        .await
        .unwrap();
    assert!(routed_to(&ch, "amq.headers", "", p(), &["q"])
        .await
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_exchange_routes_by_queue_name() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q1").await;
    declare(&ch, "q2").await;
    let all = ["q1", "q2"];
    let p = BasicProperties::default;
    assert_eq!(routed_to(&ch, "", "q1", p(), &all).await, ["q1"]);
    assert_eq!(routed_to(&ch, "", "q2", p(), &all).await, ["q2"]);
    assert!(routed_to(&ch, "", "nope", p(), &all).await.is_empty());
    // The default exchange cannot be bound to.
    let r = ch
        .queue_bind(
            "q1".into(),
            "".into(),
            "x".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await;
    let text = expect_code(r, 403);
    assert!(text.contains("default exchange"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_exchange_cannot_be_declared_or_deleted() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = exchange(
        &ch,
        "",
        ExchangeKind::Direct,
        xopts(),
        FieldTable::default(),
    )
    .await;
    expect_code(r, 403);
    let ch = c.create_channel().await.unwrap();
    let r = ch
        .exchange_delete("".into(), ExchangeDeleteOptions::default())
        .await;
    expect_code(r, 403);
    assert!(c.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amq_exchanges_exist_with_their_types() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    for (name, kind) in [
        ("amq.direct", ExchangeKind::Direct),
        ("amq.fanout", ExchangeKind::Fanout),
        ("amq.topic", ExchangeKind::Topic),
        ("amq.headers", ExchangeKind::Headers),
        ("amq.match", ExchangeKind::Headers),
    ] {
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..xopts()
        };
        exchange(&ch, name, kind.clone(), passive, FieldTable::default())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        // An equivalent (durable) redeclare is allowed.
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..xopts()
        };
        exchange(&ch, name, kind, durable, FieldTable::default())
            .await
            .unwrap_or_else(|e| panic!("redeclare {name}: {e:?}"));
    }
    // Redeclaring one with another type is inequivalent.
    let r = exchange(
        &ch,
        "amq.direct",
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..xopts()
        },
        FieldTable::default(),
    )
    .await;
    expect_code(r, 406);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amq_rabbitmq_trace_exists_and_is_internal() {
    // Every RabbitMQ vhost has the firehose exchange amq.rabbitmq.trace
    // (topic, durable, internal).
    let b = start().await;
    let c = b.connect().await;
    assert!(exchange_exists(&c, "amq.rabbitmq.trace").await);
    let ch = c.create_channel().await.unwrap();
    exchange(
        &ch,
        "amq.rabbitmq.trace",
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            internal: true,
            ..xopts()
        },
        FieldTable::default(),
    )
    .await
    .expect("equivalent redeclare of amq.rabbitmq.trace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_to_exchange_bindings() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "src",
        ExchangeKind::Direct,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    exchange(
        &ch,
        "dst",
        ExchangeKind::Fanout,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    exchange(
        &ch,
        "top",
        ExchangeKind::Topic,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    declare(&ch, "qd").await;
    declare(&ch, "qs").await;
    declare(&ch, "qt").await;
    bind(&ch, "qd", "dst", "", FieldTable::default()).await;
    bind(&ch, "qs", "src", "k", FieldTable::default()).await;
    ch.exchange_bind(
        "dst".into(),
        "src".into(),
        "k".into(),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let all = ["qd", "qs", "qt"];
    let p = BasicProperties::default;
    assert_eq!(routed_to(&ch, "src", "k", p(), &all).await, ["qd", "qs"]);
    assert!(routed_to(&ch, "src", "other", p(), &all).await.is_empty());
    // Publishing to the destination directly works as usual.
    assert_eq!(routed_to(&ch, "dst", "zzz", p(), &all).await, ["qd"]);

    // A chain: top -(a.#)-> src -(k)-> dst. The routing key is kept.
    bind(&ch, "qt", "top", "#", FieldTable::default()).await;
    ch.exchange_bind(
        "src".into(),
        "top".into(),
        "#".into(),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        routed_to(&ch, "top", "k", p(), &all).await,
        ["qd", "qs", "qt"]
    );

    // A cycle still delivers each message once per queue.
    ch.exchange_bind(
        "top".into(),
        "dst".into(),
        "".into(),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        routed_to(&ch, "src", "k", p(), &all).await,
        ["qd", "qs", "qt"]
    );

    // Unbinding src -> dst stops that path.
    ch.exchange_unbind(
        "dst".into(),
        "src".into(),
        "k".into(),
        ExchangeUnbindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    assert_eq!(routed_to(&ch, "src", "k", p(), &all).await, ["qs"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_bind_to_missing_exchange_is_404() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = ch
        .exchange_bind(
            "nope".into(),
            "amq.direct".into(),
            "k".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await;
    expect_code(r, 404);
    let ch = c.create_channel().await.unwrap();
    let r = ch
        .exchange_bind(
            "amq.direct".into(),
            "nope".into(),
            "k".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await;
    expect_code(r, 404);
    // queue.bind: missing exchange, missing queue.
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let r = ch
        .queue_bind(
            "q".into(),
            "nope".into(),
            "k".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await;
    expect_code(r, 404);
    let ch = c.create_channel().await.unwrap();
    let r = ch
        .queue_bind(
            "nope".into(),
            "amq.direct".into(),
            "k".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await;
    expect_code(r, 404);
    assert!(c.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternate_exchange_takes_unroutable_messages() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "ae",
        ExchangeKind::Fanout,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    exchange(
        &ch,
        "main",
        ExchangeKind::Direct,
        xopts(),
        table(&[("alternate-exchange", s("ae"))]),
    )
    .await
    .unwrap();
    declare(&ch, "routed").await;
    declare(&ch, "unrouted").await;
    bind(&ch, "routed", "main", "good", FieldTable::default()).await;
    bind(&ch, "unrouted", "ae", "", FieldTable::default()).await;
    let all = ["routed", "unrouted"];
    let p = BasicProperties::default;
    assert_eq!(routed_to(&ch, "main", "good", p(), &all).await, ["routed"]);
    assert_eq!(routed_to(&ch, "main", "bad", p(), &all).await, ["unrouted"]);

    // The message keeps its original exchange and routing key.
    publish(&ch, "main", "bad2", b"x").await;
    let m = ch
        .basic_get("unrouted".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("message in the alternate exchange's queue");
    assert_eq!(m.delivery.exchange.as_str(), "main");
    assert_eq!(m.delivery.routing_key.as_str(), "bad2");

    // Mandatory publish routed through the alternate exchange is not returned.
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let confirm = publish_with(
        &ch,
        "main",
        "bad3",
        BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        },
        b"m",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    assert!(confirm.is_ack());
    assert!(confirm.take_message().is_none(), "message was returned");
    assert_eq!(drain(&ch, "unrouted").await, ["m"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternate_exchange_that_routes_nowhere_returns_mandatory() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "ae",
        ExchangeKind::Fanout,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    exchange(
        &ch,
        "main",
        ExchangeKind::Direct,
        xopts(),
        table(&[("alternate-exchange", s("ae"))]),
    )
    .await
    .unwrap();
    // An alternate exchange that does not exist is fine too.
    exchange(
        &ch,
        "main2",
        ExchangeKind::Direct,
        xopts(),
        table(&[("alternate-exchange", s("missing"))]),
    )
    .await
    .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for x in ["main", "main2"] {
        let confirm = publish_with(
            &ch,
            x,
            "k",
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"m",
            BasicProperties::default(),
        )
        .await
        .await
        .unwrap();
        assert!(confirm.is_ack());
        let ret = confirm.take_message().expect("returned");
        assert_eq!(ret.reply_code, 312, "{x}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeclare_with_different_alternate_exchange_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    exchange(
        &ch,
        "x",
        ExchangeKind::Direct,
        xopts(),
        table(&[("alternate-exchange", s("ae1"))]),
    )
    .await
    .unwrap();
    let r = exchange(
        &ch,
        "x",
        ExchangeKind::Direct,
        xopts(),
        table(&[("alternate-exchange", s("ae2"))]),
    )
    .await;
    let text = expect_code(r, 406);
    assert!(
        text.contains("inequivalent arg 'alternate-exchange'"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_declare_of_missing_exchange_is_404() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = exchange(
        &ch,
        "nope",
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            passive: true,
            ..xopts()
        },
        FieldTable::default(),
    )
    .await;
    let text = expect_code(r, 404);
    assert_eq!(text, "NOT_FOUND - no exchange 'nope' in vhost '/'");
    assert!(channel_closed(&ch).await);
    assert!(c.status().connected());
    // The connection keeps working.
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    publish(&ch, "", "q", b"ok").await;
    assert_eq!(get_body(&ch, "q").await.as_deref(), Some(&b"ok"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeclare_with_different_type_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    exchange(
        &ch,
        "x",
        ExchangeKind::Direct,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    // Same type and flags: fine.
    exchange(
        &ch,
        "x",
        ExchangeKind::Direct,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let r = exchange(
        &ch,
        "x",
        ExchangeKind::Topic,
        xopts(),
        FieldTable::default(),
    )
    .await;
    let text = expect_code(r, 406);
    assert!(text.contains("inequivalent arg 'type'"), "{text}");
    assert!(c.status().connected());

    let ch = c.create_channel().await.unwrap();
    let r = exchange(
        &ch,
        "x",
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..xopts()
        },
        FieldTable::default(),
    )
    .await;
    let text = expect_code(r, 406);
    assert!(text.contains("inequivalent arg 'durable'"), "{text}");

    let ch = c.create_channel().await.unwrap();
    let r = exchange(
        &ch,
        "x",
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            auto_delete: true,
            ..xopts()
        },
        FieldTable::default(),
    )
    .await;
    let text = expect_code(r, 406);
    assert!(text.contains("inequivalent arg 'auto_delete'"), "{text}");

    // A passive declare does not compare anything.
    let ch = c.create_channel().await.unwrap();
    exchange(
        &ch,
        "x",
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            passive: true,
            durable: true,
            ..xopts()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_amq_prefixed_exchange_is_403() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = exchange(
        &ch,
        "amq.foo",
        ExchangeKind::Direct,
        xopts(),
        FieldTable::default(),
    )
    .await;
    let text = expect_code(r, 403);
    assert!(text.contains("amq."), "{text}");
    assert!(c.status().connected());
    assert!(!exchange_exists(&c, "amq.foo").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_amq_direct_is_403() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = ch
        .exchange_delete("amq.direct".into(), ExchangeDeleteOptions::default())
        .await;
    expect_code(r, 403);
    assert!(c.status().connected());
    assert!(exchange_exists(&c, "amq.direct").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_to_an_internal_exchange_is_403() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    exchange(
        &ch,
        "int",
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            internal: true,
            ..xopts()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    // An internal exchange still routes what other exchanges send it.
    declare(&ch, "q").await;
    bind(&ch, "q", "int", "", FieldTable::default()).await;
    ch.exchange_bind(
        "int".into(),
        "amq.direct".into(),
        "k".into(),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    publish(&ch, "amq.direct", "k", b"via").await;
    assert_eq!(drain(&ch, "q").await, ["via"]);

    let mut errors = Errors::new(&c);
    publish(&ch, "int", "", b"direct").await;
    let e = errors.next_error().await.expect("channel error");
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    assert!(channel_closed(&ch).await);
    assert!(c.status().connected());
    let ch = c.create_channel().await.unwrap();
    assert!(drain(&ch, "q").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_to_a_missing_exchange_closes_the_channel_only() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let mut errors = Errors::new(&c);
    publish(&ch, "nope", "k", b"x").await;
    let e = errors.next_error().await.expect("channel error");
    assert_eq!(reply_code(&e), Some(404), "{e:?}");
    assert_eq!(
        reply_text(&e).unwrap(),
        "NOT_FOUND - no exchange 'nope' in vhost '/'"
    );
    assert!(channel_closed(&ch).await);
    assert!(c.status().connected());

    // New channels on the same connection work.
    let ch2 = c.create_channel().await.unwrap();
    declare(&ch2, "q").await;
    publish(&ch2, "", "q", b"fine").await;
    assert_eq!(get_body(&ch2, "q").await.as_deref(), Some(&b"fine"[..]));

    // With confirms the publish's confirm fails too.
    let ch3 = c.create_channel().await.unwrap();
    ch3.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let confirm = publish_with(
        &ch3,
        "nope",
        "k",
        BasicPublishOptions::default(),
        b"x",
        BasicProperties::default(),
    )
    .await
    .await;
    assert!(confirm.is_err() || confirm.unwrap().is_nack());
    assert!(channel_closed(&ch3).await);
    assert!(c.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_delete_if_unused() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    exchange(
        &ch,
        "x",
        ExchangeKind::Direct,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    declare(&ch, "q").await;
    bind(&ch, "q", "x", "k", FieldTable::default()).await;
    let r = ch
        .exchange_delete(
            "x".into(),
            ExchangeDeleteOptions {
                if_unused: true,
                ..Default::default()
            },
        )
        .await;
    let text = expect_code(r, 406);
    assert!(text.contains("in use"), "{text}");
    assert!(c.status().connected());
    assert!(exchange_exists(&c, "x").await);

    // Once unbound, if-unused deletion succeeds.
    let ch = c.create_channel().await.unwrap();
    ch.queue_unbind("q".into(), "x".into(), "k".into(), FieldTable::default())
        .await
        .unwrap();
    ch.exchange_delete(
        "x".into(),
        ExchangeDeleteOptions {
            if_unused: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(!exchange_exists(&c, "x").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_delete_if_unused_ignores_bindings_to_it() {
    // Only bindings where the exchange is the source make it "in use".
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    exchange(
        &ch,
        "x",
        ExchangeKind::Direct,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.exchange_bind(
        "x".into(),
        "amq.direct".into(),
        "k".into(),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.exchange_delete(
        "x".into(),
        ExchangeDeleteOptions {
            if_unused: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(!exchange_exists(&c, "x").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_delete_removes_bindings_and_missing_is_ok() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    exchange(
        &ch,
        "x",
        ExchangeKind::Fanout,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    declare(&ch, "q").await;
    bind(&ch, "q", "x", "", FieldTable::default()).await;
    ch.exchange_delete("x".into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    // Deleting an exchange that does not exist succeeds (RabbitMQ 3.x).
    ch.exchange_delete("x".into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    // A new exchange of the same name starts without the old bindings.
    exchange(
        &ch,
        "x",
        ExchangeKind::Fanout,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    publish(&ch, "x", "", b"m").await;
    assert!(drain(&ch, "q").await.is_empty());
    // The queue survives the exchange.
    assert!(queue_exists(&c, "q").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_delete_exchange_goes_with_its_last_binding() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let ad = ExchangeDeclareOptions {
        auto_delete: true,
        ..xopts()
    };
    exchange(&ch, "ax", ExchangeKind::Direct, ad, FieldTable::default())
        .await
        .unwrap();
    // Never bound: it stays.
    assert!(exchange_exists(&c, "ax").await);
    declare(&ch, "q1").await;
    declare(&ch, "q2").await;
    bind(&ch, "q1", "ax", "a", FieldTable::default()).await;
    bind(&ch, "q2", "ax", "b", FieldTable::default()).await;
    ch.queue_unbind("q1".into(), "ax".into(), "a".into(), FieldTable::default())
        .await
        .unwrap();
    assert!(exchange_exists(&c, "ax").await, "one binding is left");
    ch.queue_unbind("q2".into(), "ax".into(), "b".into(), FieldTable::default())
        .await
        .unwrap();
    assert!(!exchange_exists(&c, "ax").await);

    // Deleting the bound queue removes the binding, and so the exchange.
    exchange(&ch, "ay", ExchangeKind::Fanout, ad, FieldTable::default())
        .await
        .unwrap();
    bind(&ch, "q1", "ay", "", FieldTable::default()).await;
    ch.queue_delete("q1".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert!(!exchange_exists(&c, "ay").await);

    // Exchange-to-exchange: removing its last (source) binding deletes it.
    exchange(&ch, "az", ExchangeKind::Fanout, ad, FieldTable::default())
        .await
        .unwrap();
    ch.exchange_bind(
        "amq.fanout".into(),
        "az".into(),
        "".into(),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.exchange_unbind(
        "amq.fanout".into(),
        "az".into(),
        "".into(),
        ExchangeUnbindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    assert!(!exchange_exists(&c, "az").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_publish_without_route_is_returned() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare(&ch, "q").await;
    let props = BasicProperties::default().with_message_id("id-1".into());
    let confirm = publish_with(
        &ch,
        "amq.direct",
        "unbound",
        BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        },
        b"lost",
        props.clone(),
    )
    .await
    .await
    .unwrap();
    assert!(confirm.is_ack());
    let ret = confirm.take_message().expect("basic.return");
    assert_eq!(ret.reply_code, 312);
    assert_eq!(ret.reply_text.as_str(), "NO_ROUTE");
    assert_eq!(ret.delivery.exchange.as_str(), "amq.direct");
    assert_eq!(ret.delivery.routing_key.as_str(), "unbound");
    assert_eq!(ret.delivery.data, b"lost");
    assert_eq!(ret.delivery.properties.message_id(), props.message_id());

    // Default exchange, no such queue: returned too.
    let confirm = publish_with(
        &ch,
        "",
        "no-such-queue",
        BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        },
        b"lost2",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    let ret = confirm.take_message().expect("basic.return");
    assert_eq!(ret.reply_code, 312);

    // Routable mandatory: not returned.
    let confirm = publish_with(
        &ch,
        "",
        "q",
        BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        },
        b"kept",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    assert!(confirm.is_ack());
    assert!(confirm.take_message().is_none());
    // Unroutable non-mandatory: dropped silently.
    let confirm = publish_with(
        &ch,
        "amq.direct",
        "unbound",
        BasicPublishOptions::default(),
        b"dropped",
        BasicProperties::default(),
    )
    .await
    .await
    .unwrap();
    assert!(confirm.is_ack());
    assert!(confirm.take_message().is_none());
    assert_eq!(drain(&ch, "q").await, ["kept"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_exchange_type_closes_the_connection_with_503() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    let r = exchange(
        &ch,
        "x",
        ExchangeKind::Custom("no-such-type".into()),
        xopts(),
        FieldTable::default(),
    )
    .await;
    let text = expect_code(r, 503);
    assert!(text.contains("exchange type"), "{text}");
    assert!(connection_closed(&c).await);
    // Nothing was declared.
    let c2 = b.connect().await;
    assert!(!exchange_exists(&c2, "x").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternate_exchanges_chain() {
    // main (AE ae1, no bindings) -> ae1 (AE ae2, no bindings) -> ae2 -> q.
    let b = start().await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "ae2",
        ExchangeKind::Fanout,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    exchange(
        &ch,
        "ae1",
        ExchangeKind::Direct,
        xopts(),
        table(&[("alternate-exchange", s("ae2"))]),
    )
    .await
    .unwrap();
    exchange(
        &ch,
        "main",
        ExchangeKind::Direct,
        xopts(),
        table(&[("alternate-exchange", s("ae1"))]),
    )
    .await
    .unwrap();
    declare(&ch, "q").await;
    bind(&ch, "q", "ae2", "", FieldTable::default()).await;
    assert_eq!(
        routed_to(&ch, "main", "k", BasicProperties::default(), &["q"]).await,
        ["q"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternate_exchange_not_used_when_routed_to_an_exchange() {
    // RabbitMQ uses an exchange's alternate exchange only when the exchange
    // itself matched no binding at all. A binding to another exchange is a
    // match, even if that exchange then routes nowhere.
    let b = start().await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "ae",
        ExchangeKind::Fanout,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    exchange(
        &ch,
        "empty",
        ExchangeKind::Fanout,
        xopts(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    exchange(
        &ch,
        "main",
        ExchangeKind::Direct,
        xopts(),
        table(&[("alternate-exchange", s("ae"))]),
    )
    .await
    .unwrap();
    declare(&ch, "aeq").await;
    bind(&ch, "aeq", "ae", "", FieldTable::default()).await;
    ch.exchange_bind(
        "empty".into(),
        "main".into(),
        "k".into(),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    // "k" matches the binding to "empty": not sent to the alternate exchange.
    assert!(
        routed_to(&ch, "main", "k", BasicProperties::default(), &["aeq"])
            .await
            .is_empty(),
        "message matched a binding of main but went to its alternate exchange"
    );
    // Another key matches nothing: alternate exchange.
    assert_eq!(
        routed_to(&ch, "main", "other", BasicProperties::default(), &["aeq"]).await,
        ["aeq"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_binding_with_invalid_x_match_is_406() {
    let b = start().await;
    let c = b.connect().await;
    let ch = c.create_channel().await.unwrap();
    declare(&ch, "q").await;
    let r = ch
        .queue_bind(
            "q".into(),
            "amq.headers".into(),
            "".into(),
            QueueBindOptions::default(),
            table(&[("x-match", s("bogus")), ("a", s("1"))]),
        )
        .await;
    let text = expect_code(r, 406);
    assert!(text.contains("x-match"), "{text}");
    assert!(c.status().connected());

    let ch = c.create_channel().await.unwrap();
    let r = ch
        .queue_bind(
            "q".into(),
            "amq.headers".into(),
            "".into(),
            QueueBindOptions::default(),
            table(&[("x-match", AMQPValue::LongInt(1)), ("a", s("1"))]),
        )
        .await;
    expect_code(r, 406);

    // Nothing was bound.
    let ch = c.create_channel().await.unwrap();
    publish_with(
        &ch,
        "amq.headers",
        "",
        BasicPublishOptions::default(),
        b"m",
        headers(&[("a", "1")]),
    )
    .await;
    assert!(drain(&ch, "q").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_with_different_arguments_are_distinct() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "q").await;
    let args = table(&[("tag", s("one"))]);
    bind(&ch, "q", "amq.direct", "k", FieldTable::default()).await;
    bind(&ch, "q", "amq.direct", "k", args.clone()).await;
    // Two bindings, one delivery.
    let p = BasicProperties::default;
    assert_eq!(routed_to(&ch, "amq.direct", "k", p(), &["q"]).await, ["q"]);
    // Removing the binding without arguments leaves the other one.
    ch.queue_unbind(
        "q".into(),
        "amq.direct".into(),
        "k".into(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    assert_eq!(routed_to(&ch, "amq.direct", "k", p(), &["q"]).await, ["q"]);
    ch.queue_unbind("q".into(), "amq.direct".into(), "k".into(), args)
        .await
        .unwrap();
    assert!(routed_to(&ch, "amq.direct", "k", p(), &["q"])
        .await
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_empty_words_and_repeated_hashes() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    let patterns = ["", "*.*", "#.#", "a.*.c", "a.#.#.c", "*.#"];
    for p in patterns {
        let q = format!("q[{p}]");
        declare(&ch, &q).await;
        bind(&ch, &q, "amq.topic", p, FieldTable::default()).await;
    }
    let queues: Vec<String> = patterns.iter().map(|p| format!("q[{p}]")).collect();
    let queues: Vec<&str> = queues.iter().map(|s| s.as_str()).collect();
    let cases: &[(&str, &[&str])] = &[
        ("", &["", "#.#"]),
        ("a..c", &["#.#", "a.*.c", "a.#.#.c", "*.#"]),
        (".", &["*.*", "#.#", "*.#"]),
        ("a.c", &["*.*", "#.#", "a.#.#.c", "*.#"]),
        ("a", &["#.#", "*.#"]),
    ];
    for (key, expected) in cases {
        let got = routed_to(&ch, "amq.topic", key, BasicProperties::default(), &queues).await;
        let expected: Vec<String> = expected.iter().map(|p| format!("q[{p}]")).collect();
        assert_eq!(got, expected, "routing key {key:?}");
    }
}
