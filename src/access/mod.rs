//! Who may connect and what they may do: users (RabbitMQ's password hashes
//! and tags) and their permissions per vhost (configure, write and read
//! regular expressions). The registry lives in memory and every change is
//! a store operation, so it survives restarts and will replicate with the
//! rest of the node's state.
//!
//! A fresh node (no user ever recorded) gets the default user from the
//! config (guest/guest), tagged administrator, with full permissions on
//! "/", as RabbitMQ creates it.

pub mod password;
mod permissions;
mod topic;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

pub use password::Algorithm;
pub use permissions::{Access, Permission};
pub use topic::TopicPermission;

use crate::store::{self, PermissionDef, Store, TopicPermissionDef, UserDef};

/// A user's topic permissions on one vhost, by exchange.
pub type TopicPermissions = HashMap<String, Arc<TopicPermission>>;

/// A user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// The hash in RabbitMQ's format; empty for a user without a password
    /// (who cannot log in with PLAIN or AMQPLAIN).
    pub password_hash: String,
    pub algorithm: Algorithm,
    /// administrator, monitoring, policymaker, management, impersonator,
    /// or any other tag an operator gives.
    pub tags: Vec<String>,
    /// "max-connections", "max-channels"; a negative value is no limit.
    pub limits: std::collections::BTreeMap<String, i64>,
}

impl User {
    /// A user with a password hashed the default way (SHA-256), no tags
    /// and no limits.
    pub fn with_password(name: &str, password: &str) -> User {
        User {
            name: name.to_string(),
            password_hash: password::hash(Algorithm::Sha256, password),
            algorithm: Algorithm::Sha256,
            tags: Vec::new(),
            limits: Default::default(),
        }
    }

    /// The limit `key` ("max-connections", "max-channels"), if set and
    /// not negative.
    pub fn limit(&self, key: &str) -> Option<u64> {
        self.limits.get(key).and_then(|&n| u64::try_from(n).ok())
    }

    /// Whether `password` is this user's. A user without a password has
    /// none that matches, and a blank password never matches (as in
    /// RabbitMQ's internal backend: a user given "" as its password is
    /// one nobody logs in as with a password).
    pub fn check_password(&self, password: &str) -> bool {
        !password.is_empty()
            && !self.password_hash.is_empty()
            && password::verify(self.algorithm, &self.password_hash, password)
    }

    /// Whether it carries `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }

    fn def(&self) -> UserDef {
        UserDef {
            name: self.name.clone(),
            password_hash: self.password_hash.clone(),
            hashing_algorithm: self.algorithm.name().to_string(),
            tags: self.tags.clone(),
            limits: self.limits.clone(),
        }
    }
}

/// Why an access change was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such user.
    #[error("user '{0}' not found")]
    NoUser(String),
    /// A record that cannot be used as it is.
    #[error("{0}")]
    Invalid(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// Users and permissions.
pub struct Users {
    store: Arc<Store>,
    users: RwLock<HashMap<String, Arc<User>>>,
    /// By vhost, then user.
    permissions: RwLock<HashMap<String, HashMap<String, Arc<Permission>>>>,
    /// By vhost, then user.
    topic: RwLock<HashMap<String, HashMap<String, Arc<TopicPermissions>>>>,
    /// Bumped by every change, so a connection can tell its cached view
    /// is stale with one load.
    generation: AtomicU64,
}

impl Users {
    /// Loads what the store holds; on a node that never had a user, adds
    /// `default_user` with `default_pass` as RabbitMQ does on first boot.
    pub fn open(store: Arc<Store>, default_user: &str, default_pass: &str) -> Result<Users, Error> {
        let this = Users {
            store,
            users: RwLock::new(HashMap::new()),
            permissions: RwLock::new(HashMap::new()),
            topic: RwLock::new(HashMap::new()),
            generation: AtomicU64::new(0),
        };
        for def in this.store.users()? {
            let user = user_from(&def)?;
            this.users.write().insert(user.name.clone(), Arc::new(user));
        }
        for def in this.store.permissions()? {
            let p =
                Permission::new(&def.configure, &def.write, &def.read).map_err(Error::Invalid)?;
            this.permissions
                .write()
                .entry(def.vhost.clone())
                .or_default()
                .insert(def.user.clone(), Arc::new(p));
        }
        for def in this.store.topic_permissions()? {
            let t =
                TopicPermission::new(&def.user, &def.vhost, &def.exchange, &def.write, &def.read)
                    .map_err(Error::Invalid)?;
            this.insert_topic(&def.vhost, &def.user, t);
        }
        if !this.store.users_seeded()? {
            this.put_user(User {
                tags: vec!["administrator".into()],
                ..User::with_password(default_user, default_pass)
            })?;
            this.set_permission(default_user, "/", ".*", ".*", ".*")?;
            this.store.mark_users_seeded()?;
        }
        Ok(this)
    }

    /// The user `name`.
    pub fn get(&self, name: &str) -> Option<Arc<User>> {
        self.users.read().get(name).cloned()
    }

    /// Every user, by name.
    pub fn list(&self) -> Vec<Arc<User>> {
        let mut all: Vec<_> = self.users.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// The user `name` if `password` is theirs.
    pub fn authenticate(&self, name: &str, password: &str) -> Option<Arc<User>> {
        self.get(name).filter(|u| u.check_password(password))
    }

    /// Adds or replaces a user (durable after the next group commit).
    pub fn put_user(&self, user: User) -> Result<(), Error> {
        if user.name.is_empty() {
            return Err(Error::Invalid("a user needs a name".into()));
        }
        if !user.password_hash.is_empty()
            && !password::well_formed(user.algorithm, &user.password_hash)
        {
            return Err(Error::Invalid(format!(
                "the password hash of user '{}' is not a {} hash",
                user.name,
                user.algorithm.name()
            )));
        }
        self.store.put_user(&user.def())?;
        self.users.write().insert(user.name.clone(), Arc::new(user));
        self.changed();
        Ok(())
    }

    /// Deletes a user and every permission it had.
    pub fn delete_user(&self, name: &str) -> Result<(), Error> {
        if self.users.write().remove(name).is_none() {
            return Err(Error::NoUser(name.to_string()));
        }
        for users in self.permissions.write().values_mut() {
            users.remove(name);
        }
        for users in self.topic.write().values_mut() {
            users.remove(name);
        }
        self.changed();
        self.store.delete_user(name)?;
        Ok(())
    }

    /// Sets `user`'s permissions on `vhost`.
    pub fn set_permission(
        &self,
        user: &str,
        vhost: &str,
        configure: &str,
        write: &str,
        read: &str,
    ) -> Result<(), Error> {
        if self.get(user).is_none() {
            return Err(Error::NoUser(user.to_string()));
        }
        let p = Permission::new(configure, write, read).map_err(Error::Invalid)?;
        self.store.put_permission(&PermissionDef {
            user: user.to_string(),
            vhost: vhost.to_string(),
            configure: configure.to_string(),
            write: write.to_string(),
            read: read.to_string(),
        })?;
        self.permissions
            .write()
            .entry(vhost.to_string())
            .or_default()
            .insert(user.to_string(), Arc::new(p));
        self.changed();
        Ok(())
    }

    /// Clears `user`'s permissions on `vhost`.
    pub fn clear_permission(&self, user: &str, vhost: &str) -> Result<(), Error> {
        if let Some(users) = self.permissions.write().get_mut(vhost) {
            users.remove(user);
        }
        self.changed();
        self.store.delete_permission(vhost, user)?;
        Ok(())
    }

    /// `user`'s permissions on `vhost`, if any.
    pub fn permission(&self, user: &str, vhost: &str) -> Option<Arc<Permission>> {
        self.permissions.read().get(vhost)?.get(user).cloned()
    }

    /// Every permission: vhost, user, patterns.
    pub fn permissions(&self) -> Vec<(String, String, Arc<Permission>)> {
        let mut all = Vec::new();
        for (vhost, users) in self.permissions.read().iter() {
            for (user, p) in users {
                all.push((vhost.clone(), user.clone(), Arc::clone(p)));
            }
        }
        all.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        all
    }

    /// Sets `user`'s topic permissions on `exchange` of `vhost`.
    pub fn set_topic_permission(
        &self,
        user: &str,
        vhost: &str,
        exchange: &str,
        write: &str,
        read: &str,
    ) -> Result<(), Error> {
        if self.get(user).is_none() {
            return Err(Error::NoUser(user.to_string()));
        }
        let t = TopicPermission::new(user, vhost, exchange, write, read).map_err(Error::Invalid)?;
        self.store.put_topic_permission(&TopicPermissionDef {
            user: user.to_string(),
            vhost: vhost.to_string(),
            exchange: exchange.to_string(),
            write: write.to_string(),
            read: read.to_string(),
        })?;
        self.insert_topic(vhost, user, t);
        self.changed();
        Ok(())
    }

    fn insert_topic(&self, vhost: &str, user: &str, t: TopicPermission) {
        let mut topic = self.topic.write();
        let slot = topic
            .entry(vhost.to_string())
            .or_default()
            .entry(user.to_string())
            .or_default();
        let mut map = TopicPermissions::clone(slot);
        map.insert(t.exchange.clone(), Arc::new(t));
        *slot = Arc::new(map);
    }

    /// Clears `user`'s topic permissions on `exchange` of `vhost`, or all
    /// of them on the vhost when `exchange` is None.
    pub fn clear_topic_permission(
        &self,
        user: &str,
        vhost: &str,
        exchange: Option<&str>,
    ) -> Result<(), Error> {
        {
            let mut topic = self.topic.write();
            if let Some(users) = topic.get_mut(vhost) {
                match exchange {
                    None => {
                        users.remove(user);
                    }
                    Some(x) => {
                        if let Some(slot) = users.get_mut(user) {
                            let mut map = TopicPermissions::clone(slot);
                            map.remove(x);
                            *slot = Arc::new(map);
                        }
                    }
                }
            }
        }
        self.changed();
        self.store
            .delete_topic_permission(vhost, user, exchange.unwrap_or(""))?;
        Ok(())
    }

    /// `user`'s topic permissions on `vhost` (None: no entry, so all
    /// topics allowed).
    pub fn topic_permissions(&self, user: &str, vhost: &str) -> Option<Arc<TopicPermissions>> {
        self.topic
            .read()
            .get(vhost)?
            .get(user)
            .filter(|m| !m.is_empty())
            .cloned()
    }

    /// Every topic permission: vhost, user, permission.
    pub fn all_topic_permissions(&self) -> Vec<(String, String, Arc<TopicPermission>)> {
        let mut all = Vec::new();
        for (vhost, users) in self.topic.read().iter() {
            for (user, map) in users {
                for t in map.values() {
                    all.push((vhost.clone(), user.clone(), Arc::clone(t)));
                }
            }
        }
        all.sort_by(|a, b| (&a.0, &a.1, &a.2.exchange).cmp(&(&b.0, &b.1, &b.2.exchange)));
        all
    }

    /// Forgets every permission on `vhost` (its records go with the
    /// vhost's own deletion).
    pub fn forget_vhost(&self, vhost: &str) {
        self.permissions.write().remove(vhost);
        self.topic.write().remove(vhost);
        self.changed();
    }

    /// Counts changes to users and permissions.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// A user from its record; an unknown algorithm is an error, not a user
/// nobody can log in as.
fn user_from(def: &UserDef) -> Result<User, Error> {
    let algorithm = Algorithm::parse(&def.hashing_algorithm).ok_or_else(|| {
        Error::Invalid(format!(
            "user '{}': unknown hashing algorithm '{}'",
            def.name, def.hashing_algorithm
        ))
    })?;
    Ok(User {
        name: def.name.clone(),
        password_hash: def.password_hash.clone(),
        algorithm,
        tags: def.tags.clone(),
        limits: def.limits.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_node_has_the_default_user_and_changes_survive_a_reload() {
        let store = Store::temporary().unwrap();
        let users = Users::open(Arc::clone(&store), "guest", "guest").unwrap();
        let guest = users.authenticate("guest", "guest").expect("guest logs in");
        assert!(guest.has_tag("administrator"));
        assert!(users.authenticate("guest", "nope").is_none());
        let p = users.permission("guest", "/").unwrap();
        assert!(p.allows(Access::Configure, "anything"));
        users
            .put_user(User {
                name: "app".into(),
                password_hash: password::hash(Algorithm::Sha512, "pw"),
                algorithm: Algorithm::Sha512,
                tags: vec![],
                limits: [("max-channels".to_string(), 2)].into(),
            })
            .unwrap();
        users
            .set_permission("app", "/", "^$", "^out$", "^in")
            .unwrap();
        users
            .set_topic_permission("app", "/", "amq.topic", "^{username}\\.", ".*")
            .unwrap();
        users
            .set_topic_permission("guest", "/", "amq.topic", "^$", "^$")
            .unwrap();
        users.delete_user("guest").unwrap();
        // Reopened: what was recorded, and no second default user.
        let again = Users::open(store, "guest", "guest").unwrap();
        assert!(
            again.get("guest").is_none(),
            "a deleted default user stays deleted"
        );
        assert!(again.authenticate("app", "pw").is_some());
        let p = again.permission("app", "/").unwrap();
        assert!(p.allows(Access::Write, "out") && !p.allows(Access::Write, "outside2x"));
        assert!(p.allows(Access::Read, "inbox") && !p.allows(Access::Configure, "x"));
        assert!(again.permission("guest", "/").is_none());
        assert_eq!(again.get("app").unwrap().limit("max-channels"), Some(2));
        let t = again.topic_permissions("app", "/").unwrap();
        assert!(t["amq.topic"].allows(Access::Write, "app.x"));
        assert!(!t["amq.topic"].allows(Access::Write, "other.x"));
        assert!(again.topic_permissions("guest", "/").is_none());
        assert_eq!(again.all_topic_permissions().len(), 1);
        again.clear_topic_permission("app", "/", None).unwrap();
        assert!(again.topic_permissions("app", "/").is_none());
    }

    #[test]
    fn users_without_a_password_and_bad_records_are_refused() {
        let store = Store::temporary().unwrap();
        let users = Users::open(store, "guest", "guest").unwrap();
        users
            .put_user(User {
                password_hash: String::new(),
                ..User::with_password("certs-only", "")
            })
            .unwrap();
        assert!(users.authenticate("certs-only", "").is_none());
        let bad = User {
            password_hash: "short".into(),
            ..User::with_password("x", "")
        };
        assert!(users.put_user(bad).is_err());
        assert!(users
            .set_permission("nobody", "/", ".*", ".*", ".*")
            .is_err());
        assert!(users.set_permission("guest", "/", "(", ".*", ".*").is_err());
    }
}
