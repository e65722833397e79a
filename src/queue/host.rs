//! `Host`: what a queue needs from the vhost it lives in (the vhost
//! implements it), so that the queue layer never names the vhost:
//! sending a dead-lettered copy on, and deleting a queue whose x-expires
//! ran out.

use std::sync::Arc;

use super::Queue;
use crate::message::Message;

/// The vhost side of a queue.
pub trait Host: Send + Sync {
    /// Sends a dead-lettered copy on: through the exchange it names, to
    /// every queue that exchange reaches except those RabbitMQ's cycle rule
    /// excludes (each copy written to the store at once, before the
    /// original is removed), or held, if that exchange delays messages.
    fn dead_letter(&self, msg: &Arc<Message>);

    /// `queue` was unused for its x-expires: delete it.
    fn expire(&self, queue: &Arc<Queue>);
}
