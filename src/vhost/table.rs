//! `Table`: the bindings of one exchange, either a built-in routing table
//! (`exchange::Bindings`) or a plugin's (`warren_plugin_api::RoutingTable`).
//! A plugin sees destinations as opaque ids; this maps them back.

use std::collections::HashMap;

use amq_protocol::types::FieldTable;
use warren_plugin_api::{DestId, MessageView, RoutingTable};

use super::Destination;
use crate::exchange::Bindings;
use crate::message::Message;

/// The bindings of an exchange.
pub enum Table {
    Builtin(Bindings<Destination>),
    Plugin(PluginTable),
}

/// A plugin's table and the ids it knows destinations by.
pub struct PluginTable {
    table: Box<dyn RoutingTable>,
    ids: HashMap<u64, Destination>,
    by_dest: HashMap<Destination, u64>,
    next: u64,
}

impl PluginTable {
    /// Wraps a plugin's table.
    pub fn new(table: Box<dyn RoutingTable>) -> PluginTable {
        PluginTable {
            table,
            ids: HashMap::new(),
            by_dest: HashMap::new(),
            next: 1,
        }
    }

    fn id_of(&mut self, dest: &Destination) -> DestId {
        if let Some(id) = self.by_dest.get(dest) {
            return DestId(*id);
        }
        let id = self.next;
        self.next += 1;
        self.ids.insert(id, dest.clone());
        self.by_dest.insert(dest.clone(), id);
        DestId(id)
    }

    fn forget_unused(&mut self, id: DestId) {
        if !self.table.bindings().iter().any(|(_, _, d)| *d == id) {
            if let Some(dest) = self.ids.remove(&id.0) {
                self.by_dest.remove(&dest);
            }
        }
    }
}

impl Table {
    /// Whether there are no bindings.
    pub fn is_empty(&self) -> bool {
        match self {
            Table::Builtin(b) => b.is_empty(),
            Table::Plugin(p) => p.table.is_empty(),
        }
    }

    /// Whether some binding routes to `dest`.
    pub fn has_destination(&self, dest: &Destination) -> bool {
        match self {
            Table::Builtin(b) => b.has_destination(dest),
            Table::Plugin(p) => p.by_dest.contains_key(dest),
        }
    }

    /// Every binding as (key, arguments, destination).
    pub fn list(&self) -> Vec<(String, FieldTable, Destination)> {
        match self {
            Table::Builtin(b) => b
                .iter()
                .map(|(k, a, d)| (k.to_string(), a.clone(), d.clone()))
                .collect(),
            Table::Plugin(p) => p
                .table
                .bindings()
                .into_iter()
                .filter_map(|(k, a, id)| p.ids.get(&id.0).map(|d| (k, a, d.clone())))
                .collect(),
        }
    }

    /// Adds a binding: Ok(false) if it existed; Err(text) if the exchange
    /// type refuses it.
    pub fn bind(
        &mut self,
        key: &str,
        args: &FieldTable,
        dest: Destination,
    ) -> Result<bool, String> {
        match self {
            Table::Builtin(b) => Ok(b.bind(key, args, dest)),
            Table::Plugin(p) => {
                let id = p.id_of(&dest);
                let r = p.table.bind(key, args, id);
                if !matches!(r, Ok(true)) {
                    p.forget_unused(id);
                }
                r
            }
        }
    }

    /// Removes a binding; false if there was none.
    pub fn unbind(&mut self, key: &str, args: &FieldTable, dest: &Destination) -> bool {
        match self {
            Table::Builtin(b) => b.unbind(key, args, dest),
            Table::Plugin(p) => {
                let Some(&id) = p.by_dest.get(dest) else {
                    return false;
                };
                let removed = p.table.unbind(key, args, DestId(id));
                p.forget_unused(DestId(id));
                removed
            }
        }
    }

    /// Removes every binding to `dest`.
    pub fn unbind_all(&mut self, dest: &Destination) -> usize {
        match self {
            Table::Builtin(b) => b.unbind_all(dest),
            Table::Plugin(p) => {
                let Some(id) = p.by_dest.remove(dest) else {
                    return 0;
                };
                p.ids.remove(&id);
                p.table.unbind_all(DestId(id))
            }
        }
    }

    /// Appends the destinations a message goes to.
    pub fn route(
        &self,
        key: &str,
        headers: Option<&FieldTable>,
        msg: &Message,
        out: &mut Vec<Destination>,
    ) {
        match self {
            Table::Builtin(b) => b.route(key, headers, out),
            Table::Plugin(p) => {
                let view = MessageView {
                    routing_key: key,
                    headers,
                    raw_properties: msg.properties(),
                };
                // Plugin exchanges are not the hot path: a small Vec per call.
                let mut ids = Vec::new();
                p.table.route(&view, &mut ids);
                out.extend(ids.into_iter().filter_map(|id| p.ids.get(&id.0).cloned()));
            }
        }
    }
}
