//! Resource alarms, as RabbitMQ's: the memory alarm (memory.rs,
//! `vm_memory_high_watermark`) and the free-disk alarm (disk.rs,
//! `disk_free_limit`). Each raises or clears its resource in the node's
//! `Alarms`; while any is raised, connections that publish stop reading
//! from their sockets (after telling clients that asked, with
//! `connection.blocked`) until every one clears. Consumers go on, so
//! queues drain and the resource comes back. As in RabbitMQ, alarms are
//! cluster-wide: a cluster's leader also holds the alarms its members
//! report (cluster/resources.rs), and blocks publishers while any member
//! is low (monitors.rs is what a member reports).

mod disk;
mod memory;
mod monitors;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

pub use disk::{disk_free, DiskAlarm};
pub use memory::{limit_for, resident_bytes, total_memory, MemoryAlarm};
pub use monitors::{Monitors, Report};

/// A resource whose alarm can be raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Memory = 1,
    Disk = 2,
}

impl Resource {
    /// As RabbitMQ names it in health checks and alarm lists.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::Disk => "disk",
        }
    }
}

/// Where other members' alarms sit in the bits: above this node's.
const REMOTE: u8 = 4;
/// This node's bits.
const LOCAL_MASK: u8 = (1 << REMOTE) - 1;

/// The raised alarms: this node's, a bit per resource, and (on a
/// cluster's leader) those its members report, the same bits shifted by
/// `REMOTE`.
pub struct Alarms {
    /// The bits, for a lock-free check on every read.
    bits: AtomicU8,
    raised: watch::Sender<u8>,
    /// Each member's raised bits as it last reported them (raised only).
    members: parking_lot::Mutex<BTreeMap<u64, u8>>,
}

impl Alarms {
    /// No alarm raised.
    pub fn new() -> Arc<Alarms> {
        Arc::new(Alarms {
            bits: AtomicU8::new(0),
            raised: watch::channel(0).0,
            members: Default::default(),
        })
    }

    /// Raises or clears `r` on this node; true if that changed anything.
    pub(crate) fn set(&self, r: Resource, on: bool) -> bool {
        self.update(|bits| {
            if on {
                bits | r as u8
            } else {
                bits & !(r as u8)
            }
        })
    }

    /// Records what member `id` reports raised (its own bits: `Report`);
    /// 0 for a member that clears, left, or did not answer.
    pub fn set_member(&self, id: u64, raised: u8) {
        let mut members = self.members.lock();
        if raised & LOCAL_MASK == 0 {
            members.remove(&id);
        } else {
            members.insert(id, raised & LOCAL_MASK);
        }
        let remote = members.values().fold(0, |a, b| a | b) << REMOTE;
        self.update(|bits| (bits & LOCAL_MASK) | remote);
    }

    /// Forgets every member's alarms (the node no longer leads).
    pub fn clear_members(&self) {
        self.members.lock().clear();
        self.update(|bits| bits & LOCAL_MASK);
    }

    fn update(&self, f: impl FnOnce(u8) -> u8) -> bool {
        self.raised.send_if_modified(|bits| {
            let next = f(*bits);
            if next == *bits {
                return false;
            }
            *bits = next;
            self.bits.store(next, Ordering::Relaxed);
            true
        })
    }

    /// Whether any alarm is raised, here or on a member.
    pub fn any(&self) -> bool {
        self.bits.load(Ordering::Relaxed) != 0
    }

    /// Whether this node's alarm of `r` is raised.
    pub fn is_raised(&self, r: Resource) -> bool {
        self.bits.load(Ordering::Relaxed) & r as u8 != 0
    }

    /// This node's raised bits (what it reports to a leader).
    pub fn local_bits(&self) -> u8 {
        self.bits.load(Ordering::Relaxed) & LOCAL_MASK
    }

    /// This node's raised resources.
    pub fn raised(&self) -> Vec<Resource> {
        resources(self.local_bits())
    }

    /// The members' raised resources, by member id.
    pub fn members_raised(&self) -> Vec<(u64, Resource)> {
        let members = self.members.lock();
        members
            .iter()
            .flat_map(|(&id, &bits)| resources(bits).into_iter().map(move |r| (id, r)))
            .collect()
    }

    /// Watches the bits (0: none raised).
    pub fn subscribe(&self) -> watch::Receiver<u8> {
        self.raised.subscribe()
    }

    /// Why publishers are blocked, as RabbitMQ words `connection.blocked`
    /// (whichever node is low).
    pub fn reason(&self) -> &'static str {
        let bits = self.bits.load(Ordering::Relaxed);
        let bits = bits | bits >> REMOTE;
        let raised = |r: Resource| bits & r as u8 != 0;
        match (raised(Resource::Memory), raised(Resource::Disk)) {
            (true, true) => "low on memory & low on disk",
            (false, true) => "low on disk",
            _ => "low on memory",
        }
    }
}

/// The resources raised in `bits` (a node's own, as `Report` has them).
pub fn resources(bits: u8) -> Vec<Resource> {
    [Resource::Memory, Resource::Disk]
        .into_iter()
        .filter(|&r| bits & r as u8 != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_and_reasons() {
        let a = Alarms::new();
        assert!(!a.any());
        assert!(a.set(Resource::Disk, true));
        assert!(!a.set(Resource::Disk, true));
        assert_eq!(a.reason(), "low on disk");
        a.set(Resource::Memory, true);
        assert_eq!(a.reason(), "low on memory & low on disk");
        assert_eq!(a.raised(), vec![Resource::Memory, Resource::Disk]);
        a.set(Resource::Disk, false);
        a.set(Resource::Memory, false);
        assert!(!a.any() && *a.subscribe().borrow() == 0);
    }

    #[test]
    fn members_alarms_block_too_and_are_told_apart() {
        let a = Alarms::new();
        a.set_member(2, Resource::Disk as u8);
        assert!(a.any() && a.raised().is_empty());
        assert!(!a.is_raised(Resource::Disk) && a.local_bits() == 0);
        assert_eq!(a.reason(), "low on disk");
        assert_eq!(a.members_raised(), vec![(2, Resource::Disk)]);
        a.set_member(3, Resource::Memory as u8);
        a.set(Resource::Disk, true);
        assert_eq!(a.reason(), "low on memory & low on disk");
        a.set_member(2, 0);
        assert_eq!(a.members_raised(), vec![(3, Resource::Memory)]);
        a.clear_members();
        a.set(Resource::Disk, false);
        assert!(!a.any() && a.members_raised().is_empty());
    }
}
