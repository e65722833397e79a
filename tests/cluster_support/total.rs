//! A total-queue workload in the style of Jepsen's: a publisher of
//! numbered persistent messages with pipelined confirms that moves to
//! another node whenever its connection fails or stalls, a consumer that
//! takes everything, and the check: every confirmed message dequeued,
//! nothing dequeued that was never published, a message twice only as
//! redelivered.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use parking_lot::Mutex;

use super::Cluster;

pub const QUEUE: &str = "total";
/// Confirms outstanding at most.
const WINDOW: usize = 300;
/// A confirm that takes longer means the connection is stuck.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(4);

#[derive(Default)]
pub struct History {
    /// Every id sent.
    pub published: BTreeSet<u64>,
    /// Every id the broker confirmed.
    pub confirmed: BTreeSet<u64>,
    /// When each id was sent, and when each confirm came.
    pub sent_at: BTreeMap<u64, Instant>,
    pub confirmed_at: Vec<(u64, Instant)>,
}

impl History {
    /// From `at` to the first confirm of a message sent after it: how
    /// long publishing stopped confirming (a failover seen by a client).
    pub fn gap_after(&self, at: Instant) -> Option<Duration> {
        self.confirmed_at
            .iter()
            .filter(|(id, _)| self.sent_at.get(id).is_some_and(|s| *s > at))
            .map(|(_, t)| t.duration_since(at))
            .min()
    }
}

pub fn queue_args() -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    t
}

pub fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// Where message `id` is published: exchange, routing key, headers, and
/// how many bytes its body is padded to (the id, then spaces).
pub type Route = Arc<dyn Fn(u64) -> (String, String, FieldTable, usize) + Send + Sync>;

/// Every message to the total queue, unpadded.
pub fn direct() -> Route {
    Arc::new(|_| ("".into(), QUEUE.into(), FieldTable::default(), 0))
}

/// A message's body: its id, then spaces up to `pad` bytes.
pub fn body(id: u64, pad: usize) -> Vec<u8> {
    let mut b = id.to_string().into_bytes();
    if b.len() < pad {
        b.resize(pad, b' ');
    }
    b
}

/// The id a body carries.
pub fn id_of(body: &[u8]) -> u64 {
    let digits = body.split(|&b| b == b' ').next().unwrap_or_default();
    std::str::from_utf8(digits).unwrap().parse().unwrap()
}

/// How long a request may go unanswered before the connection is given
/// up: lapin can leave a request pending for ever on a connection that
/// died under it.
const ANSWER: Duration = Duration::from_secs(30);

/// `request`'s result, None if it failed or went unanswered for `ANSWER`.
async fn answered<T, E>(request: impl std::future::Future<Output = Result<T, E>>) -> Option<T> {
    tokio::time::timeout(ANSWER, request).await.ok()?.ok()
}

/// Publishes ids from 1 on, through node `order[0]` first, moving to the
/// next node whenever a connection fails or stalls, until `stop`.
pub async fn publish(
    cluster: Arc<Cluster>,
    order: Vec<usize>,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
) {
    let order = Arc::new(Mutex::new(order));
    publish_routed(cluster, order, stop, history, direct()).await
}

/// The nodes a publisher goes through, in turn; a test may change them
/// (a member replaced) while it runs.
pub type Order = Arc<Mutex<Vec<usize>>>;

/// `publish`, each message where `route` says.
pub async fn publish_routed(
    cluster: Arc<Cluster>,
    order: Order,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
    route: Route,
) {
    let mut next = 1u64;
    let mut at = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let node = {
            let order = order.lock();
            order[at % order.len()]
        };
        at += 1;
        let uri = cluster.uri(node);
        let conn = tokio::time::timeout(
            Duration::from_secs(5),
            lapin::Connection::connect(&uri, lapin::ConnectionProperties::default()),
        )
        .await;
        let Ok(Ok(conn)) = conn else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(ch) = answered(conn.create_channel()).await else {
            continue;
        };
        let declared = answered(ch.queue_declare(QUEUE.into(), durable(), queue_args())).await;
        if declared.is_none()
            || answered(ch.confirm_select(ConfirmSelectOptions::default()))
                .await
                .is_none()
        {
            continue;
        }
        let mut window = VecDeque::new();
        'conn: loop {
            let stopping = stop.load(Ordering::Relaxed);
            if !stopping {
                let id = next;
                next += 1;
                {
                    let mut h = history.lock();
                    h.published.insert(id);
                    h.sent_at.insert(id, Instant::now());
                }
                let (exchange, key, headers, pad) = route(id);
                let sent = answered(
                    ch.basic_publish(
                        exchange.as_str().into(),
                        key.as_str().into(),
                        BasicPublishOptions::default(),
                        &body(id, pad),
                        BasicProperties::default()
                            .with_delivery_mode(2)
                            .with_headers(headers),
                    ),
                )
                .await;
                match sent {
                    Some(confirm) => window.push_back((id, confirm)),
                    None => break 'conn,
                }
            }
            while window.len() >= WINDOW || (stopping && !window.is_empty()) {
                let Some((id, confirm)) = window.pop_front() else {
                    break;
                };
                match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
                    Ok(Ok(c)) if c.is_ack() => {
                        let mut h = history.lock();
                        h.confirmed.insert(id);
                        h.confirmed_at.push((id, Instant::now()));
                    }
                    _ => break 'conn,
                }
            }
            if stopping {
                let _ = answered(conn.close(200, "done".into())).await;
                return;
            }
        }
    }
}

/// Everything in the queue, through node `i`: id -> (times, all but the
/// first redelivered).
pub async fn consume_all(cluster: &Cluster, i: usize) -> BTreeMap<u64, (u32, bool)> {
    let mut got = BTreeMap::new();
    consume_into(cluster, i, &mut got).await;
    got
}

/// `consume_all`, counted into `got` (deliveries seen before it).
pub async fn consume_into(cluster: &Cluster, i: usize, got: &mut BTreeMap<u64, (u32, bool)>) {
    let conn = cluster
        .connect(i, Duration::from_secs(30))
        .await
        .expect("connect to consume");
    let ch = conn.create_channel().await.unwrap();
    ch.basic_qos(1000, BasicQosOptions::default())
        .await
        .unwrap();
    let q = ch
        .queue_declare(QUEUE.into(), durable(), queue_args())
        .await
        .unwrap();
    let expected = q.message_count();
    let mut consumer = ch
        .basic_consume(
            QUEUE.into(),
            "check".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut n = 0u32;
    while let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_secs(3), consumer.next()).await
    {
        record(got, id_of(&d.data), d.redelivered);
        n += 1;
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
    assert!(n >= expected, "consumed {n} of the {expected} queued");
}

/// Counts a delivery of `id`: times, and whether every one after the
/// first was flagged redelivered.
pub fn record(got: &mut BTreeMap<u64, (u32, bool)>, id: u64, redelivered: bool) {
    let e = got.entry(id).or_insert((0, true));
    if e.0 > 0 && !redelivered {
        e.1 = false;
    }
    e.0 += 1;
}

pub fn check(history: &History, got: &BTreeMap<u64, (u32, bool)>) {
    check_delivered(history, got);
    let dup: Vec<u64> = got
        .iter()
        .filter(|(_, (times, redelivered))| *times > 1 && !*redelivered)
        .map(|(id, _)| *id)
        .collect();
    assert!(
        dup.is_empty(),
        "delivered twice, not as redelivered: {dup:?}"
    );
}

/// Every confirmed message dequeued, and nothing that was never
/// published.
pub fn check_delivered(history: &History, got: &BTreeMap<u64, (u32, bool)>) {
    let lost: Vec<u64> = history
        .confirmed
        .iter()
        .filter(|id| !got.contains_key(id))
        .copied()
        .collect();
    assert!(
        lost.is_empty(),
        "{} confirmed messages lost (of {}), first {:?}",
        lost.len(),
        history.confirmed.len(),
        &lost[..lost.len().min(10)]
    );
    let unknown: Vec<u64> = got
        .keys()
        .filter(|id| !history.published.contains(id))
        .copied()
        .collect();
    assert!(unknown.is_empty(), "never published: {unknown:?}");
}

/// A publisher running against a cluster (see `publish`).
pub struct Workload {
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
    publisher: tokio::task::JoinHandle<()>,
}

impl Workload {
    /// Starts publishing through the nodes of `order`, the first first.
    pub fn start(cluster: &Arc<Cluster>, order: Vec<usize>) -> Workload {
        Self::start_routed(cluster, order, direct())
    }

    /// Starts publishing, each message where `route` says.
    pub fn start_routed(cluster: &Arc<Cluster>, order: Vec<usize>, route: Route) -> Workload {
        Self::start_on(cluster, Arc::new(Mutex::new(order)), route)
    }

    /// `start_routed`, through nodes the caller may change.
    pub fn start_on(cluster: &Arc<Cluster>, order: Order, route: Route) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let history = Arc::new(Mutex::new(History::default()));
        let publisher = tokio::spawn(publish_routed(
            Arc::clone(cluster),
            order,
            Arc::clone(&stop),
            Arc::clone(&history),
            route,
        ));
        Workload {
            stop,
            history,
            publisher,
        }
    }

    /// What was published and confirmed so far, to add to.
    pub fn history(&self) -> Arc<Mutex<History>> {
        Arc::clone(&self.history)
    }

    /// Stops publishing, waits for the outstanding confirms, and says what
    /// happened.
    pub async fn stop(self) -> History {
        self.stop.store(true, Ordering::Relaxed);
        tokio::time::timeout(Duration::from_secs(30), self.publisher)
            .await
            .expect("the publisher finishes")
            .unwrap();
        let mut h = self.history.lock();
        std::mem::take(&mut *h)
    }
}

/// At least `min` confirmed, a line for the log, and `check`.
pub fn report(label: &str, min: usize, history: &History, got: &BTreeMap<u64, (u32, bool)>) {
    assert!(
        history.confirmed.len() > min,
        "{label}: too few confirmed to mean anything: {}",
        history.confirmed.len()
    );
    eprintln!(
        "{label}: {} published, {} confirmed, {} consumed",
        history.published.len(),
        history.confirmed.len(),
        got.len()
    );
    check(history, got);
}
