//! Warren, an AMQP 0-9-1 message broker that RabbitMQ clients use unchanged.
//!
//! A tour, following the data (see docs/ARCHITECTURE.md for more):
//! - [`server`] accepts connections; [`amqp`] owns the wire: frames
//!   ([`amqp::codec`]), the connection handshake and read loop
//!   ([`amqp::connection`]), channels and their method handlers
//!   ([`amqp::channel`]), publish assembly, delivery and the outbox that
//!   batches writes.
//! - [`vhost`] holds exchanges and queues by name and routes publishes;
//!   [`exchange`] has the routing tables (direct, fanout, topic, headers).
//! - [`queue`] holds messages and consumers and delivers.
//! - [`store`] makes durable state durable, on sled, with group commit.
//! - [`broker`] ties the shared state together; [`config`] sets it up.

pub mod alarm;
pub mod amqp;
pub mod broker;
pub mod config;
pub mod delayed;
pub mod exchange;
#[doc(hidden)]
pub mod fuzz;
pub mod message;
pub mod plugins;
pub mod queue;
pub mod server;
pub mod store;
pub mod util;
pub mod vhost;
pub mod wire;

pub use config::Config;
pub use server::Server;
