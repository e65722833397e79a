//! `Entry`: one message's place in one queue.

use std::sync::Arc;

use crate::message::Message;

/// A message in a queue: the shared message plus this queue's bookkeeping.
#[derive(Debug, Clone)]
pub struct Entry {
    pub msg: Arc<Message>,
    /// Position in the queue; also the store key's suffix.
    pub seq: u64,
    /// Set once the message has been delivered and came back.
    pub redelivered: bool,
    /// Written to the store (remove it there when it leaves).
    pub stored: bool,
    /// When it expires, ms since the epoch (0 = never).
    pub deadline: u64,
    /// When it entered the queue, s since the epoch (for a message-ttl a
    /// policy sets later; the entry stays 32 bytes).
    pub enqueued: u32,
    /// Times it was delivered and came back (for x-delivery-limit;
    /// saturates at 65535).
    pub returned: u16,
}

impl Entry {
    /// Whether its TTL has run out at `now` (ms since the epoch). A message
    /// whose deadline is this very millisecond may still be delivered, as
    /// RabbitMQ delivers TTL=0 messages to a waiting consumer.
    pub fn expired(&self, now: u64) -> bool {
        self.deadline != 0 && self.deadline < now
    }
}
