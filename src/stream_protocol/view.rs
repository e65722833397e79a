//! A stream connection as the management API sees it: its publishers
//! and consumers (broker/stream_clients.rs), and a way to close it
//! (`Closer`). Each publisher and consumer is listed while it exists
//! (its `Listed` guard takes it out when dropped) with counters its
//! connection and its reader bump (a few atomic adds per batch or chunk,
//! never per message).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Semaphore;

use crate::broker::stream_clients::{StreamConsumer, StreamPublisher, StreamView};
use crate::queue::Queue;

/// A connection's publishers and subscriptions.
#[derive(Default)]
pub struct View {
    publishers: Mutex<BTreeMap<u8, (u64, Arc<PublisherStats>)>>,
    consumers: Mutex<BTreeMap<u8, (u64, Arc<ConsumerStats>)>>,
    serial: AtomicU64,
}

/// A publisher's counters.
pub struct PublisherStats {
    pub stream: String,
    pub reference: Option<String>,
    pub published: AtomicU64,
    pub confirmed: AtomicU64,
    pub errored: AtomicU64,
}

impl PublisherStats {
    pub fn new(stream: &str, reference: Option<&str>) -> PublisherStats {
        PublisherStats {
            stream: stream.to_string(),
            reference: reference.map(str::to_string),
            published: AtomicU64::new(0),
            confirmed: AtomicU64::new(0),
            errored: AtomicU64::new(0),
        }
    }
}

/// A subscription's state and counters.
pub struct ConsumerStats {
    pub stream: String,
    pub queue: Arc<Queue>,
    pub properties: Vec<(String, String)>,
    pub credit: Arc<Semaphore>,
    pub consumed: AtomicU64,
    /// The offset it reads next.
    pub offset: AtomicU64,
    pub active: AtomicBool,
}

impl ConsumerStats {
    /// Counts a chunk of `n` messages sent, the last at `last`.
    pub fn sent(&self, n: u64, last: u64) {
        self.consumed.fetch_add(n, Ordering::Relaxed);
        self.offset.store(last + 1, Ordering::Relaxed);
    }
}

/// Which list an entry is on.
#[derive(Clone, Copy)]
enum Kind {
    Publisher,
    Consumer,
}

/// Keeps an entry listed; dropping it takes the entry out (unless a later
/// one took its id).
pub struct Listed {
    view: Arc<View>,
    kind: Kind,
    id: u8,
    serial: u64,
}

impl Drop for Listed {
    fn drop(&mut self) {
        let serial = self.serial;
        match self.kind {
            Kind::Publisher => {
                let mut m = self.view.publishers.lock();
                if m.get(&self.id).is_some_and(|(s, _)| *s == serial) {
                    m.remove(&self.id);
                }
            }
            Kind::Consumer => {
                let mut m = self.view.consumers.lock();
                if m.get(&self.id).is_some_and(|(s, _)| *s == serial) {
                    m.remove(&self.id);
                }
            }
        }
    }
}

impl View {
    /// Lists publisher `id`.
    pub fn publisher(self: &Arc<Self>, id: u8, stats: Arc<PublisherStats>) -> Listed {
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        self.publishers.lock().insert(id, (serial, stats));
        self.listed(Kind::Publisher, id, serial)
    }

    /// Lists subscription `id`.
    pub fn consumer(self: &Arc<Self>, id: u8, stats: Arc<ConsumerStats>) -> Listed {
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        self.consumers.lock().insert(id, (serial, stats));
        self.listed(Kind::Consumer, id, serial)
    }

    fn listed(self: &Arc<Self>, kind: Kind, id: u8, serial: u64) -> Listed {
        Listed {
            view: Arc::clone(self),
            kind,
            id,
            serial,
        }
    }

    /// Counts `n` messages of publisher `id` confirmed.
    pub fn confirmed(&self, id: u8, n: u64) {
        if let Some((_, p)) = self.publishers.lock().get(&id) {
            p.confirmed.fetch_add(n, Ordering::Relaxed);
        }
    }
}

impl StreamView for View {
    fn publishers(&self) -> Vec<StreamPublisher> {
        let m = self.publishers.lock();
        m.iter()
            .map(|(&id, (_, p))| StreamPublisher {
                id,
                stream: p.stream.clone(),
                reference: p.reference.clone().unwrap_or_default(),
                published: p.published.load(Ordering::Relaxed),
                confirmed: p.confirmed.load(Ordering::Relaxed),
                errored: p.errored.load(Ordering::Relaxed),
            })
            .collect()
    }

    fn consumers(&self) -> Vec<StreamConsumer> {
        let listed: Vec<(u8, Arc<ConsumerStats>)> = {
            let m = self.consumers.lock();
            m.iter().map(|(&id, (_, c))| (id, Arc::clone(c))).collect()
        };
        listed
            .into_iter()
            .map(|(id, c)| {
                let offset = c.offset.load(Ordering::Relaxed);
                let end = c.queue.stream().map_or(0, |s| s.readable_end(&c.queue));
                StreamConsumer {
                    id,
                    stream: c.stream.clone(),
                    credits: c.credit.available_permits() as u64,
                    consumed: c.consumed.load(Ordering::Relaxed),
                    offset,
                    offset_lag: end.saturating_sub(offset),
                    properties: c.properties.clone(),
                    active: c.active.load(Ordering::Relaxed),
                }
            })
            .collect()
    }
}

/// How the management API closes a stream connection (with the reason it
/// gives); the connection's loop waits on `asked`.
#[derive(Default)]
pub struct Closer {
    reason: std::sync::OnceLock<String>,
    asked: tokio::sync::Notify,
}

impl Closer {
    /// Resolves once the connection is to close; why.
    pub async fn asked(&self) -> String {
        self.asked.notified().await;
        self.reason.get().cloned().unwrap_or_default()
    }
}

impl crate::broker::connections::Control for Closer {
    fn force_close(&self, reason: &str) {
        let _ = self.reason.set(reason.to_string());
        // Kept until the connection's loop asks, if it is not waiting.
        self.asked.notify_one();
    }
}
