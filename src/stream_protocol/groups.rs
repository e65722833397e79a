//! Single active consumer: subscriptions that share a name on a stream
//! form a group, and one of them at a time reads (RabbitMQ's
//! `single-active-consumer` subscription property, with `name`).
//!
//! On a plain stream the first to join is active and keeps it until it
//! leaves; then the next in joining order gets it. On a partition of a
//! super stream (the subscription names it with `super-stream`) the
//! active one is the member at the partition's index modulo the group's
//! size, so the consumers of a super stream spread its partitions
//! between them; when a join or a leave moves it, the active one is told
//! to step down first, and the next becomes active only once it has
//! answered (it may store its offset first) or left: a connection that
//! leaves a ConsumerUpdate unanswered for `ANSWER_WAIT` is closed
//! (conn/sac.rs), which is how a member that never answers leaves, as in
//! RabbitMQ (its `request_timeout`).
//!
//! The groups are the broker's (every connection on both stream
//! listeners shares them); a member is told what it is through its
//! connection's channel, and the connection tells the client with
//! ConsumerUpdate (conn/sac.rs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// How long a client has to answer a ConsumerUpdate before its
/// connection is closed (RabbitMQ's default `request_timeout`).
pub const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// A group: the consumers named `name` on `stream` in `vhost`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub vhost: String,
    pub stream: String,
    pub name: String,
}

/// What a member's connection is told: subscription `sub` is now active
/// or not. `epoch` names a step-down, for `Groups::stepped_down`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Update {
    pub sub: u8,
    /// The member it is for (a subscription id may be used again).
    pub member: u64,
    pub active: bool,
    pub epoch: u64,
}

/// What a connection's own tasks and groups tell it, not yet acted on:
/// the latest group update per subscription (so at most 256, however
/// fast groups change; a member told to step down is not made active
/// again before it answers, so the latest is the one that counts), and
/// the subscriptions that ended by themselves (their stream went; by id
/// and serial, each at most once).
#[derive(Default)]
pub struct Inbox {
    news: Mutex<News>,
    arrived: Notify,
}

#[derive(Default)]
pub struct News {
    pub updates: HashMap<u8, Update>,
    pub ended: Vec<(u8, u64)>,
}

impl Inbox {
    fn put(&self, u: Update) {
        self.news.lock().updates.insert(u.sub, u);
        self.arrived.notify_one();
    }

    /// Subscription `id` (its `serial`) ended by itself.
    pub fn ended(&self, id: u8, serial: u64) {
        self.news.lock().ended.push((id, serial));
        self.arrived.notify_one();
    }

    /// The subscriptions that ended, taken now (a frame is acted on
    /// after them: a client told its stream went may subscribe again at
    /// once, with the same id).
    pub fn take_ended(&self) -> Vec<(u8, u64)> {
        std::mem::take(&mut self.news.lock().ended)
    }

    /// What came in, once something has (cancel safe).
    pub async fn take(&self) -> News {
        loop {
            {
                let mut news = self.news.lock();
                if !news.updates.is_empty() || !news.ended.is_empty() {
                    return std::mem::take(&mut *news);
                }
            }
            self.arrived.notified().await;
        }
    }
}

struct Member {
    id: u64,
    sub: u8,
    /// Its connection's inbox (gone with the connection).
    tell: Weak<Inbox>,
}

impl Member {
    /// Tells its connection; false if the connection is gone.
    fn tell(&self, u: Update) -> bool {
        self.tell.upgrade().map(|i| i.put(u)).is_some()
    }
}

struct Group {
    /// The stream's index among its super stream's partitions.
    partition: Option<usize>,
    /// In joining order.
    members: Vec<Member>,
    /// The member that is active (or being told to step down).
    active: Option<u64>,
    /// The epoch of the step-down under way, if one is.
    stepping_down: Option<u64>,
}

/// Every group of a broker.
#[derive(Default)]
pub struct Groups {
    groups: Mutex<HashMap<Key, Group>>,
    ids: AtomicU64,
}

/// A subscription's place in its group; it leaves when dropped.
pub struct Membership {
    groups: Arc<Groups>,
    pub key: Key,
    pub id: u64,
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.groups.leave(&self.key, self.id);
    }
}

impl Groups {
    /// Subscription `sub` (of the connection whose inbox is `tell`)
    /// joins group `key`; `partition` is its stream's index in a super
    /// stream. It is told when it becomes active (perhaps at once).
    pub fn join(
        self: &Arc<Self>,
        key: Key,
        partition: Option<usize>,
        sub: u8,
        tell: &Arc<Inbox>,
    ) -> Membership {
        let tell = Arc::downgrade(tell);
        let id = self.ids.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let mut groups = self.groups.lock();
            let group = groups.entry(key.clone()).or_insert_with(|| Group {
                partition,
                members: Vec::new(),
                active: None,
                stepping_down: None,
            });
            group.members.push(Member { id, sub, tell });
            self.settle(group);
        }
        Membership {
            groups: Arc::clone(self),
            key,
            id,
        }
    }

    fn leave(&self, key: &Key, id: u64) {
        let mut groups = self.groups.lock();
        let Some(group) = groups.get_mut(key) else {
            return;
        };
        group.members.retain(|m| m.id != id);
        if group.members.is_empty() {
            groups.remove(key);
            return;
        }
        if group.active == Some(id) {
            group.active = None;
            group.stepping_down = None;
        }
        self.settle(group);
    }

    /// Member `id` has stepped down (answered).
    pub fn stepped_down(&self, key: &Key, id: u64, epoch: u64) {
        let mut groups = self.groups.lock();
        let Some(group) = groups.get_mut(key) else {
            return;
        };
        if group.active == Some(id) && group.stepping_down == Some(epoch) {
            group.active = None;
            group.stepping_down = None;
            self.settle(group);
        }
    }

    /// Whether member `id` of `key` is the active one.
    #[cfg(test)]
    fn is_active(&self, key: &Key, id: u64) -> bool {
        self.groups
            .lock()
            .get(key)
            .is_some_and(|g| g.active == Some(id) && g.stepping_down.is_none())
    }

    /// Moves the group toward the member that should be active: tells the
    /// active one to step down if another should be, or makes the one that
    /// should be active if none is.
    fn settle(&self, group: &mut Group) {
        if group.stepping_down.is_some() || group.members.is_empty() {
            return;
        }
        let n = group.members.len();
        let wanted = match (group.partition, group.active) {
            (Some(p), _) => group.members[p % n].id,
            // A plain stream's active consumer keeps it.
            (None, Some(a)) => a,
            (None, None) => group.members[0].id,
        };
        match group.active {
            Some(a) if a == wanted => {}
            Some(a) => {
                let epoch = self.ids.fetch_add(1, Ordering::Relaxed) + 1;
                group.stepping_down = Some(epoch);
                if let Some(m) = group.members.iter().find(|m| m.id == a) {
                    let sent = m.tell(Update {
                        sub: m.sub,
                        member: a,
                        active: false,
                        epoch,
                    });
                    if sent {
                        return;
                    }
                }
                // Its connection is gone: nothing to wait for.
                group.stepping_down = None;
                group.active = None;
                self.settle(group);
            }
            None => {
                group.active = Some(wanted);
                if let Some(m) = group.members.iter().find(|m| m.id == wanted) {
                    // A connection that is gone leaves soon (and the group
                    // settles again then).
                    m.tell(Update {
                        sub: m.sub,
                        member: wanted,
                        active: true,
                        epoch: 0,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn key() -> Key {
        Key {
            vhost: "/".into(),
            stream: "s".into(),
            name: "app".into(),
        }
    }

    /// The update waiting in `inbox`, if one is.
    fn next(inbox: &Arc<Inbox>) -> Option<Update> {
        let news = inbox.take().now_or_never()?;
        assert_eq!(news.updates.len(), 1, "one update at a time here");
        news.updates.into_values().next()
    }

    fn inbox() -> (Arc<Inbox>, Arc<Inbox>) {
        let i = Arc::new(Inbox::default());
        (Arc::clone(&i), i)
    }

    #[tokio::test]
    async fn a_plain_stream_keeps_its_first_consumer_until_it_leaves() {
        let groups = Arc::new(Groups::default());
        let (t1, r1) = inbox();
        let (t2, r2) = inbox();
        let a = groups.join(key(), None, 1, &t1);
        assert_eq!(next(&r1).map(|u| u.active), Some(true));
        let b = groups.join(key(), None, 2, &t2);
        assert_eq!(next(&r2), None, "the second waits");
        assert_eq!(next(&r1), None, "the first is not disturbed");
        drop(a);
        assert_eq!(
            next(&r2),
            Some(Update {
                sub: 2,
                member: b.id,
                active: true,
                epoch: 0
            })
        );
        assert!(groups.is_active(&key(), b.id));
        drop(b);
        assert!(groups.groups.lock().is_empty(), "an empty group goes");
    }

    #[tokio::test]
    async fn a_partition_moves_to_its_index_after_the_step_down() {
        let groups = Arc::new(Groups::default());
        let (t1, r1) = inbox();
        let (t2, r2) = inbox();
        // Partition 1: with two members, the second is to be active.
        let a = groups.join(key(), Some(1), 1, &t1);
        assert_eq!(next(&r1).map(|u| u.active), Some(true));
        let b = groups.join(key(), Some(1), 7, &t2);
        let down = next(&r1).expect("the first is told to step down");
        assert!(!down.active);
        assert_eq!(next(&r2), None, "nothing until the step-down is over");
        // A stale answer changes nothing.
        groups.stepped_down(&key(), a.id, down.epoch + 100);
        assert_eq!(next(&r2), None);
        groups.stepped_down(&key(), a.id, down.epoch);
        assert_eq!(next(&r2).map(|u| (u.sub, u.active)), Some((7, true)));
        assert!(groups.is_active(&key(), b.id));
        // The active one leaves: the other is active at once.
        drop(b);
        assert_eq!(next(&r1).map(|u| u.active), Some(true));
        assert!(groups.is_active(&key(), a.id));
    }

    #[tokio::test]
    async fn a_member_whose_connection_is_gone_is_not_waited_for() {
        let groups = Arc::new(Groups::default());
        let (t1, r1) = inbox();
        let (t2, r2) = inbox();
        let _a = groups.join(key(), Some(1), 1, &t1);
        drop((t1, r1));
        let b = groups.join(key(), Some(1), 2, &t2);
        assert_eq!(next(&r2).map(|u| u.active), Some(true));
        assert!(groups.is_active(&key(), b.id));
    }
}
