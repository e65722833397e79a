//! Message deduplication (`x-message-deduplication` on exchanges and
//! queues) as a client sees it: a key seen before is dropped, confirmed,
//! never returned, and counted in the management API; a transaction
//! decides at commit; a dead-lettered copy comes back through a retry
//! loop; a durable cache survives a restart; arguments nothing would act
//! on are refused. tests/pika/dedup.py checks the same with pika (run
//! here when pika is installed; .ci/run installs it).

use crate::common;
use crate::helpers;

use common::pika::pika;
use common::*;
use helpers::*;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, ExchangeKind};

const DEDUP: &str = "x-message-deduplication";
const HEADER: &str = "x-deduplication-header";

fn on(extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = table(extra);
    t.insert(DEDUP.into(), AMQPValue::Boolean(true));
    t
}

fn keyed(key: &str) -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert(HEADER.into(), s(key));
    persistent().with_headers(h)
}

/// Publishes (mandatory) and waits for the confirm, which must be an
/// ack, the message not returned.
async fn publish_acked(ch: &Channel, exchange: &str, key: &str, body: &str, p: BasicProperties) {
    let confirm = publish_with(
        ch,
        exchange,
        key,
        BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        },
        body.as_bytes(),
        p,
    )
    .await
    .await
    .expect("confirm");
    assert!(confirm.is_ack(), "{body}: {confirm:?}");
    assert!(
        confirm.take_message().is_none(),
        "{body} was returned as unroutable"
    );
}

async fn confirming(b: &TestBroker) -> (lapin::Connection, Channel) {
    let (c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    (c, ch)
}

/// An API request (the API is on); its status.
async fn api(b: &TestBroker, method: reqwest::Method, path: &str) -> u16 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = format!("http://{}/api/{path}", b.api.expect("the API is on"));
    reqwest::Client::new()
        .request(method, url)
        .basic_auth("guest", Some("guest"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn api_json(b: &TestBroker, path: &str) -> serde_json::Value {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = format!("http://{}/api/{path}", b.api.expect("the API is on"));
    reqwest::Client::new()
        .get(url)
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_drops_a_key_it_saw_confirms_it_and_counts_it() {
    let b = start_with_api().await;
    let (_c, ch) = confirming(&b).await;
    exchange(
        &ch,
        "orders",
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        on(&[]),
    )
    .await
    .unwrap();
    declare(&ch, "all-orders").await;
    bind(&ch, "all-orders", "orders", "#", FieldTable::default()).await;
    publish_acked(&ch, "orders", "o.1", "first", keyed("order-1")).await;
    // Mandatory, and routable, but a duplicate: acked, not returned.
    publish_acked(&ch, "orders", "o.1", "again", keyed("order-1")).await;
    publish_acked(&ch, "orders", "o.2", "other", keyed("order-2")).await;
    // No key at all: always routed.
    publish_acked(&ch, "orders", "o.3", "plain", persistent()).await;
    publish_acked(&ch, "orders", "o.3", "plain", persistent()).await;
    assert_eq!(
        drain(&ch, "all-orders").await,
        ["first", "other", "plain", "plain"]
    );
    let x = api_json(&b, "exchanges/%2f/orders").await;
    assert_eq!(x["message_stats"]["dedup"], 1, "{x}");
    assert_eq!(x["message_stats"]["publish_in"], 5, "{x}");
    assert_eq!(x["message_stats"]["publish_out"], 4, "{x}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_drops_by_header_then_message_id_within_its_size() {
    let b = start_with_api().await;
    let (_c, ch) = confirming(&b).await;
    let args = on(&[
        ("x-cache-size", AMQPValue::LongInt(2)),
        (HEADER, s("order-id")),
    ]);
    declare_with(&ch, "work", QueueDeclareOptions::default(), args)
        .await
        .unwrap();
    let order = |id: i32| {
        let mut h = FieldTable::default();
        h.insert("order-id".into(), AMQPValue::LongInt(id));
        BasicProperties::default().with_headers(h)
    };
    let id = |id: &str| BasicProperties::default().with_message_id(ShortString::from(id));
    publish_acked(&ch, "", "work", "o1", order(1)).await;
    publish_acked(&ch, "", "work", "o1 again", order(1)).await;
    publish_acked(&ch, "", "work", "m1", id("m-1")).await;
    publish_acked(&ch, "", "work", "m1 again", id("m-1")).await;
    // Two keys are kept: a third pushes order 1 out.
    publish_acked(&ch, "", "work", "o2", order(2)).await;
    publish_acked(&ch, "", "work", "o1 third", order(1)).await;
    assert_eq!(drain(&ch, "work").await, ["o1", "m1", "o2", "o1 third"]);
    let q = api_json(&b, "queues/%2f/work").await;
    assert_eq!(q["message_stats"]["dedup"], 2, "{q}");
}

/// A rolled back publish is not remembered: the same key published
/// again and committed is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_asks_the_exchange_at_commit() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "tx-x",
        ExchangeKind::Fanout,
        ExchangeDeclareOptions::default(),
        on(&[]),
    )
    .await
    .unwrap();
    declare(&ch, "tx-q").await;
    bind(&ch, "tx-q", "tx-x", "", FieldTable::default()).await;
    ch.tx_select().await.unwrap();
    let send = |body: &'static str| {
        let ch = ch.clone();
        async move {
            publish_with(
                &ch,
                "tx-x",
                "",
                BasicPublishOptions::default(),
                body.as_bytes(),
                keyed("k"),
            )
            .await;
        }
    };
    send("rolled back").await;
    ch.tx_rollback().await.unwrap();
    send("committed").await;
    send("duplicate in the same transaction").await;
    ch.tx_commit().await.unwrap();
    send("duplicate in the next").await;
    ch.tx_commit().await.unwrap();
    assert_eq!(drain(&ch, "tx-q").await, ["committed"]);
}

/// A message rejected from a deduplicating queue, dead-lettered to a
/// delay queue and dead-lettered back when its TTL runs out, is the same
/// message moving on: it is not dropped as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_loop_through_dead_letters_brings_a_message_back() {
    let b = start().await;
    let (_c, ch) = confirming(&b).await;
    let work = on(&[
        ("x-dead-letter-exchange", s("")),
        ("x-dead-letter-routing-key", s("retry")),
    ]);
    declare_with(&ch, "jobs", QueueDeclareOptions::default(), work)
        .await
        .unwrap();
    let retry = table(&[
        ("x-message-ttl", AMQPValue::LongInt(50)),
        ("x-dead-letter-exchange", s("")),
        ("x-dead-letter-routing-key", s("jobs")),
    ]);
    declare_with(&ch, "retry", QueueDeclareOptions::default(), retry)
        .await
        .unwrap();
    publish_acked(&ch, "", "jobs", "job", keyed("job-1")).await;
    let got = ch
        .basic_get("jobs".into(), BasicGetOptions::default())
        .await
        .unwrap()
        .expect("the job");
    got.delivery
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    assert_eq!(
        get_eventually(&ch, "jobs").await.as_deref(),
        Some(&b"job"[..])
    );
    // A publisher's duplicate is still dropped.
    publish_acked(&ch, "", "jobs", "job again", keyed("job-1")).await;
    assert_eq!(drain(&ch, "jobs").await, Vec::<String>::new());
}

/// A durable exchange's and a durable queue's caches are stored with
/// their messages' commit: after a restart a key seen before is still a
/// duplicate, and a new one is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_cache_survives_a_restart() {
    let mut b = start().await;
    {
        let (_c, ch) = confirming(&b).await;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        exchange(&ch, "dx", ExchangeKind::Fanout, durable, on(&[]))
            .await
            .unwrap();
        let q = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        declare_with(&ch, "dq", q, on(&[])).await.unwrap();
        declare_with(&ch, "from-dx", q, FieldTable::default())
            .await
            .unwrap();
        bind(&ch, "from-dx", "dx", "", FieldTable::default()).await;
        for i in 0..5 {
            let k = format!("k{i}");
            publish_acked(&ch, "dx", "", &k, keyed(&k)).await;
            publish_acked(&ch, "", "dq", &k, keyed(&k)).await;
        }
    }
    b.restart().await;
    let (_c, ch) = confirming(&b).await;
    for i in 0..6 {
        let k = format!("k{i}");
        publish_acked(&ch, "dx", "", &format!("{k} again"), keyed(&k)).await;
        publish_acked(&ch, "", "dq", &format!("{k} again"), keyed(&k)).await;
    }
    let want = ["k0", "k1", "k2", "k3", "k4", "k5 again"];
    assert_eq!(drain(&ch, "from-dx").await, want);
    assert_eq!(drain(&ch, "dq").await, want);
    // Deleted and declared again: a new cache.
    ch.queue_delete("dq".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let q = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    declare_with(&ch, "dq", q, on(&[])).await.unwrap();
    publish_acked(&ch, "", "dq", "k0 anew", keyed("k0")).await;
    assert_eq!(drain(&ch, "dq").await, ["k0 anew"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_nothing_would_act_on_and_bad_values_are_refused() {
    let b = start().await;
    let cases = [
        table(&[("x-cache-size", AMQPValue::LongInt(5))]),
        table(&[
            (DEDUP, AMQPValue::Boolean(false)),
            ("x-cache-ttl", AMQPValue::LongInt(5)),
        ]),
        table(&[(DEDUP, s("yes"))]),
        on(&[("x-cache-size", AMQPValue::LongInt(0))]),
        on(&[("x-cache-size", AMQPValue::LongLongInt(10_000_001))]),
        on(&[("x-cache-ttl", s("1s"))]),
        on(&[(HEADER, s(""))]),
    ];
    for args in cases {
        let (_c, ch) = b.channel().await;
        let text = expect_code(
            declare_with(&ch, "q", QueueDeclareOptions::default(), args.clone()).await,
            406,
        );
        assert!(text.contains("invalid arg"), "{text}");
        let (_c, ch) = b.channel().await;
        let r = exchange(
            &ch,
            "x",
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            args,
        )
        .await;
        expect_code(r, 406);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pika_sees_deduplication_by_header_message_id_size_and_ttl() {
    let b = start().await;
    let uri = b.uri();
    tokio::task::spawn_blocking(move || pika(&uri, &["behaviour"]))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pika_sees_a_queue_cache_survive_a_restart() {
    let mut b = start().await;
    let uri = b.uri();
    let ran = tokio::task::spawn_blocking(move || pika(&uri, &["before", "restarted"]))
        .await
        .unwrap();
    if !ran {
        return;
    }
    b.restart().await;
    let uri = b.uri();
    tokio::task::spawn_blocking(move || pika(&uri, &["after", "restarted"]))
        .await
        .unwrap();
}

/// A publish its queue refuses (x-overflow reject-publish) is nacked and
/// its key not remembered, by the queue or by the exchange in front: the
/// publisher's retry gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_publish_leaves_no_key_behind() {
    let b = start().await;
    let (_c, ch) = confirming(&b).await;
    let full = |dedup: bool| {
        let mut t = table(&[
            ("x-max-length", AMQPValue::LongInt(1)),
            ("x-overflow", s("reject-publish")),
        ]);
        if dedup {
            t.insert(DEDUP.into(), AMQPValue::Boolean(true));
        }
        t
    };
    declare_with(&ch, "small", QueueDeclareOptions::default(), full(true))
        .await
        .unwrap();
    declare_with(&ch, "small-x", QueueDeclareOptions::default(), full(false))
        .await
        .unwrap();
    exchange(
        &ch,
        "dedup-x",
        ExchangeKind::Fanout,
        ExchangeDeclareOptions::default(),
        on(&[]),
    )
    .await
    .unwrap();
    bind(&ch, "small-x", "dedup-x", "", FieldTable::default()).await;
    let nacked = |exchange: &'static str, key: &'static str| {
        let ch = ch.clone();
        async move {
            let c = publish_with(
                &ch,
                exchange,
                key,
                BasicPublishOptions::default(),
                b"second",
                keyed("second"),
            )
            .await
            .await
            .unwrap();
            assert!(c.is_nack(), "{exchange}: {c:?}");
        }
    };
    publish_acked(&ch, "", "small", "first", keyed("first")).await;
    nacked("", "small").await;
    publish_acked(&ch, "dedup-x", "", "first", keyed("first")).await;
    nacked("dedup-x", "").await;
    // Room again: the retries get in.
    assert_eq!(drain(&ch, "small").await, ["first"]);
    assert_eq!(drain(&ch, "small-x").await, ["first"]);
    publish_acked(&ch, "", "small", "second", keyed("second")).await;
    publish_acked(&ch, "dedup-x", "", "second", keyed("second")).await;
    assert_eq!(drain(&ch, "small").await, ["second"]);
    assert_eq!(drain(&ch, "small-x").await, ["second"]);
}

/// A vhost deleted and made again, with a durable exchange of the same
/// name: the new exchange remembers nothing of the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_vhost_takes_its_caches_along() {
    let mut b = start_with_api().await;
    let make = |b: &TestBroker| {
        let uri = format!("amqp://guest:guest@{}/v1", b.addr);
        async move {
            let c = lapin::Connection::connect(&uri, Default::default())
                .await
                .unwrap();
            let ch = c.create_channel().await.unwrap();
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .unwrap();
            let durable = ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            };
            exchange(&ch, "dx", ExchangeKind::Fanout, durable, on(&[]))
                .await
                .unwrap();
            declare(&ch, "q").await;
            bind(&ch, "q", "dx", "", FieldTable::default()).await;
            (c, ch)
        }
    };
    assert_eq!(api(&b, reqwest::Method::PUT, "vhosts/v1").await, 201);
    let (c, ch) = make(&b).await;
    publish_acked(&ch, "dx", "", "k", keyed("k")).await;
    drop((c, ch));
    assert_eq!(api(&b, reqwest::Method::DELETE, "vhosts/v1").await, 204);
    assert_eq!(api(&b, reqwest::Method::PUT, "vhosts/v1").await, 201);
    let (_c, ch) = make(&b).await;
    publish_acked(&ch, "dx", "", "k again", keyed("k")).await;
    assert_eq!(drain(&ch, "q").await, ["k again"]);
    drop((_c, ch));
    // And after a restart, the key the new exchange saw is still seen.
    b.restart().await;
    let (_c, ch) = make(&b).await;
    publish_acked(&ch, "dx", "", "k third", keyed("k")).await;
    assert_eq!(drain(&ch, "q").await, Vec::<String>::new());
}

/// Definitions an older build stored with arguments it ignored (a cache
/// setting without x-message-deduplication) do not stop the start: the
/// queue runs, without deduplication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_definition_an_older_build_took_still_starts() {
    let mut b = start().await;
    b.stop().await;
    {
        let store = warren::store::Store::open(&b.dir, 1 << 20).unwrap();
        store
            .declare_queue(&warren::store::QueueDef {
                vhost: "/".into(),
                name: "old".into(),
                id: 0,
                auto_delete: false,
                arguments: table(&[("x-cache-size", AMQPValue::LongInt(5))]),
            })
            .unwrap();
        store.flush_now().unwrap();
    }
    b.restart().await;
    let (_c, ch) = confirming(&b).await;
    publish_acked(&ch, "", "old", "a", keyed("k")).await;
    publish_acked(&ch, "", "old", "b", keyed("k")).await;
    assert_eq!(drain(&ch, "old").await, ["a", "b"]);
}

/// A mandatory message returned as unroutable leaves no key at its
/// exchange: sent again once a queue is bound, it is routed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returned_message_leaves_no_key_behind() {
    let b = start().await;
    let (_c, ch) = confirming(&b).await;
    exchange(
        &ch,
        "unbound",
        ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
        on(&[]),
    )
    .await
    .unwrap();
    let mandatory = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let c = publish_with(&ch, "unbound", "k", mandatory, b"lost", keyed("m"))
        .await
        .await
        .unwrap();
    assert!(c.take_message().is_some(), "returned");
    declare(&ch, "late").await;
    bind(&ch, "late", "unbound", "k", FieldTable::default()).await;
    publish_acked(&ch, "unbound", "k", "again", keyed("m")).await;
    assert_eq!(drain(&ch, "late").await, ["again"]);
}
