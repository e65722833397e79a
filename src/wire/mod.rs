//! The AMQP 0-9-1 data encoding that every layer shares: a reader over
//! encoded fields, field tables (checked without building values, read
//! without copying, edited in place so that what a client sent stays
//! byte for byte what it sent), the basic class's property list, and
//! RabbitMQ's names for field types. A leaf: it imports nothing else of
//! the broker, so the store, queues and exchanges may use it freely.

pub mod props;
mod reader;
pub mod table;

pub use reader::FieldReader;
pub use table::{type_name, TableError, MAX_DEPTH};
