//! A queue's consumers: all of them in the order they subscribed (the
//! first is the single active consumer), and the *ready* ones, those that
//! may take a delivery now, ordered by priority (highest first) and then
//! round-robin. A consumer that refuses a delivery (out of prefetch
//! credit, its connection's outbox full, its channel closing) is *parked*:
//! out of the ready set until what it waited for happens (an ack frees its
//! credit, the outbox drains). So a delivery looks only at consumers that
//! can take it, and adding, removing, parking and unparking are O(log n):
//! ten thousand consumers out of credit cost a publish nothing.
//!
//! The queue's lock guards this; `Consumer::parked` mirrors the parked
//! state so that an ack can tell, without the structure, whether there is
//! anything to unpark.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::amqp::delivery::Consumer;

/// Why a consumer did not take a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Out of prefetch credit (its own or its channel's).
    Credit,
    /// Its connection's outbox is over the high-water mark; the outbox
    /// (at this address) wakes the queue when it drains.
    Outbox(usize),
    /// Its channel or connection is closing.
    Closed,
}

/// Ready-set key: priority (highest first), then a stamp (round-robin).
type Key = (Reverse<i32>, u64);

struct Slot {
    consumer: Arc<Consumer>,
    /// Where it is in the ready set; None while parked.
    ready: Option<Key>,
}

/// The consumers of one queue.
#[derive(Default)]
pub struct Consumers {
    /// By consumer id: ids grow, so this is subscription order.
    all: BTreeMap<u64, Slot>,
    ready: BTreeMap<Key, u64>,
    next_stamp: u64,
    /// Consumers parked on a full outbox: (outbox address, consumer id).
    on_outbox: Vec<(usize, u64)>,
}

impl Consumers {
    /// How many there are.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Whether an exclusive consumer holds the queue (then it is the only one).
    pub fn exclusive_held(&self) -> bool {
        self.all
            .first_key_value()
            .is_some_and(|(_, s)| s.consumer.exclusive)
    }

    fn stamp(&mut self, priority: i32) -> Key {
        self.next_stamp += 1;
        (Reverse(priority), self.next_stamp)
    }

    /// Adds a consumer, ready.
    pub fn add(&mut self, consumer: Arc<Consumer>) {
        let key = self.stamp(consumer.priority);
        consumer.parked.store(false, Ordering::Relaxed);
        self.ready.insert(key, consumer.id);
        self.all.insert(
            consumer.id,
            Slot {
                consumer,
                ready: Some(key),
            },
        );
    }

    /// Removes consumer `id`.
    pub fn remove(&mut self, id: u64) -> Option<Arc<Consumer>> {
        let slot = self.all.remove(&id)?;
        if let Some(key) = slot.ready {
            self.ready.remove(&key);
        }
        self.on_outbox.retain(|&(_, c)| c != id);
        Some(slot.consumer)
    }

    /// The consumer the next delivery goes to, if any may take one: with
    /// a single active consumer only the first subscribed, else the first
    /// ready one.
    pub fn next(&self, single_active: bool) -> Option<&Arc<Consumer>> {
        if single_active {
            let (_, slot) = self.all.first_key_value()?;
            return slot.ready.is_some().then_some(&slot.consumer);
        }
        let (_, id) = self.ready.first_key_value()?;
        self.all.get(id).map(|s| &s.consumer)
    }

    /// After a delivery to `id`: it goes to the back of its priority group
    /// (round-robin). A single active consumer keeps its place.
    pub fn delivered(&mut self, id: u64, single_active: bool) {
        if single_active {
            return;
        }
        let Some(priority) = self.all.get(&id).map(|s| s.consumer.priority) else {
            return;
        };
        let key = self.stamp(priority);
        let Some(slot) = self.all.get_mut(&id) else {
            return;
        };
        if let Some(old) = slot.ready.replace(key) {
            self.ready.remove(&old);
        }
        self.ready.insert(key, id);
    }

    /// Takes `id` out of the ready set for `why`.
    pub fn park(&mut self, id: u64, why: Refused) {
        let Some(slot) = self.all.get_mut(&id) else {
            return;
        };
        if let Some(key) = slot.ready.take() {
            self.ready.remove(&key);
        }
        slot.consumer.parked.store(true, Ordering::Relaxed);
        if let Refused::Outbox(at) = why {
            self.on_outbox.push((at, id));
        }
    }

    /// Puts `id` back in the ready set (its credit or outbox freed up).
    pub fn unpark(&mut self, id: u64) {
        let Some(priority) = self
            .all
            .get(&id)
            .filter(|s| s.ready.is_none())
            .map(|s| s.consumer.priority)
        else {
            return;
        };
        let key = self.stamp(priority);
        if let Some(slot) = self.all.get_mut(&id) {
            slot.ready = Some(key);
            slot.consumer.parked.store(false, Ordering::Relaxed);
        }
        self.ready.insert(key, id);
    }

    /// Unparks the consumers that waited for the outbox at `at` to drain.
    pub fn unpark_outbox(&mut self, at: usize) {
        let mut i = 0;
        while i < self.on_outbox.len() {
            if self.on_outbox[i].0 == at {
                let (_, id) = self.on_outbox.swap_remove(i);
                self.unpark(id);
            } else {
                i += 1;
            }
        }
    }

    /// Takes every consumer out (the queue is deleted).
    pub fn drain(&mut self) -> Vec<Arc<Consumer>> {
        self.ready.clear();
        self.on_outbox.clear();
        std::mem::take(&mut self.all)
            .into_values()
            .map(|s| s.consumer)
            .collect()
    }
}
