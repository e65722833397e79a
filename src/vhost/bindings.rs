//! Bindings: bind and unbind, and taking a deleted queue or exchange out
//! of every binding that points at it, with the auto-delete cascade that
//! follows. Every change to the topology (declare, delete, bind, unbind)
//! runs under the vhost's one topology lock, so a bind racing a delete
//! either lands before it (and is removed with it) or sees the destination
//! gone; nothing is persisted for an entity that is gone. Publishers never
//! take that lock.
//!
//! `Topology::sources` is the reverse index (for each destination, the
//! exchanges with a binding to it), so removing a destination touches only
//! the exchanges bound to it, and the cascade of auto-delete exchanges is a
//! worklist: a chain of any length costs time in proportion to it, and no
//! stack.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use amq_protocol::types::FieldTable;

use super::error::{Error, Result};
use super::{Destination, Exchange, VHost};
use crate::exchange::ExchangeKind;
use crate::store::BindingDef;

/// What the topology lock guards besides the registries' consistency.
#[derive(Default)]
pub struct Topology {
    /// For each destination, the exchanges that have a binding to it,
    /// by address.
    sources: HashMap<Destination, HashMap<usize, Arc<Exchange>>>,
}

fn addr(x: &Arc<Exchange>) -> usize {
    Arc::as_ptr(x) as usize
}

impl Topology {
    fn add(&mut self, dest: &Destination, source: &Arc<Exchange>) {
        self.sources
            .entry(dest.clone())
            .or_default()
            .insert(addr(source), Arc::clone(source));
    }

    fn remove(&mut self, dest: &Destination, source: &Arc<Exchange>) {
        if let Some(s) = self.sources.get_mut(dest) {
            s.remove(&addr(source));
            if s.is_empty() {
                self.sources.remove(dest);
            }
        }
    }

    fn take(&mut self, dest: &Destination) -> Vec<Arc<Exchange>> {
        self.sources
            .remove(dest)
            .map(|s| s.into_values().collect())
            .unwrap_or_default()
    }
}

impl VHost {
    /// Whether `dest` is still the live entity of its name.
    fn is_current(&self, dest: &Destination) -> bool {
        match dest {
            Destination::Queue(q) => self
                .queues
                .read()
                .get(q.name())
                .is_some_and(|cur| Arc::ptr_eq(cur, q)),
            Destination::Exchange(x) => self
                .exchanges
                .read()
                .get(&x.name)
                .is_some_and(|cur| Arc::ptr_eq(cur, x)),
        }
    }

    fn source_for_binding(&self, name: &str) -> Result<Arc<Exchange>> {
        if name.is_empty() {
            return Err(Error::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        self.exchange(name)
            .ok_or_else(|| Error::not_found(format!("no {}", self.describe("exchange", name))))
    }

    /// Resolves the destination of a bind.
    pub fn destination(&self, name: &str, to_exchange: bool, conn_id: u64) -> Result<Destination> {
        if to_exchange {
            if name.is_empty() {
                return Err(Error::access_refused(
                    "operation not permitted on the default exchange",
                ));
            }
            self.exchange(name)
                .map(Destination::Exchange)
                .ok_or_else(|| Error::not_found(format!("no {}", self.describe("exchange", name))))
        } else {
            self.queue_for(name, conn_id).map(Destination::Queue)
        }
    }

    /// `queue.bind` / `exchange.bind`.
    pub fn bind(
        &self,
        source: &str,
        dest: Destination,
        key: &str,
        args: &FieldTable,
    ) -> Result<()> {
        let mut topology = self.lock_topology()?;
        let x = self.source_for_binding(source)?;
        if !self.is_current(&dest) {
            let what = match dest {
                Destination::Queue(_) => "queue",
                Destination::Exchange(_) => "exchange",
            };
            return Err(Error::not_found(format!(
                "no {}",
                self.describe(what, dest.name())
            )));
        }
        if x.kind == Some(ExchangeKind::Headers) {
            crate::exchange::headers::validate_args(args).map_err(Error::precondition_failed)?;
        }
        let added = x
            .bindings
            .write()
            .bind(key, args, dest.clone())
            .map_err(Error::precondition_failed)?;
        if added {
            x.ever_bound.store(true, Ordering::Relaxed);
            topology.add(&dest, &x);
            if let Some(def) = self.binding_def(&x, key, args, &dest) {
                self.store.put_binding(&def)?;
            }
        }
        Ok(())
    }

    /// `queue.unbind` / `exchange.unbind`, by RabbitMQ 3.10's rules
    /// (rabbit_binding:remove, rabbit_channel:binding_action): the default
    /// exchange on either side is 403; a missing source, destination or
    /// binding is not an error; another connection's exclusive queue is
    /// 405 only if the binding exists.
    pub fn unbind(
        &self,
        source: &str,
        dest: &str,
        to_exchange: bool,
        key: &str,
        args: &FieldTable,
        conn_id: u64,
    ) -> Result<()> {
        if source.is_empty() || (to_exchange && dest.is_empty()) {
            return Err(Error::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        let mut topology = self.lock_topology()?;
        let Some(x) = self.exchange(source) else {
            return Ok(());
        };
        let dest = match to_exchange {
            true => self.exchange(dest).map(Destination::Exchange),
            false => self.queue(dest).map(Destination::Queue),
        };
        let Some(dest) = dest else {
            return Ok(());
        };
        let (removed, still_bound) = {
            let mut bindings = x.bindings.write();
            if let Destination::Queue(q) = &dest {
                if self.check_exclusive(q, conn_id).is_err() {
                    let exists = bindings
                        .list()
                        .iter()
                        .any(|(k, a, d)| k == key && a == args && d == &dest);
                    return match exists {
                        true => Err(self.locked(q.name())),
                        false => Ok(()),
                    };
                }
            }
            let removed = bindings.unbind(key, args, &dest);
            (removed, bindings.has_destination(&dest))
        };
        if removed {
            if !still_bound {
                topology.remove(&dest, &x);
            }
            self.forget_binding(&x, key, args, &dest)?;
            if self.should_auto_delete(&x) {
                self.remove_exchanges_locked(&mut topology, vec![x])?;
            }
        }
        Ok(())
    }

    /// Removes every binding to `dest` (a queue or exchange being deleted)
    /// and auto-deletes the source exchanges left without bindings. The
    /// caller holds the topology lock.
    pub(super) fn unbind_everywhere_locked(
        &self,
        topology: &mut Topology,
        dest: &Destination,
    ) -> Result<()> {
        let mut emptied = Vec::new();
        for x in topology.take(dest) {
            self.unbind_from(&x, dest)?;
            if self.should_auto_delete(&x) {
                emptied.push(x);
            }
        }
        self.remove_exchanges_locked(topology, emptied)
    }

    /// Removes `x`'s bindings to `dest`, stored ones included.
    fn unbind_from(&self, x: &Arc<Exchange>, dest: &Destination) -> Result<()> {
        let removed: Vec<(String, FieldTable)> = {
            let mut b = x.bindings.write();
            let list = b
                .list()
                .into_iter()
                .filter(|(_, _, d)| d == dest)
                .map(|(k, a, _)| (k, a))
                .collect();
            b.unbind_all(dest);
            list
        };
        for (key, args) in &removed {
            self.forget_binding(x, key, args, dest)?;
        }
        Ok(())
    }

    fn should_auto_delete(&self, x: &Exchange) -> bool {
        x.auto_delete && x.ever_bound.load(Ordering::Relaxed) && x.bindings.read().is_empty()
    }

    /// Removes exchanges, and the auto-delete exchanges their removal
    /// leaves without bindings, and so on: a worklist, not recursion. The
    /// caller holds the topology lock.
    pub(super) fn remove_exchanges_locked(
        &self,
        topology: &mut Topology,
        mut work: Vec<Arc<Exchange>>,
    ) -> Result<()> {
        while let Some(x) = work.pop() {
            {
                let mut exchanges = self.exchanges.write();
                match exchanges.get(&x.name) {
                    Some(cur) if Arc::ptr_eq(cur, &x) => {
                        exchanges.remove(&x.name);
                    }
                    _ => continue,
                }
            }
            if let Some(d) = &x.dedup {
                d.close();
            }
            if x.durable {
                self.store.delete_exchange(&self.name, &x.name)?;
            }
            // Its own bindings go (one to itself would keep it alive
            // forever), out of the reverse index too.
            let own = x.bindings.read().list();
            for (key, args, d) in &own {
                self.forget_binding(&x, key, args, d)?;
            }
            for (_, _, d) in own {
                x.bindings.write().unbind_all(&d);
                topology.remove(&d, &x);
            }
            // And so do those that point at it from other exchanges.
            let dest = Destination::Exchange(Arc::clone(&x));
            for source in topology.take(&dest) {
                self.unbind_from(&source, &dest)?;
                if self.should_auto_delete(&source) {
                    work.push(source);
                }
            }
        }
        Ok(())
    }

    fn binding_def(
        &self,
        x: &Exchange,
        key: &str,
        args: &FieldTable,
        dest: &Destination,
    ) -> Option<BindingDef> {
        let durable_dest = match dest {
            Destination::Queue(q) => q.config.store_id != 0,
            Destination::Exchange(d) => d.durable,
        };
        (x.durable && durable_dest).then(|| BindingDef {
            vhost: self.name.clone(),
            source: x.name.clone(),
            destination: dest.name().to_string(),
            to_exchange: matches!(dest, Destination::Exchange(_)),
            routing_key: key.to_string(),
            arguments: args.clone(),
        })
    }

    fn forget_binding(
        &self,
        x: &Exchange,
        key: &str,
        args: &FieldTable,
        dest: &Destination,
    ) -> Result<()> {
        if let Some(def) = self.binding_def(x, key, args, dest) {
            self.store.delete_binding(&def)?;
        }
        Ok(())
    }

    /// Whether the destination of a stored binding exists (startup).
    pub fn has_destination(&self, def: &BindingDef) -> bool {
        match def.to_exchange {
            true => self.exchange(&def.destination).is_some(),
            false => self.queue(&def.destination).is_some(),
        }
    }

    /// Recreates a durable binding (startup).
    pub fn restore_binding(&self, def: &BindingDef) -> Result<()> {
        let dest = self.destination(&def.destination, def.to_exchange, 0)?;
        self.bind(&def.source, dest, &def.routing_key, &def.arguments)
    }
}
