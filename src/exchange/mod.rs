//! Routing tables of the built-in exchange types (direct, fanout, topic,
//! headers): which bindings an exchange holds and which destinations a
//! message goes to. Pure data structures: no I/O, no locking, no async.
//!
//! A binding is identified by (routing key, arguments, destination), as in
//! RabbitMQ; binding twice is a no-op and `route` reports each destination
//! at most once per call.

pub mod direct;
pub mod fanout;
pub mod headers;
pub mod topic;

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use amq_protocol::types::AMQPValue;
pub use amq_protocol::types::FieldTable;

/// The built-in exchange types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExchangeKind {
    /// Routes on exact equality of routing key and binding key.
    Direct,
    /// Routes to every bound destination.
    Fanout,
    /// Routes on dotted-word patterns with `*` and `#` wildcards.
    Topic,
    /// Routes on message headers matched against binding arguments.
    Headers,
}

impl ExchangeKind {
    /// Parses the exchange type name used by `exchange.declare`
    /// (case-sensitive, as in RabbitMQ); `None` for unknown types.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "direct" => Some(Self::Direct),
            "fanout" => Some(Self::Fanout),
            "topic" => Some(Self::Topic),
            "headers" => Some(Self::Headers),
            _ => None,
        }
    }

    /// The exchange type name as declared and listed.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Fanout => "fanout",
            Self::Topic => "topic",
            Self::Headers => "headers",
        }
    }
}

impl fmt::Display for ExchangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The routing table of one exchange, generic over the destination handle D
/// (the broker uses a cheap Clone + Eq + Hash handle such as an Arc-backed
/// queue/exchange id).
#[derive(Clone, Debug)]
pub enum Bindings<D> {
    /// Table of a direct exchange.
    Direct(direct::DirectTable<D>),
    /// Table of a fanout exchange.
    Fanout(fanout::FanoutTable<D>),
    /// Table of a topic exchange.
    Topic(topic::TopicTrie<D>),
    /// Table of a headers exchange.
    Headers(headers::HeadersTable<D>),
}

impl<D: Clone + Eq + Hash> Bindings<D> {
    /// An empty table for an exchange of the given kind.
    pub fn new(kind: ExchangeKind) -> Self {
        match kind {
            ExchangeKind::Direct => Self::Direct(Default::default()),
            ExchangeKind::Fanout => Self::Fanout(Default::default()),
            ExchangeKind::Topic => Self::Topic(Default::default()),
            ExchangeKind::Headers => Self::Headers(Default::default()),
        }
    }

    /// The kind of exchange this table belongs to.
    pub fn kind(&self) -> ExchangeKind {
        match self {
            Self::Direct(_) => ExchangeKind::Direct,
            Self::Fanout(_) => ExchangeKind::Fanout,
            Self::Topic(_) => ExchangeKind::Topic,
            Self::Headers(_) => ExchangeKind::Headers,
        }
    }

    /// Adds a binding; false if the same (key, args, dest) binding already
    /// exists (binding is idempotent in AMQP).
    pub fn bind(&mut self, key: &str, args: &FieldTable, dest: D) -> bool {
        match self {
            Self::Direct(t) => t.bind(key, args, dest),
            Self::Fanout(t) => t.bind(key, args, dest),
            Self::Topic(t) => t.bind(key, args, dest),
            Self::Headers(t) => t.bind(key, args, dest),
        }
    }

    /// Removes the binding equal to (key, args, dest); false if there was none.
    pub fn unbind(&mut self, key: &str, args: &FieldTable, dest: &D) -> bool {
        match self {
            Self::Direct(t) => t.unbind(key, args, dest),
            Self::Fanout(t) => t.unbind(key, args, dest),
            Self::Topic(t) => t.unbind(key, args, dest),
            Self::Headers(t) => t.unbind(key, args, dest),
        }
    }

    /// Removes every binding to dest (the destination was deleted); returns
    /// how many.
    pub fn unbind_all(&mut self, dest: &D) -> usize {
        match self {
            Self::Direct(t) => t.unbind_all(dest),
            Self::Fanout(t) => t.unbind_all(dest),
            Self::Topic(t) => t.unbind_all(dest),
            Self::Headers(t) => t.unbind_all(dest),
        }
    }

    /// Appends every destination the message matches to `out`, each
    /// destination at most once per call. `headers` is the message's headers
    /// table (None when the message has no headers property).
    pub fn route(&self, routing_key: &str, headers: Option<&FieldTable>, out: &mut Vec<D>) {
        match self {
            Self::Direct(t) => t.route(routing_key, out),
            Self::Fanout(t) => t.route(out),
            Self::Topic(t) => t.route(routing_key, out),
            Self::Headers(t) => t.route(headers, out),
        }
    }

    /// Number of bindings.
    pub fn len(&self) -> usize {
        match self {
            Self::Direct(t) => t.len(),
            Self::Fanout(t) => t.len(),
            Self::Topic(t) => t.len(),
            Self::Headers(t) => t.len(),
        }
    }

    /// True if there are no bindings.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every binding as (key, args, dest), for listing and for persisting
    /// definitions. The order is unspecified.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &FieldTable, &D)> + '_ {
        let it: Box<dyn Iterator<Item = (&str, &FieldTable, &D)> + '_> = match self {
            Self::Direct(t) => Box::new(t.iter()),
            Self::Fanout(t) => Box::new(t.iter()),
            Self::Topic(t) => Box::new(t.iter()),
            Self::Headers(t) => Box::new(t.iter()),
        };
        it
    }

    /// True if any binding points at dest (for exchange.delete if-unused and
    /// queue auto-delete checks).
    pub fn has_destination(&self, dest: &D) -> bool {
        match self {
            Self::Direct(t) => t.has_destination(dest),
            Self::Fanout(t) => t.has_destination(dest),
            Self::Topic(t) => t.has_destination(dest),
            Self::Headers(t) => t.has_destination(dest),
        }
    }
}

// ---------------------------------------------------------------------------
// Binding identity: argument tables compared as RabbitMQ compares stored
// binding records (same names, same types, same values).

/// How `value_eq` compares floating-point values.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Floats {
    /// Bit patterns: an equivalence relation (NaN equals itself), used for
    /// binding identity so every binding can be found again.
    Bitwise,
    /// IEEE equality, like Erlang's `==` (0.0 == -0.0), used for routing.
    Numeric,
}

/// True if two binding argument tables are the same arguments.
pub(crate) fn same_args(a: &FieldTable, b: &FieldTable) -> bool {
    tables_eq(a, b, Floats::Bitwise)
}

/// Typed equality of two tables: same names, and for each name the same
/// type and the same value.
pub(crate) fn tables_eq(a: &FieldTable, b: &FieldTable, floats: Floats) -> bool {
    let (a, b) = (a.inner(), b.inner());
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, va), (kb, vb))| ka == kb && value_eq(va, vb, floats))
}

/// Typed equality of two values, like Erlang `==` on RabbitMQ's `{Type,
/// Value}` pairs: the types must agree (short and long strings both count as
/// RabbitMQ's `longstr`), then the values must be equal.
pub(crate) fn value_eq(a: &AMQPValue, b: &AMQPValue, floats: Floats) -> bool {
    use AMQPValue as V;
    match (a, b) {
        (V::Boolean(x), V::Boolean(y)) => x == y,
        (V::ShortShortInt(x), V::ShortShortInt(y)) => x == y,
        (V::ShortShortUInt(x), V::ShortShortUInt(y)) => x == y,
        (V::ShortInt(x), V::ShortInt(y)) => x == y,
        (V::ShortUInt(x), V::ShortUInt(y)) => x == y,
        (V::LongInt(x), V::LongInt(y)) => x == y,
        (V::LongUInt(x), V::LongUInt(y)) => x == y,
        (V::LongLongInt(x), V::LongLongInt(y)) => x == y,
        (V::Timestamp(x), V::Timestamp(y)) => x == y,
        (V::Float(x), V::Float(y)) => match floats {
            Floats::Bitwise => x.to_bits() == y.to_bits(),
            Floats::Numeric => x == y,
        },
        (V::Double(x), V::Double(y)) => match floats {
            Floats::Bitwise => x.to_bits() == y.to_bits(),
            Floats::Numeric => x == y,
        },
        (V::DecimalValue(x), V::DecimalValue(y)) => x == y,
        (V::ByteArray(x), V::ByteArray(y)) => x == y,
        (V::FieldArray(x), V::FieldArray(y)) => {
            let (x, y) = (x.as_slice(), y.as_slice());
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| value_eq(p, q, floats))
        }
        (V::FieldTable(x), V::FieldTable(y)) => tables_eq(x, y, floats),
        (V::Void, V::Void) => true,
        _ => match (string_bytes(a), string_bytes(b)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
    }
}

pub(crate) use crate::wire::value::bytes as string_bytes;

// ---------------------------------------------------------------------------
// DestSet: bindings grouped by destination.

/// Above this many destinations a `DestSet` keeps a hash index; below it a
/// linear scan is cheaper and allocation-free.
const INDEX_MIN: usize = 16;

/// What an insert or remove on a `DestSet` changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing (duplicate insert, or nothing to remove).
    Nothing,
    /// A binding was added or removed; the destination's slot remains.
    Binding,
    /// A binding was added to a new slot, or removed with its slot.
    Destination,
}

/// One destination and the bindings (of type B) that lead to it.
#[derive(Clone, Debug)]
pub(crate) struct Slot<D, B> {
    pub(crate) dest: D,
    pub(crate) items: Vec<B>,
}

/// Bindings grouped by destination: each destination has one slot holding
/// its (non-empty) list of bindings, so routing through a set yields each
/// destination once.
#[derive(Clone, Debug)]
pub(crate) struct DestSet<D, B> {
    slots: Vec<Slot<D, B>>,
    /// dest -> index in `slots`; maintained only while
    /// `slots.len() > INDEX_MIN`, empty otherwise.
    index: HashMap<D, usize>,
    bindings: usize,
}

impl<D, B> Default for DestSet<D, B> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            index: HashMap::new(),
            bindings: 0,
        }
    }
}

impl<D: Clone + Eq + Hash, B> DestSet<D, B> {
    fn position(&self, dest: &D) -> Option<usize> {
        if self.slots.len() > INDEX_MIN {
            self.index.get(dest).copied()
        } else {
            self.slots.iter().position(|s| &s.dest == dest)
        }
    }

    /// Adds `item` as a binding to `dest`, unless `dest` already has a
    /// binding for which `same` holds.
    pub(crate) fn insert(&mut self, dest: D, item: B, same: impl Fn(&B) -> bool) -> Change {
        if let Some(i) = self.position(&dest) {
            let items = &mut self.slots[i].items;
            if items.iter().any(same) {
                return Change::Nothing;
            }
            items.push(item);
            self.bindings += 1;
            return Change::Binding;
        }
        self.slots.push(Slot {
            dest: dest.clone(),
            items: vec![item],
        });
        self.bindings += 1;
        let n = self.slots.len();
        if n == INDEX_MIN + 1 {
            self.index = self
                .slots
                .iter()
                .enumerate()
                .map(|(i, s)| (s.dest.clone(), i))
                .collect();
        } else if n > INDEX_MIN {
            self.index.insert(dest, n - 1);
        }
        Change::Destination
    }

    /// Removes the first binding to `dest` for which `same` holds.
    pub(crate) fn remove(&mut self, dest: &D, same: impl Fn(&B) -> bool) -> Change {
        let Some(i) = self.position(dest) else {
            return Change::Nothing;
        };
        let items = &mut self.slots[i].items;
        let Some(j) = items.iter().position(same) else {
            return Change::Nothing;
        };
        items.swap_remove(j);
        self.bindings -= 1;
        if !items.is_empty() {
            return Change::Binding;
        }
        self.remove_slot(i);
        Change::Destination
    }

    /// Removes every binding to `dest`; returns how many.
    pub(crate) fn remove_dest(&mut self, dest: &D) -> usize {
        match self.position(dest) {
            Some(i) => self.remove_slot(i),
            None => 0,
        }
    }

    fn remove_slot(&mut self, i: usize) -> usize {
        let indexed = self.slots.len() > INDEX_MIN;
        let slot = self.slots.swap_remove(i);
        if self.slots.len() <= INDEX_MIN {
            self.index = HashMap::new();
        } else if indexed {
            self.index.remove(&slot.dest);
            if let Some(moved) = self.slots.get(i) {
                self.index.insert(moved.dest.clone(), i);
            }
        }
        self.bindings -= slot.items.len();
        slot.items.len()
    }

    /// True if some binding leads to `dest`.
    pub(crate) fn contains(&self, dest: &D) -> bool {
        self.position(dest).is_some()
    }

    /// Appends every destination of the set to `out` (each once).
    pub(crate) fn push_dests(&self, out: &mut Vec<D>) {
        out.extend(self.slots.iter().map(|s| s.dest.clone()));
    }
}

impl<D, B> DestSet<D, B> {
    /// The slots, one per destination.
    pub(crate) fn slots(&self) -> &[Slot<D, B>] {
        &self.slots
    }

    /// Every binding with its destination.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&D, &B)> + '_ {
        self.slots
            .iter()
            .flat_map(|s| s.items.iter().map(move |b| (&s.dest, b)))
    }

    /// Number of bindings (not destinations).
    pub(crate) fn len(&self) -> usize {
        self.bindings
    }

    /// True if the set holds no binding.
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    //! Helpers shared by the exchange tests.
    use super::*;
    use amq_protocol::types::{LongString, ShortString};

    /// A table from (name, value) pairs.
    pub fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert(ShortString::from(*k), v.clone());
        }
        t
    }

    /// A long string value.
    pub fn s(v: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(v))
    }

    /// Routes and returns the destinations sorted.
    pub fn routed<D: Clone + Eq + Hash + Ord>(
        b: &Bindings<D>,
        key: &str,
        headers: Option<&FieldTable>,
    ) -> Vec<D> {
        let mut out = Vec::new();
        b.route(key, headers, &mut out);
        let n = out.len();
        out.sort();
        out.dedup();
        assert_eq!(n, out.len(), "duplicate destinations for {key:?}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;
    use amq_protocol::types::{FieldArray, LongString};

    const ALL: [ExchangeKind; 4] = [
        ExchangeKind::Direct,
        ExchangeKind::Fanout,
        ExchangeKind::Topic,
        ExchangeKind::Headers,
    ];

    #[test]
    fn kind_names_round_trip() {
        for k in ALL {
            assert_eq!(ExchangeKind::parse(k.as_str()), Some(k));
            assert_eq!(k.to_string(), k.as_str());
            assert_eq!(Bindings::<u32>::new(k).kind(), k);
        }
        for bad in ["", "Direct", "TOPIC", "x-consistent-hash", "fanout "] {
            assert_eq!(ExchangeKind::parse(bad), None);
        }
    }

    #[test]
    fn identity_and_bookkeeping_for_every_kind() {
        let a1 = table(&[("a", s("1"))]);
        let a2 = table(&[("a", s("2"))]);
        for k in ALL {
            let mut b = Bindings::new(k);
            assert!(b.is_empty());
            assert!(b.bind("k", &a1, 1u32));
            assert!(!b.bind("k", &a1, 1), "{k:?}: rebinding is a no-op");
            assert!(b.bind("k", &a2, 1), "{k:?}: args are part of identity");
            assert!(b.bind("k2", &a1, 1), "{k:?}: key is part of identity");
            assert!(b.bind("k", &a1, 2));
            assert_eq!(b.len(), 4);
            assert!(b.has_destination(&1) && b.has_destination(&2));
            assert!(!b.has_destination(&3));
            assert!(!b.unbind("k", &a1, &3));
            assert!(!b.unbind("other", &a1, &1));
            assert!(!b.unbind("k", &FieldTable::default(), &1));
            assert!(b.unbind("k", &a2, &1));
            assert!(!b.unbind("k", &a2, &1));
            assert_eq!(b.len(), 3);
            let mut listed: Vec<(String, u32)> =
                b.iter().map(|(k, _, d)| (k.to_owned(), *d)).collect();
            listed.sort();
            assert_eq!(
                listed,
                [("k".into(), 1), ("k".into(), 2), ("k2".into(), 1)],
                "{k:?}"
            );
            assert_eq!(b.unbind_all(&1), 2);
            assert_eq!(b.unbind_all(&1), 0);
            assert!(!b.has_destination(&1));
            assert_eq!(b.len(), 1);
            assert!(b.unbind("k", &a1, &2));
            assert!(b.is_empty());
            assert_eq!(b.iter().count(), 0);
        }
    }

    #[test]
    fn route_dispatch() {
        let none = FieldTable::default();
        let mut d = Bindings::new(ExchangeKind::Direct);
        d.bind("a", &none, 1u32);
        assert_eq!(routed(&d, "a", None), [1]);
        assert_eq!(routed(&d, "b", None), [] as [u32; 0]);
        let mut f = Bindings::new(ExchangeKind::Fanout);
        f.bind("a", &none, 1u32);
        assert_eq!(routed(&f, "zzz", None), [1]);
        let mut t = Bindings::new(ExchangeKind::Topic);
        t.bind("a.*", &none, 1u32);
        assert_eq!(routed(&t, "a.b", None), [1]);
        let mut h = Bindings::new(ExchangeKind::Headers);
        h.bind("", &table(&[("x", s("1"))]), 1u32);
        assert_eq!(routed(&h, "", Some(&table(&[("x", s("1"))]))), [1]);
        assert_eq!(routed(&h, "", None), [] as [u32; 0]);
    }

    #[test]
    fn route_appends_after_existing_output() {
        let mut f = Bindings::new(ExchangeKind::Fanout);
        f.bind("", &FieldTable::default(), 7u32);
        let mut out = vec![7];
        f.route("", None, &mut out);
        assert_eq!(out, [7, 7], "dedup is per call, earlier entries untouched");
    }

    #[test]
    fn nan_arguments_keep_a_stable_identity() {
        let nan = table(&[("f", AMQPValue::Double(f64::NAN))]);
        let mut b = Bindings::new(ExchangeKind::Direct);
        assert!(b.bind("k", &nan, 1u32));
        assert!(!b.bind("k", &nan, 1));
        assert!(b.unbind("k", &nan, &1));
    }

    #[test]
    fn argument_identity_is_typed() {
        use AMQPValue as V;
        let pairs = [
            (V::LongInt(1), V::LongLongInt(1), false),
            (V::LongInt(1), V::LongInt(1), true),
            (V::Double(0.0), V::Double(-0.0), false),
            (s("x"), V::ByteArray(b"x".to_vec().into()), false),
            (
                V::FieldArray(FieldArray::from(vec![s("a")])),
                V::FieldArray(FieldArray::from(vec![s("a")])),
                true,
            ),
            (
                V::FieldArray(FieldArray::from(vec![s("a")])),
                V::FieldArray(FieldArray::from(vec![s("a"), s("a")])),
                false,
            ),
            (
                V::FieldTable(table(&[("n", V::Boolean(true))])),
                V::FieldTable(table(&[("n", V::Boolean(true))])),
                true,
            ),
            (
                V::LongString(LongString::from("s")),
                V::ShortString("s".into()),
                true,
            ),
        ];
        for (a, b, eq) in pairs {
            let (ta, tb) = (table(&[("k", a.clone())]), table(&[("k", b.clone())]));
            assert_eq!(same_args(&ta, &tb), eq, "{a:?} vs {b:?}");
        }
        assert!(!same_args(
            &table(&[("a", s("1"))]),
            &table(&[("b", s("1"))])
        ));
        assert!(!same_args(&table(&[("a", s("1"))]), &FieldTable::default()));
    }

    #[test]
    fn dest_set_index_survives_growth_and_shrinkage() {
        let mut set: DestSet<u32, u32> = DestSet::default();
        for d in 0..100 {
            assert_eq!(set.insert(d, d, |&b| b == d), Change::Destination);
            assert_eq!(set.insert(d, d + 1000, |&b| b == d + 1000), Change::Binding);
            assert_eq!(set.insert(d, d, |&b| b == d), Change::Nothing);
        }
        assert_eq!(set.len(), 200);
        for d in (0..100).step_by(3) {
            assert_eq!(set.remove(&d, |&b| b == d), Change::Binding);
            assert_eq!(set.remove(&d, |&b| b == d), Change::Nothing);
            assert_eq!(set.remove(&d, |&b| b == d + 1000), Change::Destination);
        }
        for d in 0..100 {
            assert_eq!(set.contains(&d), d % 3 != 0, "dest {d}");
        }
        for d in 0..100 {
            let n = set.remove_dest(&d);
            assert_eq!(n, if d % 3 == 0 { 0 } else { 2 });
            for e in d + 1..100 {
                assert_eq!(set.contains(&e), e % 3 != 0);
            }
        }
        assert!(set.is_empty());
        assert_eq!(set.len(), 0);
    }
}
