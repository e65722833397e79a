//! A node's resource monitors: its alarms and the memory and free-disk
//! alarms that raise them. A single node's broker owns them; a cluster
//! node keeps them for its whole life (they watch its own memory and
//! disk whether it leads or follows), lends them to the broker of each
//! term it leads, and answers a leader's question with a `Report`.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{resident_bytes, Alarms, DiskAlarm, MemoryAlarm};

/// A node's alarms and their monitors.
#[derive(Clone)]
pub struct Monitors {
    pub alarms: Arc<Alarms>,
    pub memory: Arc<MemoryAlarm>,
    pub disk: Arc<DiskAlarm>,
}

/// What a member tells the leader of its resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Its own raised alarms (`Alarms::local_bits`).
    pub raised: u8,
    pub mem_used: u64,
    pub mem_limit: u64,
    pub disk_free: u64,
    pub disk_free_limit: u64,
}

impl Monitors {
    /// Monitors memory against `mem_limit` resident bytes and the
    /// filesystem of `data_dir` against `disk_limit` free bytes, from now
    /// until the last clone is dropped; an error if the free space cannot
    /// be read.
    pub fn start(data_dir: &Path, mem_limit: u64, disk_limit: u64) -> Result<Monitors, String> {
        let alarms = Alarms::new();
        let memory = MemoryAlarm::new(mem_limit, Arc::clone(&alarms));
        let disk = DiskAlarm::new(data_dir, disk_limit, Arc::clone(&alarms))?;
        memory.start();
        disk.start();
        Ok(Monitors {
            alarms,
            memory,
            disk,
        })
    }

    /// This node's resources now.
    pub fn report(&self) -> Report {
        Report {
            raised: self.alarms.local_bits(),
            mem_used: resident_bytes().unwrap_or(0),
            mem_limit: self.memory.limit(),
            disk_free: self.disk.free_now(),
            disk_free_limit: self.disk.limit(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alarm::Resource;

    #[tokio::test]
    async fn a_report_says_what_this_node_has_raised() {
        let dir = tempfile::tempdir().unwrap();
        let m = Monitors::start(dir.path(), u64::MAX, u64::MAX).unwrap();
        m.alarms.set_member(7, Resource::Memory as u8);
        let r = m.report();
        assert_eq!(r.raised, Resource::Disk as u8, "its own, not a member's");
        assert_eq!(r.disk_free_limit, u64::MAX);
        assert!(r.disk_free > 0);
    }
}
