//! A user's permissions on one vhost, as RabbitMQ has them: three regular
//! expressions over resource names (configure: declare and delete; write:
//! publish into, bind to; read: consume, get, purge, bind from). A pattern
//! matches anywhere in the name unless anchored; "" means "^$", as in
//! RabbitMQ: only the empty name, so in effect nothing.

use regex::Regex;

/// The kind of access an operation needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Configure,
    Write,
    Read,
}

impl Access {
    /// RabbitMQ's word for it in refusals.
    pub fn word(self) -> &'static str {
        match self {
            Access::Configure => "configure",
            Access::Write => "write",
            Access::Read => "read",
        }
    }
}

/// Compiled permissions.
#[derive(Debug)]
pub struct Permission {
    /// The patterns as given: configure, write, read.
    pub patterns: [String; 3],
    configure: Regex,
    write: Regex,
    read: Regex,
}

impl Permission {
    /// Compiles the three patterns; the error names the bad one.
    pub fn new(configure: &str, write: &str, read: &str) -> Result<Permission, String> {
        let compile = |what: &str, p: &str| -> Result<Regex, String> {
            let p = if p.is_empty() { "^$" } else { p };
            Regex::new(p).map_err(|e| format!("invalid {what} permission regex '{p}': {e}"))
        };
        Ok(Permission {
            patterns: [configure.into(), write.into(), read.into()],
            configure: compile("configure", configure)?,
            write: compile("write", write)?,
            read: compile("read", read)?,
        })
    }

    /// Whether `access` to the resource `name` is allowed.
    pub fn allows(&self, access: Access, name: &str) -> bool {
        let re = match access {
            Access::Configure => &self.configure,
            Access::Write => &self.write,
            Access::Read => &self.read,
        };
        re.is_match(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_rabbitmq_matches_them() {
        let p = Permission::new(".*", "^app\\.", "").unwrap();
        assert!(p.allows(Access::Configure, ""));
        assert!(p.allows(Access::Write, "app.events"));
        assert!(!p.allows(Access::Write, "myapp.events"));
        assert!(
            !p.allows(Access::Read, "anything"),
            "an empty pattern is ^$"
        );
        assert!(p.allows(Access::Read, ""));
        let unanchored = Permission::new("tmp", "^$", "^$").unwrap();
        assert!(unanchored.allows(Access::Configure, "my-tmp-queue"));
        assert!(unanchored.allows(Access::Write, ""));
        assert!(!unanchored.allows(Access::Write, "x"));
        assert!(Permission::new("[", "", "")
            .unwrap_err()
            .contains("configure"));
    }
}
