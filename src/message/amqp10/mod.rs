//! Messages in AMQP 1.0's format, as RabbitMQ's stream protocol carries
//! them (each entry of a chunk is an AMQP 1.0 message: its sections
//! encoded one after the other).
//!
//! A message published over the stream protocol is stored as it came:
//! its AMQP 1.0 bytes are the stored message's body, and its property
//! list is `STORED_PROPS` (only a headers table with the one entry
//! `x-amqp-1.0`), which says so; a stream reader over the stream protocol
//! is handed those bytes unchanged. A message published over AMQP 0-9-1
//! is written as AMQP 1.0 when a reader over the stream protocol takes it
//! (`from_091.rs`); an AMQP 1.0 message is read as AMQP 0-9-1 by the
//! readers that speak it (`to_091.rs`). `types.rs` reads AMQP 1.0's
//! encoded values.

use super::Message;

mod from_091;
mod to_091;
mod types;

pub use from_091::encode_091;
pub use to_091::{readable, to_091};

/// The header the stored property list of an AMQP 1.0 message holds.
pub const MARKER: &[u8] = b"x-amqp-1.0";

/// The property list an AMQP 1.0 message is stored with: the headers flag
/// (bit 13), then a table of one entry, `x-amqp-1.0` = true.
pub const STORED_PROPS: &[u8] = &[
    0x20, 0x00, // flags: headers
    0, 0, 0, 13, // the table's length
    10, b'x', b'-', b'a', b'm', b'q', b'p', b'-', b'1', b'.', b'0', // the key
    b't', 1, // true
];

/// Whether `msg`, as a stream stored it, is an AMQP 1.0 message (its body
/// is the message's AMQP 1.0 encoding). An AMQP 0-9-1 message is stored
/// with an `x-stream-offset` header added, so none is stored with this
/// property list alone, whatever its publisher set.
pub fn is_amqp10(msg: &Message) -> bool {
    msg.properties() == STORED_PROPS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::props::{self, Field};
    use crate::wire::table;

    #[test]
    fn the_marker_is_a_property_list_with_one_header() {
        let layout = props::layout(STORED_PROPS).expect("a valid list");
        assert_eq!(layout.flags, Field::Headers.flag());
        let headers = props::headers(STORED_PROPS).unwrap();
        let v = table::get(headers, MARKER).unwrap();
        assert_eq!((v.tag, v.bytes), (b't', &[1u8][..]));
    }
}
