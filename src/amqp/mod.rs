//! The wire: everything that knows AMQP frames exist. Bytes come in through
//! `codec`, connections and channels turn methods into calls on `vhost` and
//! `queue`, and everything going out is encoded into a connection's
//! `outbox`.

pub mod assembler;
pub mod auth;
pub mod authz;
pub mod channel;
pub mod coalesce;
pub mod codec;
pub mod connection;
pub mod consumer_timeout;
pub mod context;
pub mod delivery;
pub mod error;
pub mod flow;
mod handshake;
pub mod node;
pub mod outbox;
pub mod pinning;
pub mod reply_to;
pub mod transport;
