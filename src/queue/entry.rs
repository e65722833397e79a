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
}
