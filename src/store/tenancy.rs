//! Durable vhosts and runtime parameters. A vhost record holds what
//! RabbitMQ shows of it (description, tags, default queue type).
//! Parameters are RabbitMQ's model for everything else an operator sets per
//! vhost: a component ("policy", "operator_policy", "vhost-limits", or one
//! a plugin owns), a name and a JSON value; global parameters have a name
//! and a value. Deleting a vhost removes every record under it in one
//! operation.

use serde::{Deserialize, Serialize};

use super::definitions::{key, put_def, BINDING, EXCHANGE, QUEUE};
use super::{access, Error, Result, Store};

/// A vhost.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct VhostDef {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
    /// "classic" unless set otherwise ("" in records from before it was kept).
    #[serde(default)]
    pub default_queue_type: String,
}

/// A runtime parameter of one vhost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParameterDef {
    pub vhost: String,
    pub component: String,
    pub name: String,
    pub value: serde_json::Value,
}

/// A node-wide parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GlobalParameterDef {
    pub name: String,
    pub value: serde_json::Value,
}

pub(super) const VHOST: &str = "v";
const PARAMETER: &str = "r";
const GLOBAL: &str = "g";

/// Applies `Op::PutVhost`.
pub(super) fn put_vhost(tree: &sled::Tree, def: &VhostDef) -> Result<()> {
    put_def(tree, key(VHOST, &[&def.name]), def)
}

/// The ids of vhost `name`'s durable queues.
pub(super) fn queue_ids(tree: &sled::Tree, name: &str) -> Result<Vec<u64>> {
    let mut prefix = key(QUEUE, &[name]);
    prefix.push(0);
    let mut ids = Vec::new();
    for item in tree.scan_prefix(prefix) {
        let (k, v) = item?;
        let def: super::QueueDef = serde_json::from_slice(&v)
            .map_err(|e| Error::Corrupt(format!("queue {:?}: {e}", String::from_utf8_lossy(&k))))?;
        ids.push(def.id);
    }
    Ok(ids)
}

/// Applies `Op::DeleteVhost`: the vhost and everything recorded under it.
/// Returns the ids of its durable queues, whose messages the caller
/// deletes.
pub(super) fn delete_vhost(tree: &sled::Tree, name: &str) -> Result<Vec<u64>> {
    let queue_ids = queue_ids(tree, name)?;
    let mut batch = sled::Batch::default();
    batch.remove(key(VHOST, &[name]));
    for kind in [
        EXCHANGE,
        QUEUE,
        BINDING,
        access::PERMISSION,
        access::TOPIC_PERMISSION,
        PARAMETER,
    ] {
        let mut prefix = key(kind, &[name]);
        prefix.push(0);
        for item in tree.scan_prefix(prefix) {
            batch.remove(item?.0);
        }
    }
    tree.apply_batch(batch)?;
    Ok(queue_ids)
}

/// Applies `Op::PutParameter`.
pub(super) fn put_parameter(tree: &sled::Tree, def: &ParameterDef) -> Result<()> {
    put_def(
        tree,
        key(PARAMETER, &[&def.vhost, &def.component, &def.name]),
        def,
    )
}

/// Applies `Op::DeleteParameter`.
pub(super) fn delete_parameter(
    tree: &sled::Tree,
    vhost: &str,
    component: &str,
    name: &str,
) -> Result<()> {
    tree.remove(key(PARAMETER, &[vhost, component, name]))?;
    Ok(())
}

/// Applies `Op::PutGlobalParameter`.
pub(super) fn put_global(tree: &sled::Tree, def: &GlobalParameterDef) -> Result<()> {
    put_def(tree, key(GLOBAL, &[&def.name]), def)
}

/// Applies `Op::DeleteGlobalParameter`.
pub(super) fn delete_global(tree: &sled::Tree, name: &str) -> Result<()> {
    tree.remove(key(GLOBAL, &[name]))?;
    Ok(())
}

/// A vhost record: today's, or the bare name older versions wrote.
#[derive(Deserialize)]
#[serde(untagged)]
enum VhostRecord {
    Def(VhostDef),
    Name(String),
}

impl Store {
    /// Every recorded vhost.
    pub fn vhosts(&self) -> Result<Vec<VhostDef>> {
        Ok(self
            .scan_defs::<VhostRecord>(VHOST)?
            .into_iter()
            .map(|r| match r {
                VhostRecord::Def(d) => d,
                VhostRecord::Name(name) => VhostDef {
                    name,
                    ..VhostDef::default()
                },
            })
            .collect())
    }

    /// Every vhost's parameters.
    pub fn parameters(&self) -> Result<Vec<ParameterDef>> {
        self.scan_defs(PARAMETER)
    }

    /// Every global parameter.
    pub fn global_parameters(&self) -> Result<Vec<GlobalParameterDef>> {
        self.scan_defs(GLOBAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ExchangeDef, PermissionDef, QueueDef};
    use amq_protocol::types::FieldTable;

    #[test]
    fn deleting_a_vhost_removes_everything_under_it_and_nothing_else() {
        let s = Store::temporary().unwrap();
        for name in ["a", "ab"] {
            s.put_vhost(&VhostDef {
                name: name.into(),
                description: "d".into(),
                tags: vec!["t".into()],
                default_queue_type: "classic".into(),
            })
            .unwrap();
            s.put_exchange(&ExchangeDef {
                vhost: name.into(),
                name: "x".into(),
                kind: "direct".into(),
                durable: true,
                auto_delete: false,
                internal: false,
                arguments: FieldTable::default(),
            })
            .unwrap();
            s.declare_queue(&QueueDef {
                vhost: name.into(),
                name: "q".into(),
                id: 0,
                auto_delete: false,
                arguments: FieldTable::default(),
            })
            .unwrap();
            s.put_permission(&PermissionDef {
                user: "guest".into(),
                vhost: name.into(),
                configure: ".*".into(),
                write: ".*".into(),
                read: ".*".into(),
            })
            .unwrap();
            s.put_parameter(&ParameterDef {
                vhost: name.into(),
                component: "vhost-limits".into(),
                name: "limits".into(),
                value: serde_json::json!({"max-queues": 3}),
            })
            .unwrap();
        }
        s.put_global_parameter(&GlobalParameterDef {
            name: "cluster_name".into(),
            value: serde_json::json!("warren"),
        })
        .unwrap();
        s.delete_vhost("a").unwrap();
        let names = |v: Vec<String>| v;
        assert_eq!(
            names(s.vhosts().unwrap().into_iter().map(|v| v.name).collect()),
            vec!["ab".to_string()]
        );
        assert!(s.exchanges().unwrap().iter().all(|x| x.vhost == "ab"));
        assert_eq!(s.queues().unwrap().len(), 1);
        assert_eq!(s.permissions().unwrap().len(), 1);
        assert_eq!(s.parameters().unwrap()[0].vhost, "ab");
        assert_eq!(s.global_parameters().unwrap().len(), 1);
    }

    #[test]
    fn a_vhost_recorded_by_name_alone_is_read() {
        let s = Store::temporary().unwrap();
        s.defs
            .insert(key(VHOST, &["old"]), &br#""old""#[..])
            .unwrap();
        let v = s.vhosts().unwrap();
        assert_eq!(v[0].name, "old");
        assert_eq!(v[0].description, "");
    }
}
