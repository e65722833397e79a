//! The `x-consistent-hash` exchange type, compatible with RabbitMQ's
//! rabbitmq_consistent_hash_exchange: a binding's key is its weight (a
//! positive integer), and a message goes to one destination chosen by a
//! hash of its routing key, or of the header named by the `hash-header`
//! argument, or of the property named by `hash-property`. The same input
//! always lands on the same destination while the bindings stay the same.
//!
//! Each binding owns `weight` buckets; a message's hash picks a bucket with
//! jump consistent hashing (Lamping and Veach), so adding a binding moves
//! only the share of messages the new buckets take. The buckets are not
//! stored one by one: each binding keeps where its run of buckets ends,
//! and a bucket's owner is found by binary search, so a weight of
//! 1,000,000 costs what a weight of 1 does.

use warren_plugin_api::{
    AMQPValue, DestId, ExchangeType, FieldTable, MessageView, RoutingTable, Table,
};

/// The exchange type.
pub struct ConsistentHash;

/// What a message is hashed by.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HashOn {
    RoutingKey,
    Header(String),
    Property(String),
}

const PROPERTIES: &[&str] = &[
    "message_id",
    "correlation_id",
    "timestamp",
    "app_id",
    "user_id",
    "type",
    "reply_to",
    "content_type",
    "content_encoding",
    "priority",
    "delivery_mode",
    "expiration",
    "cluster_id",
];

use warren_plugin_api::value::text;

fn hash_on(args: &FieldTable) -> Result<HashOn, String> {
    let header = args
        .inner()
        .get("hash-header")
        .map(|v| text(v).ok_or("hash-header must be a string"));
    let property = args
        .inner()
        .get("hash-property")
        .map(|v| text(v).ok_or("hash-property must be a string"));
    match (header, property) {
        (Some(_), Some(_)) => Err("hash-header and hash-property are mutually exclusive".into()),
        (Some(h), None) => Ok(HashOn::Header(h?)),
        (None, Some(p)) => {
            let p = p?;
            if PROPERTIES.contains(&p.as_str()) {
                Ok(HashOn::Property(p))
            } else {
                Err(format!("unsupported hash-property '{p}'"))
            }
        }
        (None, None) => Ok(HashOn::RoutingKey),
    }
}

impl ExchangeType for ConsistentHash {
    fn name(&self) -> &'static str {
        "x-consistent-hash"
    }

    fn validate(&self, arguments: &FieldTable) -> Result<(), String> {
        hash_on(arguments).map(|_| ())
    }

    fn new_table(&self, arguments: &FieldTable) -> Table {
        Table::Custom(Box::new(Ring {
            hash_on: hash_on(arguments).unwrap_or(HashOn::RoutingKey),
            bindings: Vec::new(),
            runs: Vec::new(),
        }))
    }
}

/// The bindings of one exchange and the buckets they own.
struct Ring {
    hash_on: HashOn,
    bindings: Vec<(String, FieldTable, DestId)>,
    /// Per binding, in binding order: where its run of buckets ends (the
    /// sum of the weights up to and including it) and its destination.
    runs: Vec<(u64, DestId)>,
}

impl Ring {
    fn rebuild(&mut self) {
        self.runs.clear();
        let mut end = 0u64;
        for (key, _, dest) in &self.bindings {
            end += key.trim().parse::<u32>().unwrap_or(0) as u64;
            self.runs.push((end, *dest));
        }
    }

    /// How many buckets there are (the sum of the weights).
    fn buckets(&self) -> u64 {
        self.runs.last().map_or(0, |&(end, _)| end)
    }

    /// The destination owning bucket `b`.
    fn owner(&self, b: u64) -> Option<DestId> {
        let i = self.runs.partition_point(|&(end, _)| end <= b);
        self.runs.get(i).map(|&(_, d)| d)
    }

    fn input(&self, msg: &MessageView<'_>) -> Option<String> {
        match &self.hash_on {
            HashOn::RoutingKey => Some(msg.routing_key.to_string()),
            HashOn::Header(h) => msg.headers?.inner().get(h.as_str()).map(value_text),
            HashOn::Property(p) => property(msg, p),
        }
    }
}

fn value_text(v: &AMQPValue) -> String {
    text(v).unwrap_or_else(|| format!("{v:?}"))
}

fn property(msg: &MessageView<'_>, name: &str) -> Option<String> {
    let p = msg.properties();
    let s = |v: &Option<warren_plugin_api::ShortString>| v.as_ref().map(|s| s.as_str().to_string());
    match name {
        "message_id" => s(p.message_id()),
        "correlation_id" => s(p.correlation_id()),
        "app_id" => s(p.app_id()),
        "user_id" => s(p.user_id()),
        "type" => s(p.kind()),
        "reply_to" => s(p.reply_to()),
        "content_type" => s(p.content_type()),
        "content_encoding" => s(p.content_encoding()),
        "expiration" => s(p.expiration()),
        "cluster_id" => s(p.cluster_id()),
        "timestamp" => p.timestamp().map(|t| t.to_string()),
        "priority" => p.priority().map(|v| v.to_string()),
        "delivery_mode" => p.delivery_mode().map(|v| v.to_string()),
        _ => None,
    }
}

/// FNV-1a, 64-bit: stable across runs and platforms.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Jump consistent hash: a bucket in 0..n for `key`.
fn jump(mut key: u64, n: u64) -> u64 {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < n as i64 {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b.max(0) as u64
}

impl RoutingTable for Ring {
    fn bind(&mut self, key: &str, arguments: &FieldTable, dest: DestId) -> Result<bool, String> {
        match key.trim().parse::<i64>() {
            Ok(w) if w > 0 && w <= 1_000_000 => {}
            Ok(_) => return Err("the binding key (weight) must be greater than 0".into()),
            Err(_) => {
                return Err(format!(
                    "the binding key (weight) must be an integer, got '{key}'"
                ))
            }
        }
        if self
            .bindings
            .iter()
            .any(|(k, a, d)| k == key && a == arguments && *d == dest)
        {
            return Ok(false);
        }
        self.bindings
            .push((key.to_string(), arguments.clone(), dest));
        self.rebuild();
        Ok(true)
    }

    fn unbind(&mut self, key: &str, arguments: &FieldTable, dest: DestId) -> bool {
        let before = self.bindings.len();
        self.bindings
            .retain(|(k, a, d)| !(k == key && a == arguments && *d == dest));
        let removed = self.bindings.len() != before;
        if removed {
            self.rebuild();
        }
        removed
    }

    fn unbind_all(&mut self, dest: DestId) -> usize {
        let before = self.bindings.len();
        self.bindings.retain(|(_, _, d)| *d != dest);
        let n = before - self.bindings.len();
        if n > 0 {
            self.rebuild();
        }
        n
    }

    fn route(&self, msg: &MessageView<'_>, out: &mut Vec<DestId>) {
        let n = self.buckets();
        if n == 0 {
            return;
        }
        // No header / property to hash: RabbitMQ routes such a message nowhere.
        let Some(input) = self.input(msg) else { return };
        if let Some(d) = self.owner(jump(fnv1a(input.as_bytes()), n)) {
            out.push(d);
        }
    }

    fn bindings(&self) -> Vec<(String, FieldTable, DestId)> {
        self.bindings.clone()
    }

    fn len(&self) -> usize {
        self.bindings.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(key: &str) -> MessageView<'_> {
        MessageView {
            routing_key: key,
            headers: None,
            raw_properties: &[0, 0],
        }
    }

    fn custom(t: Table) -> Box<dyn RoutingTable> {
        match t {
            Table::Custom(t) => t,
            Table::Builtin(_) => panic!("a custom table"),
        }
    }

    fn ring(weights: &[&str]) -> Box<dyn RoutingTable> {
        let mut t = custom(ConsistentHash.new_table(&FieldTable::default()));
        for (i, w) in weights.iter().enumerate() {
            assert_eq!(
                t.bind(w, &FieldTable::default(), DestId(i as u64)),
                Ok(true)
            );
        }
        t
    }

    #[test]
    fn even_across_equal_weights_and_stable() {
        let t = ring(&["1", "1", "1", "1"]);
        let mut counts = [0usize; 4];
        for i in 0..100_000u32 {
            let key = format!("key-{}", i.wrapping_mul(2_654_435_761));
            let mut out = Vec::new();
            t.route(&view(&key), &mut out);
            assert_eq!(out.len(), 1);
            counts[out[0].0 as usize] += 1;
            let mut again = Vec::new();
            t.route(&view(&key), &mut again);
            assert_eq!(out, again, "same key, same destination");
        }
        for c in counts {
            assert!((22_500..=27_500).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn weights_skew_the_share() {
        let t = ring(&["1", "3"]);
        let mut heavy = 0;
        for i in 0..40_000u32 {
            let mut out = Vec::new();
            t.route(&view(&i.to_string()), &mut out);
            heavy += (out[0] == DestId(1)) as usize;
        }
        assert!((28_000..=32_000).contains(&heavy), "{heavy}");
    }

    #[test]
    fn a_huge_weight_costs_no_memory_and_keeps_its_share() {
        let mut t = Ring {
            hash_on: HashOn::RoutingKey,
            bindings: Vec::new(),
            runs: Vec::new(),
        };
        t.bind("1000000", &FieldTable::default(), DestId(0))
            .unwrap();
        t.bind("1000000", &FieldTable::default(), DestId(1))
            .unwrap();
        assert_eq!(t.runs.len(), 2);
        assert_eq!(t.buckets(), 2_000_000);
        let mut counts = [0usize; 2];
        for i in 0..20_000u32 {
            let mut out = Vec::new();
            t.route(&view(&format!("k{i}")), &mut out);
            counts[out[0].0 as usize] += 1;
        }
        assert!((9_000..=11_000).contains(&counts[0]), "{counts:?}");
        // The owner of each bucket is the binding whose run covers it.
        assert_eq!(t.owner(0), Some(DestId(0)));
        assert_eq!(t.owner(999_999), Some(DestId(0)));
        assert_eq!(t.owner(1_000_000), Some(DestId(1)));
        assert_eq!(t.owner(2_000_000), None);
    }

    #[test]
    fn keys_must_be_positive_integers() {
        let mut t = custom(ConsistentHash.new_table(&FieldTable::default()));
        assert!(t.bind("zero", &FieldTable::default(), DestId(1)).is_err());
        assert!(t.bind("0", &FieldTable::default(), DestId(1)).is_err());
        assert_eq!(t.bind("2", &FieldTable::default(), DestId(1)), Ok(true));
        assert_eq!(t.bind("2", &FieldTable::default(), DestId(1)), Ok(false));
        assert_eq!(t.unbind_all(DestId(1)), 1);
        assert!(t.is_empty());
    }

    #[test]
    fn header_and_property_arguments() {
        let mut args = FieldTable::default();
        args.insert("hash-header".into(), AMQPValue::LongString("h".into()));
        assert!(ConsistentHash.validate(&args).is_ok());
        args.insert(
            "hash-property".into(),
            AMQPValue::LongString("message_id".into()),
        );
        assert!(ConsistentHash.validate(&args).is_err());
        let mut bad = FieldTable::default();
        bad.insert("hash-property".into(), AMQPValue::LongString("nope".into()));
        assert!(ConsistentHash.validate(&bad).is_err());
    }
}
