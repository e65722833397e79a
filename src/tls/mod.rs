//! TLS with rustls (ring): the server configuration made from the `[tls]`
//! settings, and reloading it without a restart. `Tls` holds the
//! configuration in force; every handshake takes the current one, so a
//! reload (SIGHUP, or the management API) changes what new handshakes
//! see while established connections keep theirs. A reload that fails
//! (a missing or broken file) keeps the old configuration and says why.
//! Only TLS 1.2 and 1.3 exist in rustls: nothing older can be offered.
//! identity.rs: the user name SASL EXTERNAL takes from a certificate;
//! cluster.rs: node-to-node links, the peer's certificate required.

pub mod cluster;
pub mod identity;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedProtocolVersion};

use crate::config::{TlsConfig, Verify};

/// The TLS configuration in force, reloadable.
pub struct Tls {
    settings: TlsConfig,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Reads the certificate, key and CA files `settings` names.
    pub fn load(settings: &TlsConfig) -> Result<Arc<Tls>, String> {
        let config = build(settings)?;
        Ok(Arc::new(Tls {
            settings: settings.clone(),
            current: RwLock::new(Arc::new(config)),
        }))
    }

    /// Reads the files again; new handshakes use what they hold now. On an
    /// error the configuration in force stays.
    pub fn reload(&self) -> Result<(), String> {
        let config = build(&self.settings)?;
        *self.current.write() = Arc::new(config);
        Ok(())
    }

    /// The configuration for the next handshake.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.current.read())
    }

    /// An acceptor with the configuration in force.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server_config())
    }

    /// How long a client has to finish the handshake.
    pub fn handshake_timeout(&self) -> Duration {
        self.settings.handshake_timeout()
    }

    /// Whether clients are asked for a certificate (SASL EXTERNAL can
    /// only work then).
    pub fn asks_for_client_certificates(&self) -> bool {
        self.settings.verify() == Verify::Peer
    }
}

/// Reloads each of `all` (every TLS listener's configuration); the first
/// error, after trying them all.
pub fn reload_all(all: &[Arc<Tls>]) -> Result<(), String> {
    if all.is_empty() {
        return Err("no TLS is configured".into());
    }
    let mut first = Ok(());
    for t in all {
        if let Err(e) = t.reload() {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(crate) fn versions(names: &[String]) -> Result<Vec<&'static SupportedProtocolVersion>, String> {
    names
        .iter()
        .map(|v| match v.as_str() {
            "tlsv1.3" => Ok(&rustls::version::TLS13),
            "tlsv1.2" => Ok(&rustls::version::TLS12),
            other => Err(format!("TLS version '{other}' is not offered")),
        })
        .collect()
}

/// A client configuration trusting the CAs in `ca` (PEM), for a tool
/// that calls a node's HTTPS API.
pub fn client_trusting(ca: &std::path::Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca, "CA file")? {
        roots
            .add(cert)
            .map_err(|e| format!("CA file {}: {e}", ca.display()))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

pub(crate) fn certificates(
    path: &std::path::Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}

/// The rustls server configuration `s` describes.
fn build(s: &TlsConfig) -> Result<ServerConfig, String> {
    s.check()?;
    let (Some(certfile), Some(keyfile)) = (&s.certfile, &s.keyfile) else {
        return Err("TLS needs tls.certfile and tls.keyfile".into());
    };
    let chain = certificates(certfile, "tls.certfile")?;
    let key = PrivateKeyDer::from_pem_file(keyfile)
        .map_err(|e| format!("tls.keyfile {}: {e}", keyfile.display()))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&versions(&s.versions)?)
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = match (s.verify(), &s.cacertfile) {
        (Verify::Peer, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca, "tls.cacertfile")? {
                roots
                    .add(cert)
                    .map_err(|e| format!("tls.cacertfile {}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let verifier = if s.fail_if_no_peer_cert {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier
                .build()
                .map_err(|e| format!("tls.cacertfile {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("tls.certfile / tls.keyfile: {e}"))
}
