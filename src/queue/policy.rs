//! What a queue's policies change, applied at once: the arguments in force
//! are the x-arguments merged with the definition its policy and operator
//! policy make together (args.rs). A lowered max-length drops or
//! dead-letters the oldest messages (overflow drop-head); a new or lower
//! message-ttl expires every message older than it, and the rest by then;
//! a new expires starts the unused-queue watcher.

use std::sync::Arc;

use super::args::Overflow;
use super::{expiry, Queue};
use crate::policy::Applied;

impl Queue {
    /// Applies `applied` (its policies as they are now).
    pub fn apply_policy(self: &Arc<Self>, applied: &Applied) {
        let live = self.args.with_policy(&applied.definition);
        let mut st = self.state.lock();
        let ttl = live.message_ttl.filter(|&t| Some(t) != st.live.message_ttl);
        st.live = live;
        st.policy.clone_from(&applied.policy);
        st.operator_policy.clone_from(&applied.operator_policy);
        st.effective.clone_from(&applied.definition);
        if let Some(ttl) = ttl {
            for (deadline, seq) in st.ready.retime(ttl) {
                self.schedule(&mut st, deadline, seq);
            }
            // Already due: the timer takes them now.
            self.timer.notify_one();
        }
        if st.live.overflow == Overflow::DropHead {
            self.drop_over_limit(&mut st);
        }
        if st.live.expires.is_some() {
            // Under the lock, so it cannot miss a watcher that is ending.
            expiry::watch_unused(self);
        }
        self.finish(st);
    }

    /// The names of the policy and operator policy that apply, if any.
    pub fn policies(&self) -> (Option<String>, Option<String>) {
        let st = self.state.lock();
        (st.policy.clone(), st.operator_policy.clone())
    }

    /// The consumer timeout in force (x-argument or policy), ms.
    pub fn consumer_timeout(&self) -> Option<u64> {
        self.state.lock().live.consumer_timeout
    }

    /// The arguments in force.
    pub fn live_args(&self) -> super::args::QueueArgs {
        self.state.lock().live.clone()
    }
}
