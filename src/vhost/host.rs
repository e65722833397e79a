//! The vhost as its queues' `queue::Host`: dead-lettered copies are routed
//! (or held) here, and queues whose x-expires ran out are deleted here.

use std::sync::Arc;

use super::routing::{RouteScratch, Routed};
use super::VHost;
use crate::message::Message;
use crate::queue::{dead_letter, Host, Queue};

impl Host for VHost {
    fn dead_letter(&self, msg: &Arc<Message>) {
        let mut scratch = RouteScratch::for_dead_letters();
        let mut routes = Vec::new();
        match self.route(msg, &mut scratch, &mut routes) {
            // A delayed-message exchange as the dead-letter exchange holds
            // the copy, as the plugin would.
            Ok(Routed::Hold(delay_ms)) => {
                if let Err(e) = self.hold(msg, delay_ms) {
                    tracing::error!("cannot hold a dead-lettered message: {e}");
                }
            }
            Ok(Routed::Queues | Routed::Duplicate { .. }) => {
                for q in routes {
                    if dead_letter::is_cycle(msg, q.name()) {
                        continue;
                    }
                    if let Err(e) = q.push_dead_lettered(msg) {
                        tracing::error!(
                            queue = q.name(),
                            "cannot store a dead-lettered message: {e}"
                        );
                    }
                }
            }
            // A dead-letter exchange that does not exist drops the copy,
            // as in RabbitMQ.
            Err(_) => {}
        }
    }

    fn expire(&self, queue: &Arc<Queue>) {
        if let Err(e) = self.remove_queue(queue) {
            tracing::warn!(queue = queue.name(), "x-expires delete failed: {e}");
        }
    }
}
