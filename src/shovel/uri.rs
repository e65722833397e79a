//! A shovel's AMQP URIs, as RabbitMQ reads them: `amqp://` or `amqps://`,
//! optional credentials, host and port, one path segment naming the vhost
//! (percent-decoded; none means "/"), and the query parameters RabbitMQ
//! takes for the connection. A URI with no host means this broker: Warren
//! connects to its own AMQP listener, as the user the URI names (with its
//! password checked). RabbitMQ acts there as an internal user that passes
//! every check, or as a named user without a password: Warren asks for
//! the credentials instead.

use std::fmt;

use super::tls::{self, TlsOptions};

/// What a shovel connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uri {
    pub tls: bool,
    /// None: this broker.
    pub host: Option<String>,
    pub port: Option<u16>,
    pub user: Option<String>,
    pub pass: Option<String>,
    pub vhost: String,
    /// Whether the URI named its vhost (a federation link defaults to its
    /// own object's vhost, a shovel to "/").
    pub vhost_given: bool,
    pub heartbeat: Option<u16>,
    pub connection_timeout: Option<u64>,
    pub channel_max: Option<u16>,
    pub frame_max: Option<u32>,
    pub auth_mechanism: Option<String>,
    /// An amqps URI's TLS options (shovel/tls.rs).
    pub tls_options: TlsOptions,
}

fn decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or("a bad percent escape")?;
            let b = u8::from_str_radix(hex, 16).map_err(|_| "a bad percent escape")?;
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "not UTF-8 once decoded".to_string())
}

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{key} must be a number, not '{v}'"))
}

impl Uri {
    /// Parses `text`; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Uri, String> {
        let uri = Uri::parse_any(text)?;
        uri.check_credentials()?;
        Ok(uri)
    }

    /// Whether the URI names a user and password (Warren never logs in as
    /// guest on a URI's behalf); the refusal if not.
    pub fn check_credentials(&self) -> Result<(), String> {
        let bad = |why: &str| format!("\"{}\" not a valid URI: {why}", self.redacted());
        if self.host.is_none() && (self.user.is_none() || self.pass.is_none()) {
            return Err(bad(
                "a URI without a host (this broker) needs a user and password: Warren \
                 connects to itself as that user (RabbitMQ would act as an all-powerful \
                 internal user)",
            ));
        }
        if self.user.is_none() || self.pass.is_none() {
            return Err(bad(
                "a URI needs a user and password (RabbitMQ would log in as guest, which \
                 on this broker's own host would pass its loopback-only rule)",
            ));
        }
        Ok(())
    }

    /// Parses `text`, with or without credentials.
    pub fn parse_any(text: &str) -> Result<Uri, String> {
        let shown = without_secrets(text);
        let bad = |why: &str| format!("\"{shown}\" not a valid URI: {why}");
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| bad("no scheme (amqp:// or amqps://)"))?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "amqp" => false,
            "amqps" => true,
            other => return Err(bad(&format!("unexpected scheme '{other}'"))),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], Some(&rest[at + 1..])),
            None => (rest, None),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, pass) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((n, p)) => (
                    Some(decode(n).map_err(|e| bad(&e))?),
                    Some(decode(p).map_err(|e| bad(&e))?),
                ),
                None => (Some(decode(u).map_err(|e| bad(&e))?), None),
            },
        };
        let (host, port) = split_host_port(hostport).map_err(|e| bad(&e))?;
        if host.is_none() && port.is_some() {
            return Err(bad("a port requires a host"));
        }
        let vhost = match path {
            None => "/".to_string(),
            Some(p) if p.contains('/') => return Err(bad("the vhost must be one path segment")),
            Some(p) => decode(p).map_err(|e| bad(&e))?,
        };
        if vhost.is_empty() {
            return Err(bad("an empty vhost"));
        }
        let mut uri = Uri {
            tls,
            host,
            port,
            user,
            pass,
            vhost,
            vhost_given: path.is_some(),
            heartbeat: None,
            connection_timeout: None,
            channel_max: None,
            frame_max: None,
            auth_mechanism: None,
            tls_options: TlsOptions::default(),
        };
        let mut seen: Vec<&str> = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = decode(v).map_err(|e| bad(&e))?;
            // The first of a repeated key counts, as RabbitMQ reads them;
            // every auth_mechanism is checked (RabbitMQ offers each in
            // turn; lapin takes one, the first).
            if seen.contains(&k) && k != "auth_mechanism" {
                continue;
            }
            seen.push(k);
            match k {
                "heartbeat" => uri.heartbeat = Some(number(k, &v).map_err(|e| bad(&e))?),
                "connection_timeout" => {
                    uri.connection_timeout = Some(number(k, &v).map_err(|e| bad(&e))?)
                }
                "channel_max" => uri.channel_max = Some(number(k, &v).map_err(|e| bad(&e))?),
                "frame_max" => uri.frame_max = Some(number(k, &v).map_err(|e| bad(&e))?),
                "auth_mechanism" => match v.to_ascii_lowercase().as_str() {
                    m @ ("plain" | "amqplain" | "external") => {
                        uri.auth_mechanism.get_or_insert_with(|| m.to_string());
                    }
                    other => return Err(bad(&format!("unknown auth_mechanism '{other}'"))),
                },
                // The TLS key's password: RabbitMQ ignores it on a plain
                // connection (its issue 8129), and so does Warren.
                "password" if !tls => {}
                k if tls::KEYS.contains(&k) && !tls => {
                    return Err(bad(&format!(
                        "the TLS option '{k}' on an amqp:// URI (amqps:// is TLS)"
                    )))
                }
                k if tls::KEYS.contains(&k) && uri.host.is_none() => {
                    return Err(bad(&format!(
                        "the TLS option '{k}' on a URI without a host (this broker, \
                         reached over loopback without TLS)"
                    )))
                }
                k if tls::KEYS.contains(&k) => uri.tls_options.take(k, &v).map_err(|e| bad(&e))?,
                // RabbitMQ ignores what it does not know.
                _ => {}
            }
        }
        uri.tls_options.check().map_err(|e| bad(&e))?;
        if uri.vhost.len() > 255 {
            return Err(bad("a vhost longer than 255 bytes"));
        }
        Ok(uri)
    }

    /// The URI without credentials or query, as the status and headers
    /// show it (RabbitMQ's redaction).
    pub fn redacted(&self) -> String {
        let scheme = if self.tls { "amqps" } else { "amqp" };
        let host = self.host.as_deref().unwrap_or("");
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
        format!("{scheme}://{host}{port}/{}", encode(&self.vhost))
    }
}

impl fmt::Display for Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// `text` with anything up to its last `@` taken out (credentials, even
/// a password holding an unescaped `/` or `?`), and the key file's
/// `password` in the query hidden, for an error that quotes it (and so a
/// log that keeps it).
fn without_secrets(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    let rest = match rest.rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    let Some((before, query)) = rest.split_once('?') else {
        return format!("{scheme}://{rest}");
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some(("password", _)) => "password=...".to_string(),
            _ => pair.to_string(),
        })
        .collect();
    format!("{scheme}://{before}?{}", query.join("&"))
}

/// What may be shown of a URI that no longer reads (stored by an older
/// build): the scheme and what follows the last `@`, without the query.
pub fn shown_unread(text: &str) -> String {
    let shown = without_secrets(text);
    match shown.split_once('?') {
        Some((before, _)) => before.to_string(),
        None => shown,
    }
}

/// Percent-encodes what a path segment may not hold.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// "host", "host:port", "[v6]", "[v6]:port" or "" (no host).
fn split_host_port(s: &str) -> Result<(Option<String>, Option<u16>), String> {
    if s.is_empty() {
        return Ok((None, None));
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or("an unclosed [")?;
        match after.strip_prefix(':') {
            Some(p) => (h.to_string(), Some(p)),
            None if after.is_empty() => (h.to_string(), None),
            None => return Err("junk after ]".into()),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            // Not echoed: a password with an unescaped '/' or '?' ends up
            // read as the port.
            Ok(0) | Err(_) => return Err("a port out of range".to_string()),
            Ok(n) => Some(n),
        },
    };
    if host.is_empty() {
        return Ok((None, port));
    }
    Ok((Some(decode(&host)?), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_rabbitmq_reads() {
        let u = Uri::parse("amqp://u%40x:p%3Aw@example.com:5673/my%2Fvh?heartbeat=5&x=1").unwrap();
        assert_eq!(u.host.as_deref(), Some("example.com"));
        assert_eq!(u.port, Some(5673));
        assert_eq!(u.user.as_deref(), Some("u@x"));
        assert_eq!(u.pass.as_deref(), Some("p:w"));
        assert_eq!(u.vhost, "my/vh");
        assert_eq!(u.heartbeat, Some(5));
        assert_eq!(u.redacted(), "amqp://example.com:5673/my%2Fvh");
        let v = Uri::parse("amqps://u:p@[::1]").unwrap();
        assert_eq!(
            (v.host.as_deref(), v.port, v.vhost.as_str()),
            (Some("::1"), None, "/")
        );
        assert_eq!(v.redacted(), "amqps://[::1]/%2F");
        let local = Uri::parse("amqp://a:b@/v").unwrap();
        assert_eq!(local.host, None);
        for bad in [
            "http://h",
            "amqp://h:0",
            "amqp://h/a/b",
            "amqp://",
            "amqp://u@/v",
            "amqp://u:p@h?cacertfile=/x",
            "amqps://u:p@/v?cacertfile=/x",
            "amqps://u:p@h?cacertfile=x",
            "amqps://u:p@h?verify=none",
            "amqp://h?heartbeat=x",
            "amqp://:5672",
            "amqp://h",
        ] {
            assert!(Uri::parse(bad).is_err(), "{bad}");
        }
        let e = Uri::parse("amqp://user:secret@h:0").unwrap_err();
        assert!(!e.contains("secret") && e.contains("amqp://h:0"), "{e}");
        let e = Uri::parse("amqps://u:p@h?password=hush&depth=x").unwrap_err();
        assert!(!e.contains("hush") && e.contains("password=..."), "{e}");
        let e = Uri::parse("amqp://u:pa?ss/x@h:0").unwrap_err();
        assert!(!e.contains("pa") && !e.contains("ss"), "{e}");
        assert_eq!(
            shown_unread("amqps://u:p/w@h:1/v?password=x"),
            "amqps://h:1/v"
        );
        let two = Uri::parse("amqp://u:p@h?auth_mechanism=external&auth_mechanism=plain").unwrap();
        assert_eq!(two.auth_mechanism.as_deref(), Some("external"));
        assert!(Uri::parse("amqp://u:p@h?auth_mechanism=plain&auth_mechanism=crdemo").is_err());
        let first = Uri::parse("amqp://u:p@h?heartbeat=5&heartbeat=7").unwrap();
        assert_eq!(first.heartbeat, Some(5), "the first counts, as in RabbitMQ");
        assert!(
            Uri::parse("amqp://u:p@h?password=x").is_ok(),
            "ignored, as RabbitMQ does"
        );
        let t = Uri::parse(
            "amqps://u:p@h?cacertfile=%2Fcerts%2Fca.pem&verify=verify_peer&server_name_indication=disable",
        )
        .unwrap();
        assert_eq!(
            t.tls_options.cacertfile.as_deref(),
            Some(std::path::Path::new("/certs/ca.pem"))
        );
        assert_eq!(t.tls_options.sni, tls::Sni::Disabled);
        assert_eq!(t.redacted(), "amqps://h/%2F");
    }
}
