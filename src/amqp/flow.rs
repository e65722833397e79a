//! Blocking publishers while a resource alarm is raised (alarm/: memory or
//! free disk; RabbitMQ's connection.blocked extension). As in RabbitMQ, a
//! connection is blocked when it publishes while an alarm is up: it then
//! stops reading from its socket until every alarm clears (the read loop
//! in connection.rs keeps sending what it owes meanwhile, confirms
//! included). A client that announced the `connection.blocked` capability
//! is told when it is blocked and unblocked. Missed-heartbeat checks pause
//! while blocked: the client's frames are simply not read.
//!
//! In a cluster a publishing connection also stops reading while the
//! leader's commits fall behind (store/raft/backlog.rs): RabbitMQ's credit
//! flow, which its clients are not told of either.

use amq_protocol::protocol::{connection, AMQPClass};
use amq_protocol::types::ShortString;
use tokio::sync::watch;

use super::context::ConnCtx;

/// Tells the client (if it asked to be told) that it is now blocked, and
/// why ("low on memory", "low on disk").
pub fn blocked(ctx: &ConnCtx) {
    if ctx.caps.connection_blocked {
        ctx.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Blocked(connection::Blocked {
                reason: ShortString::from(ctx.broker.alarms.reason()),
            })),
        );
    }
}

/// Tells the client (if it asked to be told) that it is unblocked.
pub fn unblocked(ctx: &ConnCtx) {
    if ctx.caps.connection_blocked {
        ctx.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Unblocked(connection::Unblocked {})),
        );
    }
}

/// Waits until the store's backlog is lowered (never, without one).
pub async fn lowered(congestion: &mut Option<watch::Receiver<bool>>) {
    match congestion {
        // A closed watch (the journal is gone) lets the connection go on
        // to find out.
        Some(rx) => drop(rx.wait_for(|raised| !*raised).await),
        None => std::future::pending().await,
    }
}
