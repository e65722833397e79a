//! The management HTTP API as rabbitmq_http_client (the client rabbitmqadmin
//! v2 is built on) drives it. One test per group of endpoints: the overview,
//! whoami, nodes and the cluster name; vhosts; users; permissions and topic
//! permissions; exchanges, queues and bindings with publish and get; queue
//! lists, paged; connections, channels and consumers, and closing them;
//! policies and operator policies; vhost and user limits; definitions;
//! health checks; the refusals (401, 404, 400); and the message stats of
//! exchanges, channels, connections, vhosts and the overview. Each checks what a
//! client sees: the crate's types decode every answer, and what the API
//! changes shows over AMQP too.

use crate::common;
use crate::helpers;

use std::future::Future;
use std::time::Duration;

use common::*;
use helpers::*;
use lapin::{options::*, types::FieldTable, Connection, ConnectionProperties};
use rabbitmq_http_client::api::{Client, HttpClientError};
use rabbitmq_http_client::commons::{
    BindingDestinationType, PaginationParams, PolicyTarget, QueueType, SupportedProtocol,
    UserLimitTarget, VirtualHostLimitTarget,
};
use rabbitmq_http_client::password_hashing;
use rabbitmq_http_client::requests::{
    self, BindingDeletionParams, EnforcedLimitParams, ExchangeParams, PolicyDefinitionBuilder,
    PolicyParams, QueueParams, UserParams, VirtualHostParams,
};
use rabbitmq_http_client::responses::{
    self, ChannelState, HealthCheckFailureDetails, ReachabilityProbeOutcome,
};
use serde_json::{json, Map, Value};
use warren::config::Port;

/// The client, with its endpoint and credentials as owned strings.
type Api = Client<String, String, String>;

/// A client of `b`'s management API as guest.
fn api(b: &TestBroker) -> Api {
    api_as(b, "guest", "guest")
}

/// A client of `b`'s management API as `user`.
fn api_as(b: &TestBroker, user: &str, password: &str) -> Api {
    let endpoint = format!("http://{}/api", b.api.expect("the management API is on"));
    Client::new(endpoint, user.to_string(), password.to_string())
}

/// A password hash as rabbitmqadmin makes one: a random 4-byte salt and
/// SHA-256 of salt and password, in base64.
fn hash(password: &str) -> String {
    password_hashing::base64_encoded_salted_password_hash_sha256(
        &password_hashing::salt(),
        password,
    )
}

/// An AMQP login as `user` to `vhost`.
async fn login(
    b: &TestBroker,
    user: &str,
    password: &str,
    vhost: &str,
) -> lapin::Result<Connection> {
    let vhost = vhost.replace('/', "%2f");
    let uri = format!("amqp://{user}:{password}@{}/{vhost}", b.addr);
    Connection::connect(&uri, ConnectionProperties::default()).await
}

/// Calls `f` every 10 ms until it gives Some, for up to 5 s.
async fn poll<T, F, Fut>(mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asserts that `r` is the client's NotFound (a 404).
#[track_caller]
fn assert_not_found<T: std::fmt::Debug>(r: Result<T, HttpClientError>) {
    match r {
        Err(HttpClientError::NotFound) => {}
        other => panic!("expected 404 Not Found, got {other:?}"),
    }
}

/// The HTTP status of the error `r` holds.
#[track_caller]
fn status_of<T: std::fmt::Debug>(r: Result<T, HttpClientError>) -> u16 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e
            .status_code()
            .map(|s| s.as_u16())
            .unwrap_or_else(|| panic!("no status code in {e:?}")),
    }
}

// ---- overview, whoami, nodes, cluster name

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_whoami_nodes_and_the_cluster_name() {
    let b = start_with_api().await;
    let rc = api(&b);
    let (_c, ch) = b.channel().await;
    declare(&ch, "counted").await;

    let o = rc.overview().await.expect("overview");
    assert_eq!(o.product_name, "Warren");
    assert!(!o.product_version.is_empty());
    assert!(!o.rabbitmq_version.is_empty());
    assert!(!o.node.is_empty());
    assert_eq!(o.object_totals.queues, 1);
    assert!(o.object_totals.exchanges > 0);
    assert!(o.object_totals.connections >= 1);
    assert!(o.object_totals.channels >= 1);
    let amqp = o
        .listeners
        .iter()
        .find(|l| l.protocol == "amqp")
        .expect("an AMQP listener");
    assert_eq!(amqp.port, u32::from(b.addr.port()));
    assert_eq!(amqp.node, o.node);
    let http = o
        .listeners
        .iter()
        .find(|l| l.protocol == "http")
        .expect("an HTTP listener");
    assert_eq!(http.port, u32::from(b.api.unwrap().port()));
    assert_eq!(
        rc.server_version().await.expect("server version"),
        o.rabbitmq_version
    );

    let me = rc.current_user().await.expect("whoami");
    assert_eq!(me.name, "guest");
    assert!(me.tags.contains("administrator"), "{:?}", me.tags);
    match rc.probe_reachability().await {
        ReachabilityProbeOutcome::Reached(d) => assert_eq!(d.current_user.name, "guest"),
        other => panic!("the node is reachable: {other:?}"),
    }

    let nodes = rc.list_nodes().await.expect("nodes");
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].name, o.node);
    assert!(!nodes[0].being_drained);
    let node = rc.get_node_info(&o.node).await.expect("one node");
    assert_eq!(node.name, o.node);
    assert!(!node.being_drained);
    assert!(!node.has_memory_alarm_in_effect);
    assert!(node.processors >= 1);
    assert_ne!(node.rabbitmq_version(), "unknown");
    rc.get_node_memory_footprint(&o.node)
        .await
        .expect("memory footprint");
    assert_not_found(rc.get_node_info("rabbit@elsewhere").await);

    let name = rc.get_cluster_name().await.expect("cluster name");
    assert_eq!(name.name, o.cluster_name);
    rc.set_cluster_name("warren-under-test")
        .await
        .expect("set the cluster name");
    assert_eq!(
        rc.get_cluster_name().await.expect("cluster name").name,
        "warren-under-test"
    );
    assert_eq!(
        rc.overview().await.expect("overview").cluster_name,
        "warren-under-test"
    );
}

// ---- vhosts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vhosts_are_made_read_updated_and_deleted() {
    let b = start_with_api().await;
    let rc = api(&b);
    // A name that needs encoding in a path ("/" and "-").
    let name = "staging/eu-1";
    let params = VirtualHostParams::named(name)
        .with_description("pre-production")
        .with_tags(vec!["qa", "blue"])
        .with_default_queue_type(QueueType::Quorum);
    rc.create_vhost(&params).await.expect("create the vhost");

    let v = rc.get_vhost(name).await.expect("the vhost");
    assert_eq!(v.name, name);
    assert_eq!(v.description.as_deref(), Some("pre-production"));
    assert_eq!(v.default_queue_type.as_deref(), Some("quorum"));
    let tags = v.tags.as_ref().expect("tags");
    assert_eq!(tags.len(), 2, "{tags:?}");
    assert!(tags.contains("qa") && tags.contains("blue"), "{tags:?}");
    let meta = v.metadata.as_ref().expect("metadata");
    assert_eq!(meta.description.as_deref(), Some("pre-production"));

    let names: Vec<String> = rc
        .list_vhosts()
        .await
        .expect("vhosts")
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert!(names.contains(&"/".to_string()), "{names:?}");
    assert!(names.contains(&name.to_string()), "{names:?}");
    let page = rc
        .list_vhosts_paged(&PaginationParams::first_page(1))
        .await
        .expect("a page of vhosts");
    assert_eq!(page.len(), 1);

    rc.update_vhost(&VirtualHostParams::named(name).with_description("pre-production, v2"))
        .await
        .expect("update the vhost");
    assert_eq!(
        rc.get_vhost(name)
            .await
            .expect("the vhost")
            .description
            .as_deref(),
        Some("pre-production, v2")
    );

    // A connection to the vhost is closed when the vhost is deleted.
    rc.declare_permissions(&requests::Permissions::full_access("guest", name))
        .await
        .expect("guest may use the vhost");
    let conn = login(&b, "guest", "guest", name)
        .await
        .expect("connect to the vhost");
    let mut errors = Errors::new(&conn);
    rc.delete_vhost(name, false)
        .await
        .expect("delete the vhost");
    let e = errors.next_error().await.expect("the connection is closed");
    assert_eq!(reply_code(&e), Some(320), "{e:?}");
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("CONNECTION_FORCED - vhost 'staging/eu-1' is deleted")
    );
    assert_not_found(rc.get_vhost(name).await);
    assert!(!rc
        .list_vhosts()
        .await
        .expect("vhosts")
        .iter()
        .any(|v| v.name == name));
    rc.delete_vhost(name, true)
        .await
        .expect("deleting a missing vhost idempotently");
    assert_not_found(rc.delete_vhost(name, false).await);
}

// ---- users

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_made_over_the_api_log_in_over_amqp() {
    let b = start_with_api().await;
    let rc = api(&b);
    let alice_hash = hash("s3cret");
    rc.create_user(&UserParams::new(
        "alice",
        &alice_hash,
        "management,policymaker",
    ))
    .await
    .expect("create alice");
    rc.declare_permissions(&requests::Permissions::full_access("alice", "/"))
        .await
        .expect("alice may use /");
    rc.create_user(&UserParams::without_tags("loner", &hash("pw")))
        .await
        .expect("create loner");
    rc.create_user(&UserParams::without_tags("bob", &hash("pw")))
        .await
        .expect("create bob");

    let alice = rc.get_user("alice").await.expect("alice");
    assert_eq!(alice.name, "alice");
    assert_eq!(alice.tags.len(), 2, "{:?}", alice.tags);
    assert!(alice.tags.contains("management") && alice.tags.contains("policymaker"));
    assert_eq!(
        alice.password_hash.as_ref().map(|h| h.as_str()),
        Some(alice_hash.as_str())
    );

    // Tags are a list.
    let users = rc.list_users().await.expect("users");
    let guest = users.iter().find(|u| u.name == "guest").expect("guest");
    assert!(guest.tags.contains("administrator"), "{:?}", guest.tags);
    let loner = users.iter().find(|u| u.name == "loner").expect("loner");
    assert!(loner.tags.is_empty(), "{:?}", loner.tags);
    let page = rc
        .list_users_paged(&PaginationParams::first_page(2))
        .await
        .expect("a page of users");
    assert_eq!(page.len(), 2);

    // The hash is what alice logs in with.
    let conn = login(&b, "alice", "s3cret", "/")
        .await
        .expect("alice logs in");
    assert_connection_works(&conn).await;
    assert!(login(&b, "alice", "not-it", "/").await.is_err());

    let without: Vec<String> = rc
        .list_users_without_permissions()
        .await
        .expect("users without permissions")
        .into_iter()
        .map(|u| u.name)
        .collect();
    assert!(without.contains(&"loner".to_string()), "{without:?}");
    assert!(!without.contains(&"alice".to_string()), "{without:?}");
    assert!(!without.contains(&"guest".to_string()), "{without:?}");

    // Deleting alice closes her connection, and she can no longer log in.
    let mut errors = Errors::new(&conn);
    rc.delete_user("alice", false).await.expect("delete alice");
    let e = errors
        .next_error()
        .await
        .expect("alice's connection is closed");
    assert_eq!(reply_code(&e), Some(320), "{e:?}");
    assert!(login(&b, "alice", "s3cret", "/").await.is_err());
    assert_not_found(rc.get_user("alice").await);
    rc.delete_user("alice", true)
        .await
        .expect("deleting a missing user idempotently");
    assert_not_found(rc.delete_user("alice", false).await);

    // Bulk delete; a name that is not a user is skipped.
    rc.delete_users(vec!["loner", "bob", "nobody"])
        .await
        .expect("bulk delete");
    assert_not_found(rc.get_user("loner").await);
    assert_not_found(rc.get_user("bob").await);
    rc.get_user("guest").await.expect("guest stays");
}

// ---- permissions and topic permissions

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_and_topic_permissions_are_granted_listed_and_cleared() {
    let b = start_with_api().await;
    let rc = api(&b);
    // A name that needs encoding in a path ("_" and ".").
    let user = "app_user.1";
    rc.create_user(&UserParams::management(user, &hash("pw")))
        .await
        .expect("create the user");
    rc.declare_permissions(&requests::Permissions {
        user,
        vhost: "/",
        configure: "^app\\.",
        write: ".*",
        read: ".*",
    })
    .await
    .expect("declare permissions");

    let want = responses::Permissions {
        user: user.into(),
        vhost: "/".into(),
        configure: "^app\\.".into(),
        write: ".*".into(),
        read: ".*".into(),
    };
    assert_eq!(
        rc.get_permissions("/", user).await.expect("permissions"),
        want
    );
    assert!(rc.list_permissions().await.expect("all").contains(&want));
    let in_root = rc.list_permissions_in("/").await.expect("in /");
    assert!(in_root.contains(&want), "{in_root:?}");
    assert!(in_root.iter().any(|p| p.user == "guest"), "{in_root:?}");
    assert_eq!(
        rc.list_permissions_of(user).await.expect("of the user"),
        vec![want.clone()]
    );

    // In force over AMQP: configure on ^app\. only.
    let conn = login(&b, user, "pw", "/").await.expect("the user logs in");
    let ch = conn.create_channel().await.expect("channel");
    declare(&ch, "app.jobs").await;
    expect_code(
        declare_with(
            &ch,
            "other",
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await,
        403,
    );

    rc.declare_topic_permissions(&requests::TopicPermissions {
        user,
        vhost: "/",
        exchange: "amq.topic",
        write: "^orders\\.",
        read: ".*",
    })
    .await
    .expect("declare topic permissions");
    let topic = responses::TopicPermission {
        user: user.into(),
        vhost: "/".into(),
        exchange: "amq.topic".into(),
        read: ".*".into(),
        write: "^orders\\.".into(),
    };
    assert!(rc
        .list_topic_permissions()
        .await
        .expect("all topic permissions")
        .contains(&topic));
    assert_eq!(
        rc.list_topic_permissions_in("/").await.expect("in /"),
        vec![topic.clone()]
    );
    assert_eq!(
        rc.list_topic_permissions_of(user)
            .await
            .expect("of the user"),
        vec![topic.clone()]
    );
    assert_eq!(
        rc.get_topic_permissions_of("/", user)
            .await
            .expect("topic permission"),
        topic
    );
    // Publishing to a topic the user may not write to closes the channel.
    let ch2 = conn.create_channel().await.expect("channel");
    let mut errors = Errors::new(&conn);
    publish(&ch2, "amq.topic", "billing.new", b"x").await;
    assert_eq!(errors.next_code().await, Some(403));

    rc.clear_topic_permissions("/", user, false)
        .await
        .expect("clear topic permissions");
    assert!(rc
        .list_topic_permissions_of(user)
        .await
        .expect("of the user")
        .is_empty());
    assert_not_found(rc.get_topic_permissions_of("/", user).await);

    rc.clear_permissions("/", user, false)
        .await
        .expect("clear permissions");
    assert_not_found(rc.get_permissions("/", user).await);
    assert!(rc
        .list_permissions_of(user)
        .await
        .expect("of the user")
        .is_empty());
    assert!(rc
        .list_users_without_permissions()
        .await
        .expect("users without permissions")
        .iter()
        .any(|u| u.name == user));
    rc.clear_permissions("/", user, true)
        .await
        .expect("clearing again idempotently");
    assert_not_found(rc.clear_permissions("/", user, false).await);
}

// ---- exchanges, queues, bindings, publish and get

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchanges_queues_and_bindings_route_what_the_api_publishes() {
    let b = start_with_api().await;
    let rc = api(&b);
    rc.declare_exchange("/", &ExchangeParams::durable_direct("orders", None))
        .await
        .expect("declare the exchange");
    let x = rc.get_exchange_info("/", "orders").await.expect("exchange");
    assert_eq!(x.name, "orders");
    assert_eq!(x.vhost, "/");
    assert_eq!(x.exchange_type, "direct");
    assert!(x.durable && !x.auto_delete);
    let xs = rc.list_exchanges_in("/").await.expect("exchanges");
    assert!(xs.iter().any(|x| x.name == "orders"));
    // The default exchange is listed with the empty name.
    assert!(xs
        .iter()
        .any(|x| x.name.is_empty() && x.exchange_type == "direct"));
    assert_eq!(
        rc.list_exchanges_paged(&PaginationParams::first_page(2))
            .await
            .expect("a page of exchanges")
            .len(),
        2
    );

    let q = QueueParams::new_durable_classic_queue("orders.eu", None).with_message_ttl(60_000);
    rc.declare_queue("/", &q).await.expect("declare the queue");
    let info = rc.get_queue_info("/", "orders.eu").await.expect("queue");
    assert_eq!(info.name, "orders.eu");
    assert_eq!(info.queue_type, "classic");
    assert!(info.durable && !info.auto_delete && !info.exclusive);
    assert_eq!(info.arguments.get("x-message-ttl"), Some(&json!(60_000)));

    rc.bind_queue("/", "orders.eu", "orders", Some("eu"), None)
        .await
        .expect("bind");
    let mut args = Map::new();
    args.insert("region".into(), json!("west"));
    rc.bind_queue(
        "/",
        "orders.eu",
        "orders",
        Some("eu.west"),
        Some(args.clone()),
    )
    .await
    .expect("bind with arguments");

    let all = rc.list_bindings().await.expect("bindings");
    let eu = all
        .iter()
        .find(|b| b.source == "orders" && b.routing_key == "eu")
        .expect("the binding is listed");
    assert_eq!(eu.vhost, "/");
    assert_eq!(eu.destination, "orders.eu");
    assert_eq!(eu.destination_type, BindingDestinationType::Queue);
    assert_eq!(eu.properties_key.as_deref(), Some("eu"));
    let west = all
        .iter()
        .find(|b| b.source == "orders" && b.routing_key == "eu.west")
        .expect("the binding with arguments is listed");
    assert_eq!(west.arguments.get("region"), Some(&json!("west")));
    assert!(west.properties_key.is_some());
    assert_eq!(
        rc.list_bindings_in("/").await.expect("bindings in /").len(),
        all.len()
    );
    let on_queue = rc
        .list_queue_bindings("/", "orders.eu")
        .await
        .expect("queue bindings");
    // The default exchange's binding, then the two.
    assert_eq!(on_queue.len(), 3, "{on_queue:?}");
    assert!(on_queue
        .iter()
        .any(|b| b.source.is_empty() && b.routing_key == "orders.eu"));
    assert_eq!(
        rc.list_exchange_bindings_with_source("/", "orders")
            .await
            .expect("bindings from the exchange")
            .len(),
        2
    );

    // Publish over the API: to the exchange, and to the default one.
    let routed = rc
        .publish_message("/", "orders", "eu", "order 1", Map::new())
        .await
        .expect("publish");
    assert!(routed.routed);
    let lost = rc
        .publish_message("/", "orders", "nowhere", "lost", Map::new())
        .await
        .expect("publish");
    assert!(!lost.routed);
    let mut props = Map::new();
    props.insert("content_type".into(), json!("text/plain"));
    props.insert("delivery_mode".into(), json!(2));
    props.insert("headers".into(), json!({"origin": "api"}));
    let routed = rc
        .publish_message("/", "", "orders.eu", "order 2", props)
        .await
        .expect("publish to the default exchange");
    assert!(routed.routed);

    // Get them back, requeued.
    let got = rc
        .get_messages("/", "orders.eu", 2, "ack_requeue_true")
        .await
        .expect("get");
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].payload, "order 1");
    assert_eq!(got[0].payload_encoding, "string");
    assert_eq!(got[0].payload_bytes, 7);
    assert_eq!(got[0].exchange, "orders");
    assert_eq!(got[0].routing_key, "eu");
    assert_eq!(got[0].message_count, 1);
    assert!(!got[0].redelivered);
    assert_eq!(got[1].payload, "order 2");
    assert_eq!(got[1].exchange, "");
    assert_eq!(got[1].routing_key, "orders.eu");
    let p = &got[1].properties.0;
    assert_eq!(p.get("content_type"), Some(&json!("text/plain")));
    assert_eq!(p.get("delivery_mode"), Some(&json!(2)));
    assert_eq!(
        p.get("headers").and_then(|h| h.get("origin")),
        Some(&json!("api"))
    );

    // Requeued, then taken for good.
    let taken = rc
        .get_messages("/", "orders.eu", 1, "ack_requeue_false")
        .await
        .expect("get");
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].payload, "order 1");
    assert!(taken[0].redelivered);
    let r = &rc;
    poll(|| async move {
        r.get_queue_info("/", "orders.eu")
            .await
            .ok()
            .filter(|q| q.message_count == 1)
    })
    .await
    .expect("one message is left");

    rc.purge_queue("/", "orders.eu").await.expect("purge");
    poll(|| async move {
        r.get_queue_info("/", "orders.eu")
            .await
            .ok()
            .filter(|q| q.message_count == 0)
    })
    .await
    .expect("the queue is empty");
    assert!(rc
        .get_messages("/", "orders.eu", 1, "ack_requeue_false")
        .await
        .expect("get")
        .is_empty());

    // Unbind both; the queue keeps the default exchange's binding.
    let unbind = BindingDeletionParams {
        virtual_host: "/",
        source: "orders",
        destination: "orders.eu",
        destination_type: BindingDestinationType::Queue,
        routing_key: "eu",
        arguments: None,
    };
    rc.delete_binding(&unbind, false).await.expect("unbind");
    rc.delete_binding(
        &BindingDeletionParams {
            routing_key: "eu.west",
            arguments: Some(args),
            ..unbind.clone()
        },
        false,
    )
    .await
    .expect("unbind the one with arguments");
    let left = rc
        .list_queue_bindings("/", "orders.eu")
        .await
        .expect("queue bindings");
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].source.is_empty());
    assert!(
        !rc.publish_message("/", "orders", "eu", "order 3", Map::new())
            .await
            .expect("publish")
            .routed
    );
    assert_not_found(rc.delete_binding(&unbind, false).await);
    rc.delete_binding(&unbind, true)
        .await
        .expect("unbinding again idempotently");

    rc.delete_queue("/", "orders.eu", false)
        .await
        .expect("delete the queue");
    assert_not_found(rc.get_queue_info("/", "orders.eu").await);
    rc.delete_exchange("/", "orders", false)
        .await
        .expect("delete the exchange");
    assert_not_found(rc.get_exchange_info("/", "orders").await);
    rc.delete_queue("/", "orders.eu", true)
        .await
        .expect("deleting a missing queue idempotently");
    rc.delete_exchange("/", "orders", true)
        .await
        .expect("deleting a missing exchange idempotently");
}

// ---- queue lists

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_lists_come_in_pages_and_show_depth() {
    let b = start_with_api().await;
    let rc = api(&b);
    for name in ["list.a", "list.b", "list.c"] {
        rc.declare_queue("/", &QueueParams::new_durable_classic_queue(name, None))
            .await
            .expect("declare");
    }
    // With page parameters the answer is RabbitMQ's page object; the
    // client reads its seven fields and gives the items.
    let first = rc
        .list_queues_paged(&PaginationParams::first_page(2))
        .await
        .expect("page 1");
    let second_params = PaginationParams::new(2, 2);
    let second = rc.list_queues_paged(&second_params).await.expect("page 2");
    assert_eq!(first.len(), 2);
    assert_eq!(second.len(), 1);
    assert!(second_params.is_last_page(&second));
    let mut names: Vec<String> = first
        .iter()
        .chain(&second)
        .map(|q| q.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["list.a", "list.b", "list.c"]);
    assert_eq!(
        rc.list_queues_in_paged("/", &PaginationParams::first_page(500))
            .await
            .expect("a page of /")
            .len(),
        3
    );
    // Without them, a plain list.
    assert_eq!(rc.list_queues().await.expect("queues").len(), 3);
    assert_eq!(rc.list_queues_in("/").await.expect("queues in /").len(), 3);
    assert_eq!(rc.list_classic_queues().await.expect("classic").len(), 3);

    // The depth of a queue published to over AMQP.
    let (_c, ch) = b.channel().await;
    declare(&ch, "depth").await;
    for _ in 0..3 {
        publish(&ch, "", "depth", b"m").await;
    }
    let r = &rc;
    let info = poll(|| async move {
        r.get_queue_info("/", "depth")
            .await
            .ok()
            .filter(|q| q.message_count == 3)
    })
    .await
    .expect("the queue shows its 3 messages");
    assert_eq!(info.vhost, "/");
    assert_eq!(info.unacknowledged_message_count, 0);
    assert_eq!(info.consumer_count, 0);
    assert_eq!(info.state, "running");
    assert!(!info.node.is_empty());
    let detailed = rc
        .list_queues_with_details()
        .await
        .expect("queues with details");
    let depth = detailed
        .iter()
        .find(|q| q.name == "depth")
        .expect("depth is listed");
    assert_eq!(depth.message_count, 3);
}

/// GET /api/queues/%2F/`name`, once `ready` holds of it.
async fn queue_json(b: &TestBroker, name: &str, ready: impl Fn(&Value) -> bool) -> Value {
    queue_json_within(b, name, Duration::from_secs(5), ready).await
}

/// The same, waiting up to `wait`.
async fn queue_json_within(
    b: &TestBroker,
    name: &str,
    wait: Duration,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let path = format!("/api/queues/%2F/{name}");
    let mut last = Value::Null;
    for _ in 0..wait.as_millis() / 50 {
        last = get_json(b, &path).await;
        if ready(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never got there: {last}");
}

async fn declare_durable(ch: &lapin::Channel, name: &str) {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_shows_its_memory_and_where_its_bytes_are() {
    let b = start_with_api().await;
    let (_c, ch) = b.channel().await;
    declare_durable(&ch, "mem").await;
    let empty = queue_json(&b, "mem", |_| true).await;
    let empty_memory = empty["memory"].as_u64().expect("memory");
    assert!(empty_memory > 0, "{empty}");
    for _ in 0..100 {
        publish(&ch, "", "mem", &[7u8; 1000]).await;
    }
    let q = queue_json(&b, "mem", |q| q["messages"] == 100).await;
    assert_eq!(q["message_bytes"], 100_000, "{q}");
    assert_eq!(q["message_bytes_ready"], 100_000, "{q}");
    assert_eq!(q["message_bytes_ram"], 100_000, "{q}");
    assert_eq!(q["messages_ram"], 100, "{q}");
    assert_eq!(q["messages_paged_out"], 0, "{q}");
    let memory = q["memory"].as_u64().expect("memory");
    assert!(memory >= empty_memory + 100_000, "{q}");
    assert!(memory < 1_000_000, "{q}");

    // Ten delivered and not acked: their bytes move to unacknowledged.
    ch.basic_qos(10, BasicQosOptions::default()).await.unwrap();
    let _consumer = consumer(&ch, "mem", "holds-ten").await;
    let q = queue_json(&b, "mem", |q| q["messages_unacknowledged"] == 10).await;
    assert_eq!(q["message_bytes"], 100_000, "{q}");
    assert_eq!(q["message_bytes_ready"], 90_000, "{q}");
    assert_eq!(q["message_bytes_unacknowledged"], 10_000, "{q}");
    assert_eq!(q["messages_unacknowledged_ram"], 10, "{q}");
    assert!(q["memory"].as_u64() >= Some(empty_memory + 100_000), "{q}");

    // Past the memory bound (16 MiB) a durable queue keeps the rest only
    // in the store: paged out, and not in its memory.
    declare_durable(&ch, "paged").await;
    let big = vec![1u8; 1 << 20];
    for _ in 0..24 {
        publish_with(
            &ch,
            "",
            "paged",
            BasicPublishOptions::default(),
            &big,
            persistent(),
        )
        .await;
    }
    let q = queue_json(&b, "paged", |q| q["messages"] == 24).await;
    assert_eq!(q["message_bytes"], 24 << 20, "{q}");
    let paged = q["message_bytes_paged_out"].as_u64().expect("paged out");
    assert!(paged >= 4 << 20, "{q}");
    assert_eq!(
        q["message_bytes_ram"].as_u64(),
        Some((24 << 20) - paged),
        "{q}"
    );
    let memory = q["memory"].as_u64().expect("memory");
    assert!(memory < (24 << 20) - paged + (1 << 20), "{q}");
    assert!(memory >= (24 << 20) - paged, "{q}");
}

/// A backlog's tail past the memory bound is recovered from the store's
/// index without being read (store/msglog): after a restart the queue
/// still counts every message and every body byte, a message in the tail
/// still expires when its TTL says, and all come back in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paged_backlog_keeps_its_bytes_and_ttl_across_a_restart() {
    let mut b = start_with_api().await;
    let (c, ch) = b.channel().await;
    declare_durable(&ch, "tail").await;
    let mut bytes = 0u64;
    for i in 0..20u8 {
        let body = vec![i; (1 << 20) + usize::from(i) * 77];
        bytes += body.len() as u64;
        publish_with(
            &ch,
            "",
            "tail",
            BasicPublishOptions::default(),
            &body,
            persistent(),
        )
        .await;
    }
    // In the tail: three that expire 8 s after they were published.
    for i in 0..3u64 {
        let body = vec![b'e'; 1000 + i as usize];
        bytes += body.len() as u64;
        let props = persistent().with_expiration("8000".into());
        publish_with(
            &ch,
            "",
            "tail",
            BasicPublishOptions::default(),
            &body,
            props,
        )
        .await;
    }
    let body = b"last".to_vec();
    bytes += body.len() as u64;
    publish_with(
        &ch,
        "",
        "tail",
        BasicPublishOptions::default(),
        &body,
        persistent(),
    )
    .await;
    let q = queue_json(&b, "tail", |q| q["messages"] == 24).await;
    assert_eq!(q["message_bytes"], bytes, "{q}");
    drop((ch, c));
    b.restart_when_unlocked().await;
    let q = queue_json(&b, "tail", |q| q["messages"] == 24).await;
    assert_eq!(q["message_bytes"], bytes, "{q}");
    assert!(q["messages_paged_out"].as_u64() > Some(3), "{q}");
    let q = queue_json_within(&b, "tail", Duration::from_secs(30), |q| q["messages"] == 21).await;
    assert_eq!(q["message_bytes"], bytes - 3003, "{q}");
    let (_c, ch) = b.channel().await;
    for i in 0..20u8 {
        let m = ch
            .basic_get("tail".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .expect("a message");
        assert_eq!(m.data.len(), (1 << 20) + usize::from(i) * 77);
        assert!(m.data.iter().all(|&x| x == i));
    }
    let m = ch
        .basic_get("tail".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the last");
    assert_eq!(m.data, b"last");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_active_consumer_queue_names_its_active_consumer() {
    let b = start_with_api().await;
    let (_c, ch) = b.channel().await;
    declare_with(
        &ch,
        "sac",
        QueueDeclareOptions::default(),
        table(&[(
            "x-single-active-consumer",
            lapin::types::AMQPValue::Boolean(true),
        )]),
    )
    .await
    .unwrap();
    let q = queue_json(&b, "sac", |_| true).await;
    assert_eq!(q["single_active_consumer_tag"], Value::Null, "{q}");
    let _first = consumer(&ch, "sac", "first").await;
    let _second = consumer(&ch, "sac", "second").await;
    let q = queue_json(&b, "sac", |q| q["consumers"] == 2).await;
    assert_eq!(q["single_active_consumer_tag"], "first", "{q}");
}

// ---- connections, channels, consumers

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_channels_and_consumers_are_listed_and_closed() {
    let b = start_with_api().await;
    let rc = api(&b);
    let props = ConnectionProperties::default().with_connection_name("mgmt-test".into());
    let conn = Connection::connect(&b.uri(), props).await.expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    declare(&ch, "watched").await;
    let _consumer = consumer(&ch, "watched", "watcher-1").await;

    let r = &rc;
    let c = poll(|| async move {
        r.list_connections().await.ok().and_then(|l| {
            l.into_iter()
                .find(|c| c.client_properties.connection_name == "mgmt-test")
        })
    })
    .await
    .expect("the connection is listed");
    assert_eq!(c.username, "guest");
    assert_eq!(c.protocol, "AMQP 0-9-1");
    assert!(c.connected_at > 0);
    assert_eq!(c.server_port, Some(u32::from(b.addr.port())));
    assert_eq!(c.client_properties.product, "lapin");
    assert_eq!(c.client_properties.platform, "rust");
    let caps = c
        .client_properties
        .capabilities
        .as_ref()
        .expect("capabilities");
    assert!(caps.publisher_confirms && caps.consumer_cancel_notify && caps.basic_nack);
    let name = c.name.clone();
    let one = rc.get_connection_info(&name).await.expect("the connection");
    assert_eq!(one.name, name);
    assert_eq!(one.username, "guest");
    assert!(!rc
        .list_connections_paged(&PaginationParams::first_page(10))
        .await
        .expect("a page of connections")
        .is_empty());
    assert!(rc
        .list_connections_in("/")
        .await
        .expect("connections to /")
        .iter()
        .any(|c| c.name == name));
    assert!(rc
        .list_user_connections("guest")
        .await
        .expect("guest's connections")
        .iter()
        .any(|c| c.name == name && c.vhost == "/"));

    let n = name.as_str();
    let channels = poll(|| async move {
        r.list_channels().await.ok().filter(|l| {
            l.iter()
                .any(|c| c.connection_details.name == n && c.consumer_count == 1)
        })
    })
    .await
    .expect("the channel is listed with its consumer");
    let chan = channels
        .iter()
        .find(|c| c.connection_details.name == name)
        .expect("the channel");
    assert_eq!(chan.vhost, "/");
    assert_eq!(chan.id, 1);
    assert_eq!(chan.state, ChannelState::Running);
    assert!(!chan.has_publisher_confirms_enabled);
    let on = rc.list_channels_on(&name).await.expect("channels on it");
    assert_eq!(on.len(), 1);
    assert_eq!(
        rc.get_channel_info(&chan.name)
            .await
            .expect("the channel")
            .id,
        chan.id
    );
    assert!(!rc
        .list_channels_paged(&PaginationParams::first_page(10))
        .await
        .expect("a page of channels")
        .is_empty());
    assert_eq!(
        rc.list_channels_in("/").await.expect("channels in /").len(),
        1
    );

    let consumers = rc.list_consumers().await.expect("consumers");
    let cons = consumers
        .iter()
        .find(|c| c.consumer_tag == "watcher-1")
        .expect("the consumer is listed");
    assert_eq!(cons.queue.name, "watched");
    assert_eq!(cons.queue.vhost, "/");
    assert!(cons.manual_ack);
    assert!(!cons.exclusive);
    let details = cons.channel_details.as_ref().expect("channel details");
    assert_eq!(details.connection_name, name);
    assert_eq!(details.username, "guest");
    assert!(rc
        .list_consumers_in("/")
        .await
        .expect("consumers in /")
        .iter()
        .any(|c| c.consumer_tag == "watcher-1"));
    assert_eq!(
        rc.get_queue_info("/", "watched")
            .await
            .expect("queue")
            .consumer_count,
        1
    );

    // Closing it: 320 with the reason given.
    let mut errors = Errors::new(&conn);
    rc.close_connection(&name, Some("bye"), false)
        .await
        .expect("close the connection");
    let e = errors.next_error().await.expect("the connection is closed");
    assert_eq!(reply_code(&e), Some(320), "{e:?}");
    assert_eq!(reply_text(&e).as_deref(), Some("CONNECTION_FORCED - bye"));
    poll(|| async move {
        r.list_connections()
            .await
            .ok()
            .filter(|l| !l.iter().any(|c| c.name == n))
    })
    .await
    .expect("the connection is no longer listed");
    assert_not_found(rc.close_connection(&name, None, false).await);
    rc.close_connection(&name, None, true)
        .await
        .expect("closing a missing connection idempotently");

    // Closing all of a user's connections.
    let other = b.connect().await;
    let mut errors = Errors::new(&other);
    rc.close_user_connections("guest", Some("maintenance"), false)
        .await
        .expect("close guest's connections");
    let e = errors.next_error().await.expect("the connection is closed");
    assert_eq!(reply_code(&e), Some(320), "{e:?}");
    assert_eq!(
        reply_text(&e).as_deref(),
        Some("CONNECTION_FORCED - maintenance")
    );
}

// ---- policies

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_and_operator_policies_apply_to_queues() {
    let b = start_with_api().await;
    let rc = api(&b);
    let def = PolicyDefinitionBuilder::new().max_length(1).build();
    let max_one = PolicyParams::new("/", "max-one", "^p\\.", def)
        .apply_to(PolicyTarget::Queues)
        .priority(1);
    rc.declare_policy(&max_one)
        .await
        .expect("declare the policy");

    let listed = rc.list_policies().await.expect("policies");
    let p = listed
        .iter()
        .find(|p| p.name == "max-one")
        .expect("the policy is listed");
    assert_eq!(p.vhost, "/");
    assert_eq!(p.pattern, "^p\\.");
    assert_eq!(p.apply_to, PolicyTarget::Queues);
    assert_eq!(p.priority, 1);
    assert_eq!(p.definition.get("max-length"), Some(&json!(1)));
    assert_eq!(&rc.get_policy("/", "max-one").await.expect("policy"), p);
    assert_eq!(
        rc.list_policies_in("/").await.expect("policies in /").len(),
        1
    );

    // It holds for a queue declared over AMQP: 3 in, 1 left, the last.
    let (_c, ch) = b.channel().await;
    declare(&ch, "p.q").await;
    declare(&ch, "other").await;
    for body in ["m1", "m2", "m3"] {
        publish(&ch, "", "p.q", body.as_bytes()).await;
        publish(&ch, "", "other", body.as_bytes()).await;
    }
    assert_eq!(message_count(&ch, "p.q").await, 1);
    assert_eq!(message_count(&ch, "other").await, 3);
    let left = rc
        .get_messages("/", "p.q", 10, "ack_requeue_true")
        .await
        .expect("get");
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].payload, "m3");
    let info = rc.get_queue_info("/", "p.q").await.expect("queue");
    assert_eq!(info.policy.as_deref(), Some("max-one"));
    assert_eq!(
        info.effective_policy_definition
            .as_ref()
            .and_then(|d| d.get("max-length")),
        Some(&json!(1))
    );

    // Operator policies are a list of their own.
    let cap = PolicyParams::new(
        "/",
        "cap",
        "^p\\.",
        PolicyDefinitionBuilder::new().max_length(5).build(),
    )
    .apply_to(PolicyTarget::Queues);
    rc.declare_operator_policy(&cap)
        .await
        .expect("declare the operator policy");
    let ops = rc
        .list_operator_policies()
        .await
        .expect("operator policies");
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].name, "cap");
    assert_eq!(ops[0].definition.get("max-length"), Some(&json!(5)));
    assert_eq!(
        rc.list_operator_policies_in("/").await.expect("in /").len(),
        1
    );
    assert_eq!(
        rc.get_operator_policy("/", "cap")
            .await
            .expect("operator policy")
            .name,
        "cap"
    );
    assert!(!rc
        .list_policies()
        .await
        .expect("policies")
        .iter()
        .any(|p| p.name == "cap"));
    assert_eq!(
        rc.get_queue_info("/", "p.q")
            .await
            .expect("queue")
            .operator_policy
            .as_deref(),
        Some("cap")
    );
    // Not every key may be in an operator policy.
    let bad = PolicyParams::new(
        "/",
        "bad",
        ".*",
        PolicyDefinitionBuilder::new()
            .dead_letter_exchange("dlx")
            .build(),
    );
    assert_eq!(status_of(rc.declare_operator_policy(&bad).await), 400);

    // Without the policy the operator policy's cap of 5 holds.
    rc.delete_policy("/", "max-one", false)
        .await
        .expect("delete the policy");
    assert!(rc.list_policies().await.expect("policies").is_empty());
    assert_not_found(rc.get_policy("/", "max-one").await);
    publish(&ch, "", "p.q", b"m4").await;
    publish(&ch, "", "p.q", b"m5").await;
    assert_eq!(message_count(&ch, "p.q").await, 3);
    assert_eq!(
        rc.get_queue_info("/", "p.q").await.expect("queue").policy,
        None
    );

    rc.delete_operator_policy("/", "cap", false)
        .await
        .expect("delete the operator policy");
    assert!(rc
        .list_operator_policies()
        .await
        .expect("operator policies")
        .is_empty());
    assert_not_found(rc.get_operator_policy("/", "cap").await);
    assert_eq!(
        rc.get_queue_info("/", "p.q")
            .await
            .expect("queue")
            .operator_policy,
        None
    );
    rc.delete_policy("/", "max-one", true)
        .await
        .expect("deleting a missing policy idempotently");
    assert_not_found(rc.delete_operator_policy("/", "cap", false).await);
}

// ---- limits

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vhost_and_user_limits_are_set_listed_and_cleared() {
    let b = start_with_api().await;
    let rc = api(&b);
    rc.set_vhost_limit(
        "/",
        EnforcedLimitParams::new(VirtualHostLimitTarget::MaxQueues, 1),
    )
    .await
    .expect("set max-queues");
    let limits = rc.list_vhost_limits("/").await.expect("limits of /");
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0].vhost, "/");
    assert_eq!(limits[0].limits.get("max-queues"), Some(&json!(1)));
    assert!(rc
        .list_all_vhost_limits()
        .await
        .expect("all vhost limits")
        .iter()
        .any(|l| l.vhost == "/"));

    // In force over AMQP.
    let (c, ch) = b.channel().await;
    declare(&ch, "only").await;
    expect_code(
        declare_with(
            &ch,
            "second",
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await,
        406,
    );
    rc.clear_vhost_limit("/", VirtualHostLimitTarget::MaxQueues)
        .await
        .expect("clear max-queues");
    assert!(rc
        .list_vhost_limits("/")
        .await
        .expect("limits of /")
        .is_empty());
    let ch = c.create_channel().await.expect("channel");
    declare(&ch, "second").await;

    // User limits.
    rc.create_user(&UserParams::without_tags("limited", &hash("pw")))
        .await
        .expect("create the user");
    rc.declare_permissions(&requests::Permissions::full_access("limited", "/"))
        .await
        .expect("permissions");
    rc.set_user_limit(
        "limited",
        EnforcedLimitParams::new(UserLimitTarget::MaxChannels, 1),
    )
    .await
    .expect("set max-channels");
    rc.set_user_limit(
        "limited",
        EnforcedLimitParams::new(UserLimitTarget::MaxConnections, 5),
    )
    .await
    .expect("set max-connections");
    let limits = rc.list_user_limits("limited").await.expect("user limits");
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0].username, "limited");
    assert_eq!(limits[0].limits.get("max-channels"), Some(&json!(1)));
    assert_eq!(limits[0].limits.get("max-connections"), Some(&json!(5)));
    assert!(rc
        .list_all_user_limits()
        .await
        .expect("all user limits")
        .iter()
        .any(|l| l.username == "limited"));

    // In force over AMQP: a second channel is refused.
    let conn = login(&b, "limited", "pw", "/").await.expect("log in");
    let _first = conn.create_channel().await.expect("the first channel");
    let mut errors = Errors::new(&conn);
    let _ = conn.create_channel().await;
    assert_eq!(errors.next_code().await, Some(530));

    rc.clear_user_limit("limited", UserLimitTarget::MaxChannels)
        .await
        .expect("clear max-channels");
    let limits = rc.list_user_limits("limited").await.expect("user limits");
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0].limits.get("max-channels"), None);
    rc.clear_user_limit("limited", UserLimitTarget::MaxConnections)
        .await
        .expect("clear max-connections");
    assert!(rc
        .list_user_limits("limited")
        .await
        .expect("user limits")
        .is_empty());
    assert_not_found(
        rc.clear_user_limit("limited", UserLimitTarget::MaxConnections)
            .await,
    );
}

// ---- definitions

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_are_exported_and_imported() {
    let b = start_with_api().await;
    let rc = api(&b);
    rc.declare_queue(
        "/",
        &QueueParams::new_durable_classic_queue("exported", None),
    )
    .await
    .expect("declare");

    let defs = rc
        .export_cluster_wide_definitions_as_data()
        .await
        .expect("export as data");
    assert!(defs.virtual_hosts.iter().any(|v| v.name == "/"));
    let guest = defs
        .users
        .iter()
        .find(|u| u.name == "guest")
        .expect("guest is exported");
    assert!(guest.tags.contains("administrator"));
    assert!(defs
        .permissions
        .iter()
        .any(|p| p.user == "guest" && p.vhost == "/"));
    assert!(defs
        .queues
        .iter()
        .any(|q| q.name == "exported" && q.vhost == "/" && q.durable));
    let text = rc
        .export_cluster_wide_definitions()
        .await
        .expect("export as text");
    let v: Value = serde_json::from_str(&text).expect("the export is JSON");
    assert!(v["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .any(|q| q["name"] == "exported"));
    let vdefs = rc
        .export_vhost_definitions_as_data("/")
        .await
        .expect("export / as data");
    assert!(vdefs.queues.iter().any(|q| q.name == "exported"));

    // Import a user, its permissions and a queue.
    let imported = json!({
        "users": [{
            "name": "imported",
            "password_hash": hash("imported-pw"),
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": ["management"],
        }],
        "permissions": [{
            "user": "imported", "vhost": "/",
            "configure": ".*", "write": ".*", "read": ".*",
        }],
        "queues": [{
            "name": "imported.q", "vhost": "/",
            "durable": true, "auto_delete": false,
            "arguments": {"x-max-length": 10},
        }],
    });
    rc.import_definitions(imported).await.expect("import");
    let q = rc
        .get_queue_info("/", "imported.q")
        .await
        .expect("the imported queue");
    assert!(q.durable);
    assert_eq!(q.arguments.get("x-max-length"), Some(&json!(10)));
    let u = rc.get_user("imported").await.expect("the imported user");
    assert!(u.tags.contains("management"));
    let conn = login(&b, "imported", "imported-pw", "/")
        .await
        .expect("the imported user logs in");
    assert!(queue_exists(&conn, "imported.q").await);

    // Into one vhost: the entries name no vhost.
    rc.import_vhost_definitions(
        "/",
        json!({"queues": [
            {"name": "vhost.q", "durable": true, "auto_delete": false, "arguments": {}}
        ]}),
    )
    .await
    .expect("import into /");
    rc.get_queue_info("/", "vhost.q")
        .await
        .expect("the queue imported into /");

    // A file that is not definitions: 400.
    assert_eq!(
        status_of(rc.import_definitions(json!({"queues": "none"})).await),
        400
    );
}

// ---- health checks

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_pass_and_fail_as_rabbitmqs_do() {
    let b = start_with_api().await;
    let rc = api(&b);
    rc.health_check_local_alarms()
        .await
        .expect("no local alarms");
    rc.health_check_cluster_wide_alarms()
        .await
        .expect("no alarms in the cluster");
    rc.health_check_if_node_is_quorum_critical()
        .await
        .expect("a single node is not quorum critical");
    rc.health_check_port_listener(b.addr.port())
        .await
        .expect("the AMQP port listens");
    rc.health_check_port_listener(b.api.unwrap().port())
        .await
        .expect("the API port listens");
    rc.health_check_protocol_listener(SupportedProtocol::AMQP)
        .await
        .expect("an AMQP listener");
    rc.health_check_protocol_listener(SupportedProtocol::HTTP)
        .await
        .expect("an HTTP listener");
    // RabbitMQ 3.x's node health check, still used by clients and
    // monitors: for this node, by name too; another name is not a node.
    let node = rc.overview().await.expect("overview").node;
    assert_eq!(
        get_json(&b, "/api/healthchecks/node").await,
        json!({"status": "ok"})
    );
    assert_eq!(
        get_json(&b, &format!("/api/healthchecks/node/{node}")).await,
        json!({"status": "ok"})
    );
    let (status, _) = http(&b, "GET", "/api/healthchecks/node/rabbit@nowhere", "").await;
    assert_eq!(status, 404);

    let ours = [b.addr.port(), b.api.unwrap().port()];
    let unused = [1u16, 2, 3]
        .into_iter()
        .find(|p| !ours.contains(p))
        .unwrap();
    match rc.health_check_port_listener(unused).await {
        Err(HttpClientError::HealthCheckFailed {
            status_code,
            details,
            ..
        }) => {
            assert_eq!(status_code.as_u16(), 503);
            match details {
                HealthCheckFailureDetails::NoActivePortListener(d) => {
                    assert_eq!(d.status, "failed");
                    assert_eq!(d.inactive_port, unused);
                }
                other => panic!("unexpected details: {other:?}"),
            }
        }
        other => panic!("expected a failed port check, got {other:?}"),
    }
    match rc
        .health_check_protocol_listener(SupportedProtocol::MQTT)
        .await
    {
        Err(HttpClientError::HealthCheckFailed {
            status_code,
            details,
            ..
        }) => {
            assert_eq!(status_code.as_u16(), 503);
            match details {
                HealthCheckFailureDetails::NoActiveProtocolListener(d) => {
                    assert_eq!(d.inactive_protocol, "mqtt");
                    assert!(d.active_protocols.contains(&"amqp".to_string()));
                }
                other => panic!("unexpected details: {other:?}"),
            }
        }
        other => panic!("expected a failed protocol check, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarm_health_checks_fail_while_the_memory_alarm_is_up() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(tmp.path());
    cfg.memory_limit_mb = 1; // always over: the alarm is up from the start
    cfg.management_port = Port::On(0);
    let b = start_with(cfg).await;
    let broker = std::sync::Arc::clone(&b.server.as_ref().unwrap().broker);
    assert!(eventually(|| broker.memory.is_raised()).await);
    let rc = api(&b);
    let node = rc.overview().await.expect("overview").node;
    for check in ["local", "cluster"] {
        let r = if check == "local" {
            rc.health_check_local_alarms().await
        } else {
            rc.health_check_cluster_wide_alarms().await
        };
        match r {
            Err(HttpClientError::HealthCheckFailed {
                status_code,
                details: HealthCheckFailureDetails::AlarmCheck(d),
                ..
            }) => {
                assert_eq!(status_code.as_u16(), 503);
                assert_eq!(d.alarms.len(), 1, "{d:?}");
                assert_eq!(d.alarms[0].resource, "memory");
                assert_eq!(d.alarms[0].node, node);
            }
            other => panic!("expected a failed {check} alarm check, got {other:?}"),
        }
    }
    assert!(
        rc.get_node_info(&node)
            .await
            .expect("node")
            .has_memory_alarm_in_effect
    );
    // The 3.x node health check answers 200 with the failure and why.
    let old = get_json(&b, "/api/healthchecks/node").await;
    assert_eq!(old["status"], "failed", "{old}");
    let reason = old["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("resource alarm(s) in effect") && reason.contains("memory"),
        "{old}"
    );
}

// ---- refusals

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_come_back_with_rabbitmqs_status_codes() {
    let b = start_with_api().await;
    let rc = api(&b);

    // A wrong password or an unknown user: 401.
    let e = api_as(&b, "guest", "not-the-password")
        .overview()
        .await
        .expect_err("a wrong password");
    assert!(e.is_unauthorized(), "{e:?}");
    assert_eq!(e.status_code().map(|s| s.as_u16()), Some(401));
    assert_eq!(
        e.error_details().and_then(|d| d.reason.as_deref()),
        Some("Login failed")
    );
    let e = api_as(&b, "nobody", "x")
        .current_user()
        .await
        .expect_err("an unknown user");
    assert!(e.is_unauthorized(), "{e:?}");
    assert!(matches!(
        api_as(&b, "guest", "not-the-password")
            .probe_reachability()
            .await,
        ReachabilityProbeOutcome::Unreachable(_)
    ));

    // What is not there: 404.
    assert_not_found(rc.get_queue_info("/", "missing").await);
    assert_not_found(rc.get_queue_info("no-such-vhost", "q").await);
    assert_not_found(rc.get_exchange_info("/", "missing").await);
    assert_not_found(rc.get_vhost("missing").await);
    assert_not_found(rc.get_user("missing").await);
    assert_not_found(rc.delete_queue("/", "missing", false).await);

    // What the broker refuses: 400.
    let bad = QueueParams::new_durable_classic_queue("bad", None)
        .with_argument("x-overflow".into(), json!("sideways"));
    assert_eq!(status_of(rc.declare_queue("/", &bad).await), 400);
    assert_not_found(rc.get_queue_info("/", "bad").await);
    rc.declare_queue("/", &QueueParams::new_durable_classic_queue("kept", None))
        .await
        .expect("declare");
    assert_eq!(
        status_of(
            rc.declare_queue("/", &QueueParams::new_transient_autodelete("kept", None))
                .await
        ),
        400,
        "redeclared with other properties"
    );

    // A monitoring user sees everything but changes nothing.
    rc.create_user(&UserParams::monitoring("watcher", &hash("pw")))
        .await
        .expect("create the monitor");
    let watcher = api_as(&b, "watcher", "pw");
    let me = watcher.current_user().await.expect("whoami");
    assert!(me.tags.contains("monitoring"), "{:?}", me.tags);
    assert!(watcher
        .list_queues()
        .await
        .expect("a monitor lists queues")
        .iter()
        .any(|q| q.name == "kept"));
    watcher.list_nodes().await.expect("a monitor lists nodes");
    watcher
        .list_connections()
        .await
        .expect("a monitor lists connections");
    let e = watcher
        .create_vhost(&VirtualHostParams::named("not-allowed"))
        .await
        .expect_err("a monitor may not make a vhost");
    assert!(e.is_unauthorized(), "{e:?}");
    assert_not_found(rc.get_vhost("not-allowed").await);
    let e = watcher.list_users().await.expect_err("nor list users");
    assert!(e.is_unauthorized(), "{e:?}");
    let e = watcher
        .declare_queue("/", &QueueParams::new_durable_classic_queue("nope", None))
        .await
        .expect_err("nor declare in a vhost it has no permissions on");
    assert!(e.is_unauthorized(), "{e:?}");

    // A user with no management tag may not use the API at all.
    rc.create_user(&UserParams::without_tags("plain", &hash("pw")))
        .await
        .expect("create the user");
    let e = api_as(&b, "plain", "pw")
        .overview()
        .await
        .expect_err("no tag, no API");
    assert!(e.is_unauthorized(), "{e:?}");

    // A bad policy: 400 bad_request, "Validation failed" and the keys, as
    // RabbitMQ words it (unknown keys all named together).
    for (definition, names) in [
        (
            r#"{"foo": "bar", "max-length": 1, "zap": 2}"#,
            vec![
                r#"{<<"foo">>,<<"bar">>}"#,
                r#"{<<"zap">>,2}"#,
                "not recognised policy settings",
            ],
        ),
        (r#"{"max-length": "ten"}"#, vec!["max-length"]),
    ] {
        let body = format!(r#"{{"pattern": ".*", "definition": {definition}}}"#);
        let (status, answer) = http(&b, "PUT", "/api/policies/%2F/bad", &body).await;
        assert_eq!(status, 400, "{answer}");
        let answer: Value = serde_json::from_str(&answer).expect("JSON");
        assert_eq!(answer["error"], "bad_request", "{answer}");
        let reason = answer["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("Validation failed"), "{answer}");
        for n in names {
            assert!(reason.contains(n), "{n} in {answer}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_over_http_is_checked_as_publishing_over_amqp() {
    let b = start_with_api().await;
    let rc = api(&b);
    rc.create_user(&UserParams {
        name: "pub",
        password_hash: &hash("pw"),
        tags: "management",
    })
    .await
    .expect("make the user");
    let users = &b.server.as_ref().unwrap().broker.users;
    users.set_permission("pub", "/", ".*", ".*", ".*").unwrap();
    users
        .set_topic_permission("pub", "/", "amq.topic", "^pub\\.", ".*")
        .unwrap();
    let as_pub = api_as(&b, "pub", "pw");
    let ok = as_pub
        .publish_message("/", "amq.topic", "pub.x", "fine", Map::new())
        .await
        .expect("a routing key the topic permission allows");
    assert!(!ok.routed, "no queue is bound");
    assert_eq!(
        status_of(
            as_pub
                .publish_message("/", "amq.topic", "other.x", "refused", Map::new())
                .await
        ),
        401,
        "a topic permission refuses the key"
    );
    let mut props = Map::new();
    props.insert("user_id".into(), json!("someone-else"));
    assert_eq!(
        status_of(
            as_pub
                .publish_message("/", "amq.topic", "pub.x", "forged", props)
                .await
        ),
        400,
        "a user_id other than the caller's own"
    );
}

// ---- message stats, sorting by depth, vhost creation, one queue's
// bindings, a parameter's status codes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_refusals_are_worded_as_rabbitmqs() {
    let b = start_with_api().await;
    // (method, path, body, RabbitMQ 3.10.8's reason); all are 400
    // bad_request. The first two are in tests/fixtures/rabbitmq-3.10.
    let cases = [
        (
            "PUT",
            "/api/queues/%2F/badarg",
            r#"{"durable":true,"arguments":{"x-max-priority":"high"}}"#,
            r#"invalid arg 'x-max-priority' for queue 'badarg' in vhost '/': "expected integer, got longstr""#,
        ),
        (
            "PUT",
            "/api/exchanges/%2F/badtype",
            r#"{"type":"nosuchtype"}"#,
            "unknown exchange type 'nosuchtype'",
        ),
        (
            "PUT",
            "/api/queues/%2F/mode",
            r#"{"arguments":{"x-queue-mode":"eager"}}"#,
            r#"invalid arg 'x-queue-mode' for queue 'mode' in vhost '/': "unsupported queue mode 'eager'""#,
        ),
        (
            "PUT",
            "/api/queues/%2F/classic",
            r#"{"arguments":{"x-max-in-memory-length":5}}"#,
            "invalid arg 'x-max-in-memory-length' for queue 'classic' in vhost '/' of queue type rabbit_classic_queue",
        ),
        (
            "PUT",
            "/api/vhost-limits/%2F/max-connections",
            r#"{"value":"abc"}"#,
            "Validation failed\n\nmax-connections should be a number, actually was <<\"abc\">>\n",
        ),
        (
            "PUT",
            "/api/vhost-limits/%2F/foo",
            r#"{"value":5}"#,
            "Validation failed\n\nUnrecognised terms [{<<\"foo\">>,5}] in limits\n",
        ),
        (
            "PUT",
            "/api/vhost-limits/%2F/max-queues",
            "{}",
            "[{key_missing,value}]",
        ),
        (
            "PUT",
            "/api/user-limits/guest/max-channels",
            r#"{"value":1.5}"#,
            "max-channels should be a number, actually was 1.5",
        ),
        (
            "PUT",
            "/api/user-limits/guest/max-queues",
            r#"{"value":1}"#,
            "Unrecognised terms [{<<\"max-queues\">>,1}] in user-limits",
        ),
        (
            "PUT",
            "/api/permissions/%2F/guest",
            r#"{"configure":".*"}"#,
            "[{key_missing,write},{key_missing,read}]",
        ),
        (
            "PUT",
            "/api/permissions/%2F/nobody",
            r#"{"configure":".*","write":".*","read":".*"}"#,
            "vhost_or_user_not_found",
        ),
        (
            "PUT",
            "/api/topic-permissions/%2F/guest",
            r#"{"exchange":"amq.topic"}"#,
            "[{key_missing,write},{key_missing,read}]",
        ),
        (
            "PUT",
            "/api/parameters/policy/%2F/p",
            r#"{"value":{"pattern":".*","definition":{}}}"#,
            "policies may not be set using this method",
        ),
        (
            "PUT",
            "/api/global-parameters/g",
            "{}",
            "[{key_missing,value}]",
        ),
    ];
    for (method, path, body, reason) in cases {
        let (status, answer) = http(&b, method, path, body).await;
        assert_eq!(status, 400, "{method} {path}: {answer}");
        let answer: Value = serde_json::from_str(&answer).expect("JSON");
        assert_eq!(answer["error"], "bad_request", "{method} {path}: {answer}");
        assert_eq!(answer["reason"], reason, "{method} {path}");
    }
    // Nothing of it was made.
    for path in ["/api/queues/%2F/badarg", "/api/exchanges/%2F/badtype"] {
        assert_eq!(http(&b, "GET", path, "").await.0, 404, "{path}");
    }
    assert_eq!(get_json(&b, "/api/vhost-limits/%2F").await, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_refusals_are_worded_as_rabbitmqs() {
    let b = start_with_api().await;
    let long = format!("/api/queues/%2F/{}", "q".repeat(256));
    // (method, path, body, status, error, RabbitMQ 3.10.8's reason, read
    // from its sources: a tuple comes out as a list).
    let cases = [
        (
            "PUT",
            "/api/queues/%2F/dlx",
            r#"{"arguments":{"x-dead-letter-exchange":5}}"#,
            400,
            "bad_request",
            json!("invalid type 'long' for arg 'x-dead-letter-exchange' in queue 'dlx' in vhost '/'"),
        ),
        (
            "PUT",
            "/api/exchanges/%2F/ae",
            r#"{"type":"direct","arguments":{"alternate-exchange":5}}"#,
            400,
            "bad_request",
            json!("invalid type 'long' for arg 'alternate-exchange' in exchange 'ae' in vhost '/'"),
        ),
        (
            "PUT",
            "/api/queues/%2F/nulls",
            r#"{"arguments":{"x-max-length":null}}"#,
            400,
            "bad_request",
            json!("null_not_allowed"),
        ),
        (
            "PUT",
            "/api/queues/%2F/yes",
            r#"{"durable":"yes"}"#,
            400,
            "bad_request",
            json!(["not_boolean", "yes"]),
        ),
        (
            "PUT",
            long.as_str(),
            "{}",
            400,
            "bad_request",
            json!("queue should be less than 255 bytes, actually was 256\n"),
        ),
        (
            "PUT",
            "/api/queues/%2F/amq.mine",
            "{}",
            401,
            "not_authorised",
            json!("Access refused."),
        ),
        (
            "PUT",
            "/api/exchanges/%2F/amq.mine",
            r#"{"type":"direct"}"#,
            401,
            "not_authorised",
            json!("Access refused."),
        ),
        (
            "DELETE",
            "/api/exchanges/%2F/amq.direct",
            "",
            401,
            "not_authorised",
            json!("Access refused."),
        ),
        (
            "PUT",
            "/api/users/u",
            r#"{"password":"pw"}"#,
            400,
            "bad_request",
            json!("tags_not_present"),
        ),
        (
            "PUT",
            "/api/users/u",
            r#"{"password":"pw","password_hash":"abc","tags":""}"#,
            400,
            "bad_request",
            json!("both_password_and_password_hash_are_provided"),
        ),
        (
            "PUT",
            "/api/users/u",
            r#"{"password_hash":"!!!notbase64","tags":""}"#,
            400,
            "bad_request",
            json!(["not_base64", "!!!notbase64"]),
        ),
        (
            "PUT",
            "/api/policies/%2F/p",
            r#"{"pattern":"(","definition":{"max-length":1}}"#,
            400,
            "bad_request",
            json!("Validation failed\n\npattern should be regular expression but is invalid: {\"unclosed group\",0}\n"),
        ),
        (
            "PUT",
            "/api/queues/%2F/twice",
            r#""{\"durable\":true}""#,
            400,
            "bad_request",
            json!("invalid payload: the request body JSON-decoded to a string. Is the input doubly-JSON-encoded?"),
        ),
        ("PUT", "/api/queues/%2F/list", "[]", 400, "bad_request", json!("not_json")),
        ("PUT", "/api/queues/%2F/five", "5", 400, "bad_request", json!("not_json")),
    ];
    for (method, path, body, status, error, reason) in cases {
        let (got, answer) = http(&b, method, path, body).await;
        assert_eq!(got, status, "{method} {path}: {answer}");
        let answer: Value = serde_json::from_str(&answer).expect("JSON");
        assert_eq!(answer["error"], error, "{method} {path}: {answer}");
        assert_eq!(answer["reason"], reason, "{method} {path}");
    }
    // The old administrator flag stands for the tag.
    let (got, answer) = http(
        &b,
        "PUT",
        "/api/users/old",
        r#"{"password":"pw","administrator":true}"#,
    )
    .await;
    assert_eq!(got, 201, "{answer}");
    assert_eq!(
        get_json(&b, "/api/users/old").await["tags"],
        json!(["administrator"])
    );
    // null and true stand for an empty object: a queue with defaults.
    for (name, body) in [("from-null", "null"), ("from-true", "true")] {
        let path = format!("/api/queues/%2F/{name}");
        let (got, answer) = http(&b, "PUT", &path, body).await;
        assert_eq!(got, 201, "{body}: {answer}");
        assert_eq!(get_json(&b, &path).await["name"], name, "{body}");
    }
    // Nothing refused was made.
    for path in [
        "/api/queues/%2F/dlx",
        "/api/exchanges/%2F/ae",
        "/api/queues/%2F/nulls",
        "/api/queues/%2F/yes",
        "/api/users/u",
        "/api/policies/%2F/p",
        "/api/queues/%2F/twice",
    ] {
        assert_eq!(http(&b, "GET", path, "").await.0, 404, "{path}");
    }
}

/// `method path` with a JSON `body` to `b`'s management API as guest:
/// the status and the body (the crate's types do not carry every stats
/// field, nor a success's status).
async fn http(b: &TestBroker, method: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = b.api.expect("the management API is on");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // "guest:guest" in base64.
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8(raw).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: {head}"));
    (status, body.to_string())
}

/// GET `path` as JSON (200 expected).
async fn get_json(b: &TestBroker, path: &str) -> Value {
    let (status, body) = http(b, "GET", path, "").await;
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_stats_count_what_clients_did() {
    let b = start_with_api().await;
    let rc = api(&b);
    let props = ConnectionProperties::default().with_connection_name("stats-client".into());
    let conn = Connection::connect(&b.uri(), props).await.expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    declare(&ch, "stats.q").await;
    declare(&ch, "stats.other").await;
    exchange(
        &ch,
        "stats.x",
        lapin::ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("exchange");
    bind(&ch, "stats.q", "stats.x", "k", FieldTable::default()).await;
    for key in ["k", "k", "k", "k", "k", "nowhere", "nowhere"] {
        publish_with(
            &ch,
            "stats.x",
            key,
            BasicPublishOptions::default(),
            b"m",
            Default::default(),
        )
        .await
        .await
        .expect("confirmed");
    }
    publish_with(
        &ch,
        "",
        "stats.other",
        BasicPublishOptions::default(),
        b"m",
        Default::default(),
    )
    .await
    .await
    .expect("confirmed");
    for _ in 0..2 {
        let got = ch
            .basic_get("stats.q".into(), BasicGetOptions::default())
            .await
            .expect("basic.get")
            .expect("a message");
        got.delivery
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
    }
    // The acks have been handled once a later synchronous method answers.
    assert_eq!(message_count(&ch, "stats.q").await, 3);

    // The exchange: 7 in, 5 routed out; counted once its channel's batch
    // ended, so looked at until it shows.
    let b2 = &b;
    let x = poll(|| async move {
        let x = get_json(b2, "/api/exchanges/%2F/stats.x").await;
        (x["message_stats"]["publish_in"] == 7).then_some(x)
    })
    .await
    .expect("the exchange counts 7 messages in");
    assert_eq!(x["message_stats"]["publish_out"], 5);
    assert!(x["message_stats"]["publish_in_details"]["rate"].is_number());
    let d = get_json(&b, "/api/exchanges/%2F/amq.default").await;
    assert_eq!(d["message_stats"]["publish_in"], 1, "{d}");

    // The channel and its connection.
    let channels = get_json(&b, "/api/channels").await;
    let c = channels
        .as_array()
        .expect("a list")
        .iter()
        .find(|c| c["connection_details"]["name"].is_string() && c["confirm"] == true)
        .expect("the confirm channel")
        .clone();
    let m = &c["message_stats"];
    assert_eq!(m["publish"], 8, "{m}");
    assert_eq!(m["confirm"], 8, "{m}");
    assert_eq!(m["drop_unroutable"], 2, "{m}");
    assert_eq!(m["get"], 2, "{m}");
    assert_eq!(m["ack"], 2, "{m}");
    assert_eq!(m["deliver_get"], 2, "{m}");
    assert!(m["publish_details"]["rate"].is_number());
    let conns = get_json(&b, "/api/connections").await;
    let ours = conns
        .as_array()
        .expect("a list")
        .iter()
        .find(|c| c["user_provided_name"] == "stats-client")
        .expect("our connection")
        .clone();
    for k in ["recv_oct", "send_oct", "recv_cnt", "send_cnt"] {
        assert!(ours[k].as_u64().unwrap_or(0) > 0, "{k}: {ours}");
    }
    assert!(ours["recv_oct_details"]["rate"].is_number());
    assert_eq!(ours["message_stats"]["publish"], 8);

    // The vhost and the overview sum the channels.
    let v = get_json(&b, "/api/vhosts/%2F").await;
    assert_eq!(v["message_stats"]["publish"], 8, "{v}");
    let o = get_json(&b, "/api/overview").await;
    assert_eq!(o["message_stats"]["publish"], 8);
    assert_eq!(o["message_stats"]["confirm"], 8);
    assert_eq!(o["queue_totals"]["messages"], 4);
    let churn = &o["churn_rates"];
    assert_eq!(churn["queue_declared"], 2, "{churn}");
    assert_eq!(churn["queue_created"], 2, "{churn}");
    assert_eq!(churn["queue_deleted"], 0, "{churn}");
    assert!(churn["connection_created"].as_u64() >= Some(1), "{churn}");
    assert!(churn["queue_declared_details"]["rate"].is_number());
    // Closing the channel keeps what it counted.
    ch.close(200, "done".into()).await.expect("close");
    let v = get_json(&b, "/api/vhosts/%2F").await;
    assert_eq!(v["message_stats"]["publish"], 8, "{v}");

    // Sorted by depth, deepest first, without rendering every queue.
    let page = get_json(
        &b,
        "/api/queues?sort=messages&sort_reverse=true&page=1&page_size=2",
    )
    .await;
    let names: Vec<&str> = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|q| q["name"].as_str())
        .collect();
    assert_eq!(names, ["stats.q", "stats.other"]);
    assert_eq!(page["filtered_count"], 2);

    // A vhost made over the API may be used by whoever made it, as in
    // RabbitMQ.
    rc.create_vhost(&VirtualHostParams::named("made-by-guest"))
        .await
        .expect("create the vhost");
    let there = login(&b, "guest", "guest", "made-by-guest")
        .await
        .expect("guest may use the vhost it made");
    let tch = there.create_channel().await.expect("channel");
    declare(&tch, "in-the-new-vhost").await;

    // A queue's bindings: its own only (the default exchange's, then the
    // others), however many queues the vhost has.
    let bindings = get_json(&b, "/api/queues/%2F/stats.q/bindings").await;
    let sources: Vec<&str> = bindings
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|b| b["source"].as_str())
        .collect();
    assert_eq!(sources, ["", "stats.x"], "{bindings}");
    let from_x = get_json(&b, "/api/exchanges/%2F/stats.x/bindings/source").await;
    assert_eq!(from_x.as_array().map(Vec::len), Some(1), "{from_x}");

    // A parameter made answers 201, updated 204, as RabbitMQ's.
    let put = |v: &'static str| {
        let b = &b;
        async move {
            http(b, "PUT", "/api/global-parameters/warren-test", v)
                .await
                .0
        }
    };
    assert_eq!(put(r#"{"value": 1}"#).await, 201);
    assert_eq!(put(r#"{"value": 2}"#).await, 204);
}

/// The HTTP API client's stream tests (declare with x-max-age and with
/// x-initial-cluster-size, get, delete, idempotent delete), then what a
/// listed stream shows: its type, size, offsets and segments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_declared_listed_and_deleted_through_the_api() {
    let b = start_with_api().await;
    let rc = api(&b);
    let mut extra = Map::new();
    extra.insert("x-initial-cluster-size".into(), json!(3));
    let params = requests::StreamParams {
        name: "api.stream",
        expiration: "24h",
        max_length_bytes: None,
        max_segment_length_bytes: None,
        arguments: Some(extra),
    };
    assert_not_found(rc.get_stream_info("/", "api.stream").await);
    rc.declare_stream("/", &params)
        .await
        .expect("declare_stream");
    let info = rc.get_stream_info("/", "api.stream").await.expect("get");
    assert_eq!(info.queue_type, "stream");
    assert!(info.durable);
    let empty = get_json(&b, "/api/queues/%2f/api.stream").await;
    assert_eq!(empty["arguments"]["x-max-age"], "24h");
    assert_eq!(empty["messages"], 0);
    assert_eq!(empty["first_offset"], Value::Null);
    assert_eq!(empty["last_offset"], Value::Null);
    rc.delete_stream("/", "api.stream", false)
        .await
        .expect("delete");
    rc.delete_stream("/", "api.stream", true)
        .await
        .expect("an idempotent delete of what is gone");
    assert!(rc.delete_stream("/", "api.stream", false).await.is_err());
    assert_not_found(rc.get_stream_info("/", "api.stream").await);

    let params = requests::StreamParams {
        name: "sized.stream",
        expiration: "7D",
        max_length_bytes: Some(1 << 30),
        max_segment_length_bytes: Some(10_000),
        arguments: None,
    };
    rc.declare_stream("/", &params)
        .await
        .expect("declare_stream");
    let (_c, ch) = b.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for i in 0..25 {
        ch.basic_publish(
            "".into(),
            "sized.stream".into(),
            BasicPublishOptions::default(),
            format!("{i:04}:{}", "s".repeat(995)).as_bytes(),
            lapin::BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let listed = get_json(&b, "/api/queues/%2f").await;
    let s = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "sized.stream")
        .expect("listed");
    assert_eq!(s["type"], "stream");
    assert_eq!(s["messages"], 25);
    assert_eq!(s["messages_ready"], 25);
    assert_eq!(s["message_bytes"], 25_000);
    assert_eq!(s["first_offset"], 0);
    assert_eq!(s["last_offset"], 24);
    assert_eq!(s["committed_offset"], 24);
    // 10 messages of 1,000 bytes fill a segment.
    assert_eq!(s["segments"], 3);
    // A get reads from an offset and moves nothing.
    let get = |body: &'static str| http(&b, "POST", "/api/queues/%2f/sized.stream/get", body);
    for _ in 0..2 {
        let (status, body) =
            get(r#"{"count":10,"ackmode":"ack_requeue_false","encoding":"auto","offset":20}"#)
                .await;
        assert_eq!(status, 200, "{body}");
        let got: Value = serde_json::from_str(&body).unwrap();
        let got = got.as_array().unwrap();
        assert_eq!(got.len(), 5);
        assert_eq!(got[0]["properties"]["headers"]["x-stream-offset"], 20);
        assert!(got[0]["payload"].as_str().unwrap().starts_with("0020:"));
        assert_eq!(got[4]["message_count"], 0);
    }
    let (_, body) =
        get(r#"{"count":5,"ackmode":"ack_requeue_true","encoding":"auto","offset":"last"}"#).await;
    let last: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(last[0]["properties"]["headers"]["x-stream-offset"], 24);
    let (_, body) = get(r#"{"count":1,"ackmode":"ack_requeue_true","encoding":"auto"}"#).await;
    let first: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(first[0]["properties"]["headers"]["x-stream-offset"], 0);
    let (status, _) =
        get(r#"{"count":1,"ackmode":"ack_requeue_true","encoding":"auto","offset":-1}"#).await;
    assert_eq!(status, 400);
    assert_eq!(
        get_json(&b, "/api/queues/%2f/sized.stream").await["messages"],
        25
    );
    let published = poll(|| async {
        let q = get_json(&b, "/api/queues/%2f/sized.stream").await;
        (q["message_stats"]["publish"] == 25).then_some(())
    })
    .await;
    assert!(published.is_some(), "appends are counted as publishes");
}
