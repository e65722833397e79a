//! Permissions on AMQP operations, checked as RabbitMQ 3.10 checks them
//! (docs/rabbitmq-permissions.md): configure to declare and delete, write
//! on the destination and read on the source to bind, write on the
//! exchange to publish, read on the queue to consume, get and purge; 403
//! with RabbitMQ's text. The user_id property must be the user's own.

use crate::common;
use crate::helpers;

use common::*;
use helpers::*;
use lapin::{options::*, types::FieldTable, BasicProperties, Channel, Connection};
use warren::access::User;

/// A broker with guest (everything) and `u` with these patterns on "/".
async fn with_user(configure: &str, write: &str, read: &str, tags: &[&str]) -> TestBroker {
    let b = start().await;
    let users = &b.server.as_ref().expect("running").broker.users;
    users
        .put_user(User {
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ..User::with_password("u", "pw")
        })
        .unwrap();
    users
        .set_permission("u", "/", configure, write, read)
        .unwrap();
    b
}

async fn as_user(b: &TestBroker) -> (Connection, Channel) {
    let uri = format!("amqp://u:pw@{}/%2f", b.addr);
    let c = Connection::connect(&uri, lapin::ConnectionProperties::default())
        .await
        .expect("u connects");
    let ch = c.create_channel().await.expect("channel");
    (c, ch)
}

fn refused(kind: &str, name: &str) -> String {
    format!("ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user 'u'")
}

async fn declare_q(ch: &Channel, name: &str) -> Result<lapin::Queue, lapin::Error> {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configure_governs_declare_and_delete_but_not_passive_declares() {
    let b = with_user("^mine\\.", ".*", ".*", &[]).await;
    let (_c, ch) = as_user(&b).await;
    declare_q(&ch, "mine.q")
        .await
        .expect("configure allows mine.*");
    let (_c, ch) = as_user(&b).await;
    assert_eq!(
        expect_code(declare_q(&ch, "theirs").await, 403),
        refused("queue", "theirs")
    );
    // Passive declares need no permission.
    let (_g, guest) = b.channel().await;
    declare(&guest, "theirs").await;
    let (_c, ch) = as_user(&b).await;
    assert_eq!(message_count(&ch, "theirs").await, 0);
    assert_eq!(
        expect_code(
            ch.queue_delete("theirs".into(), QueueDeleteOptions::default())
                .await,
            403
        ),
        refused("queue", "theirs")
    );
    let (_c, ch) = as_user(&b).await;
    let x = ch
        .exchange_declare(
            "other".into(),
            lapin::ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await;
    assert_eq!(expect_code(x, 403), refused("exchange", "other"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_needs_write_on_the_queue_and_read_on_the_exchange() {
    let b = with_user(".*", "^q$", "^readable$", &[]).await;
    let (_g, guest) = b.channel().await;
    declare(&guest, "q").await;
    declare(&guest, "other").await;
    for x in ["readable", "secret"] {
        guest
            .exchange_declare(
                x.into(),
                lapin::ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    let bind = |ch: Channel, q: &'static str, x: &'static str| async move {
        ch.queue_bind(
            q.into(),
            x.into(),
            "k".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
    };
    let (_c, ch) = as_user(&b).await;
    bind(ch, "q", "readable")
        .await
        .expect("write on q, read on readable");
    let (_c, ch) = as_user(&b).await;
    assert_eq!(
        expect_code(bind(ch, "other", "readable").await, 403),
        refused("queue", "other")
    );
    let (_c, ch) = as_user(&b).await;
    assert_eq!(
        expect_code(bind(ch, "q", "secret").await, 403),
        refused("exchange", "secret")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_needs_write_on_the_exchange_and_the_default_one_is_amq_default() {
    let b = with_user(".*", "^amq\\.default$", ".*", &[]).await;
    let (_g, guest) = b.channel().await;
    declare(&guest, "q").await;
    let (c, ch) = as_user(&b).await;
    let mut errors = Errors::new(&c);
    ch.basic_publish(
        "".into(),
        "q".into(),
        BasicPublishOptions::default(),
        b"ok",
        BasicProperties::default(),
    )
    .await
    .unwrap();
    assert_eq!(message_count(&ch, "q").await, 1);
    ch.basic_publish(
        "amq.fanout".into(),
        "".into(),
        BasicPublishOptions::default(),
        b"no",
        BasicProperties::default(),
    )
    .await
    .unwrap();
    let e = errors.next_error().await.expect("the channel is closed");
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    assert_eq!(
        reply_text(&e).unwrap_or_default(),
        refused("exchange", "amq.fanout")
    );
    assert_eq!(message_count(&guest, "q").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_get_and_purge_need_read_on_the_queue() {
    let b = with_user(".*", ".*", "^open$", &[]).await;
    let (_g, guest) = b.channel().await;
    declare(&guest, "open").await;
    declare(&guest, "closed").await;
    let (_c, ch) = as_user(&b).await;
    assert!(ch
        .basic_get("open".into(), BasicGetOptions::default())
        .await
        .unwrap()
        .is_none());
    ch.queue_purge("open".into(), QueuePurgeOptions::default())
        .await
        .expect("purge open");
    let get = ch
        .basic_get("closed".into(), BasicGetOptions::default())
        .await;
    assert_eq!(expect_code(get, 403), refused("queue", "closed"));
    let (_c, ch) = as_user(&b).await;
    let consume = ch
        .basic_consume(
            "closed".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
    assert_eq!(expect_code(consume, 403), refused("queue", "closed"));
    let (_c, ch) = as_user(&b).await;
    let purge = ch
        .queue_purge("closed".into(), QueuePurgeOptions::default())
        .await;
    assert_eq!(expect_code(purge, 403), refused("queue", "closed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_change_applies_to_an_open_connection() {
    let b = with_user(".*", ".*", ".*", &[]).await;
    let (_c, ch) = as_user(&b).await;
    declare_q(&ch, "a").await.unwrap();
    b.server
        .as_ref()
        .unwrap()
        .broker
        .users
        .set_permission("u", "/", "^$", ".*", ".*")
        .unwrap();
    assert_eq!(
        expect_code(declare_q(&ch, "b").await, 403),
        refused("queue", "b")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_id_must_be_the_users_own_unless_an_impersonator() {
    let b = with_user(".*", ".*", ".*", &[]).await;
    let (c, ch) = as_user(&b).await;
    let mut errors = Errors::new(&c);
    declare_q(&ch, "q").await.unwrap();
    let own = BasicProperties::default().with_user_id("u".into());
    ch.basic_publish(
        "".into(),
        "q".into(),
        BasicPublishOptions::default(),
        b"1",
        own,
    )
    .await
    .unwrap();
    assert_eq!(message_count(&ch, "q").await, 1);
    let other = BasicProperties::default().with_user_id("boss".into());
    ch.basic_publish(
        "".into(),
        "q".into(),
        BasicPublishOptions::default(),
        b"2",
        other.clone(),
    )
    .await
    .unwrap();
    let e = errors.next_error().await.expect("the channel is closed");
    assert_eq!(reply_code(&e), Some(406), "{e:?}");
    assert_eq!(
        reply_text(&e).unwrap_or_default(),
        "PRECONDITION_FAILED - user_id property set to 'boss' but authenticated user was 'u'"
    );
    let b = with_user(".*", ".*", ".*", &["impersonator"]).await;
    let (_c, ch) = as_user(&b).await;
    declare_q(&ch, "q").await.unwrap();
    ch.basic_publish(
        "".into(),
        "q".into(),
        BasicPublishOptions::default(),
        b"2",
        other,
    )
    .await
    .unwrap();
    assert_eq!(message_count(&ch, "q").await, 1);
}
