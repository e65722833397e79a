//! The TLS side of an `amqps://` URI, as RabbitMQ's Erlang client reads
//! its query (`cacertfile`, `certfile`, `keyfile`, `password`, `verify`,
//! `server_name_indication`, `depth`, `fail_if_no_peer_cert`,
//! `customize_hostname_check`), and the rustls client configuration they
//! make for a shovel or federation link.
//!
//! Files are read at each connect, so a renewed certificate is picked up
//! by the next run. They are read only under the directory the config's
//! `link_tls_dir` names (unset: none): a URI is set over the HTTP API by
//! any policymaker of a vhost, who must not be able to make the broker
//! present its own key to a server of their choice (the directory is
//! shared by every vhost's).

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, Error, SignatureScheme};

use crate::tls::{certificates, provider};

/// The query parameters this module takes (a plain `amqp://` URI naming
/// one is refused: nothing would act on it).
pub const KEYS: &[&str] = &[
    "cacertfile",
    "certfile",
    "keyfile",
    "password",
    "verify",
    "fail_if_no_peer_cert",
    "server_name_indication",
    "depth",
    "customize_hostname_check",
];

/// What name the server's certificate is checked against, and sent as
/// SNI.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Sni {
    /// The URI's host (RabbitMQ's default under verify_peer).
    #[default]
    Host,
    Name(String),
    /// `disable`: no SNI sent and, as OTP does, no name checked (the
    /// chain still is).
    Disabled,
}

/// An amqps URI's TLS options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM CAs the server must chain to; none: the public (webpki) roots.
    pub cacertfile: Option<PathBuf>,
    /// The client certificate (PEM, with its chain) and its key.
    pub certfile: Option<PathBuf>,
    pub keyfile: Option<PathBuf>,
    /// The key file's passphrase (an encrypted PKCS#8 key).
    pub password: Option<String>,
    /// verify_peer (the default); false: verify_none.
    pub verify: bool,
    pub sni: Sni,
    /// The most intermediate CA certificates between the server's
    /// certificate and a trusted one (verify_peer only).
    pub depth: Option<usize>,
    /// `customize_hostname_check=https`: a wildcard name in the server's
    /// certificate may match (OTP's default check takes none).
    pub wildcards: bool,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            cacertfile: None,
            certfile: None,
            keyfile: None,
            password: None,
            verify: true,
            sni: Sni::Host,
            depth: None,
            wildcards: false,
        }
    }
}

fn absolute(key: &str, v: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(v);
    if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "{key} must be an absolute path without '..', not '{v}'"
        ));
    }
    Ok(p)
}

impl TlsOptions {
    /// Takes query parameter `key`'s decoded `value`.
    pub fn take(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "cacertfile" => self.cacertfile = Some(absolute(key, value)?),
            "certfile" => self.certfile = Some(absolute(key, value)?),
            "keyfile" => self.keyfile = Some(absolute(key, value)?),
            "password" => self.password = Some(value.to_string()),
            "verify" => {
                self.verify = match value {
                    "verify_peer" => true,
                    "verify_none" => false,
                    other => {
                        return Err(format!(
                            "verify must be verify_peer or verify_none, not '{other}'"
                        ))
                    }
                }
            }
            // A TLS server's option: OTP takes false on a client (what a
            // client does anyway) and refuses true, and so does Warren.
            "fail_if_no_peer_cert" => match value {
                "false" => {}
                "true" => {
                    return Err("fail_if_no_peer_cert=true is a TLS server's option \
                                (OTP refuses it on a client: {option,server_only,...})"
                        .into())
                }
                other => {
                    return Err(format!(
                        "fail_if_no_peer_cert must be true or false, not '{other}'"
                    ))
                }
            },
            "server_name_indication" => {
                self.sni = match value {
                    "disable" => Sni::Disabled,
                    name => {
                        ServerName::try_from(name.to_string()).map_err(|_| {
                            format!("server_name_indication '{name}' is not a host name")
                        })?;
                        Sni::Name(name.to_string())
                    }
                }
            }
            "depth" => {
                let d: u8 = value.parse().map_err(|_| {
                    format!("depth must be a number of certificates from 0 to 255, not '{value}'")
                })?;
                self.depth = Some(usize::from(d));
            }
            // OTP's HTTPS match: a wildcard in the leftmost label.
            "customize_hostname_check" => {
                if value != "https" {
                    return Err(format!(
                        "customize_hostname_check takes only 'https', not '{value}'"
                    ));
                }
                self.wildcards = true;
            }
            other => return Err(format!("'{other}' is not a TLS option")),
        }
        Ok(())
    }

    /// Whether the options agree with each other.
    pub fn check(&self) -> Result<(), String> {
        if self.keyfile.is_some() && self.certfile.is_none() {
            return Err("keyfile needs a certfile".into());
        }
        if self.password.is_some() && self.certfile.is_none() {
            return Err(
                "password is the key's passphrase, and no certfile or keyfile is named".into(),
            );
        }
        if self.verify && self.sni == Sni::Disabled && self.cacertfile.is_none() {
            return Err(
                "server_name_indication=disable checks no name, so with the public \
                        roots any publicly trusted certificate would pass: name the \
                        cacertfile the server's certificate chains to"
                    .into(),
            );
        }
        if !self.verify && self.depth.is_some() {
            return Err(
                "depth bounds the chain verify_peer verifies; verify_none verifies none".into(),
            );
        }
        Ok(())
    }

    /// The key's file: `keyfile`, else `certfile` (a PEM holding both, as
    /// OTP reads it).
    fn key_path(&self) -> Option<&Path> {
        self.keyfile.as_deref().or(self.certfile.as_deref())
    }

    fn files(&self) -> impl Iterator<Item = (&'static str, &Path)> {
        [
            ("cacertfile", &self.cacertfile),
            ("certfile", &self.certfile),
            ("keyfile", &self.keyfile),
        ]
        .into_iter()
        .filter_map(|(k, p)| p.as_deref().map(|p| (k, p)))
    }

    /// Whether every file named lies under `dir` (`link_tls_dir`), by
    /// name: what a definition is checked against when it is set (the
    /// files themselves are read, and their real paths checked, at each
    /// connect).
    pub fn check_files(&self, dir: Option<&Path>) -> Result<(), String> {
        for (key, path) in self.files() {
            let Some(dir) = dir else {
                return Err(no_dir(key, path));
            };
            let real_dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
            if !path.starts_with(dir) && !path.starts_with(&real_dir) {
                return Err(outside(key, path, dir));
            }
        }
        Ok(())
    }

    /// The rustls configuration these options make for a connection to
    /// `host`, and the name to hand the handshake (checked against the
    /// server's certificate unless SNI is disabled).
    pub fn client_config(
        &self,
        host: &str,
        dir: Option<&Path>,
    ) -> Result<(Arc<ClientConfig>, ServerName<'static>), String> {
        self.check()?;
        let provider = provider();
        let mut trusted = None;
        let webpki = if self.verify {
            let mut roots = rustls::RootCertStore::empty();
            match &self.cacertfile {
                Some(ca) => {
                    let ca = resolve("cacertfile", ca, dir)?;
                    for cert in certificates(&ca, "cacertfile")? {
                        roots
                            .add(cert)
                            .map_err(|e| format!("cacertfile {}: {e}", ca.display()))?;
                    }
                }
                None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            }
            let roots = Arc::new(roots);
            trusted = Some(Arc::clone(&roots));
            let v = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| format!("cacertfile: {e}"))?;
            Some(v)
        } else {
            // verify_none reads no CA file, but one named must still be
            // where link_tls_dir allows.
            if let Some(ca) = &self.cacertfile {
                resolve("cacertfile", ca, dir)?;
            }
            None
        };
        let check = Check {
            webpki,
            names: self.sni != Sni::Disabled,
            wildcards: self.wildcards,
            depth: self.depth.zip(trusted),
            algorithms: provider.signature_verification_algorithms,
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS versions: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(check));
        let mut config = match (&self.certfile, self.key_path()) {
            (Some(cert), Some(key)) => {
                let cert = resolve("certfile", cert, dir)?;
                let key = resolve("keyfile", key, dir)?;
                let chain = certificates(&cert, "certfile")?;
                let key = private_key(&key, self.password.as_deref())?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("certfile / keyfile: {e}"))?
            }
            _ => builder.with_no_client_auth(),
        };
        config.enable_sni = self.sni != Sni::Disabled;
        let name = match &self.sni {
            Sni::Name(n) => n.clone(),
            Sni::Host | Sni::Disabled => host.to_string(),
        };
        let name = ServerName::try_from(name)
            .map_err(|e| format!("'{host}' as a TLS server name: {e}"))?;
        Ok((Arc::new(config), name))
    }
}

fn no_dir(key: &str, path: &Path) -> String {
    format!(
        "{key} {}: this broker reads no TLS files for shovel and federation URIs until \
         its config's link_tls_dir names the directory that holds them",
        path.display()
    )
}

fn outside(key: &str, path: &Path, dir: &Path) -> String {
    format!(
        "{key} {}: not under link_tls_dir ({}), the only place this broker reads a URI's \
         TLS files from",
        path.display(),
        dir.display()
    )
}

/// `path`'s real path, if it is under `dir`'s.
fn resolve(key: &str, path: &Path, dir: Option<&Path>) -> Result<PathBuf, String> {
    let Some(dir) = dir else {
        return Err(no_dir(key, path));
    };
    let real_dir = dir
        .canonicalize()
        .map_err(|e| format!("link_tls_dir {}: {e}", dir.display()))?;
    let real = path
        .canonicalize()
        .map_err(|e| format!("{key} {}: {e}", path.display()))?;
    if !real.starts_with(&real_dir) {
        return Err(outside(key, path, dir));
    }
    Ok(real)
}

/// The largest key file read (a key is a few KiB).
const KEY_MAX: u64 = 1 << 20;

/// The private key in PEM file `path`: PKCS#8, PKCS#1 (RSA) or SEC1 (EC),
/// or an encrypted PKCS#8 key opened with `password`.
fn private_key(path: &Path, password: Option<&str>) -> Result<PrivateKeyDer<'static>, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("keyfile {shown}: {e}"))?;
    if meta.len() > KEY_MAX {
        return Err(format!("keyfile {shown}: larger than a key file"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("keyfile {shown}: {e}"))?;
    const ENCRYPTED: &str = "-----BEGIN ENCRYPTED PRIVATE KEY-----";
    if let Some(at) = text.find(ENCRYPTED) {
        let Some(password) = password else {
            return Err(format!(
                "keyfile {shown}: the key is encrypted; the URI's password opens it"
            ));
        };
        let end = "-----END ENCRYPTED PRIVATE KEY-----";
        let stop = text[at..]
            .find(end)
            .map(|i| at + i + end.len())
            .ok_or_else(|| format!("keyfile {shown}: an encrypted key without its end"))?;
        let (_, doc) = pkcs8::der::Document::from_pem(&text[at..stop])
            .map_err(|e| format!("keyfile {shown}: {e}"))?;
        let info = pkcs8::EncryptedPrivateKeyInfo::try_from(doc.as_bytes())
            .map_err(|e| format!("keyfile {shown}: {e}"))?;
        let plain = info.decrypt(password).map_err(|_| {
            format!(
                "keyfile {shown}: the password does not open the key (or its cipher is not PBES2)"
            )
        })?;
        return Ok(PrivatePkcs8KeyDer::from(plain.as_bytes().to_vec()).into());
    }
    if text.contains("Proc-Type: 4,ENCRYPTED") {
        return Err(format!(
            "keyfile {shown}: a key in OpenSSL's legacy encrypted form; convert it with \
             `openssl pkcs8 -topk8` (PKCS#8, PBES2)"
        ));
    }
    PrivateKeyDer::from_pem_slice(text.as_bytes()).map_err(|e| format!("keyfile {shown}: {e}"))
}

/// How a link checks the server's certificate: webpki's chain and name
/// check (or none, for verify_none), the name check left out when SNI is
/// disabled, a wildcard name refused unless allowed, and `depth`.
#[derive(Debug)]
struct Check {
    webpki: Option<Arc<WebPkiServerVerifier>>,
    names: bool,
    wildcards: bool,
    /// The most intermediates, and the trusted roots a path ends at.
    depth: Option<(usize, Arc<rustls::RootCertStore>)>,
    algorithms: WebPkiSupportedAlgorithms,
}

fn bad_cert(why: String) -> Error {
    Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(
        std::io::Error::other(why),
    ))))
}

/// Whether the certificate names `name` exactly (not by a wildcard): the
/// match OTP makes without customize_hostname_check=https.
fn names_exactly(end_entity: &CertificateDer<'_>, name: &ServerName<'_>) -> Result<(), Error> {
    let ServerName::DnsName(dns) = name else {
        return Ok(());
    };
    let (_, cert) = x509_parser::parse_x509_certificate(end_entity)
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let exact = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .is_some_and(|san| {
            san.value.general_names.iter().any(|g| {
                matches!(g, x509_parser::extensions::GeneralName::DNSName(n)
                    if n.eq_ignore_ascii_case(dns.as_ref()))
            })
        });
    match exact {
        true => Ok(()),
        false => Err(bad_cert(format!(
            "the certificate names {} only by a wildcard, which \
             customize_hostname_check=https allows",
            dns.as_ref()
        ))),
    }
}

/// Whether a path from `end_entity` to one of `roots` has at most
/// `depth` intermediate certificates (webpki looks for one among every
/// path the presented certificates make).
fn within_depth(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    roots: &rustls::RootCertStore,
    depth: usize,
    now: UnixTime,
    algorithms: &WebPkiSupportedAlgorithms,
) -> Result<(), Error> {
    let cert = webpki::EndEntityCert::try_from(end_entity)
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let short = |p: &webpki::VerifiedPath<'_>| match p.intermediate_certificates().count() {
        n if n <= depth => Ok(()),
        _ => Err(webpki::Error::MaximumPathDepthExceeded),
    };
    cert.verify_for_usage(
        algorithms.all,
        &roots.roots,
        intermediates,
        now,
        webpki::KeyUsage::server_auth(),
        None,
        Some(&short),
    )
    .map(|_| ())
    .map_err(|_| {
        bad_cert(format!(
            "no chain to a trusted certificate with at most {depth} intermediate \
             certificates (depth)"
        ))
    })
}

impl ServerCertVerifier for Check {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let Some(webpki) = &self.webpki else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            // rustls checks the name last: the chain has passed.
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.names => {}
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        if self.names && !self.wildcards {
            names_exactly(end_entity, server_name)?;
        }
        if let Some((depth, roots)) = &self.depth {
            within_depth(
                end_entity,
                intermediates,
                roots,
                *depth,
                now,
                &self.algorithms,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(query: &[(&str, &str)]) -> Result<TlsOptions, String> {
        let mut o = TlsOptions::default();
        for (k, v) in query {
            o.take(k, v)?;
        }
        o.check()?;
        Ok(o)
    }

    #[test]
    fn reads_the_options_rabbitmq_reads() {
        let o = opts(&[
            ("cacertfile", "/etc/certs/ca.pem"),
            ("certfile", "/etc/certs/c.pem"),
            ("keyfile", "/etc/certs/k.pem"),
            ("password", "s3cret"),
            ("verify", "verify_none"),
            ("server_name_indication", "rabbit.example"),
            ("fail_if_no_peer_cert", "false"),
            ("customize_hostname_check", "https"),
        ])
        .unwrap();
        assert!(!o.verify && o.wildcards);
        assert_eq!(o.sni, Sni::Name("rabbit.example".into()));
        assert_eq!(opts(&[("depth", "2")]).unwrap().depth, Some(2));
        let combined = opts(&[("certfile", "/c.pem"), ("password", "x")]).unwrap();
        assert_eq!(combined.key_path(), Some(Path::new("/c.pem")));
        assert_eq!(
            opts(&[
                ("server_name_indication", "disable"),
                ("cacertfile", "/ca.pem")
            ])
            .unwrap()
            .sni,
            Sni::Disabled
        );
        for bad in [
            &[("cacertfile", "ca.pem")][..],
            &[("cacertfile", "/etc/../ca.pem")],
            &[("verify", "verify_maybe")],
            &[("depth", "-1")],
            &[("depth", "256")],
            &[("depth", "1"), ("verify", "verify_none")],
            &[("server_name_indication", "disable")],
            &[("fail_if_no_peer_cert", "yes")],
            &[("fail_if_no_peer_cert", "true")],
            &[("customize_hostname_check", "ldap")],
            &[("server_name_indication", "not a name")],
            &[("keyfile", "/k.pem")],
            &[("password", "x")],
        ] {
            assert!(opts(bad).is_err(), "{bad:?}");
        }
    }

    /// A certificate for `name` signed by `by` (itself, when None), a CA
    /// or not: its DER and key.
    fn cert(
        name: &str,
        ca: bool,
        by: Option<&(rcgen::Certificate, rcgen::KeyPair)>,
    ) -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        if ca {
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        }
        let c = match by {
            Some((issuer, issuer_key)) => p.signed_by(&key, issuer, issuer_key).unwrap(),
            None => p.self_signed(&key).unwrap(),
        };
        (c, key)
    }

    /// A check of certificates chaining to `root`.
    fn checking(
        root: &(rcgen::Certificate, rcgen::KeyPair),
        depth: Option<usize>,
        wildcards: bool,
    ) -> Check {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root.0.der().clone()).unwrap();
        let roots = Arc::new(roots);
        Check {
            webpki: Some(
                WebPkiServerVerifier::builder_with_provider(Arc::clone(&roots), provider())
                    .build()
                    .unwrap(),
            ),
            names: true,
            wildcards,
            depth: depth.map(|d| (d, roots)),
            algorithms: provider().signature_verification_algorithms,
        }
    }

    #[test]
    fn depth_bounds_the_verified_chain_and_wildcards_need_https() {
        let root = cert("root", true, None);
        let mid = cert("mid", true, Some(&root));
        let stranger = cert("stranger", true, None);
        let leaf = cert("server.example", false, Some(&mid));
        let der = |c: &(rcgen::Certificate, rcgen::KeyPair)| c.0.der().clone();
        let name = ServerName::try_from("server.example").unwrap();
        let verify = |depth, chain: &[CertificateDer<'static>]| {
            checking(&root, Some(depth), false).verify_server_cert(
                &der(&leaf),
                chain,
                &name,
                &[],
                UnixTime::now(),
            )
        };
        assert!(
            verify(0, &[der(&mid)]).is_err(),
            "one intermediate, depth 0"
        );
        assert!(verify(1, &[der(&mid)]).is_ok());
        // Neither the root sent along nor a stranger counts.
        assert!(verify(1, &[der(&mid), der(&root), der(&stranger)]).is_ok());

        let wild = cert("*.wild.example", false, Some(&root));
        let host = ServerName::try_from("a.wild.example").unwrap();
        let verify = |wildcards| {
            checking(&root, None, wildcards).verify_server_cert(
                &der(&wild),
                &[],
                &host,
                &[],
                UnixTime::now(),
            )
        };
        let e = verify(false).unwrap_err().to_string();
        assert!(e.contains("only by a wildcard"), "{e}");
        assert!(verify(true).is_ok());
    }

    #[test]
    fn files_are_read_only_under_link_tls_dir() {
        let o = opts(&[("cacertfile", "/etc/warren/links/ca.pem")]).unwrap();
        assert!(o.check_files(None).unwrap_err().contains("link_tls_dir"));
        assert!(o.check_files(Some(Path::new("/etc/warren/links"))).is_ok());
        let e = o
            .check_files(Some(Path::new("/etc/warren/other")))
            .unwrap_err();
        assert!(e.contains("not under link_tls_dir"), "{e}");
        // A symlink out of the directory is caught where the file is read.
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        let link = dir.path().join("ca.pem");
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        let o = opts(&[("cacertfile", link.to_str().unwrap())]).unwrap();
        assert!(o.check_files(Some(dir.path())).is_ok());
        let e = o.client_config("h", Some(dir.path())).unwrap_err();
        assert!(e.contains("not under link_tls_dir"), "{e}");
    }
}
