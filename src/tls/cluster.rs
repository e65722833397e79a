//! TLS for the links between cluster nodes (the mirroring issue's Raft
//! port): the node's own certificate, key and CA from `[tls]`, with the
//! peer's certificate required and verified both ways, whatever `verify`
//! and `fail_if_no_peer_cert` say for clients. Each node is both a server
//! (peers connect to it) and a client (it connects to peers).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::{certificates, provider, versions};
use crate::config::TlsConfig;

/// Both ends of a node-to-node link.
pub struct ClusterTls {
    /// For connections from peers: their certificate is required.
    pub server: Arc<ServerConfig>,
    /// For connections to peers: this node's certificate is presented.
    pub client: Arc<ClientConfig>,
}

/// The cluster link configurations `s` gives; it needs a certificate,
/// its key and a CA.
pub fn cluster(s: &TlsConfig) -> Result<ClusterTls, String> {
    let (Some(certfile), Some(keyfile), Some(ca)) = (&s.certfile, &s.keyfile, &s.cacertfile) else {
        return Err("TLS between nodes needs tls.certfile, tls.keyfile and tls.cacertfile".into());
    };
    let chain = certificates(certfile, "tls.certfile")?;
    let key = || {
        PrivateKeyDer::from_pem_file(keyfile)
            .map_err(|e| format!("tls.keyfile {}: {e}", keyfile.display()))
    };
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca, "tls.cacertfile")? {
        roots
            .add(cert)
            .map_err(|e| format!("tls.cacertfile {}: {e}", ca.display()))?;
    }
    let roots = Arc::new(roots);
    let versions = versions(&s.versions)?;
    // verify_peer and fail_if_no_peer_cert, forced.
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider())
        .build()
        .map_err(|e| format!("tls.cacertfile {}: {e}", ca.display()))?;
    let server = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key()?)
        .map_err(|e| format!("tls.certfile / tls.keyfile: {e}"))?;
    let client = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key()?)
        .map_err(|e| format!("tls.certfile / tls.keyfile: {e}"))?;
    Ok(ClusterTls {
        server: Arc::new(server),
        client: Arc::new(client),
    })
}
