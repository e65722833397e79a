//! Messages in AMQP 1.0's format, as RabbitMQ's stream protocol carries
//! them (each entry of a chunk is an AMQP 1.0 message: its sections
//! encoded one after the other).
//!
//! A message published over the stream protocol is stored as it came:
//! its AMQP 1.0 bytes are the stored message's body, and its property
//! list is `STORED_PROPS` (only a headers table with the one entry
//! `x-amqp-1.0`, and a publisher's filter label as a second one), which
//! says so; a stream reader over the stream protocol
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

/// The header that labels a message for stream filtering (the filter
/// value a publisher of the stream protocol's version 2 gives), second in
/// the stored table when there is one.
const FILTER_KEY: &[u8] = b"x-stream-filter-value";
/// Where the label's value starts in the stored property list.
const FILTER_AT: usize = STORED_PROPS.len() + 1 + FILTER_KEY.len() + 1 + 4;

/// The property list an AMQP 1.0 message labelled `filter` is stored with,
/// written into `out` (cleared first): `STORED_PROPS` with the label as a
/// second header, so stream filtering (queue/stream/filter.rs) reads it
/// as it reads an AMQP 0-9-1 publisher's.
pub fn stored_props_with(filter: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(STORED_PROPS);
    let table = (STORED_PROPS.len() - 6 + 1 + FILTER_KEY.len() + 1 + 4 + filter.len()) as u32;
    out[2..6].copy_from_slice(&table.to_be_bytes());
    out.push(FILTER_KEY.len() as u8);
    out.extend_from_slice(FILTER_KEY);
    out.push(b'S');
    out.extend_from_slice(&(filter.len() as u32).to_be_bytes());
    out.extend_from_slice(filter);
}

/// Whether `msg`, as a stream stored it, is an AMQP 1.0 message (its body
/// is the message's AMQP 1.0 encoding): its property list is
/// `STORED_PROPS`, or that with a filter label (`stored_props_with`). An
/// AMQP 0-9-1 message is stored with an `x-stream-offset` header added
/// last, so none is stored with either list, whatever its publisher set.
pub fn is_amqp10(msg: &Message) -> bool {
    is_stored_props(msg.properties())
}

/// Whether `p` is a property list `is_amqp10` recognises.
pub fn is_stored_props(p: &[u8]) -> bool {
    if p == STORED_PROPS {
        return true;
    }
    let n = STORED_PROPS.len();
    let labelled = p.len() >= FILTER_AT
        && p[..2] == STORED_PROPS[..2]
        && p[6..n] == STORED_PROPS[6..n]
        && p[n] as usize == FILTER_KEY.len()
        && &p[n + 1..n + 1 + FILTER_KEY.len()] == FILTER_KEY
        && p[FILTER_AT - 5] == b'S';
    labelled
        && u32::from_be_bytes([p[2], p[3], p[4], p[5]]) as usize == p.len() - 6
        && u32::from_be_bytes([
            p[FILTER_AT - 4],
            p[FILTER_AT - 3],
            p[FILTER_AT - 2],
            p[FILTER_AT - 1],
        ]) as usize
            == p.len() - FILTER_AT
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

    fn stored(props: &[u8]) -> Message {
        Message::new(b"", b"s", props, b"", crate::message::Meta::default())
    }

    #[test]
    fn a_labelled_list_is_an_amqp10_message_with_its_label_as_a_header() {
        let mut props = Vec::new();
        stored_props_with(b"red", &mut props);
        assert!(props::layout(&props).is_ok(), "a valid list");
        let headers = props::headers(&props).unwrap();
        let label = table::get(headers, FILTER_KEY).and_then(|v| v.as_long_str());
        assert_eq!(label.map(|l| l.to_vec()), Some(b"red".to_vec()));
        assert!(table::get(headers, MARKER).is_some());
        assert!(is_amqp10(&stored(&props)));
        assert!(is_amqp10(&stored(STORED_PROPS)));
        stored_props_with(b"", &mut props);
        assert!(is_amqp10(&stored(&props)), "an empty label");
        // Anything more (an AMQP 0-9-1 message's x-stream-offset after the
        // same two headers) is not one.
        stored_props_with(b"red", &mut props);
        let mut more = props.clone();
        more.extend_from_slice(&[1, b'x', b'V']);
        let table = u32::from_be_bytes(more[2..6].try_into().unwrap()) + 3;
        more[2..6].copy_from_slice(&table.to_be_bytes());
        assert!(!is_amqp10(&stored(&more)));
        let mut lying = props.clone();
        lying[FILTER_AT - 1] += 1;
        assert!(!is_amqp10(&stored(&lying)), "a label longer than the list");
    }
}
