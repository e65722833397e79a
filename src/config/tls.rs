//! The `[tls]` table: RabbitMQ's ssl_options under their names
//! (cacertfile, certfile, keyfile, verify, fail_if_no_peer_cert, versions)
//! and its ssl_handshake_timeout. The AMQPS listener is on when a
//! certificate is configured; the files are read by crate::tls.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Deserialize;

/// Whether client certificates are verified (RabbitMQ's `verify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum Verify {
    /// A client certificate, if presented, must chain to `cacertfile`.
    Peer,
    /// Client certificates are not asked for.
    None,
}

impl FromStr for Verify {
    type Err = String;

    fn from_str(s: &str) -> Result<Verify, String> {
        match s {
            "verify_peer" | "peer" => Ok(Verify::Peer),
            "verify_none" | "none" => Ok(Verify::None),
            other => Err(format!(
                "verify must be verify_peer or verify_none (peer or none), not '{other}'"
            )),
        }
    }
}

impl TryFrom<String> for Verify {
    type Error = String;

    fn try_from(s: String) -> Result<Verify, String> {
        s.parse()
    }
}

impl fmt::Display for Verify {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verify::Peer => "verify_peer",
            Verify::None => "verify_none",
        })
    }
}

/// Where SASL EXTERNAL takes the user name from in a client certificate
/// (RabbitMQ's ssl_cert_login_from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CertLoginFrom {
    /// The subject, as `openssl x509 -subject -nameopt RFC2253` prints it.
    DistinguishedName,
    /// The subject's common name.
    CommonName,
    /// A subject alternative name (`ssl_cert_login_san_type`, `_index`).
    SubjectAlternativeName,
}

/// Which subject alternative names (RabbitMQ's ssl_cert_login_san_type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SanType {
    Dns,
    Ip,
    Email,
    Uri,
    OtherName,
}

/// TLS settings, shared by the AMQPS, HTTPS and metrics listeners. Keys
/// take RabbitMQ's ssl_options names or the flags' (tls_cert, tls_key,
/// tls_ca, tls_verify, tls_fail_if_no_peer_cert).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM CA certificates that client certificates must chain to.
    #[serde(alias = "tls_ca")]
    pub cacertfile: Option<PathBuf>,
    /// PEM server certificate, then its chain.
    #[serde(alias = "tls_cert")]
    pub certfile: Option<PathBuf>,
    /// PEM private key (PKCS#8, RSA or EC).
    #[serde(alias = "tls_key")]
    pub keyfile: Option<PathBuf>,
    /// verify_peer or verify_none; unset: verify_peer when `cacertfile`
    /// is set (a presented certificate is always checked), else none.
    #[serde(alias = "tls_verify")]
    pub verify: Option<Verify>,
    /// Refuse clients that present no certificate (needs verify_peer).
    #[serde(alias = "tls_fail_if_no_peer_cert")]
    pub fail_if_no_peer_cert: bool,
    /// Protocol versions offered: "tlsv1.3", "tlsv1.2" (nothing older).
    pub versions: Vec<String>,
    /// Milliseconds a client has to finish the TLS handshake.
    pub ssl_handshake_timeout: u64,
    /// SASL EXTERNAL's user name: from the distinguished name (default),
    /// the common name or a subject alternative name.
    pub ssl_cert_login_from: CertLoginFrom,
    /// With subject_alternative_name: which kind (default dns).
    pub ssl_cert_login_san_type: SanType,
    /// With subject_alternative_name: the how-manyth of that kind (from 0).
    pub ssl_cert_login_san_index: usize,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cacertfile: None,
            certfile: None,
            keyfile: None,
            verify: None,
            fail_if_no_peer_cert: false,
            versions: vec!["tlsv1.3".into(), "tlsv1.2".into()],
            ssl_handshake_timeout: 5_000,
            ssl_cert_login_from: CertLoginFrom::DistinguishedName,
            ssl_cert_login_san_type: SanType::Dns,
            ssl_cert_login_san_index: 0,
        }
    }
}

impl TlsConfig {
    /// Whether a certificate is configured (TLS listeners may run).
    pub fn enabled(&self) -> bool {
        self.certfile.is_some()
    }

    /// The verify mode in force.
    pub fn verify(&self) -> Verify {
        match (self.verify, &self.cacertfile) {
            (Some(v), _) => v,
            (None, Some(_)) => Verify::Peer,
            (None, None) => Verify::None,
        }
    }

    /// The TLS handshake timeout.
    pub fn handshake_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ssl_handshake_timeout)
    }

    /// What does not fit together, found before any file is read.
    pub fn check(&self) -> Result<(), String> {
        match (&self.certfile, &self.keyfile) {
            (Some(_), None) => return Err("tls.certfile needs tls.keyfile".into()),
            (None, Some(_)) => return Err("tls.keyfile needs tls.certfile".into()),
            _ => {}
        }
        if self.verify() == Verify::Peer && self.cacertfile.is_none() {
            return Err("tls.verify = verify_peer needs tls.cacertfile".into());
        }
        if self.fail_if_no_peer_cert && self.verify() != Verify::Peer {
            return Err("tls.fail_if_no_peer_cert needs tls.verify = verify_peer".into());
        }
        if self.versions.is_empty() {
            return Err("tls.versions is empty".into());
        }
        for v in &self.versions {
            if !matches!(v.as_str(), "tlsv1.3" | "tlsv1.2") {
                return Err(format!(
                    "tls.versions: '{v}' is not offered (Warren speaks tlsv1.3 and tlsv1.2 only)"
                ));
            }
        }
        if self.ssl_handshake_timeout == 0 {
            return Err("tls.ssl_handshake_timeout must be above 0".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rabbitmqs_names_and_what_does_not_fit() {
        let t: TlsConfig = toml::from_str(
            "cacertfile = \"ca.pem\"\ncertfile = \"c.pem\"\nkeyfile = \"k.pem\"\n\
             verify = \"verify_peer\"\nfail_if_no_peer_cert = true",
        )
        .unwrap();
        assert_eq!(t.verify(), Verify::Peer);
        assert!(t.check().is_ok());
        let no_key = TlsConfig {
            certfile: Some("c.pem".into()),
            ..TlsConfig::default()
        };
        assert!(no_key.check().unwrap_err().contains("keyfile"));
        let old = TlsConfig {
            versions: vec!["tlsv1.1".into()],
            ..TlsConfig::default()
        };
        assert!(old.check().unwrap_err().contains("tlsv1.1"));
        let fail_without_verify = TlsConfig {
            fail_if_no_peer_cert: true,
            ..TlsConfig::default()
        };
        assert!(fail_without_verify.check().is_err());
        assert!(toml::from_str::<TlsConfig>("verify = \"sometimes\"").is_err());
        let flags: TlsConfig = toml::from_str(
            "tls_cert = \"c.pem\"\ntls_key = \"k.pem\"\ntls_ca = \"ca.pem\"\n\
             tls_verify = \"peer\"\ntls_fail_if_no_peer_cert = true",
        )
        .unwrap();
        assert_eq!(flags.certfile, t.certfile);
        assert_eq!(flags.keyfile, t.keyfile);
        assert_eq!(flags.cacertfile, t.cacertfile);
        assert_eq!(flags.verify, Some(Verify::Peer));
        assert!(flags.fail_if_no_peer_cert);
        assert_eq!("none".parse::<Verify>(), Ok(Verify::None));
    }
}
