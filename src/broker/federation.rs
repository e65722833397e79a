//! The broker's federation (crate::federation): its upstream and upstream
//! set parameters, checked and stored; what links read of the vhosts
//! (the `Downstream` side: federated exchanges, their bindings, the
//! topology's ticks) and publishing what they bring in.

use std::sync::{Arc, Weak};

use amq_protocol::types::FieldTable;

use super::Broker;
use crate::federation::params::{self, UPSTREAM, UPSTREAM_SET};
use crate::federation::{Choice, Downstream, Federated, Kind, Published, Survey};
use crate::message::Message;
use crate::policy::Target;
use crate::store::ParameterDef;
use crate::vhost::error::{Error, Result};
use crate::vhost::policies::queue_type;
use crate::vhost::routing::Routed;

/// Whether `component` is one of federation's parameters.
pub fn is_federation(component: &str) -> bool {
    component == UPSTREAM || component == UPSTREAM_SET || component == params::FEDERATION
}

impl Broker {
    /// Checks and stores federation parameter `name` of `vhost` (an
    /// upstream or an upstream set), and brings the vhost's links in line.
    pub fn put_federation_parameter(
        &self,
        component: &str,
        vhost: &str,
        name: &str,
        value: &serde_json::Value,
    ) -> Result<()> {
        if self.vhost(vhost).is_none() {
            return Err(Error::not_found(format!("no vhost '{vhost}'")));
        }
        check_federation_parameter(component, name, value).map_err(Error::precondition_failed)?;
        self.check_link_tls_files(component, value)
            .map_err(Error::precondition_failed)?;
        self.store.put_parameter(&ParameterDef {
            vhost: vhost.to_string(),
            component: component.to_string(),
            name: name.to_string(),
            value: value.clone(),
        })?;
        self.federation.changed(vhost);
        Ok(())
    }

    /// Clears federation parameter `name` of `vhost`; the links that used
    /// it stop.
    pub fn delete_federation_parameter(
        &self,
        component: &str,
        vhost: &str,
        name: &str,
    ) -> Result<()> {
        self.store.delete_parameter(vhost, component, name)?;
        self.federation.changed(vhost);
        Ok(())
    }

    /// Whether the TLS files a federation or shovel parameter's URIs name
    /// lie where this broker reads them from (`link_tls_dir`); the value
    /// is a checked one.
    pub fn check_link_tls_files(
        &self,
        component: &str,
        value: &serde_json::Value,
    ) -> std::result::Result<(), String> {
        let dir = self.config.link_tls_dir.as_deref();
        match component {
            UPSTREAM => params::check_upstream_files(value, dir),
            crate::shovel::COMPONENT => {
                crate::shovel::Spec::parse("", value).and_then(|spec| spec.check_tls_files(dir))
            }
            _ => Ok(()),
        }
    }

    /// What federation sees of this broker.
    pub fn federation_side(broker: &Arc<Broker>) -> Arc<dyn Downstream> {
        Arc::new(Side(Arc::downgrade(broker)))
    }
}

/// Checks a federation parameter's value; Err is the refusal's text.
pub fn check_federation_parameter(
    component: &str,
    name: &str,
    value: &serde_json::Value,
) -> std::result::Result<(), String> {
    match component {
        UPSTREAM => params::check_upstream(name, value),
        UPSTREAM_SET => params::check_set(name, value),
        _ => Err(params::check_leftover(name)),
    }
}

/// The broker as federation's downstream (weakly: the broker owns the
/// links).
struct Side(Weak<Broker>);

impl Downstream for Side {
    fn cluster_name(&self) -> String {
        self.0
            .upgrade()
            .map(|b| b.cluster_name())
            .unwrap_or_default()
    }

    fn survey(&self, vhost: &str) -> Option<Survey> {
        let b = self.0.upgrade()?;
        let vh = b.vhost(vhost)?;
        let policies = vh.policies();
        let federating = policies
            .list()
            .iter()
            .any(|p| !p.operator && Choice::of(&p.definition).is_some());
        let mut survey = Survey {
            federating,
            ..Survey::default()
        };
        if !federating {
            return Some(survey);
        }
        for p in b.store.parameters().ok()? {
            if p.vhost != vhost {
                continue;
            }
            match p.component.as_str() {
                UPSTREAM => {
                    survey.upstreams.insert(p.name, p.value);
                }
                UPSTREAM_SET => {
                    survey.sets.insert(p.name, p.value);
                }
                _ => {}
            }
        }
        for x in vh.exchanges() {
            if x.name.is_empty() || x.internal {
                continue;
            }
            let applied = policies.apply(&x.name, Target::Exchange);
            let (Some(policy), Some(choice)) = (applied.policy, Choice::of(&applied.definition))
            else {
                continue;
            };
            survey.federated.push(Federated {
                kind: Kind::Exchange,
                name: x.name.clone(),
                type_name: x.type_name.clone(),
                durable: x.durable,
                auto_delete: x.auto_delete,
                internal: x.internal,
                arguments: x.arguments.clone(),
                policy,
                choice,
            });
        }
        for q in vh.queues() {
            let args = &q.config.arguments;
            if args.inner().contains_key("x-internal-purpose") || q.stream().is_some() {
                // Exchange federation's own queues, and streams, are not
                // federated (as RabbitMQ).
                continue;
            }
            let applied = policies.apply(q.name(), Target::Queue(&queue_type(&q)));
            let (Some(policy), Some(choice)) = (applied.policy, Choice::of(&applied.definition))
            else {
                continue;
            };
            survey.federated.push(Federated {
                kind: Kind::Queue,
                name: q.name().to_string(),
                type_name: queue_type(&q),
                durable: q.config.durable,
                auto_delete: q.config.auto_delete,
                internal: false,
                arguments: args.clone(),
                policy,
                choice,
            });
        }
        survey
            .federated
            .sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
        Some(survey)
    }

    fn bindings_of(&self, vhost: &str, exchange: &str) -> Option<Vec<(String, FieldTable)>> {
        let x = self.0.upgrade()?.vhost(vhost)?.exchange(exchange)?;
        let bindings = x.bindings.read();
        Some(
            bindings
                .list()
                .into_iter()
                .map(|(k, a, _)| (k, a))
                .collect(),
        )
    }

    fn changes(&self, vhost: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.0.upgrade()?.vhost(vhost)?.changes())
    }

    fn queue_demand(&self, vhost: &str, queue: &str) -> Option<crate::queue::Demand> {
        self.0.upgrade()?.vhost(vhost)?.queue(queue)?.demand()
    }

    fn blocked(&self) -> bool {
        self.0.upgrade().is_some_and(|b| b.alarms.any())
    }

    fn publish(&self, vhost: &str, msgs: &[Arc<Message>]) -> Published {
        let refused = |e: String| Published {
            done: 0,
            error: Some(e),
            synced: Box::pin(async { Ok(()) }),
        };
        let Some(b) = self.0.upgrade() else {
            return refused("the broker stopped".into());
        };
        let Some(vh) = b.vhost(vhost) else {
            return refused(format!("no vhost '{vhost}'"));
        };
        let mut scratch = Default::default();
        let mut routes = Vec::new();
        let mut stored = false;
        let mut done = 0;
        let mut error = None;
        for msg in msgs {
            match route_one(&vh, msg, &mut scratch, &mut routes) {
                Ok(s) => stored |= s,
                Err((s, e)) => {
                    stored |= s;
                    error = Some(e);
                    break;
                }
            }
            done += 1;
        }
        let store = Arc::clone(&b.store);
        Published {
            done,
            error,
            synced: Box::pin(async move {
                if stored {
                    store.sync().await.map_err(|e| e.to_string())?;
                }
                Ok(())
            }),
        }
    }
}

/// Routes one message in `vh` as a publish does (BCC taken out); whether
/// it stored anything, or why it was refused (and whether it stored
/// anything before).
fn route_one(
    vh: &crate::vhost::VHost,
    msg: &Arc<Message>,
    scratch: &mut crate::vhost::routing::RouteScratch,
    routes: &mut Vec<Arc<crate::queue::Queue>>,
) -> std::result::Result<bool, (bool, String)> {
    routes.clear();
    let routed = vh
        .route(msg, scratch, routes)
        .map_err(|e| (false, e.text))?;
    let admitted = scratch.take_admitted();
    let msg = match crate::vhost::routing::strip_bcc(msg) {
        Some(stripped) => Arc::new(stripped),
        None => Arc::clone(msg),
    };
    let forget = |admitted: Option<crate::vhost::routing::Admitted>| {
        if let Some(a) = admitted {
            a.forget();
        }
    };
    match routed {
        Routed::Hold(delay_ms) => {
            if let Err(e) = vh.hold(&msg, delay_ms) {
                forget(admitted);
                return Err((false, e.to_string()));
            }
            return Ok(true);
        }
        Routed::Duplicate { durable } => return Ok(durable),
        Routed::Queues => {}
    }
    let mut stored = false;
    for q in routes.drain(..) {
        match q.push(&msg) {
            Ok(p) if p.rejected => {
                forget(admitted);
                return Err((
                    stored | p.stored,
                    format!(
                        "queue '{}' refused the message (its overflow rejects publishes)",
                        q.name()
                    ),
                ));
            }
            Ok(p) => stored |= p.stored,
            Err(e) => {
                forget(admitted);
                return Err((stored, e.to_string()));
            }
        }
    }
    Ok(stored)
}
