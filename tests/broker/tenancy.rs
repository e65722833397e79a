//! Tenancy as RabbitMQ has it: vhosts made and deleted (a live connection
//! is closed with 320, everything in the vhost goes, durably), topic
//! permissions on topic exchanges, and the vhost and user limits with
//! RabbitMQ's errors.

use crate::common;
use crate::helpers;

use std::sync::Arc;

use common::*;
use helpers::*;
use lapin::{options::*, types::FieldTable, BasicProperties, Connection};
use warren::access::User;
use warren::broker::Broker;
use warren::vhost::Meta;

fn broker(b: &TestBroker) -> &Arc<Broker> {
    &b.server.as_ref().expect("running").broker
}

async fn connect_as(
    b: &TestBroker,
    user: &str,
    pass: &str,
    vhost: &str,
) -> lapin::Result<Connection> {
    let vhost = vhost.replace('/', "%2f");
    let uri = format!("amqp://{user}:{pass}@{}/{vhost}", b.addr);
    Connection::connect(&uri, lapin::ConnectionProperties::default()).await
}

fn add_user(b: &TestBroker, name: &str, limits: &[(&str, i64)]) {
    let users = &broker(b).users;
    users
        .put_user(User {
            limits: limits.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..User::with_password(name, "pw")
        })
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_vhost_closes_its_connections_with_320_and_removes_everything_durably() {
    let mut b = start().await;
    let meta = Meta {
        description: "production".into(),
        tags: vec!["a".into()],
        default_queue_type: "classic".into(),
        ..Meta::named("prod")
    };
    assert!(broker(&b).put_vhost(meta.clone()).unwrap());
    broker(&b)
        .users
        .set_permission("guest", "prod", ".*", ".*", ".*")
        .unwrap();
    let conn = connect_as(&b, "guest", "guest", "prod").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare("work".into(), durable, FieldTable::default())
        .await
        .unwrap();
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(
        "events".into(),
        lapin::ExchangeKind::Topic,
        durable,
        FieldTable::default(),
    )
    .await
    .unwrap();
    bind(&ch, "work", "events", "#", FieldTable::default()).await;
    ch.basic_publish(
        "".into(),
        "work".into(),
        BasicPublishOptions::default(),
        b"kept?",
        persistent(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    // Survives a restart as it was made.
    drop(ch);
    drop(conn);
    b.restart().await;
    assert_eq!(broker(&b).vhost("prod").unwrap().meta(), meta);
    let conn = connect_as(&b, "guest", "guest", "prod").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    assert_eq!(message_count(&ch, "work").await, 1);
    let mut errors = Errors::new(&conn);
    assert!(broker(&b).delete_vhost("prod").unwrap());
    let e = errors.next_error().await.expect("the connection is closed");
    assert_eq!(reply_code(&e), Some(320), "{e:?}");
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("CONNECTION_FORCED - vhost 'prod' is deleted"),
        "{e:?}"
    );
    let e = connect_as(&b, "guest", "guest", "prod")
        .await
        .expect_err("the vhost is gone");
    assert_eq!(reply_code(&e), Some(530), "{e:?}");
    // Gone after a restart too, and a vhost made again with the name is
    // empty, with no permission left over.
    b.restart().await;
    assert!(broker(&b).vhost("prod").is_none());
    assert!(broker(&b).put_vhost(Meta::named("prod")).unwrap());
    assert!(broker(&b).users.permission("guest", "prod").is_none());
    broker(&b)
        .users
        .set_permission("guest", "prod", ".*", ".*", ".*")
        .unwrap();
    let conn = connect_as(&b, "guest", "guest", "prod").await.unwrap();
    assert!(!queue_exists(&conn, "work").await);
    assert!(!exchange_exists(&conn, "events").await);
    // "/" was not touched.
    let (_c, ch) = b.channel().await;
    declare(&ch, "still-here").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_permissions_govern_publishing_and_binding_on_topic_exchanges_only() {
    let b = start().await;
    add_user(&b, "u", &[]);
    let users = &broker(&b).users;
    users.set_permission("u", "/", ".*", ".*", ".*").unwrap();
    users
        .set_topic_permission("u", "/", "amq.topic", "^{username}\\.", "^public\\.")
        .unwrap();
    // Also on a direct exchange: topic permissions do not apply there.
    users
        .set_topic_permission("u", "/", "amq.direct", "^$", "^$")
        .unwrap();
    // guest has no topic permissions: it binds what it likes.
    let (guest, gch) = b.channel().await;
    declare(&gch, "mine").await;
    bind(&gch, "mine", "amq.topic", "u.#", FieldTable::default()).await;
    let conn = connect_as(&b, "u", "pw", "/").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    declare(&ch, "inbox").await;
    bind(
        &ch,
        "inbox",
        "amq.topic",
        "public.news",
        FieldTable::default(),
    )
    .await;
    bind(
        &ch,
        "inbox",
        "amq.direct",
        "anything",
        FieldTable::default(),
    )
    .await;
    publish(&ch, "amq.topic", "u.orders", b"mine").await;
    publish(&ch, "amq.direct", "anything", b"direct").await;
    assert_eq!(wait_count(&guest, "mine", 1).await, 1);
    assert_eq!(wait_count(&guest, "inbox", 1).await, 1);
    let e = ch
        .queue_bind(
            "inbox".into(),
            "amq.topic".into(),
            "private.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect_err("read on the binding key is refused");
    assert_eq!(reply_code(&e), Some(403));
    assert_eq!(
        reply_text(&e).as_deref(),
        Some(
            "ACCESS_REFUSED - access to topic 'private.#' in exchange 'amq.topic' \
             in vhost '/' refused for user 'u'"
        )
    );
    let ch = conn.create_channel().await.unwrap();
    ch.basic_publish(
        "amq.topic".into(),
        "u-not.orders".into(),
        BasicPublishOptions::default(),
        b"not mine",
        BasicProperties::default(),
    )
    .await
    .unwrap();
    assert!(channel_closed(&ch).await);
    publish(&gch, "amq.topic", "u.from-guest", b"guest").await;
    assert_eq!(wait_count(&guest, "mine", 2).await, 2);
    // Cleared: allowed again, on a connection already open.
    users.clear_topic_permission("u", "/", None).unwrap();
    let ch = conn.create_channel().await.unwrap();
    publish(&ch, "amq.topic", "other.orders", b"now allowed").await;
    bind(
        &ch,
        "inbox",
        "amq.topic",
        "private.#",
        FieldTable::default(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vhost_limits_refuse_connections_and_queues_with_rabbitmqs_errors() {
    let b = start().await;
    broker(&b)
        .set_vhost_limit("/", "max-connections", Some(1))
        .unwrap();
    broker(&b)
        .set_vhost_limit("/", "max-queues", Some(1))
        .unwrap();
    let (_c, ch) = b.channel().await;
    let e = connect_as(&b, "guest", "guest", "/")
        .await
        .expect_err("one connection at most");
    assert_eq!(reply_code(&e), Some(530), "{e:?}");
    assert!(
        format!("{e:?}").contains(
            "access to vhost '/' refused for user 'guest': connection limit (1) is reached"
        ),
        "{e:?}"
    );
    declare(&ch, "one").await;
    let text = expect_code(
        ch.queue_declare(
            "two".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await,
        406,
    );
    assert!(
        text.contains("cannot declare queue 'two': queue limit in vhost '/' (1) is reached"),
        "{text}"
    );
    // Lifted: both go through; the limits survive nothing else changing.
    broker(&b)
        .set_vhost_limit("/", "max-connections", None)
        .unwrap();
    broker(&b)
        .set_vhost_limit("/", "max-queues", Some(-1))
        .unwrap();
    let other = connect_as(&b, "guest", "guest", "/").await.unwrap();
    let ch2 = other.create_channel().await.unwrap();
    declare(&ch2, "two").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vhost_limits_survive_a_restart() {
    let mut b = start().await;
    broker(&b)
        .set_vhost_limit("/", "max-queues", Some(0))
        .unwrap();
    b.restart().await;
    let (_c, ch) = b.channel().await;
    expect_code(
        ch.queue_declare(
            "q".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await,
        406,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_limits_refuse_connections_and_channels_with_rabbitmqs_errors() {
    let b = start().await;
    add_user(&b, "u", &[("max-connections", 1), ("max-channels", 2)]);
    broker(&b)
        .users
        .set_permission("u", "/", ".*", ".*", ".*")
        .unwrap();
    let conn = connect_as(&b, "u", "pw", "/").await.unwrap();
    let e = connect_as(&b, "u", "pw", "/")
        .await
        .expect_err("one connection at most");
    assert!(
        format!("{e:?}")
            .contains("connection refused for user 'u': user connection limit (1) is reached"),
        "{e:?}"
    );
    let first = conn.create_channel().await.unwrap();
    let _second = conn.create_channel().await.unwrap();
    let mut errors = Errors::new(&conn);
    let _ = conn.create_channel().await;
    let e = errors
        .next_error()
        .await
        .expect("the third channel is refused");
    assert_eq!(reply_code(&e), Some(530), "{e:?}");
    assert!(
        format!("{e:?}").contains(
            "number of channels opened for user 'u' has reached the maximum allowed user limit of (2)"
        ),
        "{e:?}"
    );
    drop(first);
    // The connection is gone with the refusal (530 is a connection error);
    // its channels no longer count, and another connection may open.
    assert!(connection_closed(&conn).await);
    assert!(
        eventually(|| broker(&b).connections.count() == 0).await,
        "the closed connection is no longer registered"
    );
    let again = connect_as(&b, "u", "pw", "/").await.unwrap();
    again.create_channel().await.unwrap();
    again.create_channel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_user_closes_its_connections_with_320() {
    let b = start().await;
    add_user(&b, "u", &[]);
    broker(&b)
        .users
        .set_permission("u", "/", ".*", ".*", ".*")
        .unwrap();
    let conn = connect_as(&b, "u", "pw", "/").await.unwrap();
    let mut errors = Errors::new(&conn);
    broker(&b).delete_user("u").unwrap();
    let e = errors.next_error().await.expect("closed");
    assert_eq!(reply_code(&e), Some(320), "{e:?}");
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("CONNECTION_FORCED - user 'u' is deleted")
    );
    // guest's connections stay.
    let (c, _ch) = b.channel().await;
    assert_connection_works(&c).await;
}
