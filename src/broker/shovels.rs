//! The broker's shovels (crate::shovel): declared as `shovel` runtime
//! parameters, started when the broker serves, and stopped with their
//! parameter or their vhost.

use crate::shovel::{Spec, COMPONENT};
use crate::store::ParameterDef;
use crate::vhost::error::{Error, Result};

use super::Broker;

impl Broker {
    /// Starts the shovel of every stored `shovel` parameter (once this
    /// broker's AMQP listener is bound: see `Shovels::configure`).
    pub fn start_shovels(&self) -> Result<()> {
        for p in self.store.parameters()? {
            if p.component != COMPONENT || self.vhost(&p.vhost).is_none() {
                continue;
            }
            match Spec::parse(&p.name, &p.value) {
                Ok(spec) => self.shovels.start(&p.vhost, &p.name, spec),
                Err(e) => {
                    tracing::error!(vhost = %p.vhost, shovel = %p.name, "shovel not started: {e}")
                }
            }
        }
        Ok(())
    }

    /// Checks and stores shovel `name` of `vhost`, and (re)starts it;
    /// Err (a precondition failure) names every fault of its definition.
    pub fn put_shovel(&self, vhost: &str, name: &str, value: &serde_json::Value) -> Result<()> {
        if self.vhost(vhost).is_none() {
            return Err(Error::not_found(format!("no vhost '{vhost}'")));
        }
        let spec = Spec::parse(name, value).map_err(Error::precondition_failed)?;
        spec.check_tls_files(self.config.link_tls_dir.as_deref())
            .map_err(Error::precondition_failed)?;
        self.store.put_parameter(&ParameterDef {
            vhost: vhost.to_string(),
            component: COMPONENT.to_string(),
            name: name.to_string(),
            value: value.clone(),
        })?;
        self.shovels.start(vhost, name, spec);
        Ok(())
    }

    /// Stops shovel `name` of `vhost` and clears its parameter.
    pub fn delete_shovel(&self, vhost: &str, name: &str) -> Result<()> {
        self.shovels.stop(vhost, name);
        self.store.delete_parameter(vhost, COMPONENT, name)?;
        Ok(())
    }

    /// What a shovel that finished its `src-delete-after` calls: its
    /// parameter goes.
    pub fn shovel_finished(broker: &std::sync::Weak<Broker>) -> crate::shovel::Finished {
        let broker = std::sync::Weak::clone(broker);
        Box::new(move |vhost: &str, name: &str| {
            let Some(b) = broker.upgrade() else { return };
            if let Err(e) = b.store.delete_parameter(vhost, COMPONENT, name) {
                tracing::warn!(vhost, shovel = name, "cannot clear a finished shovel: {e}");
            }
        })
    }
}
