//! `[management]`: what the HTTP API accepts (RabbitMQ's `management.*`
//! keys of the same names).

use serde::Deserialize;

/// The HTTP API's limits and cross-origin rules.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ManagementConfig {
    /// The largest request body read, bytes; a larger one is answered 413
    /// unread (RabbitMQ's management.http_max_body_size, 10 MiB). A
    /// definitions file is a body like any other.
    pub http_max_body_size: usize,
    /// Origins besides the API's own whose browser requests are served
    /// ("https://ops.example.com", or "*" for any), with CORS headers
    /// (management.cors.allow_origins). A request from any other origin
    /// is refused with 403, so a page elsewhere cannot use a browser's
    /// login to the API.
    pub cors_allow_origins: Vec<String>,
    /// Seconds a browser may keep a preflight's answer
    /// (management.cors.max_age, 1800).
    pub cors_max_age: u64,
    /// Milliseconds a client has to send a request's headers, and that a
    /// kept-alive connection may sit idle (RabbitMQ's cowboy closes one
    /// with no request in 5 s by default).
    pub header_timeout_ms: u64,
    /// Connections open at once on each HTTP listener (the API, its
    /// HTTPS port, Prometheus), as ranch's max_connections; past it a
    /// new one is closed unread.
    pub max_connections: usize,
    /// Connections open at once from one client address, per listener.
    pub max_connections_per_source: usize,
}

impl Default for ManagementConfig {
    fn default() -> Self {
        ManagementConfig {
            http_max_body_size: 10 << 20,
            cors_allow_origins: Vec::new(),
            cors_max_age: 1800,
            header_timeout_ms: 10_000,
            max_connections: 1024,
            max_connections_per_source: 64,
        }
    }
}

impl ManagementConfig {
    /// Refuses settings that cannot work.
    pub fn check(&self) -> Result<(), String> {
        if self.http_max_body_size == 0 {
            return Err("management.http_max_body_size must be above 0".into());
        }
        if self.header_timeout_ms == 0 {
            return Err("management.header_timeout_ms must be above 0".into());
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return Err("management.max_connections must be from 1 to 1000000".into());
        }
        if !(1..=self.max_connections).contains(&self.max_connections_per_source) {
            return Err(
                "management.max_connections_per_source must be from 1 to max_connections".into(),
            );
        }
        for o in &self.cors_allow_origins {
            let scheme = o.starts_with("http://") || o.starts_with("https://");
            if o != "*" && (!scheme || o.ends_with('/')) {
                return Err(format!(
                    "management.cors_allow_origins: '{o}' is not an origin (\"*\", or \
                     scheme://host[:port] with no path, as browsers send it)"
                ));
            }
        }
        Ok(())
    }

    /// Whether requests from `origin` are served with CORS headers.
    pub fn allows_origin(&self, origin: &str) -> bool {
        self.cors_allow_origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    }
}
