//! Messages built into one buffer: a stream protocol Publish frame's
//! messages, each a slice of the frame's one allocation rather than an
//! allocation of its own (and its free when the stream's tail lets it go).
//! The buffer lives while any of its messages does; a frame's messages go
//! to one stream and leave its tail together, so that is about as long as
//! each would have lived alone.

use bytes::Bytes;

use super::{Message, Meta};

/// Where one message lies in the batch's buffer.
struct Span {
    start: usize,
    props_at: u32,
    props_len: u32,
    body_at: u32,
    end: usize,
    meta: Meta,
}

/// Messages written one after another into one buffer.
pub struct Batch {
    raw: Vec<u8>,
    spans: Vec<Span>,
}

impl Batch {
    /// An empty batch with room for `bytes` of messages, `count` of them.
    pub fn with_capacity(bytes: usize, count: usize) -> Batch {
        Batch {
            raw: Vec::with_capacity(bytes),
            spans: Vec::with_capacity(count),
        }
    }

    /// Adds a message laid out as `Message::new` lays it out.
    pub fn push(
        &mut self,
        exchange: &[u8],
        routing_key: &[u8],
        properties: &[u8],
        body: &[u8],
        meta: Meta,
    ) {
        let ex = &exchange[..exchange.len().min(255)];
        let rk = &routing_key[..routing_key.len().min(255)];
        let raw = &mut self.raw;
        let start = raw.len();
        raw.push(ex.len() as u8);
        raw.extend_from_slice(ex);
        raw.push(rk.len() as u8);
        raw.extend_from_slice(rk);
        let props_at = raw.len() - start;
        raw.extend_from_slice(properties);
        let body_at = raw.len() - start;
        raw.extend_from_slice(body);
        self.spans.push(Span {
            start,
            props_at: props_at as u32,
            props_len: properties.len() as u32,
            body_at: body_at as u32,
            end: raw.len(),
            meta,
        });
    }

    /// How many messages it holds.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The messages, in the order they were pushed.
    pub fn into_messages(self) -> impl ExactSizeIterator<Item = Message> {
        let raw = Bytes::from(self.raw);
        self.spans.into_iter().map(move |s| Message {
            raw: raw.slice(s.start..s.end),
            props_at: s.props_at,
            props_len: s.props_len,
            body_at: s.body_at,
            meta: s.meta,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's messages read as `Message::new` would have built them,
    /// and share one buffer.
    #[test]
    fn messages_read_as_built_one_by_one() {
        let meta = Meta::default().with_delivery_mode(2);
        // Exchange, routing key, properties and body.
        type Parts<'a> = (&'a [u8], &'a [u8], &'a [u8], &'a [u8]);
        let parts: [Parts<'_>; 3] = [
            (b"", b"stream", &[0x20, 0], b"first"),
            (b"ex", b"", &[], b""),
            (&[b'x'; 300], &[b'k'; 3], &[0, 0], &[7; 1000]),
        ];
        let mut batch = Batch::with_capacity(16, 1);
        for (ex, rk, props, body) in parts {
            batch.push(ex, rk, props, body, meta);
        }
        assert_eq!(batch.len(), 3);
        let msgs: Vec<Message> = batch.into_messages().collect();
        for (m, (ex, rk, props, body)) in msgs.iter().zip(parts) {
            let one = Message::new(ex, rk, props, body, meta);
            assert_eq!(m.exchange(), one.exchange());
            assert_eq!(m.routing_key(), one.routing_key());
            assert_eq!(m.properties(), one.properties());
            assert_eq!(m.body(), one.body());
            assert_eq!(m.meta, one.meta);
            assert_eq!(m.backing(), one.backing());
        }
        let end = msgs[0].backing().as_ptr() as usize + msgs[0].backing().len();
        assert_eq!(msgs[1].backing().as_ptr() as usize, end, "one buffer");
    }
}
