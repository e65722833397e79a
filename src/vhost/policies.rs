//! A vhost's policies and operator policies (the selection and merge rules
//! are in crate::policy): the set in force, and applying it to every queue
//! and exchange at once when it changes, and to each new one as it is made.

use std::sync::Arc;

use super::{Exchange, VHost};
use crate::policy::{Policies, Target};
use crate::queue::Queue;

/// The queue type policies match a queue by (x-queue-type, else classic).
pub fn queue_type(q: &Queue) -> String {
    q.config
        .arguments
        .inner()
        .get("x-queue-type")
        .and_then(crate::wire::value::text)
        .unwrap_or_else(|| "classic".to_string())
}

impl VHost {
    /// The policies in force.
    pub fn policies(&self) -> Arc<Policies> {
        Arc::clone(&self.policies.read())
    }

    /// Replaces the policies in force and applies them to every queue and
    /// exchange (the caller has made the change durable).
    pub fn set_policies(&self, policies: Policies) {
        // Swapped under the topology lock, which declares hold while they
        // apply the policies in force and register the new queue or
        // exchange: one registered before the swap is in the walk below,
        // one registered after it took the new set. The walk itself runs
        // without the lock, so declares elsewhere do not wait for it.
        let policies = Arc::new(policies);
        {
            let _topology = self.topology.lock();
            *self.policies.write() = Arc::clone(&policies);
        }
        for q in self.queues() {
            self.apply_to_queue(&policies, &q);
        }
        for x in self.exchanges() {
            apply_to_exchange(&policies, &x);
        }
    }

    pub(super) fn apply_to_queue(&self, policies: &Policies, q: &Arc<Queue>) {
        let applied = policies.apply(q.name(), Target::Queue(&queue_type(q)));
        q.apply_policy(&applied);
    }

    pub(super) fn apply_policies_to_exchange(&self, x: &Exchange) {
        apply_to_exchange(&self.policies(), x);
    }
}

fn apply_to_exchange(policies: &Policies, x: &Exchange) {
    let applied = policies.apply(&x.name, Target::Exchange);
    let alternate = applied
        .definition
        .get("alternate-exchange")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    *x.policy.write() = super::entities::ExchangePolicy {
        name: applied.policy,
        alternate,
    };
}
