//! Direct reply-to, as RabbitMQ documents it. A requester consumes from the
//! pseudo-queue `amq.rabbitmq.reply-to` (no-ack) and publishes requests on
//! that channel with reply_to = `amq.rabbitmq.reply-to`; the broker rewrites
//! that property to `amq.rabbitmq.reply-to.<token>`, and a responder's
//! publish to the default exchange with that routing key goes straight to
//! the requester's consumer. No queue is created; a reply to a consumer that
//! is gone is dropped (so is one whose connection is over its outbox
//! high-water mark: replies are at most once, as in RabbitMQ, and a
//! requester that stops reading cannot grow the broker).
//!
//! The token is 22 random characters from a CSPRNG (132 bits): a token
//! cannot be guessed to read another requester's replies.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::RwLock;

use super::delivery::ChannelDelivery;
use crate::message::Message;

/// The pseudo-queue a requester consumes from.
pub const PSEUDO_QUEUE: &str = "amq.rabbitmq.reply-to";
/// What the broker turns reply_to into: this, then the token.
pub const PREFIX: &str = "amq.rabbitmq.reply-to.";

/// A channel's reply consumer.
pub struct ReplyConsumer {
    /// Its consumer tag.
    pub tag: String,
    /// The token in its reply-to name.
    pub token: String,
    delivery: Arc<ChannelDelivery>,
}

impl ReplyConsumer {
    /// The reply_to value requests on its channel carry.
    pub fn address(&self) -> String {
        format!("{PREFIX}{}", self.token)
    }
}

/// Every live reply consumer, by token.
#[derive(Default)]
pub struct ReplyTo {
    consumers: RwLock<HashMap<String, Weak<ReplyConsumer>>>,
}

impl ReplyTo {
    /// Registers a reply consumer for `delivery`'s channel.
    pub fn register(&self, tag: String, delivery: Arc<ChannelDelivery>) -> Arc<ReplyConsumer> {
        let token = crate::util::random_name();
        let c = Arc::new(ReplyConsumer {
            tag,
            token: token.clone(),
            delivery,
        });
        self.consumers.write().insert(token, Arc::downgrade(&c));
        c
    }

    /// Forgets a reply consumer (cancelled, or its channel closed).
    pub fn unregister(&self, c: &ReplyConsumer) {
        self.consumers.write().remove(&c.token);
    }

    /// The consumer of reply-to name `name` (the whole queue name), if it
    /// is alive.
    pub fn lookup(&self, name: &[u8]) -> Option<Arc<ReplyConsumer>> {
        let token = std::str::from_utf8(name.strip_prefix(PREFIX.as_bytes())?).ok()?;
        self.consumers.read().get(token)?.upgrade()
    }

    /// Delivers a reply published with routing key `name`; false if it was
    /// dropped (no such consumer, or it cannot take it now).
    pub fn deliver(&self, name: &[u8], msg: &Message) -> bool {
        match self.lookup(name) {
            Some(c) => c.delivery.deliver_reply(&c.tag, msg),
            None => false,
        }
    }
}
