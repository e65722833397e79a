//! The topology under stress and across restarts:
//! - a durable queue declared with arguments JSON cannot hold (NaN, an
//!   infinite float, a table 64 levels deep) and its messages survive a
//!   restart (Warren used to store such a definition in a form that failed
//!   to parse at the next start, and skipped it: the queue and its
//!   confirmed messages vanished);
//! - records of a queue whose definition is gone (a crash between deleting
//!   the definition and the messages) are deleted at the next start;
//! - binds racing deletes never leave a stored binding to a deleted queue,
//!   and racing declares never store other arguments than the live ones;
//! - chains of 10,000 exchanges (exchange bindings, alternate exchanges)
//!   route without recursion, and 10,000 auto-delete exchanges cascade away
//!   when the queue at the end goes.

use crate::common;
use crate::helpers;

use amq_protocol::types::{AMQPValue, FieldTable};
use common::*;
use helpers::*;
use lapin::{options::*, BasicProperties, ExchangeKind};
use warren::message::{Message, Meta};
use warren::store::Store;

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

/// A table nested `levels` deep counting itself.
fn nested(levels: usize) -> FieldTable {
    let mut t = FieldTable::default();
    for _ in 1..levels {
        let mut outer = FieldTable::default();
        outer.insert("k".into(), AMQPValue::FieldTable(t));
        t = outer;
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_queue_with_any_argument_values_survives_a_restart() {
    let mut b = start().await;
    {
        let (_c, ch) = b.channel().await;
        let mut args = FieldTable::default();
        args.insert("x-nan".into(), AMQPValue::Double(f64::NAN));
        args.insert("x-inf".into(), AMQPValue::Float(f32::NEG_INFINITY));
        // With the arguments table itself, 64 levels: the most allowed.
        args.insert("x-deep".into(), AMQPValue::FieldTable(nested(63)));
        ch.queue_declare("odd-args".into(), durable(), args)
            .await
            .unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let c = ch
            .basic_publish(
                "".into(),
                "odd-args".into(),
                BasicPublishOptions::default(),
                b"kept",
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap();
        assert!(c.await.unwrap().is_ack());
    }
    b.restart_when_unlocked().await;
    let (_c, ch) = b.channel().await;
    assert_eq!(
        get_body(&ch, "odd-args").await.as_deref(),
        Some(&b"kept"[..]),
        "the queue and its message came back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_a_deleted_queue_are_swept_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    {
        // What a crash right after deleting queue 999's definition leaves.
        let store = Store::open(&dir, 1 << 20).unwrap();
        let msg = Message::new(b"", b"gone", &[0x10, 0, 2], b"x", Meta::default());
        store.put_message(999, 1, &msg, 0).unwrap();
        store.flush_now().unwrap();
    }
    let mut b = start_with(config(&dir)).await;
    b.stop().await;
    drop(b);
    let store = Store::open(&dir, 1 << 20).unwrap();
    assert_eq!(store.messages(999).count(), 0, "orphan records were swept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_racing_deletes_store_no_binding_to_a_deleted_queue() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let mut b = start_with(config(&dir)).await;
    let (_c, ch) = b.channel().await;
    exchange(
        &ch,
        "race-x",
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let binder = b.connect().await;
    let deleter = b.connect().await;
    for round in 0..200 {
        let name = format!("race-q{}", round % 4);
        ch.queue_declare(name.as_str().into(), durable(), FieldTable::default())
            .await
            .unwrap();
        let bch = binder.create_channel().await.unwrap();
        let dch = deleter.create_channel().await.unwrap();
        let n = name.clone();
        let bind = tokio::spawn(async move {
            let _ = bch
                .queue_bind(
                    n.as_str().into(),
                    "race-x".into(),
                    "k".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await;
        });
        let n = name.clone();
        let delete = tokio::spawn(async move {
            let _ = dch
                .queue_delete(n.as_str().into(), QueueDeleteOptions::default())
                .await;
        });
        bind.await.unwrap();
        delete.await.unwrap();
    }
    drop((binder, deleter));
    b.stop().await;
    drop(b);
    let store = Store::open(&dir, 1 << 20).unwrap();
    let queues: Vec<String> = store
        .queues()
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    for def in store.bindings().unwrap() {
        assert!(
            queues.contains(&def.destination),
            "stored binding to deleted queue {:?}",
            def.destination
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_declares_store_the_arguments_in_use() {
    let mut b = start().await;
    let c1 = b.connect().await;
    let c2 = b.connect().await;
    let args = |ae: &str| table(&[("alternate-exchange", s(ae))]);
    let opts = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    for i in 0..50 {
        let name = format!("decl-{i}");
        let (ch1, ch2) = (
            c1.create_channel().await.unwrap(),
            c2.create_channel().await.unwrap(),
        );
        let (n1, n2) = (name.clone(), name.clone());
        let a = tokio::spawn(async move {
            ch1.exchange_declare(n1.as_str().into(), ExchangeKind::Fanout, opts, args("a"))
                .await
                .is_ok()
        });
        let bb = tokio::spawn(async move {
            ch2.exchange_declare(n2.as_str().into(), ExchangeKind::Fanout, opts, args("b"))
                .await
                .is_ok()
        });
        let (a, bb) = (a.await.unwrap(), bb.await.unwrap());
        assert!(a ^ bb, "exactly one declare wins: {a} {bb}");
    }
    // Which one won is stored: after a restart, the same one is in use.
    let (_c, ch) = b.channel().await;
    let mut live = Vec::new();
    for i in 0..50 {
        let name = format!("decl-{i}");
        let ch = b.connect().await.create_channel().await.unwrap();
        let is_a = ch
            .exchange_declare(name.as_str().into(), ExchangeKind::Fanout, opts, args("a"))
            .await
            .is_ok();
        live.push(is_a);
    }
    drop(ch);
    drop((c1, c2));
    b.restart_when_unlocked().await;
    for (i, is_a) in live.into_iter().enumerate() {
        let name = format!("decl-{i}");
        let ch = b.connect().await.create_channel().await.unwrap();
        let still_a = ch
            .exchange_declare(name.as_str().into(), ExchangeKind::Fanout, opts, args("a"))
            .await
            .is_ok();
        assert_eq!(
            still_a, is_a,
            "{name}: stored arguments differ from the live ones"
        );
    }
}

const CHAIN: usize = 10_000;

/// Declares `n` fanout exchanges named `{prefix}{i}` with `args(i)`, no
/// round trip each.
async fn declare_chain(
    ch: &lapin::Channel,
    prefix: &str,
    auto_delete: bool,
    args: impl Fn(usize) -> FieldTable,
) {
    for i in 0..CHAIN {
        ch.exchange_declare(
            format!("{prefix}{i}").as_str().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                auto_delete,
                nowait: true,
                ..ExchangeDeclareOptions::default()
            },
            args(i),
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_10000_exchange_bindings_routes_and_cascades_away() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "end").await;
    declare_chain(&ch, "e2e-", true, |_| FieldTable::default()).await;
    for i in 0..CHAIN - 1 {
        ch.exchange_bind(
            format!("e2e-{}", i + 1).as_str().into(),
            format!("e2e-{i}").as_str().into(),
            "".into(),
            ExchangeBindOptions { nowait: true },
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    bind(
        &ch,
        "end",
        &format!("e2e-{}", CHAIN - 1),
        "",
        FieldTable::default(),
    )
    .await;
    publish(&ch, "e2e-0", "any", b"through").await;
    assert_eq!(
        get_eventually(&ch, "end").await.as_deref(),
        Some(&b"through"[..])
    );
    // The queue goes: the last exchange loses its only binding and is
    // auto-deleted, and so on up the chain.
    ch.queue_delete("end".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let conn = b.connect().await;
    assert!(
        !exchange_exists(&conn, "e2e-0").await,
        "the whole chain went"
    );
    assert!(!exchange_exists(&conn, &format!("e2e-{}", CHAIN / 2)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_10000_alternate_exchanges_routes() {
    let b = start().await;
    let (_c, ch) = b.channel().await;
    declare(&ch, "last").await;
    declare_chain(&ch, "ae-", false, |i| {
        table(&[("alternate-exchange", s(&format!("ae-{}", i + 1)))])
    })
    .await;
    // The last one has an alternate that does not exist; bind it instead.
    bind(
        &ch,
        "last",
        &format!("ae-{}", CHAIN - 1),
        "",
        FieldTable::default(),
    )
    .await;
    publish(&ch, "ae-0", "any", b"alternates").await;
    assert_eq!(
        get_eventually(&ch, "last").await.as_deref(),
        Some(&b"alternates"[..])
    );
    // A cycle of alternates ends too.
    let cyc = |me: &str, ae: &str| {
        let ch = ch.clone();
        let (me, ae) = (me.to_string(), ae.to_string());
        async move {
            ch.exchange_declare(
                me.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                table(&[("alternate-exchange", s(&ae))]),
            )
            .await
            .unwrap()
        }
    };
    cyc("cyc-a", "cyc-b").await;
    cyc("cyc-b", "cyc-a").await;
    publish(&ch, "cyc-a", "nowhere", b"x").await;
    // The channel still answers: the publish ended.
    assert_eq!(message_count(&ch, "last").await, 0);
}
