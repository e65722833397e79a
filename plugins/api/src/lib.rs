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

/// Reading field values as clients send them: every integer width as one
/// integer, short and long strings as one string. The broker and plugins
/// use these, so an argument reads the same everywhere.
pub mod value {
    use super::AMQPValue;

    /// An integer of any width.
    pub fn int(v: &AMQPValue) -> Option<i64> {
        Some(match v {
            AMQPValue::ShortShortInt(n) => *n as i64,
            AMQPValue::ShortShortUInt(n) => *n as i64,
            AMQPValue::ShortInt(n) => *n as i64,
            AMQPValue::ShortUInt(n) => *n as i64,
            AMQPValue::LongInt(n) => *n as i64,
            AMQPValue::LongUInt(n) => *n as i64,
            AMQPValue::LongLongInt(n) => *n,
            _ => return None,
        })
    }

    /// The bytes of a short or long string.
    pub fn bytes(v: &AMQPValue) -> Option<&[u8]> {
        match v {
            AMQPValue::LongString(s) => Some(s.as_bytes()),
            AMQPValue::ShortString(s) => Some(s.as_str().as_bytes()),
            _ => None,
        }
    }

    /// A short or long string (invalid UTF-8 replaced).
    pub fn text(v: &AMQPValue) -> Option<String> {
        bytes(v).map(|b| String::from_utf8_lossy(b).into_owned())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_width_and_both_strings_read_alike() {
            assert_eq!(int(&AMQPValue::ShortShortUInt(200)), Some(200));
            assert_eq!(int(&AMQPValue::LongLongInt(-5)), Some(-5));
            assert_eq!(int(&AMQPValue::Boolean(true)), None);
            assert_eq!(text(&AMQPValue::ShortString("a".into())), Some("a".into()));
            assert_eq!(text(&AMQPValue::LongString("b".into())), Some("b".into()));
            assert_eq!(bytes(&AMQPValue::LongInt(1)), None);
        }
    }
}
