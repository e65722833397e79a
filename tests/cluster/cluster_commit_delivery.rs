//! A cluster's leader delivered a replicated message (a persistent one in
//! a durable queue) as soon as it was queued, before its log entry was
//! committed: with both followers stopped, a consumer got a message the
//! cluster did not hold, and could ack it while its publisher had no
//! confirm (and would publish it again, a duplicate, if the leader was
//! lost). As RabbitMQ's quorum queues do, a replicated message is now
//! delivered, and returned by basic.get, only once committed.

use crate::cluster_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cluster_support::total::durable;
use cluster_support::Cluster;
use futures::StreamExt;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};

/// Cluster tests share the machine's two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn publish(ch: &Channel, queue: &str, body: &str) -> lapin::PublisherConfirm {
    ch.basic_publish(
        "".into(),
        queue.into(),
        BasicPublishOptions::default(),
        body.as_bytes(),
        BasicProperties::default().with_delivery_mode(2),
    )
    .await
    .unwrap()
}

/// Waits up to `within` for `n` deliveries.
async fn until(count: &AtomicUsize, n: usize, within: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + within;
    while count.load(Ordering::SeqCst) < n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    count.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_message_is_delivered_only_once_committed() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Longer timeouts than the defaults: the leader must not step down
    // while its followers are stopped for a few seconds.
    let toml = "[cluster]\nelection_timeout_ms = 3000\nstep_down_ms = 4000\n";
    let cluster = Cluster::start_with(3, toml);
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let conn = cluster
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    for q in ["q", "g"] {
        ch.queue_declare(q.into(), durable(), FieldTable::default())
            .await
            .unwrap();
    }
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let cch = conn.create_channel().await.unwrap();
    let mut consumer = cch
        .basic_consume(
            "q".into(),
            "c".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    tokio::spawn(async move {
        while let Some(Ok(_)) = consumer.next().await {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    });
    for i in 0..5 {
        assert!(publish(&ch, "q", &i.to_string())
            .await
            .await
            .unwrap()
            .is_ack());
    }
    assert_eq!(until(&count, 5, Duration::from_secs(10)).await, 5);

    for &f in &followers {
        cluster.signal(f, libc::SIGSTOP);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut confirms = Vec::new();
    for i in 0..10 {
        confirms.push(publish(&ch, "q", &format!("p{i}")).await);
        confirms.push(publish(&ch, "g", &format!("g{i}")).await);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let gch = conn.create_channel().await.unwrap();
    let got = gch
        .basic_get("g".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap();
    assert!(got.is_none(), "basic.get returned a message not committed");
    assert_eq!(
        count.load(Ordering::SeqCst),
        5,
        "persistent messages were delivered before their entry committed"
    );

    for &f in &followers {
        cluster.signal(f, libc::SIGCONT);
    }
    for c in confirms {
        let c = tokio::time::timeout(Duration::from_secs(20), c)
            .await
            .expect("a confirm once the followers are back")
            .unwrap();
        assert!(c.is_ack());
    }
    assert_eq!(until(&count, 15, Duration::from_secs(10)).await, 15);
    let got = gch
        .basic_get("g".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap();
    assert!(got.is_some(), "basic.get finds the committed message");
    let _ = conn.close(200, "done".into()).await;
    cluster.assert_no_panics();
}

/// A durable queue declared again (or passively) by a second connection
/// got its declare-ok at once while the first connection's declare was
/// not committed: the second client went on with a queue the cluster
/// might never hold. It now waits for the commit, as the first does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redeclare_is_answered_only_once_the_declare_is_committed() {
    let _one = ONE_AT_A_TIME.lock().await;
    let toml = "[cluster]\nelection_timeout_ms = 3000\nstep_down_ms = 4000\n";
    let cluster = Cluster::start_with(3, toml);
    let (leader, _) = cluster.wait_leader(0, Duration::from_secs(30)).await;
    let first = cluster
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect");
    let second = cluster
        .connect(leader, Duration::from_secs(30))
        .await
        .expect("connect");
    let (a, b) = (
        first.create_channel().await.unwrap(),
        second.create_channel().await.unwrap(),
    );
    for i in 0..3 {
        if i != leader {
            cluster.signal(i, libc::SIGSTOP);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let declaring = tokio::spawn(async move {
        a.queue_declare("r".into(), durable(), FieldTable::default())
            .await
            .map(|_| ())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let again = tokio::spawn(async move {
        let p = b
            .queue_declare("r".into(), passive, FieldTable::default())
            .await
            .map(|_| ());
        let d = b
            .queue_declare("r".into(), durable(), FieldTable::default())
            .await
            .map(|_| ());
        p.and(d)
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !again.is_finished(),
        "a passive declare was answered before the declare was committed"
    );
    for i in 0..3 {
        if i != leader {
            cluster.signal(i, libc::SIGCONT);
        }
    }
    let within = Duration::from_secs(20);
    tokio::time::timeout(within, declaring)
        .await
        .expect("the declare is answered")
        .unwrap()
        .unwrap();
    tokio::time::timeout(within, again)
        .await
        .expect("the redeclares are answered")
        .unwrap()
        .unwrap();
    cluster.assert_no_panics();
}
