//! Blocking publishers while the memory alarm is raised (RabbitMQ's
//! connection.blocked extension): a connection that has published stops
//! reading from its socket until the alarm clears; a client that announced
//! the `connection.blocked` capability is told when it is blocked and
//! unblocked. Heartbeat checks pause meanwhile: the client's frames are
//! simply not read.

use amq_protocol::protocol::{connection, AMQPClass};
use amq_protocol::types::ShortString;
use tokio::sync::watch;

use super::connection::ConnCtx;

/// How waiting ended.
pub enum Unblocked {
    /// The alarm cleared.
    Cleared,
    /// The broker is shutting down (or the alarm is gone).
    Shutdown,
}

/// Waits, not reading, until the alarm is down. Call only when it is up.
pub async fn wait_while_blocked(
    ctx: &ConnCtx,
    alarm: &mut watch::Receiver<bool>,
    shutdown: &mut watch::Receiver<bool>,
) -> Unblocked {
    if ctx.caps.connection_blocked {
        ctx.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Blocked(connection::Blocked {
                reason: ShortString::from("low on memory"),
            })),
        );
    }
    let ended = loop {
        if !*alarm.borrow_and_update() {
            break Unblocked::Cleared;
        }
        tokio::select! {
            changed = alarm.changed() => {
                if changed.is_err() {
                    break Unblocked::Shutdown;
                }
            }
            _ = shutdown.changed() => break Unblocked::Shutdown,
        }
    };
    if ctx.caps.connection_blocked {
        ctx.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Unblocked(connection::Unblocked {})),
        );
    }
    ended
}
