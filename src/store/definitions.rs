//! Durable definitions: exchanges, queues and bindings (vhosts are in
//! tenancy.rs), one sled
//! record each, serde-encoded (JSON). Keys sort by kind, then vhost, then
//! name, so a prefix scan lists one kind.
//!
//! Arguments are stored as their AMQP field-table encoding (hex in the
//! JSON), which represents every field value exactly: NaN and infinite
//! floats, nesting as deep as the wire allows (JSON held neither: such a
//! queue used to be written in a form that failed to parse at restart, and
//! it and its messages vanished). A record is read back before it is
//! written, and one that cannot be read at start stops the start, naming
//! it, rather than being skipped.

use amq_protocol::types::FieldTable;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::{Error, Result, Store};

/// A durable exchange.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExchangeDef {
    pub vhost: String,
    pub name: String,
    pub kind: String,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    #[serde(with = "args")]
    pub arguments: FieldTable,
}

/// A durable queue; `id` prefixes its messages' keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueDef {
    pub vhost: String,
    pub name: String,
    pub id: u64,
    pub auto_delete: bool,
    #[serde(with = "args")]
    pub arguments: FieldTable,
}

/// A binding between durable entities.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BindingDef {
    pub vhost: String,
    pub source: String,
    pub destination: String,
    pub to_exchange: bool,
    pub routing_key: String,
    #[serde(with = "args")]
    pub arguments: FieldTable,
}

/// Arguments as the hex of their AMQP encoding; records written before
/// (serde's own form of the table) are still read.
mod args {
    use amq_protocol::types::FieldTable;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::wire::table;

    pub fn serialize<S: Serializer>(t: &FieldTable, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::hex(&table::encode_table(t)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FieldTable, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Encoded(String),
            Legacy(FieldTable),
        }
        match Repr::deserialize(d)? {
            Repr::Encoded(h) => super::unhex(&h)
                .and_then(|bytes| table::decode_table(&bytes))
                .ok_or_else(|| {
                    serde::de::Error::custom("arguments are not an encoded field table")
                }),
            Repr::Legacy(t) => Ok(t),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

pub(super) const EXCHANGE: &str = "x";
pub(super) const QUEUE: &str = "q";
pub(super) const BINDING: &str = "b";
const NEXT_QUEUE_ID: &[u8] = b"meta\0next_queue_id";

pub(super) fn key(kind: &str, parts: &[&str]) -> Vec<u8> {
    let mut k = kind.as_bytes().to_vec();
    for p in parts {
        k.push(0);
        k.extend_from_slice(p.as_bytes());
    }
    k
}

impl BindingDef {
    fn key(&self) -> Vec<u8> {
        self.key_with(&hex(&crate::wire::table::encode_table(&self.arguments)))
    }

    /// The key older versions used (serde's JSON of the arguments).
    fn legacy_key(&self) -> Vec<u8> {
        self.key_with(&serde_json::to_string(&self.arguments).unwrap_or_default())
    }

    fn key_with(&self, args: &str) -> Vec<u8> {
        let kind = if self.to_exchange { "e" } else { "q" };
        key(
            BINDING,
            &[
                &self.vhost,
                &self.source,
                kind,
                &self.destination,
                &self.routing_key,
                args,
            ],
        )
    }
}

/// Writes a definition, once it is known to read back as itself.
pub(super) fn put_def<T: Serialize + DeserializeOwned>(
    tree: &sled::Tree,
    k: Vec<u8>,
    v: &T,
) -> Result<()> {
    let bytes = serde_json::to_vec(v).map_err(|e| Error::Corrupt(e.to_string()))?;
    let back = serde_json::from_slice::<T>(&bytes)
        .ok()
        .and_then(|t| serde_json::to_vec(&t).ok());
    if back.as_deref() != Some(&bytes[..]) {
        return Err(Error::Corrupt(format!(
            "definition {} would not read back",
            String::from_utf8_lossy(&k)
        )));
    }
    tree.insert(k, bytes)?;
    Ok(())
}

/// Records (or replaces) a durable exchange.
pub(super) fn put_exchange(tree: &sled::Tree, def: &ExchangeDef) -> Result<()> {
    put_def(tree, key(EXCHANGE, &[&def.vhost, &def.name]), def)
}

/// Forgets an exchange.
pub(super) fn delete_exchange(tree: &sled::Tree, vhost: &str, name: &str) -> Result<()> {
    tree.remove(key(EXCHANGE, &[vhost, name]))?;
    Ok(())
}

/// Forgets a queue's definition.
pub(super) fn delete_queue(tree: &sled::Tree, vhost: &str, name: &str) -> Result<()> {
    tree.remove(key(QUEUE, &[vhost, name]))?;
    Ok(())
}

/// Records a binding.
pub(super) fn put_binding(tree: &sled::Tree, def: &BindingDef) -> Result<()> {
    put_def(tree, def.key(), def)
}

/// Forgets a binding (under its key and the key older versions used).
pub(super) fn delete_binding(tree: &sled::Tree, def: &BindingDef) -> Result<()> {
    tree.remove(def.key())?;
    tree.remove(def.legacy_key())?;
    Ok(())
}

/// Records a durable queue under the next id (replacing a record of the
/// same name that a failed delete left: its messages, under the old id,
/// are swept at the next start).
/// The last durable queue id given.
pub(super) fn last_queue_id(tree: &sled::Tree) -> Result<u64> {
    match tree.get(NEXT_QUEUE_ID)? {
        Some(b) => <[u8; 8]>::try_from(&b[..])
            .map(u64::from_be_bytes)
            .map_err(|_| Error::Corrupt("queue id counter".into())),
        None => Ok(0),
    }
}

pub(super) fn declare_queue(tree: &sled::Tree, def: &QueueDef) -> Result<u64> {
    let k = key(QUEUE, &[&def.vhost, &def.name]);
    let n = last_queue_id(tree)?;
    // A journal that applies on commit chose the id when it shipped the
    // operation (store/raft); applying it again changes nothing.
    let id = if def.id != 0 { def.id } else { n + 1 };
    tree.insert(NEXT_QUEUE_ID, &id.max(n).to_be_bytes())?;
    put_def(tree, k, &QueueDef { id, ..def.clone() })?;
    Ok(id)
}

/// Every definition of `kind` in `tree`.
fn scan<T: DeserializeOwned>(tree: &sled::Tree, kind: &str) -> Result<Vec<T>> {
    let mut prefix = kind.as_bytes().to_vec();
    prefix.push(0);
    let mut out = Vec::new();
    for item in tree.scan_prefix(prefix) {
        let (k, v) = item?;
        // Never skipped: a lost queue definition would lose its messages.
        let def = serde_json::from_slice(&v).map_err(|e| {
            Error::Corrupt(format!(
                "definition {:?} cannot be read: {e}",
                String::from_utf8_lossy(&k)
            ))
        })?;
        out.push(def);
    }
    Ok(out)
}

/// The ids of every durable queue defined in `tree`.
pub(super) fn queue_ids(tree: &sled::Tree) -> Result<std::collections::HashSet<u64>> {
    let defs: Vec<QueueDef> = scan(tree, QUEUE)?;
    Ok(defs.into_iter().map(|d| d.id).collect())
}

impl Store {
    pub(super) fn scan_defs<T: DeserializeOwned>(&self, kind: &str) -> Result<Vec<T>> {
        scan(&self.defs, kind)
    }

    /// Every durable exchange.
    pub fn exchanges(&self) -> Result<Vec<ExchangeDef>> {
        self.scan_defs(EXCHANGE)
    }

    /// Every durable queue.
    pub fn queues(&self) -> Result<Vec<QueueDef>> {
        self.scan_defs(QUEUE)
    }

    /// The durable queue `name` of `vhost`, if there is one.
    pub fn queue_def(&self, vhost: &str, name: &str) -> Result<Option<QueueDef>> {
        let Some(v) = self.defs.get(key(QUEUE, &[vhost, name]))? else {
            return Ok(None);
        };
        serde_json::from_slice(&v)
            .map(Some)
            .map_err(|e| Error::Corrupt(format!("queue {name:?} cannot be read: {e}")))
    }

    /// Every durable binding.
    pub fn bindings(&self) -> Result<Vec<BindingDef>> {
        self.scan_defs(BINDING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_round_trip() {
        let s = Store::temporary().unwrap();
        s.put_vhost(&super::super::VhostDef {
            name: "/".into(),
            ..Default::default()
        })
        .unwrap();
        let x = ExchangeDef {
            vhost: "/".into(),
            name: "x".into(),
            kind: "topic".into(),
            durable: true,
            auto_delete: false,
            internal: false,
            arguments: FieldTable::default(),
        };
        s.put_exchange(&x).unwrap();
        let mut q = QueueDef {
            vhost: "/".into(),
            name: "q".into(),
            id: 0,
            auto_delete: false,
            arguments: FieldTable::default(),
        };
        let id = s.declare_queue(&q).unwrap();
        q.id = id;
        let b = BindingDef {
            vhost: "/".into(),
            source: "x".into(),
            destination: "q".into(),
            to_exchange: false,
            routing_key: "a.#".into(),
            arguments: FieldTable::default(),
        };
        s.put_binding(&b).unwrap();
        assert_eq!(s.vhosts().unwrap()[0].name, "/");
        assert_eq!(s.exchanges().unwrap(), vec![x]);
        assert_eq!(s.queues().unwrap(), vec![q.clone()]);
        assert_eq!(s.bindings().unwrap(), vec![b.clone()]);
        s.delete_binding(&b).unwrap();
        s.delete_queue("/", "q", id).unwrap();
        assert!(s.bindings().unwrap().is_empty());
        assert!(s.queues().unwrap().is_empty());
        assert_eq!(s.declare_queue(&q).unwrap(), id + 1, "ids are never reused");
        // A record a failed delete left behind is replaced, under a new id.
        assert_eq!(s.declare_queue(&q).unwrap(), id + 2);
        assert_eq!(s.queues().unwrap()[0].id, id + 2);
    }

    #[test]
    fn every_argument_value_round_trips() {
        use amq_protocol::types::AMQPValue;
        let s = Store::temporary().unwrap();
        // 64 levels with `args` itself, the most the wire takes.
        let mut deep = FieldTable::default();
        for _ in 0..62 {
            let mut outer = FieldTable::default();
            outer.insert("k".into(), AMQPValue::FieldTable(deep));
            deep = outer;
        }
        let mut args = FieldTable::default();
        args.insert("nan".into(), AMQPValue::Double(f64::NAN));
        args.insert("inf".into(), AMQPValue::Float(f32::INFINITY));
        args.insert("deep".into(), AMQPValue::FieldTable(deep));
        let q = QueueDef {
            vhost: "/".into(),
            name: "odd".into(),
            id: 1,
            auto_delete: false,
            arguments: args.clone(),
        };
        s.declare_queue(&q).unwrap();
        let back = s.queues().unwrap();
        let enc = crate::wire::table::encode_table;
        assert_eq!(enc(&back[0].arguments), enc(&args));
    }

    #[test]
    fn an_unreadable_definition_stops_the_scan() {
        let s = Store::temporary().unwrap();
        s.defs
            .insert(key(QUEUE, &["/", "broken"]), &b"{not json"[..])
            .unwrap();
        let e = s.queues().unwrap_err().to_string();
        assert!(e.contains("broken"), "{e}");
    }

    #[test]
    fn legacy_records_are_read() {
        let s = Store::temporary().unwrap();
        let legacy = br#"{"vhost":"/","name":"old","id":3,"auto_delete":false,"arguments":{}}"#;
        s.defs
            .insert(key(QUEUE, &["/", "old"]), &legacy[..])
            .unwrap();
        assert_eq!(s.queues().unwrap()[0].name, "old");
    }
}
