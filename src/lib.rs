//! Warren, an AMQP 0-9-1 message broker that RabbitMQ clients use unchanged.
//!
//! A tour, from the bottom layer up; a module uses only the layers below
//! it (docs/ARCHITECTURE.md has the table, `scripts/module_graph.py`
//! checks it):
//! - [`wire`] and [`util`]: the AMQP data encoding (field tables, the
//!   property list, short strings, reading field values) and small helpers.
//! - [`config`], [`message`] (one buffer per message: route, properties,
//!   body), [`alarm`] (the memory and free-disk alarms), [`plugins`] (the exchange types
//!   compiled in), [`policy`] (selecting and merging policies).
//! - [`store`] makes state durable on sled: every change is an operation
//!   ([`store::Op`]) submitted to a journal ([`store::Journal`]) and applied
//!   by one applier, with group commit. [`exchange`] has the routing tables
//!   (direct, fanout, topic, headers).
//! - [`dedup`]: message deduplication caches for exchanges and queues
//!   (`x-message-deduplication`), durable through the store.
//! - [`queue`] holds messages and consumers and delivers, through traits it
//!   owns for what is above it ([`queue::Sink`], [`queue::Host`]);
//!   [`delayed`] holds delayed messages and emits them when due;
//!   [`access`] holds users (RabbitMQ's password hashes) and permissions.
//! - [`vhost`] holds exchanges and queues by name, declares, binds and
//!   routes, with its own error type.
//! - [`broker`] wires the layers and recovers state at start.
//! - [`definitions`] exports and imports RabbitMQ's definitions JSON.
//! - [`amqp`] owns the wire: frames ([`amqp::codec`]), the handshake and
//!   read loop, channels and their method handlers, publish assembly,
//!   delivery (a channel's side implements the queue's sink) and the outbox
//!   that batches writes; reply codes live only here.
//! - [`http`] is the management HTTP API (RabbitMQ's /api).
//! - [`stream_protocol`] serves RabbitMQ's stream protocol (port 5552)
//!   over the same streams.
//! - [`server`] accepts connections and shuts down in order.

pub mod access;
pub mod admin;
pub mod alarm;
pub mod amqp;
pub mod broker;
pub mod cluster;
pub mod config;
pub mod dedup;
pub mod definitions;
pub mod delayed;
pub mod exchange;
pub mod federation;
#[doc(hidden)]
pub mod fuzz;
pub mod history;
pub mod http;
pub mod message;
pub mod plugins;
pub mod policy;
pub mod queue;
pub mod rates;
pub mod server;
pub mod shovel;
pub mod store;
pub mod stream_protocol;
pub mod tls;
pub mod util;
pub mod vhost;
pub mod wire;

pub use config::Config;
pub use server::Server;
