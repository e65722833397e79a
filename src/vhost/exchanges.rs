//! Exchanges of a vhost: `exchange.declare` (reserved names, types built
//! in or from a plugin, equivalence with one already declared), delete,
//! and restoring durable ones at start. Durable ones are recorded in the
//! store under the topology lock, so a racing declare cannot record other
//! arguments than the ones in use.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use amq_protocol::types::FieldTable;
use parking_lot::RwLock;

use super::equivalence;
use super::error::{Error, Result};
use super::table::{PluginTable, Table};
use super::{Exchange, VHost};
use crate::exchange::{Bindings, ExchangeKind};
use crate::store::ExchangeDef;

/// What `exchange.declare` asks for.
#[derive(Debug, Clone)]
pub struct ExchangeSpec {
    pub name: String,
    pub kind: String,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
}

impl VHost {
    /// `exchange.declare`.
    pub fn declare_exchange(&self, spec: &ExchangeSpec, passive: bool) -> Result<Arc<Exchange>> {
        self.declare_exchange_as(spec, passive, false)
    }

    /// `exchange.declare`, or (`restoring`) a durable exchange recovered
    /// from the store.
    fn declare_exchange_as(
        &self,
        spec: &ExchangeSpec,
        passive: bool,
        restoring: bool,
    ) -> Result<Arc<Exchange>> {
        if spec.name.is_empty() {
            return Err(Error::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        if passive {
            return self.exchange(&spec.name).ok_or_else(|| {
                Error::not_found(format!("no {}", self.describe("exchange", &spec.name)))
            });
        }
        // The check, the stored definition and the registry entry happen as
        // one: a racing declare cannot store other arguments than the ones
        // in use.
        let _topology = self.lock_topology()?;
        let kind = ExchangeKind::parse(&spec.kind);
        let plugin = match kind {
            Some(_) => None,
            None => Some(self.plugins.exchange_type(&spec.kind).ok_or_else(|| {
                Error::command_invalid(format!("unknown exchange type '{}'", spec.kind))
            })?),
        };
        if let Some(x) = self.exchange(&spec.name) {
            let subject = self.describe("exchange", &spec.name);
            equivalence::exchange(spec, &x, &subject).map_err(Error::precondition_failed)?;
            return Ok(x);
        }
        if spec.name.starts_with("amq.") {
            return Err(Error::access_refused(format!(
                "exchange name '{}' contains reserved prefix 'amq.*'",
                spec.name
            )));
        }
        check_alternate(&spec.arguments, &self.describe("exchange", &spec.name))?;
        let subject = self.describe("exchange", &spec.name);
        let dedup = match restoring {
            false => {
                let settings = self.check_dedup(&spec.arguments, spec.durable, &subject)?;
                let owner = spec
                    .durable
                    .then(|| crate::store::dedup::exchange_owner(&self.name, &spec.name));
                self.new_dedup(settings, owner)?
            }
            true => {
                let owner = crate::store::dedup::exchange_owner(&self.name, &spec.name);
                self.restore_dedup(&spec.arguments, owner, &subject)?
            }
        };
        let table = match (kind, &plugin) {
            (Some(k), _) => Table::Builtin(Bindings::new(k)),
            (None, Some(t)) => {
                t.validate(&spec.arguments)
                    .map_err(Error::precondition_failed)?;
                match t.new_table(&spec.arguments) {
                    warren_plugin_api::Table::Custom(table) => {
                        Table::Plugin(PluginTable::new(table))
                    }
                    warren_plugin_api::Table::Builtin(name) => {
                        let inner = ExchangeKind::parse(name).ok_or_else(|| {
                            Error::internal(format!("plugin asked for unknown type '{name}'"))
                        })?;
                        Table::Builtin(Bindings::new(inner))
                    }
                }
            }
            (None, None) => {
                return Err(Error::command_invalid(format!(
                    "unknown exchange type '{}'",
                    spec.kind
                )))
            }
        };
        let alternate = spec
            .arguments
            .inner()
            .get("alternate-exchange")
            .and_then(crate::wire::value::text);
        if spec.durable {
            self.store.put_exchange(&ExchangeDef {
                vhost: self.name.clone(),
                name: spec.name.clone(),
                kind: spec.kind.clone(),
                durable: true,
                auto_delete: spec.auto_delete,
                internal: spec.internal,
                arguments: spec.arguments.clone(),
            })?;
        }
        let x = Arc::new(Exchange {
            name: spec.name.clone(),
            kind,
            type_name: spec.kind.clone(),
            durable: spec.durable,
            auto_delete: spec.auto_delete,
            internal: spec.internal,
            arguments: spec.arguments.clone(),
            alternate,
            policy: Default::default(),
            bindings: RwLock::new(table),
            ever_bound: AtomicBool::new(false),
            plugin,
            held: Default::default(),
            stats: Default::default(),
            dedup,
        });
        self.apply_policies_to_exchange(&x);
        self.exchanges
            .write()
            .insert(spec.name.clone(), Arc::clone(&x));
        Ok(x)
    }

    /// `exchange.delete`. A missing exchange is not an error (RabbitMQ 3.x).
    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> Result<()> {
        if name.is_empty() {
            return Err(Error::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        if name.starts_with("amq.") {
            return Err(Error::access_refused(format!(
                "deletion of system {} not allowed",
                self.describe("exchange", name)
            )));
        }
        let mut topology = self.lock_topology()?;
        let Some(x) = self.exchange(name) else {
            return Ok(());
        };
        if if_unused && !x.bindings.read().is_empty() {
            return Err(Error::precondition_failed(format!(
                "{} in use",
                self.describe("exchange", name)
            )));
        }
        self.remove_exchanges_locked(&mut topology, vec![x])
    }

    /// Recreates a durable exchange from the store (startup).
    pub fn restore_exchange(&self, def: &ExchangeDef) -> Result<()> {
        let spec = ExchangeSpec {
            name: def.name.clone(),
            kind: def.kind.clone(),
            durable: true,
            auto_delete: def.auto_delete,
            internal: def.internal,
            arguments: def.arguments.clone(),
        };
        if self.exchange(&def.name).is_none() {
            self.declare_exchange_as(&spec, false, true)?;
        }
        Ok(())
    }
}

/// 406 for an alternate exchange that is not a name, in RabbitMQ's words
/// (`subject`: "exchange 'x' in vhost '/'").
pub(super) fn check_alternate(args: &FieldTable, subject: &str) -> Result<()> {
    match args.inner().get("alternate-exchange") {
        Some(v) if crate::wire::value::text(v).is_none() => {
            Err(Error::precondition_failed(format!(
                "invalid type '{}' for arg 'alternate-exchange' in {subject}",
                crate::wire::type_name(v)
            )))
        }
        _ => Ok(()),
    }
}
