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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

pub use password::Algorithm;
pub use permissions::{Access, Permission};

use crate::store::{self, PermissionDef, Store, UserDef};

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
}

impl User {
    /// Whether `password` is this user's. A user without a password has
    /// none that matches.
    pub fn check_password(&self, password: &str) -> bool {
        !self.password_hash.is_empty()
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
        if !this.store.users_seeded()? {
            this.put_user(User {
                name: default_user.to_string(),
                password_hash: password::hash(Algorithm::Sha256, default_pass),
                algorithm: Algorithm::Sha256,
                tags: vec!["administrator".into()],
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
            })
            .unwrap();
        users
            .set_permission("app", "/", "^$", "^out$", "^in")
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
    }

    #[test]
    fn users_without_a_password_and_bad_records_are_refused() {
        let store = Store::temporary().unwrap();
        let users = Users::open(store, "guest", "guest").unwrap();
        users
            .put_user(User {
                name: "certs-only".into(),
                password_hash: String::new(),
                algorithm: Algorithm::Sha256,
                tags: vec![],
            })
            .unwrap();
        assert!(users.authenticate("certs-only", "").is_none());
        let bad = User {
            name: "x".into(),
            password_hash: "short".into(),
            algorithm: Algorithm::Sha256,
            tags: vec![],
        };
        assert!(users.put_user(bad).is_err());
        assert!(users
            .set_permission("nobody", "/", ".*", ".*", ".*")
            .is_err());
        assert!(users.set_permission("guest", "/", "(", ".*", ".*").is_err());
    }
}
