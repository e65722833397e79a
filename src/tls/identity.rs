//! The user name SASL EXTERNAL takes from a verified client certificate,
//! as rabbitmq_auth_mechanism_ssl does: the subject's distinguished name
//! in RFC 2253 form, as `openssl x509 -noout -subject -nameopt RFC2253`
//! prints it (every component in reverse order, components joined by "," without spaces,
//! multi-valued RDNs by "+", short attribute names, RFC 4514 escapes and
//! bytes above 0x7f as \XX); or its common name; or one of its subject
//! alternative names.

use std::fmt::Write;

use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::x509::{AttributeTypeAndValue, X509Name};

use crate::config::{CertLoginFrom, SanType, TlsConfig};

/// The login name in `cert` (DER) as `settings` ask for it.
pub fn login_name(cert: &[u8], settings: &TlsConfig) -> Result<String, String> {
    let (_, cert) =
        X509Certificate::from_der(cert).map_err(|e| format!("unreadable certificate: {e}"))?;
    match settings.ssl_cert_login_from {
        CertLoginFrom::DistinguishedName => Ok(rfc2253(cert.subject())),
        CertLoginFrom::CommonName => cert
            .subject()
            .iter_common_name()
            .next()
            .map(value)
            .ok_or_else(|| "the certificate's subject has no common name".to_string()),
        CertLoginFrom::SubjectAlternativeName => {
            let kind = settings.ssl_cert_login_san_type;
            let index = settings.ssl_cert_login_san_index;
            let names = cert
                .subject_alternative_name()
                .map_err(|e| format!("unreadable subject alternative names: {e}"))?;
            names
                .iter()
                .flat_map(|ext| ext.value.general_names.iter())
                .filter_map(|n| san(n, kind))
                .nth(index)
                .ok_or_else(|| {
                    format!("the certificate has no subject alternative name {kind:?} #{index}")
                })
        }
    }
}

/// Whether `cert` (DER) names `host` (a DNS name or an IP address) in its
/// subject alternative names, as a TLS client checks a server's: an IP
/// address as an IP entry, a DNS name exactly (case aside) or under a
/// wildcard for its first label ("*.example.com"). Member links check
/// the connecting member's certificate this way (cluster/identity.rs).
pub fn names_host(cert: &[u8], host: &str) -> bool {
    let Ok((_, cert)) = X509Certificate::from_der(cert) else {
        return false;
    };
    let Ok(Some(sans)) = cert.subject_alternative_name() else {
        return false;
    };
    let ip: Option<std::net::IpAddr> = host.parse().ok();
    sans.value.general_names.iter().any(|n| match (n, ip) {
        (GeneralName::IPAddress(_), Some(ip)) => {
            san(n, SanType::Ip).and_then(|s| s.parse().ok()) == Some(ip)
        }
        (GeneralName::DNSName(name), None) => dns_matches(name, host),
        _ => false,
    })
}

fn dns_matches(pattern: &str, host: &str) -> bool {
    let (pattern, host) = (pattern.trim_end_matches('.'), host.trim_end_matches('.'));
    if pattern.eq_ignore_ascii_case(host) {
        return true;
    }
    match (pattern.strip_prefix("*."), host.split_once('.')) {
        (Some(parent), Some((label, rest))) => {
            !label.is_empty() && parent.contains('.') && parent.eq_ignore_ascii_case(rest)
        }
        _ => false,
    }
}

/// A subject alternative name of `kind`, as text.
fn san(name: &GeneralName<'_>, kind: SanType) -> Option<String> {
    match (name, kind) {
        (GeneralName::DNSName(s), SanType::Dns)
        | (GeneralName::RFC822Name(s), SanType::Email)
        | (GeneralName::URI(s), SanType::Uri) => Some(s.to_string()),
        (GeneralName::IPAddress(b), SanType::Ip) => match b.len() {
            4 => Some(std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string()),
            16 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(b);
                Some(std::net::Ipv6Addr::from(a).to_string())
            }
            _ => None,
        },
        // The value inside its [0] EXPLICIT wrapper, as text when it is a
        // string.
        (GeneralName::OtherName(_, der), SanType::OtherName) => {
            let inner = x509_parser::der_parser::asn1_rs::Any::from_der(der).ok()?.1;
            let s = x509_parser::der_parser::asn1_rs::Any::from_der(inner.data)
                .ok()
                .and_then(|(_, v)| std::str::from_utf8(v.data).ok().map(str::to_string));
            Some(s.unwrap_or_else(|| hex(inner.data)))
        }
        _ => None,
    }
}

/// openssl's short name for an attribute type, if it has one.
fn short_name(oid: &str) -> Option<&'static str> {
    Some(match oid {
        "2.5.4.3" => "CN",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.9" => "street",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "2.5.4.4" => "SN",
        "2.5.4.5" => "serialNumber",
        "2.5.4.12" => "title",
        "2.5.4.13" => "description",
        "2.5.4.15" => "businessCategory",
        "2.5.4.17" => "postalCode",
        "2.5.4.41" => "name",
        "2.5.4.42" => "GN",
        "2.5.4.43" => "initials",
        "2.5.4.44" => "generationQualifier",
        "2.5.4.46" => "dnQualifier",
        "2.5.4.65" => "pseudonym",
        "2.5.4.97" => "organizationIdentifier",
        "0.9.2342.19200300.100.1.1" => "UID",
        "0.9.2342.19200300.100.1.25" => "DC",
        "1.2.840.113549.1.9.1" => "emailAddress",
        _ => return None,
    })
}

/// `name` in RFC 2253 form, as openssl prints it.
pub fn rfc2253(name: &X509Name<'_>) -> String {
    let rdns: Vec<_> = name.iter_rdn().collect();
    let mut out = String::new();
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // openssl's dn_rev reverses every component, those of a
        // multi-valued RDN too.
        let attrs: Vec<_> = rdn.iter().collect();
        for (j, attr) in attrs.iter().rev().enumerate() {
            if j > 0 {
                out.push('+');
            }
            let oid = attr.attr_type().to_id_string();
            match short_name(&oid) {
                Some(sn) => {
                    out.push_str(sn);
                    out.push('=');
                    escape(&value(attr), &mut out);
                }
                // Unknown types: the dotted OID and the value's DER in hex.
                None => {
                    out.push_str(&oid);
                    out.push_str("=#");
                    out.push_str(&hex(&der_of(attr)));
                }
            }
        }
    }
    out
}

/// An attribute's value as text (BMPString from UCS-2, T61String read as
/// Latin-1, the other string types as UTF-8).
fn value(attr: &AttributeTypeAndValue<'_>) -> String {
    let v = attr.attr_value();
    match v.tag() {
        Tag::BmpString => {
            let units: Vec<u16> = v
                .data
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))
                .collect();
            String::from_utf16_lossy(&units)
        }
        Tag::T61String => v.data.iter().map(|&b| b as char).collect(),
        _ => String::from_utf8_lossy(v.data).into_owned(),
    }
}

/// The value's DER (tag, length, content).
fn der_of(attr: &AttributeTypeAndValue<'_>) -> Vec<u8> {
    let v = attr.attr_value();
    let mut out = vec![v.tag().0 as u8];
    let len = v.data.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|&b| b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(v.data);
    out
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02X}");
    }
    s
}

/// RFC 2253 / 4514 escapes, as openssl's esc_2253, esc_ctrl and esc_msb.
fn escape(v: &str, out: &mut String) {
    let chars: Vec<char> = v.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let edge = (i == 0 && (c == '#' || c == ' ')) || (i + 1 == chars.len() && c == ' ');
        if matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') || edge {
            out.push('\\');
            out.push(c);
        } else if (c as u32) < 0x20 || c as u32 == 0x7f {
            let _ = write!(out, "\\{:02X}", c as u32);
        } else if (c as u32) >= 0x80 {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "\\{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subject_reads_as_openssl_prints_it_with_nameopt_rfc2253() {
        use rustls::pki_types::pem::PemObject;
        let pem = include_str!("../../tests/fixtures/tls/tricky-subject.pem");
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let settings = TlsConfig::default();
        assert_eq!(
            login_name(&der, &settings).unwrap(),
            "emailAddress=app@example.org,CN=app \\C3\\A9 \\<x\\>,OU=\\#hash+OU=ops,\
             O=Example\\, Inc.,DC=example,DC=org"
        );
        let cn = TlsConfig {
            ssl_cert_login_from: CertLoginFrom::CommonName,
            ..TlsConfig::default()
        };
        assert_eq!(login_name(&der, &cn).unwrap(), "app é <x>");
    }

    #[test]
    fn values_are_escaped_as_openssl_escapes_them() {
        let mut s = String::new();
        escape("a,b+c\"d\\e<f>g;h", &mut s);
        assert_eq!(s, "a\\,b\\+c\\\"d\\\\e\\<f\\>g\\;h");
        s.clear();
        escape("#lead and trail ", &mut s);
        assert_eq!(s, "\\#lead and trail\\ ");
        s.clear();
        escape(" é", &mut s);
        assert_eq!(s, "\\ \\C3\\A9");
    }

    #[test]
    fn a_certificate_names_the_hosts_of_its_subject_alternative_names() {
        let key = rcgen::KeyPair::generate().unwrap();
        let names = vec![
            "node1.example.com".to_string(),
            "*.nodes.example.com".to_string(),
            "10.0.0.1".to_string(),
            "::1".to_string(),
        ];
        let cert = rcgen::CertificateParams::new(names)
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = cert.der();
        for yes in [
            "node1.example.com",
            "NODE1.example.com.",
            "n2.nodes.example.com",
            "10.0.0.1",
            "::1",
        ] {
            assert!(names_host(der, yes), "{yes}");
        }
        for no in [
            "node2.example.com",
            "a.b.nodes.example.com",
            "nodes.example.com",
            "10.0.0.2",
            "example.com",
            "",
        ] {
            assert!(!names_host(der, no), "{no}");
        }
        assert!(!names_host(b"not a certificate", "10.0.0.1"));
    }
}
