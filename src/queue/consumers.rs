//! A queue's consumers: all of them in the order they subscribed (the
//! first is the single active consumer), and the *ready* ones, those that
//! may take a delivery now, in one round-robin ring per priority (highest
//! first). A consumer that refuses a delivery (out of prefetch credit, its
//! connection's outbox full, its channel closing) is *parked*: out of the
//! ready rings until what it waited for happens (an ack frees its credit,
//! the outbox drains). So a delivery looks only at consumers that can take
//! it: ten thousand consumers out of credit cost a publish nothing.
//!
//! Costs: a delivery is O(1) (the ring's front goes to its back); adding,
//! removing, parking and unparking are O(log n) or O(1) amortized. A ring
//! entry carries the consumer's generation: parking or removing a consumer
//! bumps it, which turns its entry stale, and stale entries are dropped
//! when they reach the front (or when they outnumber the live ones).
//!
//! With a single active consumer, an active consumer that leaves while it
//! still holds unacked deliveries hands over only once they are settled
//! (`Handover`): acked, they are done; requeued (its channel closed, a
//! nack), they go first to the consumer that takes over, in their order.
//! So two consumers never work on the queue at once, and the order holds
//! whether a client cancels before it closes (pika does) or not.
//!
//! The queue's lock guards all of this; the consumer's own atomics only
//! mirror it, so that an ack can tell without the lock whether there is
//! anything to unpark.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Consumer;

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

/// One priority's consumers.
#[derive(Default)]
struct Level {
    /// Ready consumers in round-robin order, with the generation they had
    /// when queued (older generations are stale entries).
    ring: VecDeque<(Arc<Consumer>, u32)>,
    /// How many entries of `ring` are live.
    ready: usize,
    /// How many consumers of this priority are subscribed.
    subscribed: usize,
}

impl Level {
    fn is_live(entry: &(Arc<Consumer>, u32)) -> bool {
        let (c, generation) = entry;
        !c.parked.load(Ordering::Relaxed) && c.generation.load(Ordering::Relaxed) == *generation
    }

    /// Drops stale entries from the front; the live front, if any.
    fn front(&mut self) -> Option<&Arc<Consumer>> {
        while let Some(e) = self.ring.front() {
            if Self::is_live(e) {
                break;
            }
            self.ring.pop_front();
        }
        self.ring.front().map(|(c, _)| c)
    }

    fn push(&mut self, c: Arc<Consumer>) {
        let generation = c.generation.load(Ordering::Relaxed);
        self.ring.push_back((c, generation));
        self.ready += 1;
        // Many park / unpark cycles without a delivery leave stale
        // entries behind: keep them from outgrowing the live ones.
        if self.ring.len() > 2 * self.ready + 32 {
            self.ring.retain(Self::is_live);
        }
    }
}

/// The consumers of one queue.
#[derive(Default)]
pub struct Consumers {
    /// By consumer id: ids grow, so this is subscription order.
    all: BTreeMap<u64, Arc<Consumer>>,
    /// By priority, highest first (a queue has few priorities: a short
    /// list beats a map on every delivery).
    levels: Vec<(i32, Level)>,
    /// Consumers parked on a full outbox: (outbox address, consumer id).
    on_outbox: Vec<(usize, u64)>,
    /// A single active consumer that left holding deliveries.
    handover: Option<Handover>,
}

/// The single active consumer that left with deliveries unsettled: none
/// goes to the next one until they are.
struct Handover {
    consumer: u64,
    unsettled: u32,
}

impl Consumers {
    /// Whether a consumer of priority `min` or higher can take a delivery
    /// now (not parked: it has credit, its outbox has room).
    pub fn any_ready_from(&self, min: i32) -> bool {
        self.levels.iter().any(|(p, l)| *p >= min && l.ready > 0)
    }

    /// Whether a consumer of priority `min` or higher is subscribed, ready
    /// or not.
    pub fn any_from(&self, min: i32) -> bool {
        self.levels
            .iter()
            .any(|(p, l)| *p >= min && l.subscribed > 0)
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Every consumer, in subscription order.
    pub fn list(&self) -> Vec<Arc<Consumer>> {
        self.all.values().cloned().collect()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Whether an exclusive consumer holds the queue (then it is the only one).
    pub fn exclusive_held(&self) -> bool {
        self.all.first_key_value().is_some_and(|(_, c)| c.exclusive)
    }

    fn level(&mut self, priority: i32) -> Option<&mut Level> {
        self.levels
            .iter_mut()
            .find(|(p, _)| *p == priority)
            .map(|(_, l)| l)
    }

    /// The highest-priority level with a ready consumer.
    fn first_ready(&mut self) -> Option<&mut Level> {
        self.levels
            .iter_mut()
            .find(|(_, l)| l.ready > 0)
            .map(|(_, l)| l)
    }

    /// Makes `c`'s ring entries stale.
    fn retire(c: &Consumer) {
        c.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds a consumer, ready.
    pub fn add(&mut self, c: Arc<Consumer>) {
        c.parked.store(false, Ordering::Relaxed);
        Self::retire(&c);
        let at = match self.levels.iter().position(|(p, _)| *p <= c.priority) {
            Some(i) if self.levels[i].0 == c.priority => i,
            Some(i) => {
                self.levels.insert(i, (c.priority, Level::default()));
                i
            }
            None => {
                self.levels.push((c.priority, Level::default()));
                self.levels.len() - 1
            }
        };
        let level = &mut self.levels[at].1;
        level.subscribed += 1;
        level.push(Arc::clone(&c));
        self.all.insert(c.id, c);
    }

    /// Removes consumer `id`.
    pub fn remove(&mut self, id: u64) -> Option<Arc<Consumer>> {
        let c = self.all.remove(&id)?;
        if let Some(i) = self.levels.iter().position(|(p, _)| *p == c.priority) {
            let level = &mut self.levels[i].1;
            if !c.parked.load(Ordering::Relaxed) {
                level.ready -= 1;
            }
            level.subscribed -= 1;
            if level.subscribed == 0 {
                self.levels.remove(i);
            }
        }
        // Parked, so an ack cannot unpark it, and its entries stale.
        c.parked.store(true, Ordering::Relaxed);
        Self::retire(&c);
        self.on_outbox.retain(|&(_, other)| other != id);
        Some(c)
    }

    /// Removes consumer `id`, the single active one of its queue: if it
    /// leaves holding deliveries, the next one waits until they are
    /// settled (`settled`).
    pub fn remove_active(&mut self, id: u64) -> Option<Arc<Consumer>> {
        let active = self
            .all
            .first_key_value()
            .is_some_and(|(&first, _)| first == id);
        let c = self.remove(id)?;
        let unsettled = c.unacked();
        if active && unsettled > 0 && self.handover.is_none() {
            self.handover = Some(Handover {
                consumer: id,
                unsettled,
            });
        }
        Some(c)
    }

    /// A delivery to consumer `id` was settled (acked, requeued, rejected).
    pub fn settled(&mut self, id: u64) {
        if let Some(h) = self.handover.as_mut().filter(|h| h.consumer == id) {
            h.unsettled -= 1;
            if h.unsettled == 0 {
                self.handover = None;
            }
        }
    }

    /// The consumer the next delivery goes to, if any may take one: with
    /// a single active consumer only the first subscribed (once the one
    /// before it has no delivery unsettled), else the front of the
    /// highest-priority ring with a ready consumer.
    pub fn next(&mut self, single_active: bool) -> Option<&Arc<Consumer>> {
        if single_active {
            if self.handover.is_some() {
                return None;
            }
            let (_, c) = self.all.first_key_value()?;
            return (!c.parked.load(Ordering::Relaxed)).then_some(c);
        }
        self.first_ready()?.front()
    }

    /// After a delivery to the consumer `next` returned: it goes to the
    /// back of its ring (round-robin). A single active consumer keeps its
    /// place.
    pub fn delivered(&mut self, single_active: bool) {
        if single_active {
            return;
        }
        if let Some(level) = self.first_ready() {
            if level.ready > 1 {
                if let Some(front) = level.ring.pop_front() {
                    level.ring.push_back(front);
                }
            }
        }
    }

    /// Parks the consumer `next` returned, for `why`: out of the ready
    /// rings until `unpark`.
    pub fn park_next(&mut self, single_active: bool, why: Refused) {
        let c = if single_active {
            self.all.first_key_value().map(|(_, c)| Arc::clone(c))
        } else {
            self.first_ready()
                .and_then(|l| l.ring.pop_front())
                .map(|(c, _)| c)
        };
        let Some(c) = c else { return };
        if c.parked.swap(true, Ordering::Relaxed) {
            return;
        }
        Self::retire(&c);
        if let Some(level) = self.level(c.priority) {
            level.ready -= 1;
        }
        if let Refused::Outbox(at) = why {
            if !self.on_outbox.contains(&(at, c.id)) {
                self.on_outbox.push((at, c.id));
            }
        }
    }

    /// Puts consumer `id` back among the ready ones (its credit or outbox
    /// freed up).
    pub fn unpark(&mut self, id: u64) {
        let Some(c) = self.all.get(&id) else {
            return;
        };
        if !c.parked.swap(false, Ordering::Relaxed) {
            return;
        }
        Self::retire(c);
        let c = Arc::clone(c);
        if let Some(level) = self.level(c.priority) {
            level.push(c);
        }
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
        self.levels.clear();
        self.on_outbox.clear();
        self.handover = None;
        let all: Vec<Arc<Consumer>> = std::mem::take(&mut self.all).into_values().collect();
        for c in &all {
            c.parked.store(true, Ordering::Relaxed);
            Self::retire(c);
        }
        all
    }
}
