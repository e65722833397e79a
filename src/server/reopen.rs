//! A single node whose store failed a commit (the disk filled under it, a
//! sync failed) cannot trust it again: sled refuses every write after an
//! I/O error, and after a failed sync what the page cache holds is
//! unknown. Nothing it could not write was confirmed. So the node closes
//! every connection (320 CONNECTION_FORCED), drops the store, and opens it
//! again from disk, on the same ports, once the data directory has room:
//! confirmed messages come back, unconfirmed ones are the publishers' to
//! send again, as after a restart. A store that still does not open after
//! a minute with room stops the node (exit 70). (A cluster member's term
//! gives way to a new one instead: mirror.rs.)

use std::future::Future;
use std::time::Duration;

use tracing::{error, info, warn};

use super::Server;
use crate::config::{Config, Port};

/// How often the store is looked at.
const CHECK: Duration = Duration::from_millis(100);
/// How often a reopen is tried while it fails or the disk has no room.
const RETRY: Duration = Duration::from_secs(1);
/// Free bytes a reopen waits for at least, whatever the alarm's limit.
const MIN_ROOM: u64 = 8 << 20;
/// Tries with room after which a store that does not open stops the node.
const GIVE_UP: u32 = 60;

impl Server {
    /// Resolves once the store failed a commit: the server must be shut
    /// down and started anew (`restart`).
    pub async fn store_failed(&self) {
        let mut tick = tokio::time::interval(CHECK);
        while self.broker.store.journal_open() {
            tick.tick().await;
        }
        error!("the store failed a commit: closing every connection and opening it again");
    }

    /// The configuration with every listener on the port it bound, so a
    /// restart binds the same ones (configured as 0: any free port), and
    /// no definitions file: it was imported at the start, and importing
    /// it again would undo what changed since.
    pub fn bound_config(&self) -> Config {
        let mut c = self.broker.config.clone();
        c.load_definitions = None;
        let pin = |p: &mut Port, addr: Option<std::net::SocketAddr>| {
            if let (Port::On(_), Some(a)) = (*p, addr) {
                *p = Port::On(a.port());
            }
        };
        let amqp = c.port.get().map(|_| self.addr);
        pin(&mut c.port, amqp);
        pin(&mut c.management_port, self.management_addr);
        pin(&mut c.prometheus_port, self.prometheus_addr);
        let pin_opt = |p: &mut Option<Port>, addr: Option<std::net::SocketAddr>| {
            if let Some(a) = addr {
                *p = Some(Port::On(a.port()));
            }
        };
        pin_opt(&mut c.amqps_port, self.amqps_addr);
        pin_opt(&mut c.management_tls_port, self.management_tls_addr);
        pin_opt(&mut c.prometheus_tls_port, self.prometheus_tls_addr);
        c
    }
}

/// Starts a server on `config` again once its data directory has room
/// (the free-disk limit, and at least 8 MiB) and the store opens; tries
/// every second. None if `stop` resolves first; an error if the store
/// still does not open after a minute with room (a supervisor should
/// know).
pub async fn restart(
    config: &Config,
    stop: impl Future<Output = ()>,
) -> Result<Option<Server>, String> {
    tokio::pin!(stop);
    let room = config
        .disk_free_limit
        .bytes(crate::alarm::total_memory())
        .unwrap_or(0)
        .max(MIN_ROOM);
    let mut said = String::new();
    let mut failed_with_room = 0;
    loop {
        let why = match crate::alarm::disk_free(&config.data_dir) {
            Ok(free) if free >= room => match Server::start(config.clone()).await {
                Ok(server) => {
                    info!("the store is open again: serving");
                    return Ok(Some(server));
                }
                Err(e) => {
                    failed_with_room += 1;
                    if failed_with_room >= GIVE_UP {
                        return Err(format!("the store does not open again: {e}"));
                    }
                    e
                }
            },
            Ok(free) => format!("{free} bytes free, waiting for {room}"),
            Err(e) => format!("cannot read the free space: {e}"),
        };
        if why != said {
            warn!(dir = %config.data_dir.display(), "the store is not open yet: {why}");
            said = why;
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = &mut stop => return Ok(None),
        }
    }
}
