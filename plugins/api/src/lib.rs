//! The narrow surface a Warren plugin builds on. A plugin provides exchange
//! types: a name clients declare (`x-consistent-hash`), argument checks, and
//! a routing table per exchange over opaque destination ids that the broker
//! maps to its queues and exchanges. The broker implements the rest
//! (declare, bind, persistence, delivery); plugins never see its internals.

pub use amq_protocol::protocol::basic::AMQPProperties;
pub use amq_protocol::types::{AMQPValue, FieldTable, ShortString};

/// A destination (queue or exchange) as the broker names it to a plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestId(pub u64);

/// What a plugin may read of a message being routed.
pub struct MessageView<'a> {
    /// The routing key.
    pub routing_key: &'a str,
    /// The headers table, if the message has one.
    pub headers: Option<&'a FieldTable>,
    /// The encoded property list (decode with `properties`).
    pub raw_properties: &'a [u8],
}

impl MessageView<'_> {
    /// The decoded properties (allocates).
    pub fn properties(&self) -> AMQPProperties {
        amq_protocol::protocol::basic::parse_properties(self.raw_properties)
            .map(|(_, p)| p)
            .unwrap_or_default()
    }
}

/// How an exchange of a plugin type routes.
pub enum Table {
    /// Like a built-in exchange type: "direct", "fanout", "topic", "headers".
    Builtin(&'static str),
    /// With the plugin's own routing table.
    Custom(Box<dyn RoutingTable>),
}

/// What to do with a message published to an exchange of a plugin type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Route it now.
    Route,
    /// Hold it for this many milliseconds, then route it. The broker keeps
    /// it (on disk, so held messages cost no memory), counts it per
    /// exchange, and calls `released` when it is due.
    Delay(u64),
}

/// An exchange type provided by a plugin.
pub trait ExchangeType: Send + Sync + 'static {
    /// The type name clients declare.
    fn name(&self) -> &'static str;
    /// Checks exchange.declare arguments; the error text goes to the client
    /// with 406 PRECONDITION_FAILED.
    fn validate(&self, _arguments: &FieldTable) -> Result<(), String> {
        Ok(())
    }
    /// How a new exchange declared with `arguments` routes.
    fn new_table(&self, arguments: &FieldTable) -> Table;
    /// Decides, per publish, whether the message is routed now or held.
    fn on_publish(&self, _msg: &MessageView<'_>) -> Disposition {
        Disposition::Route
    }
    /// Headers to set on a held message when it is released (e.g. the
    /// delayed-message exchange turns x-delay negative).
    fn released(&self, _delay_ms: u64) -> Vec<(&'static str, AMQPValue)> {
        Vec::new()
    }
}

/// The bindings of one exchange of a plugin type.
pub trait RoutingTable: Send + Sync {
    /// Adds a binding; Ok(false) if it already exists; Err(text) refuses it
    /// with 406 PRECONDITION_FAILED.
    fn bind(&mut self, key: &str, arguments: &FieldTable, dest: DestId) -> Result<bool, String>;
    /// Removes a binding; false if there was none.
    fn unbind(&mut self, key: &str, arguments: &FieldTable, dest: DestId) -> bool;
    /// Removes every binding to `dest`; returns how many.
    fn unbind_all(&mut self, dest: DestId) -> usize;
    /// Appends the destinations `msg` goes to.
    fn route(&self, msg: &MessageView<'_>, out: &mut Vec<DestId>);
    /// Every binding as (key, arguments, destination).
    fn bindings(&self) -> Vec<(String, FieldTable, DestId)>;
    /// Number of bindings.
    fn len(&self) -> usize;
    /// Whether there are no bindings.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
