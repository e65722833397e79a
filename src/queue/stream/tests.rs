//! A stream over a store whose removals can be made to fail, or whose
//! commits lag (a cluster's leader).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use amq_protocol::types::{AMQPValue, FieldTable};
use tokio::sync::watch;

use crate::message::{Message, Meta};
use crate::queue::testing::TestHost;
use crate::queue::{Host, Queue, QueueConfig};
use crate::store::{Applied, Journal, Op, Result, Store};

/// A journal over the store's own: its `RemoveMessage` fails while
/// `failing` is set; with `commits`, it applies at once but commits only
/// when told (a cluster's leader whose followers lag).
struct TestJournal {
    inner: Arc<dyn Journal>,
    failing: Arc<AtomicBool>,
    commits: Option<(std::sync::atomic::AtomicU64, watch::Sender<u64>)>,
}

impl TestJournal {
    fn store(failing: Arc<AtomicBool>, commits: Option<watch::Sender<u64>>) -> Arc<Store> {
        Store::temporary_wrapped(move |inner| {
            Arc::new(TestJournal {
                inner,
                failing,
                commits: commits.map(|c| (Default::default(), c)),
            })
        })
        .unwrap()
    }
}

impl Journal for TestJournal {
    fn submit(&self, op: &Op<'_>) -> Result<Applied> {
        if matches!(op, Op::RemoveMessage { .. }) && self.failing.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("the disk said no").into());
        }
        self.inner.submit(op)
    }
    fn ticket(&self) -> u64 {
        match &self.commits {
            Some((tickets, _)) => tickets.fetch_add(1, Ordering::SeqCst) + 1,
            None => self.inner.ticket(),
        }
    }
    fn committed(&self) -> watch::Receiver<u64> {
        match &self.commits {
            Some((_, committed)) => committed.subscribe(),
            None => self.inner.committed(),
        }
    }
    fn applies_on_commit(&self) -> bool {
        self.commits.is_some()
    }
    fn commit_now(&self) -> Result<()> {
        self.inner.commit_now()
    }
    fn close(&self) -> Result<()> {
        self.inner.close()
    }
    fn defs_version(&self) -> u64 {
        self.inner.defs_version()
    }
}

fn stream_over(store: Arc<Store>, host: &Arc<TestHost>) -> Arc<Queue> {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("stream".into()),
    );
    args.insert(
        "x-stream-max-segment-size-bytes".into(),
        AMQPValue::LongLongInt(100),
    );
    args.insert("x-max-length-bytes".into(), AMQPValue::LongLongInt(300));
    let config = QueueConfig {
        name: "s".into(),
        vhost: "/".into(),
        durable: true,
        exclusive_owner: None,
        auto_delete: false,
        arguments: args,
        store_id: 7,
    };
    let host: Arc<dyn Host> = Arc::clone(host) as Arc<dyn Host>;
    let weak: Weak<dyn Host> = Arc::downgrade(&host);
    Queue::new(config, store, weak)
}

fn stored(store: &Store, id: u64) -> usize {
    store.messages(id).count()
}

#[test]
fn a_failed_retention_removal_fails_no_publish_and_is_retried() {
    let failing = Arc::new(AtomicBool::new(true));
    let store = TestJournal::store(Arc::clone(&failing), None);
    let host = Arc::new(TestHost::default());
    let q = stream_over(Arc::clone(&store), &host);
    let body = [b'x'; 100];
    // Each message fills a segment: every append past the third drops
    // the oldest, and each of those removals fails.
    for _ in 0..10 {
        let m = Message::new(b"", b"s", &[0, 0], &body, Meta::default());
        q.push(&Arc::new(m))
            .expect("the append is not failed by retention");
    }
    let s = q.stream().unwrap();
    let kept = s.extent();
    assert!(kept.messages() < 10, "{kept:?}");
    assert_eq!(stored(&store, 7), 10, "nothing could be removed");

    // The next round (the timer's) removes what is left behind.
    failing.store(false, Ordering::SeqCst);
    s.enforce(&q, super::limits(&q.args), crate::util::record_ms())
        .unwrap();
    assert_eq!(stored(&store, 7) as u64, kept.messages());
}

/// Waits up to 5 s for `sink` to have seen `n` deliveries.
async fn seen(sink: &crate::queue::testing::TestSink, n: usize) -> usize {
    for _ in 0..500 {
        if sink.seen.lock().len() >= n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    sink.seen.lock().len()
}

#[tokio::test]
async fn in_a_cluster_a_reader_gets_only_what_is_committed_and_is_woken_by_the_commit() {
    use crate::queue::testing::{consumer, TestSink};
    let (commits, _) = watch::channel(0u64);
    let store = TestJournal::store(Arc::default(), Some(commits.clone()));
    let host = Arc::new(TestHost::default());
    let q = stream_over(store, &host);
    let sink = Arc::new(TestSink::default());
    q.add_consumer(consumer(&sink, "r", 100, 0)).unwrap();
    for _ in 0..3 {
        let m = Message::new(b"", b"s", &[0, 0], b"m", Meta::default());
        q.push(&Arc::new(m)).unwrap();
    }
    assert!(sink.seen.lock().is_empty(), "nothing is committed yet");
    let s = q.stream().unwrap();
    let peek = |q: &Arc<Queue>| s.peek(q, super::Start::First, 10, 1 << 20).unwrap().len();
    assert_eq!(peek(&q), 0, "nor shown by the API");
    // The commit that covers the first two appends: the reader is woken,
    // takes them and stops at the third.
    commits.send_replace(2);
    assert_eq!(seen(&sink, 2).await, 2);
    let offsets: Vec<u64> = sink.seen.lock().iter().map(|(_, o, _)| *o).collect();
    assert_eq!(offsets, [0, 1]);
    // Its commit wakes it again, with no other event.
    commits.send_replace(3);
    assert_eq!(seen(&sink, 3).await, 3);
    // With no reader left, the API still sees what was committed since.
    q.remove_consumer(
        &sink
            .unacked
            .lock()
            .first()
            .unwrap()
            .consumer
            .clone()
            .unwrap(),
    );
    let m = Message::new(b"", b"s", &[0, 0], b"m", Meta::default());
    q.push(&Arc::new(m)).unwrap();
    assert_eq!(peek(&q), 3);
    commits.send_replace(4);
    assert_eq!(peek(&q), 4);
}

/// A batch (the stream protocol's Publish) takes consecutive offsets
/// after what was appended before it, is stored whole, and reads back in
/// order; on a store that commits later (a cluster's leader) it is read
/// only once committed, as single appends are.
#[tokio::test]
async fn a_batch_takes_consecutive_offsets_and_reads_back_in_order() {
    use crate::queue::testing::{consumer, TestSink};
    for clustered in [false, true] {
        let (commits, _) = watch::channel(0u64);
        let store = TestJournal::store(Arc::default(), clustered.then(|| commits.clone()));
        let host = Arc::new(TestHost::default());
        let q = stream_over(Arc::clone(&store), &host);
        let sink = Arc::new(TestSink::default());
        q.add_consumer(consumer(&sink, "r", 100, 0)).unwrap();
        let one = |b: &[u8]| Message::new(b"", b"s", &[0, 0], b, Meta::default().as_amqp10());
        q.push(&Arc::new(one(b"a"))).unwrap();
        let s = q.stream().unwrap();
        let batch = || vec![one(b"b"), one(b"c"), one(b"d")];
        assert!(s.push_batch(&q, batch()).unwrap());
        assert_eq!(stored(&store, 7), 4, "clustered {clustered}");
        commits.send_replace(u64::MAX);
        assert_eq!(seen(&sink, 4).await, 4, "clustered {clustered}");
        let offsets: Vec<u64> = sink.seen.lock().iter().map(|(_, o, _)| *o).collect();
        assert_eq!(offsets, [0, 1, 2, 3], "clustered {clustered}");
        let read: Vec<Vec<u8>> = store
            .messages(7)
            .map(|m| m.unwrap().message.body().to_vec())
            .collect();
        assert_eq!(read, [b"a", b"b", b"c", b"d"], "clustered {clustered}");
        s.delete();
        assert!(
            !s.push_batch(&q, batch()).unwrap(),
            "a deleted stream takes none"
        );
    }
}
