//! Test doubles for the queue's unit tests: a sink that takes what its
//! consumers' prefetch allows and keeps their unacked deliveries, and a
//! host that keeps what was dead-lettered.

use std::sync::{Arc, Weak};

use amq_protocol::types::{AMQPValue, FieldTable};
use parking_lot::Mutex;

use super::{Consumer, Entry, Host, Queue, QueueConfig, Refused, Settle, Sink, Unacked};
use crate::message::{Message, Meta};
use crate::store::Store;

/// Deliveries in the order they were made: (consumer tag, seq, redelivered).
#[derive(Default)]
pub struct TestSink {
    pub seen: Mutex<Vec<(String, u64, bool)>>,
    pub unacked: Mutex<Vec<Unacked>>,
}

impl Sink for TestSink {
    fn try_deliver(
        &self,
        consumer: &Arc<Consumer>,
        queue: &Arc<Queue>,
        entry: Entry,
    ) -> Result<(), (Entry, Refused)> {
        if consumer.prefetch != 0 && consumer.unacked() >= consumer.prefetch {
            return Err((entry, Refused::Credit));
        }
        self.seen
            .lock()
            .push((consumer.tag.clone(), entry.seq, entry.redelivered));
        if consumer.no_ack {
            queue.settle_delivered(entry);
            return Ok(());
        }
        consumer.take_credit();
        self.unacked.lock().push(Unacked {
            tag: entry.seq,
            queue: Arc::clone(queue),
            entry,
            consumer: Some(Arc::clone(consumer)),
            deadline: 0,
        });
        Ok(())
    }

    fn deliver_get(
        &self,
        queue: &Arc<Queue>,
        entry: Entry,
        _message_count: u32,
        no_ack: bool,
        _timeout_ms: u64,
    ) -> Option<Entry> {
        self.seen
            .lock()
            .push(("get".into(), entry.seq, entry.redelivered));
        if no_ack {
            return Some(entry);
        }
        self.unacked.lock().push(Unacked {
            tag: entry.seq,
            queue: Arc::clone(queue),
            entry,
            consumer: None,
            deadline: 0,
        });
        None
    }

    fn cancelled(&self, _tag: &str) {}
}

impl TestSink {
    /// Settles the unacked deliveries with these seqs, as a channel does.
    pub fn settle(&self, seqs: &[u64], how: Settle) {
        let mut taken = Vec::new();
        self.unacked.lock().retain_mut(|u| {
            if !seqs.contains(&u.entry.seq) {
                return true;
            }
            taken.push(Unacked {
                tag: u.tag,
                queue: Arc::clone(&u.queue),
                entry: u.entry.clone(),
                consumer: u.consumer.take(),
                deadline: 0,
            });
            false
        });
        for u in &taken {
            if let Some(c) = &u.consumer {
                c.give_credit();
            }
        }
        Queue::settle_all(&mut taken, how);
    }

    /// Consumer tags in delivery order.
    pub fn tags(&self) -> Vec<String> {
        self.seen.lock().iter().map(|(t, _, _)| t.clone()).collect()
    }
}

/// A host that keeps dead-lettered messages.
#[derive(Default)]
pub struct TestHost {
    pub dead: Mutex<Vec<Arc<Message>>>,
}

impl Host for TestHost {
    fn dead_letter(&self, msg: &Arc<Message>) {
        self.dead.lock().push(Arc::clone(msg));
    }
    fn expire(&self, _queue: &Arc<Queue>) {}
}

/// A transient queue with `args` (name, value) living in `host`.
pub fn queue(args: &[(&str, AMQPValue)], host: &Arc<TestHost>) -> Arc<Queue> {
    let mut table = FieldTable::default();
    for (k, v) in args {
        table.insert((*k).into(), v.clone());
    }
    let config = QueueConfig {
        name: "q".into(),
        vhost: "/".into(),
        durable: false,
        exclusive_owner: None,
        auto_delete: false,
        arguments: table,
        store_id: 0,
    };
    let host: Arc<dyn Host> = Arc::clone(host) as Arc<dyn Host>;
    let weak: Weak<dyn Host> = Arc::downgrade(&host);
    Queue::new(config, Store::temporary().unwrap(), weak)
}

/// A consumer of `sink` with this prefetch and priority.
pub fn consumer(sink: &Arc<TestSink>, tag: &str, prefetch: u32, priority: i32) -> Arc<Consumer> {
    let sink: Arc<dyn Sink> = Arc::clone(sink) as Arc<dyn Sink>;
    Arc::new(Consumer::new(
        tag.into(),
        sink,
        false,
        false,
        prefetch,
        priority,
        0,
    ))
}

/// Pushes `n` small messages.
pub fn push(q: &Arc<Queue>, n: usize) {
    for _ in 0..n {
        let m = Message::new(b"", b"q", &[0, 0], b"m", Meta::default());
        q.push(&Arc::new(m)).unwrap();
    }
}
