//! Certificates made by a test (a CA of its own, with rcgen) and brokers
//! serving AMQPS with them.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use warren::config::{Port, Verify};

use super::{config, start_in, TestBroker};

/// A CA that signs certificates.
pub struct Ca {
    pub cert: rcgen::Certificate,
    pub key: KeyPair,
}

/// A certificate and its key, in PEM.
pub struct Issued {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        Ca {
            cert: p.self_signed(&key).unwrap(),
            key,
        }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A certificate for `cn`, for a server (names `localhost` and
    /// 127.0.0.1) or a client.
    pub fn issue(&self, cn: &str, server: bool, expired: bool) -> Issued {
        self.issue_with(&[(DnType::CommonName, cn)], server, expired, &[])
    }

    /// A certificate with the subject `dn` (in DER order) and the
    /// subject alternative names `sans`.
    pub fn issue_with(
        &self,
        dn: &[(DnType, &str)],
        server: bool,
        expired: bool,
        sans: &[&str],
    ) -> Issued {
        let key = KeyPair::generate().unwrap();
        let mut names: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        if server {
            names.extend(["localhost".to_string(), "127.0.0.1".to_string()]);
        }
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            p.distinguished_name.push(t.clone(), *v);
        }
        p.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        if server && client_too(dn) {
            p.extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        Issued {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// A node of a cluster is a server and a client of its peers: its
/// certificate (named "node-...") carries both uses.
pub fn client_too(dn: &[(DnType, &str)]) -> bool {
    dn.iter().any(|(_, v)| v.starts_with("node-"))
}

/// A CA named `ca_name` and a temp dir holding its ca.pem and a server
/// certificate for `server_cn` (cert.pem, key.pem).
pub fn ca_and_server(ca_name: &str, server_cn: &str) -> (Ca, tempfile::TempDir) {
    let ca = Ca::new(ca_name);
    let certs = tempfile::tempdir().unwrap();
    write_files(certs.path(), &ca.issue(server_cn, true, false), &ca);
    (ca, certs)
}

/// Writes the server's files into `dir`: cert.pem, key.pem, ca.pem.
pub fn write_files(dir: &Path, server: &Issued, ca: &Ca) {
    std::fs::write(dir.join("cert.pem"), &server.cert).unwrap();
    std::fs::write(dir.join("key.pem"), &server.key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
}

/// A broker with AMQPS on a free port, certificates in `certs`, client
/// certificates verified against the CA and, with `required`, required.
pub async fn start_tls(certs: &Path, required: bool) -> (TestBroker, std::net::SocketAddr) {
    start_tls_with(certs, required, |_| {}).await
}

/// As `start_tls`, with `change` made to the configuration.
pub async fn start_tls_with(
    certs: &Path,
    required: bool,
    change: impl FnOnce(&mut warren::Config),
) -> (TestBroker, std::net::SocketAddr) {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    c.amqps_port = Some(Port::On(0));
    c.tls.certfile = Some(certs.join("cert.pem"));
    c.tls.keyfile = Some(certs.join("key.pem"));
    c.tls.cacertfile = Some(certs.join("ca.pem"));
    c.tls.verify = Some(Verify::Peer);
    c.tls.fail_if_no_peer_cert = required;
    c.tls.ssl_handshake_timeout = 2_000;
    // HTTPS only where a test asks (its default ports would collide).
    c.management_tls_port = Some(Port::Off);
    c.prometheus_tls_port = Some(Port::Off);
    change(&mut c);
    let b = start_in(tmp, c).await;
    let addr = b
        .server
        .as_ref()
        .and_then(|s| s.amqps_addr)
        .expect("the AMQPS listener runs");
    (b, addr)
}
