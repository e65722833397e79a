//! Declaring, binding and deleting exchanges and queues, with RabbitMQ's
//! checks (reserved names, equivalence, exclusivity) and reply texts, and
//! keeping the store's definitions in step for durable entities.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use amq_protocol::types::{AMQPValue, FieldTable};
use parking_lot::RwLock;

use super::bindings::Topology;
use super::error::{Error, Result};
use super::table::{PluginTable, Table};
use super::{Destination, Exchange, VHost};
use crate::exchange::{Bindings, ExchangeKind};
use crate::queue::{Deleted, Queue, QueueConfig};
use crate::store::{ExchangeDef, QueueDef};

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

/// What `queue.declare` asks for.
#[derive(Debug, Clone)]
pub struct QueueSpec {
    pub name: String,
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    pub arguments: FieldTable,
    /// The broker chose the name (`amq.gen-...`): the reserved prefix is ours.
    pub server_named: bool,
}

/// Queue arguments RabbitMQ compares on redeclare.
const QUEUE_ARGS_COMPARED: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
];

fn bool_str(b: bool) -> &'static str {
    if b {
        "true"
    } else {
        "false"
    }
}

/// RabbitMQ's type names for field values in equivalence errors.
fn value_type(v: &AMQPValue) -> &'static str {
    match v {
        AMQPValue::Boolean(_) => "bool",
        AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => "byte",
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => "short",
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) => "signedint",
        AMQPValue::LongLongInt(_) => "long",
        AMQPValue::Float(_) => "float",
        AMQPValue::Double(_) => "double",
        AMQPValue::DecimalValue(_) => "decimal",
        AMQPValue::ShortString(_) | AMQPValue::LongString(_) => "longstr",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::ByteArray(_) => "binary",
        AMQPValue::Void => "void",
    }
}

fn value_text(v: &AMQPValue) -> String {
    match v {
        AMQPValue::Boolean(b) => bool_str(*b).to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::ShortString(s) => s.as_str().to_string(),
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => format!("{other:?}"),
    }
}

/// Numeric values compare by value across integer widths (clients differ
/// in which width they send), everything else exactly.
fn same_value(a: &AMQPValue, b: &AMQPValue) -> bool {
    use crate::queue::args::int_arg as int;
    fn text(v: &AMQPValue) -> Option<&[u8]> {
        match v {
            AMQPValue::ShortString(s) => Some(s.as_str().as_bytes()),
            AMQPValue::LongString(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
    match (int(a), int(b)) {
        (Some(x), Some(y)) => x == y,
        _ => match (text(a), text(b)) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        },
    }
}

impl VHost {
    fn inequivalent(&self, field: &str, what: &str, name: &str, got: &str, have: &str) -> Error {
        Error::precondition_failed(format!(
            "inequivalent arg '{field}' for {}: received '{got}' but current is '{have}'",
            self.describe(what, name)
        ))
    }

    fn check_args(
        &self,
        what: &str,
        name: &str,
        keys: &[&str],
        got: &FieldTable,
        have: &FieldTable,
    ) -> Result<()> {
        for key in keys {
            let (g, h) = (got.inner().get(*key), have.inner().get(*key));
            let same = match (g, h) {
                (None, None) => true,
                (Some(a), Some(b)) => same_value(a, b),
                _ => false,
            };
            if !same {
                let describe = |v: Option<&AMQPValue>| match v {
                    Some(v) => format!("the value '{}' of type '{}'", value_text(v), value_type(v)),
                    None => "none".to_string(),
                };
                return Err(Error::precondition_failed(format!(
                    "inequivalent arg '{key}' for {}: received {} but current is {}",
                    self.describe(what, name),
                    describe(g),
                    describe(h)
                )));
            }
        }
        Ok(())
    }

    /// `exchange.declare`.
    pub fn declare_exchange(&self, spec: &ExchangeSpec, passive: bool) -> Result<Arc<Exchange>> {
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
        let _topology = self.topology.lock();
        let kind = ExchangeKind::parse(&spec.kind);
        let plugin = match kind {
            Some(_) => None,
            None => Some(self.plugins.exchange_type(&spec.kind).ok_or_else(|| {
                Error::command_invalid(format!("invalid exchange type '{}'", spec.kind))
            })?),
        };
        if let Some(x) = self.exchange(&spec.name) {
            let n = &spec.name;
            if x.type_name != spec.kind {
                return Err(self.inequivalent("type", "exchange", n, &spec.kind, &x.type_name));
            }
            for (field, got, have) in [
                ("durable", spec.durable, x.durable),
                ("auto_delete", spec.auto_delete, x.auto_delete),
                ("internal", spec.internal, x.internal),
            ] {
                if got != have {
                    return Err(self.inequivalent(
                        field,
                        "exchange",
                        n,
                        bool_str(got),
                        bool_str(have),
                    ));
                }
            }
            self.check_args(
                "exchange",
                n,
                &["alternate-exchange"],
                &spec.arguments,
                &x.arguments,
            )?;
            return Ok(x);
        }
        if spec.name.starts_with("amq.") {
            return Err(Error::access_refused(format!(
                "exchange name '{}' contains reserved prefix 'amq.*'",
                spec.name
            )));
        }
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
                    "invalid exchange type '{}'",
                    spec.kind
                )))
            }
        };
        let alternate = match spec.arguments.inner().get("alternate-exchange") {
            Some(AMQPValue::LongString(s)) => {
                Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
            }
            Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_string()),
            _ => None,
        };
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
            bindings: RwLock::new(table),
            ever_bound: AtomicBool::new(false),
            plugin,
            held: Default::default(),
        });
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
        let mut topology = self.topology.lock();
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

    /// `queue.declare`. Returns the queue and whether it was created.
    pub fn declare_queue(
        &self,
        spec: &QueueSpec,
        passive: bool,
        conn_id: u64,
    ) -> Result<Arc<Queue>> {
        if passive {
            let q = self.queue(&spec.name).ok_or_else(|| {
                Error::not_found(format!("no {}", self.describe("queue", &spec.name)))
            })?;
            self.check_exclusive(&q, conn_id)?;
            return Ok(q);
        }
        // Check, id allocation and the stored definition happen as one, or
        // two racing declares of a new durable queue could store different
        // ids than the one in use (its messages lost at the next start).
        let _topology = self.topology.lock();
        // RabbitMQ refuses the reserved prefix before looking the name up,
        // so even an existing amq.gen- queue cannot be redeclared by name.
        if spec.name.starts_with("amq.") && !spec.server_named {
            return Err(Error::access_refused(format!(
                "queue name '{}' contains reserved prefix 'amq.*'",
                spec.name
            )));
        }
        if let Some(q) = self.queue(&spec.name) {
            self.check_exclusive(&q, conn_id)?;
            self.check_queue_equivalence(&q, spec)?;
            q.touch();
            return Ok(q);
        }
        let max = self.max_queues.load(std::sync::atomic::Ordering::Relaxed);
        if max != 0 && self.queues.read().len() as u64 >= max {
            return Err(Error::precondition_failed(format!(
                "cannot declare queue '{}': queue limit in vhost '{}' ({max}) is reached",
                spec.name, self.name
            )));
        }
        crate::queue::args::validate(&spec.arguments).map_err(|(arg, why)| {
            Error::precondition_failed(format!(
                "invalid arg '{arg}' for {}: {why}",
                self.describe("queue", &spec.name)
            ))
        })?;
        // RabbitMQ makes exclusive queues transient whatever the flag says:
        // they die with their connection, so they are never stored.
        let stored = spec.durable && !spec.exclusive;
        // The id comes from the store's applied state: two declares
        // racing get the same one.
        let store_id = if stored {
            self.store.declare_queue(&QueueDef {
                vhost: self.name.clone(),
                name: spec.name.clone(),
                id: 0,
                auto_delete: spec.auto_delete,
                arguments: spec.arguments.clone(),
            })?
        } else {
            0
        };
        let config = QueueConfig {
            name: spec.name.clone(),
            vhost: self.name.clone(),
            durable: stored,
            exclusive_owner: spec.exclusive.then_some(conn_id),
            auto_delete: spec.auto_delete,
            arguments: spec.arguments.clone(),
            store_id,
        };
        let mut queues = self.queues.write();
        if let Some(q) = queues.get(&spec.name) {
            return Ok(Arc::clone(q));
        }
        let q = Queue::new(config, Arc::clone(&self.store), self.me.clone());
        queues.insert(spec.name.clone(), Arc::clone(&q));
        Ok(q)
    }

    fn check_queue_equivalence(&self, q: &Queue, spec: &QueueSpec) -> Result<()> {
        let n = &spec.name;
        for (field, got, have) in [
            ("durable", spec.durable && !spec.exclusive, q.config.durable),
            (
                "exclusive",
                spec.exclusive,
                q.config.exclusive_owner.is_some(),
            ),
            ("auto_delete", spec.auto_delete, q.config.auto_delete),
        ] {
            if got != have {
                if field == "exclusive" {
                    return Err(self.locked(n));
                }
                return Err(self.inequivalent(field, "queue", n, bool_str(got), bool_str(have)));
            }
        }
        self.check_args(
            "queue",
            n,
            QUEUE_ARGS_COMPARED,
            &spec.arguments,
            &q.config.arguments,
        )
    }

    pub(super) fn locked(&self, name: &str) -> Error {
        Error::resource_locked(format!(
            "cannot obtain exclusive access to locked {}. It could be originally declared on another \
             connection or the exclusive property value does not match that of the original declaration.",
            self.describe("queue", name)
        ))
    }

    /// 405 unless the queue is non-exclusive or owned by `conn_id`.
    pub fn check_exclusive(&self, q: &Queue, conn_id: u64) -> Result<()> {
        match q.config.exclusive_owner {
            Some(owner) if owner != conn_id => Err(self.locked(q.name())),
            _ => Ok(()),
        }
    }

    /// The queue `name`, usable by connection `conn_id`, or 404 / 405.
    pub fn queue_for(&self, name: &str, conn_id: u64) -> Result<Arc<Queue>> {
        let q = self
            .queue(name)
            .ok_or_else(|| Error::not_found(format!("no {}", self.describe("queue", name))))?;
        self.check_exclusive(&q, conn_id)?;
        Ok(q)
    }

    /// `queue.delete`. A missing queue deletes nothing and is not an error
    /// (RabbitMQ 3.x): then None.
    pub fn delete_queue(
        &self,
        name: &str,
        if_unused: bool,
        if_empty: bool,
        conn_id: u64,
    ) -> Result<Option<Deleted>> {
        let mut topology = self.topology.lock();
        let Some(q) = self.queue(name) else {
            return Ok(None);
        };
        self.check_exclusive(&q, conn_id)?;
        if if_unused && q.consumer_count() > 0 {
            return Err(Error::precondition_failed(format!(
                "{} in use",
                self.describe("queue", name)
            )));
        }
        if if_empty && q.message_count() > 0 {
            return Err(Error::precondition_failed(format!(
                "{} not empty",
                self.describe("queue", name)
            )));
        }
        self.remove_queue_locked(&mut topology, &q)
    }

    /// Removes a queue from the vhost, its bindings and its stored state;
    /// None if it was already gone.
    pub fn remove_queue(&self, q: &Arc<Queue>) -> Result<Option<Deleted>> {
        let mut topology = self.topology.lock();
        self.remove_queue_locked(&mut topology, q)
    }

    fn remove_queue_locked(
        &self,
        topology: &mut Topology,
        q: &Arc<Queue>,
    ) -> Result<Option<Deleted>> {
        {
            let mut queues = self.queues.write();
            match queues.get(q.name()) {
                Some(cur) if Arc::ptr_eq(cur, q) => {
                    queues.remove(q.name());
                }
                _ => return Ok(None),
            }
        }
        let deleted = q.delete();
        self.unbind_everywhere_locked(topology, &Destination::Queue(Arc::clone(q)))?;
        if q.config.store_id != 0 {
            self.store
                .delete_queue(&self.name, q.name(), q.config.store_id)?;
        }
        Ok(Some(deleted))
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
            self.declare_exchange(&spec, false)?;
        }
        Ok(())
    }

    /// Recreates a durable queue and its messages from the store (startup).
    pub fn restore_queue(&self, def: &QueueDef) -> Result<usize> {
        let q = Queue::new(
            QueueConfig {
                name: def.name.clone(),
                vhost: self.name.clone(),
                durable: true,
                exclusive_owner: None,
                auto_delete: def.auto_delete,
                arguments: def.arguments.clone(),
                store_id: def.id,
            },
            Arc::clone(&self.store),
            self.me.clone(),
        );
        let n = q.recover()?;
        self.queues.write().insert(def.name.clone(), q);
        Ok(n)
    }
}
