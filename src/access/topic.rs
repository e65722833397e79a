//! Topic permissions, as RabbitMQ has them: for one user, vhost and topic
//! exchange, a write and a read regular expression over routing keys
//! (write: publishing to the exchange; read: binding from it). Where a user
//! has no entry for an exchange, everything is allowed. `{username}` and
//! `{vhost}` in a pattern stand for the user's name and the vhost's, put in
//! as they are (RabbitMQ does not escape them either).

use regex::Regex;

use super::Access;

/// One exchange's topic permissions for one user.
#[derive(Debug)]
pub struct TopicPermission {
    pub exchange: String,
    /// The patterns as given (before `{username}` and `{vhost}` are put in).
    pub write_pattern: String,
    pub read_pattern: String,
    write: Regex,
    read: Regex,
}

impl TopicPermission {
    /// Compiles the patterns for `user` on `vhost`; the error names the
    /// bad one.
    pub fn new(
        user: &str,
        vhost: &str,
        exchange: &str,
        write: &str,
        read: &str,
    ) -> Result<TopicPermission, String> {
        let compile = |what: &str, p: &str| -> Result<Regex, String> {
            let expanded = p.replace("{username}", user).replace("{vhost}", vhost);
            let expanded = if expanded.is_empty() {
                "^$".to_string()
            } else {
                expanded
            };
            Regex::new(&expanded)
                .map_err(|e| format!("invalid topic {what} permission regex '{p}': {e}"))
        };
        Ok(TopicPermission {
            exchange: exchange.to_string(),
            write_pattern: write.to_string(),
            read_pattern: read.to_string(),
            write: compile("write", write)?,
            read: compile("read", read)?,
        })
    }

    /// Whether `access` (write or read) with `routing_key` is allowed.
    pub fn allows(&self, access: Access, routing_key: &str) -> bool {
        match access {
            Access::Write => self.write.is_match(routing_key),
            Access::Read => self.read.is_match(routing_key),
            Access::Configure => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_put_in_and_empty_means_nothing() {
        let t = TopicPermission::new("bob", "prod", "amq.topic", "^{username}\\.", "").unwrap();
        assert!(t.allows(Access::Write, "bob.orders"));
        assert!(!t.allows(Access::Write, "alice.orders"));
        assert!(!t.allows(Access::Read, "bob.orders"));
        assert!(t.allows(Access::Read, ""));
        let v = TopicPermission::new("u", "prod", "x", "^{vhost}$", ".*").unwrap();
        assert!(v.allows(Access::Write, "prod"));
        assert!(TopicPermission::new("u", "v", "x", "(", "")
            .unwrap_err()
            .contains("write"));
    }
}
