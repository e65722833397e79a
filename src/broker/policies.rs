//! Policies and operator policies, node-wide: set, clear, list, each kept
//! as RabbitMQ keeps it (the runtime parameter "policy" or
//! "operator_policy" of its vhost, valued {pattern, definition, priority,
//! apply-to}) and applied at once to the vhost's queues and exchanges.

use serde_json::{json, Map, Value};

use super::Broker;
use crate::policy::Policy;
use crate::store::ParameterDef;
use crate::vhost::{self, VHost};

/// The parameter component of policies.
pub const POLICY: &str = "policy";
/// The parameter component of operator policies.
pub const OPERATOR_POLICY: &str = "operator_policy";

fn component(operator: bool) -> &'static str {
    if operator {
        OPERATOR_POLICY
    } else {
        POLICY
    }
}

/// What a policy is made of, as the API and definitions files give it.
#[derive(Debug, Clone)]
pub struct PolicySpec {
    pub pattern: String,
    pub apply_to: String,
    pub priority: i64,
    pub definition: Map<String, Value>,
}

impl PolicySpec {
    /// From a stored parameter value (or a definitions file's entry):
    /// {"pattern", "definition", "priority", "apply-to"}; a definition
    /// may come as a list of pairs, as rabbitmqctl exports operator
    /// policies.
    pub fn from_value(v: &Value) -> Result<PolicySpec, String> {
        let pattern = v
            .get("pattern")
            .and_then(Value::as_str)
            .ok_or("a policy needs a pattern (a string)")?;
        let definition = match v.get("definition") {
            Some(Value::Object(m)) => m.clone(),
            Some(Value::Array(pairs)) => pairs
                .iter()
                .map(|p| match p.as_array().map(Vec::as_slice) {
                    Some([Value::String(k), v]) => Ok((k.clone(), v.clone())),
                    _ => Err(format!("a definition pair must be [key, value], not {p}")),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err("a policy needs a definition (an object)".into()),
        };
        let priority = match v.get("priority") {
            None | Some(Value::Null) => 0,
            Some(p) => p
                .as_i64()
                .or_else(|| p.as_str().and_then(|s| s.parse().ok()))
                .ok_or_else(|| format!("priority must be an integer, not {p}"))?,
        };
        let apply_to = match v.get("apply-to") {
            None | Some(Value::Null) => "all".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => return Err(format!("apply-to must be a string, not {other}")),
        };
        Ok(PolicySpec {
            pattern: pattern.to_string(),
            apply_to,
            priority,
            definition,
        })
    }

    /// The stored value.
    pub fn to_value(&self) -> Value {
        json!({
            "pattern": self.pattern,
            "definition": self.definition,
            "priority": self.priority,
            "apply-to": self.apply_to,
        })
    }

    /// The policy, or why not in RabbitMQ's words ("Validation
    /// failed", then the reason: the HTTP API's 400 says it so).
    fn policy(&self, vhost: &str, name: &str, operator: bool) -> Result<Policy, String> {
        Policy::new(
            vhost,
            name,
            &self.pattern,
            &self.apply_to,
            self.priority,
            self.definition.clone(),
            operator,
        )
        .map_err(|e| format!("Validation failed\n\n{e}\n"))
    }
}

impl Broker {
    fn vhost_or_404(&self, name: &str) -> vhost::error::Result<std::sync::Arc<VHost>> {
        self.vhost(name)
            .ok_or_else(|| vhost::Error::not_found(format!("no vhost '{name}'")))
    }

    /// Sets (or replaces) the policy `name` of `vhost` (an operator policy
    /// when `operator`), durably, and applies it at once.
    pub fn put_policy(
        &self,
        vhost: &str,
        name: &str,
        spec: &PolicySpec,
        operator: bool,
    ) -> vhost::error::Result<()> {
        let vh = self.vhost_or_404(vhost)?;
        let policy = spec
            .policy(vhost, name, operator)
            .map_err(vhost::Error::precondition_failed)?;
        let _one_at_a_time = self.policy_lock.lock();
        self.store.put_parameter(&ParameterDef {
            vhost: vhost.to_string(),
            component: component(operator).into(),
            name: name.to_string(),
            value: spec.to_value(),
        })?;
        vh.set_policies(vh.policies().with(policy));
        self.federation.changed(vhost);
        Ok(())
    }

    /// Clears the policy `name` of `vhost`; false if there was none.
    pub fn delete_policy(
        &self,
        vhost: &str,
        name: &str,
        operator: bool,
    ) -> vhost::error::Result<bool> {
        let vh = self.vhost_or_404(vhost)?;
        let _one_at_a_time = self.policy_lock.lock();
        let Some(rest) = vh.policies().without(name, operator) else {
            return Ok(false);
        };
        self.store
            .delete_parameter(vhost, component(operator), name)?;
        vh.set_policies(rest);
        self.federation.changed(vhost);
        Ok(true)
    }

    /// Restores a stored policy (startup; before queues and exchanges).
    pub(super) fn restore_policy(&self, p: &ParameterDef) -> vhost::error::Result<()> {
        let Some(vh) = self.vhost(&p.vhost) else {
            return Ok(());
        };
        let operator = p.component == OPERATOR_POLICY;
        let policy = PolicySpec::from_value(&p.value)
            .and_then(|spec| spec.policy(&p.vhost, &p.name, operator))
            .map_err(|e| {
                vhost::Error::internal(format!(
                    "policy '{}' in vhost '{}' cannot be restored: {e}",
                    p.name, p.vhost
                ))
            })?;
        vh.set_policies(vh.policies().with(policy));
        Ok(())
    }
}
