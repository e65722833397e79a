//! The AMQP 0-9-1 data encoding that every layer shares: a reader over
//! encoded fields, field tables (checked without building values, read
//! without copying, edited in place so that what a client sent stays
//! byte for byte what it sent), the basic class's property list, and
//! RabbitMQ's names for field types, and (`value`) reading a field value
//! as an integer or a string whatever width or kind the client sent. A leaf: it imports nothing else of
//! the broker, so the store, queues and exchanges may use it freely.

pub mod props;
mod reader;
pub mod table;

pub use reader::FieldReader;
pub use table::{type_name, TableError, MAX_DEPTH};
/// Field values read the same everywhere (integers of any width, both
/// string kinds): defined in the plugin API, the layer under this one.
pub use warren_plugin_api::value;

/// The smallest frame_max a peer may negotiate (AMQP 0-9-1 section 4.2.3),
/// and the largest frame either side may send before tuning.
pub const FRAME_MIN_SIZE: u32 = 4096;

/// Appends a short string, cut to 255 bytes.
pub fn put_short_str(out: &mut impl bytes::BufMut, s: &[u8]) {
    let s = &s[..s.len().min(255)];
    out.put_u8(s.len() as u8);
    out.put_slice(s);
}
