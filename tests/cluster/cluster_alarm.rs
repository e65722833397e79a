//! Resource alarms are cluster-wide, as RabbitMQ's: a follower under its
//! free-disk limit blocks the publishers the leader serves ("low on
//! disk"), the leader's health check and /api/nodes name that follower,
//! the follower's own Prometheus says so, and once it is gone (a member
//! that does not answer counts as clear) the publishers go on.

use crate::cluster_support;

use std::time::{Duration, Instant};

use cluster_support::api::get_json;
use cluster_support::Cluster;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;
use serde_json::{json, Value};

/// Waits up to 30 s for `f` to hold.
async fn until(what: &str, c: &Cluster, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "{what}; {}", c.logs_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_low_on_disk_blocks_publishers_on_the_leader() {
    let c = Cluster::start(3);
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    let f = (leader + 1) % 3;
    // The follower comes back with a limit no disk here meets.
    c.kill(f);
    *c.nodes[f].args.lock().unwrap() = vec!["--disk-free-limit".into(), "1000000TB".into()];
    c.spawn(f);
    let name = format!("warren-{}@127.0.0.1", c.nodes[f].id);
    let api = c.api(leader);

    // The leader's health check names the follower's alarm; its own
    // (local-alarms) are clear.
    let alarm = json!({"node": name, "resource": "disk"});
    until("the leader names the follower's alarm", &c, async || {
        let (status, body) = get_json(&format!("{api}/api/health/checks/alarms")).await;
        status == 503
            && body["alarms"]
                .as_array()
                .is_some_and(|a| a.contains(&alarm))
    })
    .await;
    let (status, _) = get_json(&format!("{api}/api/health/checks/local-alarms")).await;
    assert_eq!(status, 200, "the leader's own disk is fine");
    let (_, nodes) = get_json(&format!("{api}/api/nodes")).await;
    let node = nodes
        .as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == name.as_str()))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(node["disk_free_alarm"], true, "{nodes}");
    assert_eq!(
        node["disk_free_limit"], 1_000_000_000_000_000_000u64,
        "{nodes}"
    );
    assert!(node["disk_free"].as_u64().is_some_and(|f| f > 0), "{nodes}");
    // The follower's own metrics say so.
    let metrics = c.metrics(f).await;
    assert!(
        metrics.contains("\nrabbitmq_alarms_free_disk_space_watermark 1\n"),
        "{metrics}"
    );

    // A publisher on the leader is blocked, with RabbitMQ's reason.
    let conn = c
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare("held".into(), durable, FieldTable::default())
        .await
        .unwrap();
    let persistent = BasicProperties::default().with_delivery_mode(2);
    let publish = |body: &'static [u8]| {
        let ch = ch.clone();
        let props = persistent.clone();
        async move {
            ch.basic_publish(
                "".into(),
                "held".into(),
                BasicPublishOptions::default(),
                body,
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap()
        }
    };
    let _ = publish(b"before").await;
    until("the publisher is blocked", &c, async || {
        conn.status().blocked()
    })
    .await;
    assert!(
        c.log_has(leader, "a member's resource alarm"),
        "{}",
        c.logs_tail()
    );

    // The follower goes: no member reports an alarm, publishing goes on
    // (two of three still commit).
    c.kill(f);
    until("the publisher is unblocked", &c, async || {
        !conn.status().blocked()
    })
    .await;
    assert!(publish(b"after").await.is_ack());
    let (status, body) = get_json(&format!("{api}/api/health/checks/alarms")).await;
    assert_eq!(status, 200, "{body}");
    c.assert_no_panics();
}
