//! Frames as a follower's carrier sees them: cut whole out of what one
//! side sent (no copy), the few fields it reads or rewrites in place, and
//! the methods it writes itself (a stream reader's deliveries, its
//! consume-ok, cancel-ok and cancel, an ack split off for the leader).

use bytes::{BufMut, BytesMut};

use crate::amqp::codec::{self, FRAME_END, FRAME_METHOD};

/// Bytes before a frame's payload: type, channel, size.
const HEAD: usize = 7;
/// The most room reserved ahead for a frame still arriving.
const RESERVE_AHEAD: usize = 1 << 20;

/// What `cut` found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Cut {
    /// A whole frame, framing included, split off the buffer.
    Frame(BytesMut),
    /// More bytes are needed.
    Partial,
    /// Not a frame this carrier reads (a bad end octet, a frame larger
    /// than `max`): from here on the bytes pass as they are.
    Opaque,
}

/// Splits the first whole frame off `buf`.
pub(super) fn cut(buf: &mut BytesMut, max: usize) -> Cut {
    if buf.len() < HEAD {
        return Cut::Partial;
    }
    let size = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]) as usize;
    if size > max {
        return Cut::Opaque;
    }
    let whole = HEAD + size + 1;
    if buf.len() < whole {
        // Room for what is announced, a bounded step at a time: a header
        // alone reserves little.
        buf.reserve((whole - buf.len()).min(RESERVE_AHEAD));
        return Cut::Partial;
    }
    if buf[whole - 1] != FRAME_END {
        return Cut::Opaque;
    }
    Cut::Frame(buf.split_to(whole))
}

/// A frame's type.
pub(super) fn kind(frame: &[u8]) -> u8 {
    frame[0]
}

/// A frame's channel.
pub(super) fn channel(frame: &[u8]) -> u16 {
    u16::from_be_bytes([frame[1], frame[2]])
}

/// A frame's payload.
pub(super) fn payload(frame: &[u8]) -> &[u8] {
    &frame[HEAD..frame.len() - 1]
}

/// A method frame's class and method ids.
pub(super) fn method(frame: &[u8]) -> Option<(u16, u16)> {
    if kind(frame) != FRAME_METHOD {
        return None;
    }
    codec::method_ids(payload(frame))
}

/// Where basic.deliver's delivery tag lies in its frame, and its
/// consumer tag: (tag's position, consumer tag).
fn deliver_fields(frame: &[u8]) -> Option<(usize, &[u8])> {
    let at = HEAD + 4;
    let len = *frame.get(at)? as usize;
    let tag = frame.get(at + 1..at + 1 + len)?;
    let pos = at + 1 + len;
    frame.get(pos..pos + 8)?;
    Some((pos, tag))
}

/// basic.deliver's consumer tag and delivery tag.
pub(super) fn deliver_tags(frame: &[u8]) -> Option<(&[u8], u64)> {
    let (pos, consumer) = deliver_fields(frame)?;
    Some((consumer, read_u64(frame, pos)?))
}

/// basic.get-ok's delivery tag (its first field).
pub(super) fn get_ok_tag(frame: &[u8]) -> Option<u64> {
    read_u64(frame, HEAD + 4)
}

/// Rewrites the delivery tag of a basic.deliver (`get_ok`: basic.get-ok)
/// in place; the frame keeps its length.
pub(super) fn set_delivery_tag(frame: &mut [u8], get_ok: bool, tag: u64) {
    let pos = match get_ok {
        true => Some(HEAD + 4),
        false => deliver_fields(frame).map(|(p, _)| p),
    };
    if let Some(p) = pos.filter(|p| p + 8 <= frame.len()) {
        frame[p..p + 8].copy_from_slice(&tag.to_be_bytes());
    }
}

fn read_u64(frame: &[u8], at: usize) -> Option<u64> {
    let b = frame.get(at..at + 8)?;
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

/// basic.ack, basic.nack or basic.reject from a client: delivery tag,
/// multiple (never for reject), requeue (never for ack).
pub(super) fn settle_fields(frame: &[u8], method: u16) -> Option<(u64, bool, bool)> {
    let tag = read_u64(frame, HEAD + 4)?;
    let bits = *frame.get(HEAD + 12)?;
    Some(match method {
        ACK => (tag, bits & 1 != 0, false),
        NACK => (tag, bits & 1 != 0, bits & 2 != 0),
        _ => (tag, false, bits & 1 != 0),
    })
}

/// basic.ack's, basic.reject's and basic.nack's method ids.
pub(super) const ACK: u16 = 80;
pub(super) const REJECT: u16 = 90;
pub(super) const NACK: u16 = 120;

/// Appends basic.ack, basic.reject or basic.nack (`method`) as a client
/// sends it.
pub(super) fn put_settle(
    out: &mut BytesMut,
    channel: u16,
    method: u16,
    tag: u64,
    multiple: bool,
    requeue: bool,
) {
    let at = codec::begin_frame(out, FRAME_METHOD, channel);
    out.put_u16(60);
    out.put_u16(method);
    out.put_u64(tag);
    out.put_u8(match method {
        ACK => multiple as u8,
        NACK => multiple as u8 | (requeue as u8) << 1,
        _ => requeue as u8,
    });
    codec::end_frame(out, at);
}

/// Appends basic.deliver and the message's content.
pub(super) fn put_deliver(
    out: &mut BytesMut,
    channel: u16,
    consumer: &str,
    tag: u64,
    msg: &crate::message::Message,
    frame_max: u32,
) {
    let at = codec::begin_frame(out, FRAME_METHOD, channel);
    out.put_u16(60);
    out.put_u16(60);
    codec::put_short_str(out, consumer.as_bytes());
    out.put_u64(tag);
    out.put_u8(0);
    codec::put_short_str(out, msg.exchange());
    codec::put_short_str(out, msg.routing_key());
    codec::end_frame(out, at);
    codec::put_content(out, channel, msg.properties(), msg.body(), frame_max);
}

/// Appends a basic method whose only field is a consumer tag:
/// consume-ok (21), cancel-ok (31); basic.cancel (30) adds nowait.
pub(super) fn put_consumer_method(out: &mut BytesMut, channel: u16, method: u16, tag: &str) {
    let at = codec::begin_frame(out, FRAME_METHOD, channel);
    out.put_u16(60);
    out.put_u16(method);
    codec::put_short_str(out, tag.as_bytes());
    if method == 30 {
        out.put_u8(0);
    }
    codec::end_frame(out, at);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deliver(consumer: &str, tag: u64) -> BytesMut {
        let mut out = BytesMut::new();
        let msg = crate::message::Message::new(b"ex", b"rk", &[0, 0], b"body", Default::default());
        put_deliver(&mut out, 3, consumer, tag, &msg, 4096);
        out
    }

    #[test]
    fn frames_are_cut_whole_and_in_order() {
        let mut buf = deliver("c1", 7);
        let all = buf.len();
        let mut half = buf.split_to(all / 2);
        assert!(matches!(cut(&mut half, 1 << 20), Cut::Frame(_)));
        let rest = cut(&mut half, 1 << 20);
        assert_eq!(rest, Cut::Partial);
        half.unsplit(buf);
        let mut kinds = Vec::new();
        while let Cut::Frame(f) = cut(&mut half, 1 << 20) {
            kinds.push(kind(&f));
            assert_eq!(channel(&f), 3);
        }
        assert_eq!(kinds, [2, 3]);
        assert!(half.is_empty());
    }

    #[test]
    fn a_bad_end_or_a_huge_frame_is_opaque() {
        let mut buf = deliver("c1", 7);
        let mut bad = buf.clone();
        let Cut::Frame(first) = cut(&mut buf, 1 << 20) else {
            panic!("no frame");
        };
        bad[first.len() - 1] = 0;
        assert_eq!(cut(&mut bad, 1 << 20), Cut::Opaque);
        let mut huge = deliver("c1", 7);
        assert_eq!(cut(&mut huge, 8), Cut::Opaque);
    }

    #[test]
    fn a_delivery_tag_is_rewritten_in_place() {
        let mut buf = deliver("ctag", 7);
        let Cut::Frame(mut f) = cut(&mut buf, 1 << 20) else {
            panic!("no frame");
        };
        assert_eq!(method(&f), Some((60, 60)));
        assert_eq!(deliver_tags(&f), Some((&b"ctag"[..], 7)));
        let len = f.len();
        set_delivery_tag(&mut f, false, 1 << 40);
        assert_eq!(deliver_tags(&f), Some((&b"ctag"[..], 1 << 40)));
        assert_eq!(f.len(), len);
    }

    #[test]
    fn settles_read_back_as_written() {
        for (m, multiple, requeue) in [
            (ACK, true, false),
            (NACK, true, true),
            (REJECT, false, true),
        ] {
            let mut out = BytesMut::new();
            put_settle(&mut out, 1, m, 42, multiple, requeue);
            assert_eq!(method(&out), Some((60, m)));
            assert_eq!(settle_fields(&out, m), Some((42, multiple, requeue)));
        }
    }
}
