//! Users and logins: the recorded users (RabbitMQ's password hashes) are
//! who may log in, they survive a restart, the default user is created
//! once, and a vhost the user has no permission on is refused with 530.

use crate::common;

use common::{reply_code, start};
use lapin::{Connection, ConnectionProperties};
use warren::access::{password, Algorithm, User};

fn uri(b: &common::TestBroker, user: &str, pass: &str) -> String {
    format!("amqp://{user}:{pass}@{}/%2f", b.addr)
}

async fn login(b: &common::TestBroker, user: &str, pass: &str) -> Result<Connection, lapin::Error> {
    Connection::connect(&uri(b, user, pass), ConnectionProperties::default()).await
}

fn broker(b: &common::TestBroker) -> &std::sync::Arc<warren::broker::Broker> {
    &b.server.as_ref().expect("running").broker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_user_logs_in_with_its_password_and_keeps_it_across_a_restart() {
    let mut b = start().await;
    // A hash as RabbitMQ's export has it (salt 908DC60A, password test12).
    broker(&b)
        .users
        .put_user(User {
            name: "app".into(),
            password_hash: "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR".into(),
            algorithm: Algorithm::Sha256,
            tags: vec![],
            limits: Default::default(),
        })
        .unwrap();
    broker(&b)
        .users
        .set_permission("app", "/", ".*", ".*", ".*")
        .unwrap();
    login(&b, "app", "test12").await.expect("app logs in");
    let e = login(&b, "app", "test13")
        .await
        .expect_err("wrong password");
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    b.restart().await;
    login(&b, "app", "test12")
        .await
        .expect("app still logs in after a restart");
    login(&b, "guest", "guest").await.expect("guest too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_default_user_is_not_recreated_and_passwordless_users_cannot_log_in() {
    let mut b = start().await;
    let users = &broker(&b).users;
    users
        .put_user(User {
            name: "admin".into(),
            password_hash: password::hash(Algorithm::Sha512, "pw"),
            algorithm: Algorithm::Sha512,
            tags: vec!["administrator".into()],
            limits: Default::default(),
        })
        .unwrap();
    users
        .set_permission("admin", "/", ".*", ".*", ".*")
        .unwrap();
    users
        .put_user(User {
            name: "nopass".into(),
            password_hash: String::new(),
            algorithm: Algorithm::Sha256,
            tags: vec![],
            limits: Default::default(),
        })
        .unwrap();
    users
        .set_permission("nopass", "/", ".*", ".*", ".*")
        .unwrap();
    users.delete_user("guest").unwrap();
    b.restart().await;
    let e = login(&b, "guest", "guest")
        .await
        .expect_err("guest is gone");
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    let e = login(&b, "nopass", "")
        .await
        .expect_err("no password, no PLAIN login");
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    login(&b, "admin", "pw").await.expect("admin logs in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vhost_without_permission_is_refused_with_530() {
    let b = start().await;
    broker(&b)
        .users
        .put_user(User {
            name: "outsider".into(),
            password_hash: password::hash(Algorithm::Sha256, "pw"),
            algorithm: Algorithm::Sha256,
            tags: vec![],
            limits: Default::default(),
        })
        .unwrap();
    let e = login(&b, "outsider", "pw")
        .await
        .expect_err("no permission on /");
    assert_eq!(reply_code(&e), Some(530), "{e:?}");
    assert!(
        format!("{e:?}").contains("access to vhost '/' refused for user 'outsider'"),
        "{e:?}"
    );
    broker(&b)
        .users
        .set_permission("outsider", "/", "^$", "^$", "^$")
        .unwrap();
    login(&b, "outsider", "pw")
        .await
        .expect("any permission on the vhost lets it open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blank_password_never_logs_in() {
    let b = common::start_with_api().await;
    let users = &broker(&b).users;
    // A user whose password is blank, as a form or an API call left it.
    let management = |pw: &str| User {
        tags: vec!["management".into()],
        ..User::with_password("blank", pw)
    };
    users.put_user(management("")).unwrap();
    users
        .set_permission("blank", "/", ".*", ".*", ".*")
        .unwrap();
    let e = login(&b, "blank", "")
        .await
        .expect_err("PLAIN with a blank password");
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    let amqplain = format!("{}?auth_mechanism=amqplain", uri(&b, "blank", ""));
    let e = Connection::connect(&amqplain, ConnectionProperties::default())
        .await
        .expect_err("AMQPLAIN with a blank password");
    assert_eq!(reply_code(&e), Some(403), "{e:?}");
    let url = format!("http://{}/api/whoami", b.api.expect("the API is on"));
    let status = reqwest::Client::new()
        .get(&url)
        .basic_auth("blank", Some(""))
        .send()
        .await
        .expect("an answer")
        .status();
    assert_eq!(status.as_u16(), 401);
    // The same user with a password logs in everywhere.
    users.put_user(management("pw")).unwrap();
    login(&b, "blank", "pw")
        .await
        .expect("PLAIN with the password");
    let status = reqwest::Client::new()
        .get(&url)
        .basic_auth("blank", Some("pw"))
        .send()
        .await
        .expect("an answer")
        .status();
    assert_eq!(status.as_u16(), 200);
}
