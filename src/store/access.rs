//! Durable users, permissions and topic permissions: one definitions record each, JSON, as
//! RabbitMQ's definitions files name the fields. Users key by name,
//! permissions by vhost then user, topic permissions
//! by vhost, user and exchange. A marker says the default user was
//! created once, so a node whose users were all deleted stays that way.

use serde::{Deserialize, Serialize};

use super::definitions::{key, put_def};
use super::{Result, Store};

/// A user: RabbitMQ's password hash (empty: no password), the algorithm's
/// RabbitMQ name (empty in records that had none: MD5), and its tags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserDef {
    pub name: String,
    pub password_hash: String,
    #[serde(default)]
    pub hashing_algorithm: String,
    #[serde(default)]
    pub tags: Vec<String>,
    /// max-connections, max-channels (RabbitMQ's user limits).
    #[serde(default)]
    pub limits: std::collections::BTreeMap<String, i64>,
}

/// A user's permissions on one vhost (three regular expressions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PermissionDef {
    pub user: String,
    pub vhost: String,
    pub configure: String,
    pub write: String,
    pub read: String,
}

/// A user's topic permissions on one topic exchange of a vhost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicPermissionDef {
    pub user: String,
    pub vhost: String,
    pub exchange: String,
    pub write: String,
    pub read: String,
}

const USER: &str = "u";
pub(super) const PERMISSION: &str = "p";
pub(super) const TOPIC_PERMISSION: &str = "t";
const USERS_SEEDED: &[u8] = b"meta\0users_seeded";

/// Applies `Op::PutUser`.
pub(super) fn put_user(tree: &sled::Tree, def: &UserDef) -> Result<()> {
    put_def(tree, key(USER, &[&def.name]), def)
}

/// Applies `Op::DeleteUser`: the user and every permission and topic
/// permission it has.
pub(super) fn delete_user(tree: &sled::Tree, name: &str) -> Result<()> {
    tree.remove(key(USER, &[name]))?;
    let mut batch = sled::Batch::default();
    for kind in [PERMISSION, TOPIC_PERMISSION] {
        let mut prefix = kind.as_bytes().to_vec();
        prefix.push(0);
        for item in tree.scan_prefix(prefix) {
            let (k, _) = item?;
            // vhost, user[, exchange]
            let user = k.split(|&b| b == 0).nth(2);
            if user == Some(name.as_bytes()) {
                batch.remove(k);
            }
        }
    }
    tree.apply_batch(batch)?;
    Ok(())
}

/// Applies `Op::PutPermission`.
pub(super) fn put_permission(tree: &sled::Tree, def: &PermissionDef) -> Result<()> {
    put_def(tree, key(PERMISSION, &[&def.vhost, &def.user]), def)
}

/// Applies `Op::DeletePermission`.
pub(super) fn delete_permission(tree: &sled::Tree, vhost: &str, user: &str) -> Result<()> {
    tree.remove(key(PERMISSION, &[vhost, user]))?;
    Ok(())
}

/// Applies `Op::PutTopicPermission`.
pub(super) fn put_topic_permission(tree: &sled::Tree, def: &TopicPermissionDef) -> Result<()> {
    put_def(
        tree,
        key(TOPIC_PERMISSION, &[&def.vhost, &def.user, &def.exchange]),
        def,
    )
}

/// Applies `Op::DeleteTopicPermission`: one exchange's, or with `exchange`
/// empty, all of the user's on the vhost.
pub(super) fn delete_topic_permission(
    tree: &sled::Tree,
    vhost: &str,
    user: &str,
    exchange: &str,
) -> Result<()> {
    if !exchange.is_empty() {
        tree.remove(key(TOPIC_PERMISSION, &[vhost, user, exchange]))?;
        return Ok(());
    }
    let mut prefix = key(TOPIC_PERMISSION, &[vhost, user]);
    prefix.push(0);
    let mut batch = sled::Batch::default();
    for item in tree.scan_prefix(prefix) {
        batch.remove(item?.0);
    }
    tree.apply_batch(batch)?;
    Ok(())
}

/// Applies `Op::UsersSeeded`.
pub(super) fn mark_seeded(tree: &sled::Tree) -> Result<()> {
    tree.insert(USERS_SEEDED, &[1u8][..])?;
    Ok(())
}

impl Store {
    /// Every recorded user.
    pub fn users(&self) -> Result<Vec<UserDef>> {
        self.scan_defs(USER)
    }

    /// Every recorded permission.
    pub fn permissions(&self) -> Result<Vec<PermissionDef>> {
        self.scan_defs(PERMISSION)
    }

    /// Every recorded topic permission.
    pub fn topic_permissions(&self) -> Result<Vec<TopicPermissionDef>> {
        self.scan_defs(TOPIC_PERMISSION)
    }

    /// Whether the default user was ever created (stores written before
    /// users existed have no marker, so they get it at their next start).
    pub fn users_seeded(&self) -> Result<bool> {
        Ok(self.defs.get(USERS_SEEDED)?.is_some())
    }
}
