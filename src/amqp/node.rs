//! `Node`: what every AMQP connection of one broker shares beyond the
//! broker itself: the direct reply-to registry and the sweeper that
//! enforces consumer timeouts. The server makes one and hands it to each
//! connection (the broker below knows nothing of AMQP).

use std::sync::Arc;

use super::consumer_timeout::Sweeper;
use super::reply_to::ReplyTo;

/// The AMQP layer's shared state.
#[derive(Default)]
pub struct Node {
    /// Direct reply-to consumers by token.
    pub reply_to: ReplyTo,
    /// Watches deliveries for their consumer timeout.
    pub consumer_timeouts: Arc<Sweeper>,
}

impl Node {
    /// A node with its sweeper running (for as long as the node lives).
    pub fn start() -> Arc<Node> {
        let node = Arc::new(Node::default());
        node.consumer_timeouts.start(Arc::downgrade(&node));
        node
    }
}
