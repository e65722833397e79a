//! Durable definitions: vhosts, exchanges, queues and bindings, one sled
//! record each, serde-encoded. Keys sort by kind, then vhost, then name, so a
//! prefix scan lists one kind.

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
    pub arguments: FieldTable,
}

/// A durable queue; `id` prefixes its messages' keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueDef {
    pub vhost: String,
    pub name: String,
    pub id: u64,
    pub auto_delete: bool,
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
    pub arguments: FieldTable,
}

const VHOST: &str = "v";
const EXCHANGE: &str = "x";
const QUEUE: &str = "q";
const BINDING: &str = "b";
const NEXT_QUEUE_ID: &[u8] = b"meta\0next_queue_id";

fn key(kind: &str, parts: &[&str]) -> Vec<u8> {
    let mut k = kind.as_bytes().to_vec();
    for p in parts {
        k.push(0);
        k.extend_from_slice(p.as_bytes());
    }
    k
}

impl BindingDef {
    fn key(&self) -> Vec<u8> {
        let args = serde_json::to_string(&self.arguments).unwrap_or_default();
        let kind = if self.to_exchange { "e" } else { "q" };
        key(
            BINDING,
            &[
                &self.vhost,
                &self.source,
                kind,
                &self.destination,
                &self.routing_key,
                &args,
            ],
        )
    }
}

impl Store {
    fn put_def<T: Serialize>(&self, k: Vec<u8>, v: &T) -> Result<()> {
        let bytes = serde_json::to_vec(v).map_err(|e| Error::Corrupt(e.to_string()))?;
        self.defs.insert(k, bytes)?;
        self.defs_changed();
        Ok(())
    }

    fn scan_defs<T: DeserializeOwned>(&self, kind: &str) -> Result<Vec<T>> {
        let mut prefix = kind.as_bytes().to_vec();
        prefix.push(0);
        let mut out = Vec::new();
        for item in self.defs.scan_prefix(prefix) {
            let (k, v) = item?;
            // One unreadable record must not keep the broker from starting.
            match serde_json::from_slice(&v) {
                Ok(def) => out.push(def),
                Err(e) => {
                    tracing::error!(key = ?String::from_utf8_lossy(&k), "skipping unreadable definition: {e}")
                }
            }
        }
        Ok(out)
    }

    /// Records a vhost.
    pub fn put_vhost(&self, name: &str) -> Result<()> {
        self.put_def(key(VHOST, &[name]), &name)
    }
    /// Every recorded vhost.
    pub fn vhosts(&self) -> Result<Vec<String>> {
        self.scan_defs(VHOST)
    }

    /// Records a durable exchange.
    pub fn put_exchange(&self, def: &ExchangeDef) -> Result<()> {
        self.put_def(key(EXCHANGE, &[&def.vhost, &def.name]), def)
    }
    /// Forgets an exchange.
    pub fn delete_exchange(&self, vhost: &str, name: &str) -> Result<()> {
        self.defs.remove(key(EXCHANGE, &[vhost, name]))?;
        self.defs_changed();
        Ok(())
    }
    /// Every durable exchange.
    pub fn exchanges(&self) -> Result<Vec<ExchangeDef>> {
        self.scan_defs(EXCHANGE)
    }

    /// Records a durable queue.
    pub fn put_queue(&self, def: &QueueDef) -> Result<()> {
        self.put_def(key(QUEUE, &[&def.vhost, &def.name]), def)
    }
    /// Forgets a queue and deletes its messages.
    pub fn delete_queue(&self, vhost: &str, name: &str, id: u64) -> Result<()> {
        self.defs.remove(key(QUEUE, &[vhost, name]))?;
        self.defs_changed();
        self.marks.forget(&self.defs, id)?;
        self.purge_messages(id)?;
        Ok(())
    }
    /// Every durable queue.
    pub fn queues(&self) -> Result<Vec<QueueDef>> {
        self.scan_defs(QUEUE)
    }
    /// A fresh queue id, never reused.
    pub fn next_queue_id(&self) -> Result<u64> {
        let next = self.defs.update_and_fetch(NEXT_QUEUE_ID, |old| {
            let n = old
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            Some((n + 1).to_be_bytes().to_vec())
        })?;
        next.and_then(|b| <[u8; 8]>::try_from(&b[..]).ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| Error::Corrupt("queue id counter".into()))
    }

    /// Records a binding.
    pub fn put_binding(&self, def: &BindingDef) -> Result<()> {
        self.put_def(def.key(), def)
    }
    /// Forgets a binding.
    pub fn delete_binding(&self, def: &BindingDef) -> Result<()> {
        self.defs.remove(def.key())?;
        self.defs_changed();
        Ok(())
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
        s.put_vhost("/").unwrap();
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
        let id = s.next_queue_id().unwrap();
        assert_eq!(s.next_queue_id().unwrap(), id + 1);
        let q = QueueDef {
            vhost: "/".into(),
            name: "q".into(),
            id,
            auto_delete: false,
            arguments: FieldTable::default(),
        };
        s.put_queue(&q).unwrap();
        let b = BindingDef {
            vhost: "/".into(),
            source: "x".into(),
            destination: "q".into(),
            to_exchange: false,
            routing_key: "a.#".into(),
            arguments: FieldTable::default(),
        };
        s.put_binding(&b).unwrap();
        assert_eq!(s.vhosts().unwrap(), vec!["/".to_string()]);
        assert_eq!(s.exchanges().unwrap(), vec![x]);
        assert_eq!(s.queues().unwrap(), vec![q.clone()]);
        assert_eq!(s.bindings().unwrap(), vec![b.clone()]);
        s.delete_binding(&b).unwrap();
        s.delete_queue("/", "q", id).unwrap();
        assert!(s.bindings().unwrap().is_empty());
        assert!(s.queues().unwrap().is_empty());
    }
}
