//! AMQPS as clients see it: lapin over TLS (rustls) with the server
//! verified against a CA made here (rcgen), mutual TLS (a client
//! certificate required, one from another CA refused, an expired one
//! refused), SASL EXTERNAL by subject, common name or alternative name,
//! amqprs as a second client, plain AMQP on the TLS port and TLS on the
//! plain port closed cleanly and quickly, certificates reloaded without
//! dropping established connections, the management API and metrics
//! over HTTPS (rabbitmq_http_client), and RabbitMQ's stream protocol over
//! TLS (its Rust client; SASL EXTERNAL there too).

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::certs::*;
use common::*;
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::{options::*, Connection, ConnectionProperties};
use rcgen::DnType;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren::config::{Port, Verify};

fn amqps_uri(addr: std::net::SocketAddr) -> String {
    format!("amqps://guest:guest@localhost:{}/%2f", addr.port())
}

/// lapin over TLS trusting `ca`, with `client` as its certificate.
async fn connect_tls(
    addr: std::net::SocketAddr,
    ca: &str,
    client: Option<&Issued>,
) -> lapin::Result<Connection> {
    connect_tls_uri(&amqps_uri(addr), ca, client).await
}

/// lapin to `uri` trusting `ca`, with `client` as its certificate.
async fn connect_tls_uri(
    uri: &str,
    ca: &str,
    client: Option<&Issued>,
) -> lapin::Result<Connection> {
    let config = OwnedTLSConfig {
        identity: client.map(|c| OwnedIdentity::PKCS8 {
            pem: c.cert.clone().into_bytes(),
            key: c.key.clone().into_bytes(),
        }),
        cert_chain: Some(ca.to_string()),
    };
    let runtime = lapin::runtime::default_runtime().expect("tokio");
    let connect =
        Connection::connect_with_config(uri, ConnectionProperties::default(), config, runtime);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(r) => r,
        Err(_) => panic!("the TLS connection neither opened nor failed in 10 s"),
    }
}

/// Publishes one message and gets it back over `conn`.
async fn round_trip(conn: &Connection, queue: &str) {
    let ch = conn.create_channel().await.expect("channel");
    declare(&ch, queue).await;
    publish(&ch, "", queue, b"over tls").await;
    assert_eq!(
        get_eventually(&ch, queue).await.as_deref(),
        Some(&b"over tls"[..])
    );
}

/// The certificate a raw rustls client is shown by the server at `addr`
/// (its common name's bytes are in it), trusting `ca`.
async fn served_certificate(addr: std::net::SocketAddr, ca: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake");
    let (_, session) = tls.get_ref();
    session.peer_certificates().expect("a certificate")[0].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapin_verifies_the_server_and_talks_amqp_over_tls() {
    let (ca, certs) = ca_and_server("Warren test CA", "localhost");
    let (_b, addr) = start_tls(certs.path(), false).await;

    // No client certificate is needed unless required.
    let conn = connect_tls(addr, &ca.pem(), None).await.expect("AMQPS");
    round_trip(&conn, "tls.q").await;
    // With one, it is checked and accepted.
    let client = ca.issue("app", false, false);
    let with_cert = connect_tls(addr, &ca.pem(), Some(&client))
        .await
        .expect("AMQPS with a client certificate");
    round_trip(&with_cert, "tls.q2").await;

    // A client that trusts another CA refuses the server.
    let other = Ca::new("Another CA");
    assert!(connect_tls(addr, &other.pem(), None).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_missing_foreign_and_expired_client_certificates() {
    let (ca, certs) = ca_and_server("Warren test CA", "localhost");
    let (_b, addr) = start_tls(certs.path(), true).await;

    assert!(
        connect_tls(addr, &ca.pem(), None).await.is_err(),
        "no client certificate: refused (fail_if_no_peer_cert)"
    );
    let foreign = Ca::new("Another CA").issue("intruder", false, false);
    assert!(
        connect_tls(addr, &ca.pem(), Some(&foreign)).await.is_err(),
        "a certificate from another CA: refused"
    );
    let expired = ca.issue("old", false, true);
    assert!(
        connect_tls(addr, &ca.pem(), Some(&expired)).await.is_err(),
        "an expired certificate: refused"
    );
    let good = ca.issue("app", false, false);
    let conn = connect_tls(addr, &ca.pem(), Some(&good))
        .await
        .expect("a good certificate is let in");
    round_trip(&conn, "mtls.q").await;
}

/// Reads from `s` until the end of the stream; false if that took over
/// 5 s.
async fn ends_soon(s: &mut tokio::net::TcpStream) -> bool {
    let mut sink = [0u8; 4096];
    let read_all = async {
        loop {
            match s.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read_all)
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_protocol_on_either_port_is_closed_at_once() {
    let (ca, certs) = ca_and_server("Warren test CA", "localhost");
    let (b, tls_addr) = start_tls(certs.path(), false).await;

    // Plain AMQP to the TLS port.
    let mut s = tokio::net::TcpStream::connect(tls_addr).await.unwrap();
    s.write_all(b"AMQP\x00\x00\x09\x01").await.unwrap();
    assert!(ends_soon(&mut s).await, "closed, not left hanging");

    // A TLS handshake to the plain port: the client's handshake fails fast.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(b.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let attempt = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp);
    let r = tokio::time::timeout(Duration::from_secs(5), attempt).await;
    assert!(matches!(r, Ok(Err(_))), "a quick handshake failure");

    // A peer that connects and says nothing is dropped after the TLS
    // handshake timeout (2 s here).
    let mut idle = tokio::net::TcpStream::connect(tls_addr).await.unwrap();
    assert!(ends_soon(&mut idle).await, "a silent peer is dropped");
    // The broker still serves.
    let conn = connect_tls(tls_addr, &ca.pem(), None).await.expect("AMQPS");
    round_trip(&conn, "still.q").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_reload_without_dropping_connections() {
    let ca = Ca::new("Warren test CA");
    let certs = tempfile::tempdir().unwrap();
    write_files(
        certs.path(),
        &ca.issue("first-certificate", true, false),
        &ca,
    );
    let (b, addr) = start_tls(certs.path(), false).await;
    let before = served_certificate(addr, &ca.pem()).await;
    assert!(contains(&before, b"first-certificate"));
    let conn = connect_tls(addr, &ca.pem(), None).await.expect("AMQPS");

    // A broken file: the reload fails and the old certificate stays.
    std::fs::write(certs.path().join("cert.pem"), "not a certificate").unwrap();
    let server = b.server.as_ref().unwrap();
    assert!(server.reload_tls().is_err());
    assert!(contains(
        &served_certificate(addr, &ca.pem()).await,
        b"first-certificate"
    ));

    write_files(
        certs.path(),
        &ca.issue("second-certificate", true, false),
        &ca,
    );
    server.reload_tls().expect("reload");
    let after = served_certificate(addr, &ca.pem()).await;
    assert!(contains(&after, b"second-certificate"));
    // The connection made before the reload goes on.
    round_trip(&conn, "across.reload").await;
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete("across.reload".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}

/// A reqwest client trusting `ca` (rustls with ring).
fn https_client(ca: &str) -> reqwest::Client {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_management_api_and_metrics_answer_over_https() {
    let (ca, certs) = ca_and_server("Warren test CA", "localhost");
    let (b, _) = start_tls_with(certs.path(), false, |c| {
        c.management_tls_port = Some(Port::On(0));
        c.prometheus_tls_port = Some(Port::On(0));
    })
    .await;
    let server = b.server.as_ref().unwrap();
    let api_port = server.management_tls_addr.expect("HTTPS API").port();
    let metrics_port = server.prometheus_tls_addr.expect("HTTPS metrics").port();

    // rabbitmqadmin's client, over HTTPS.
    let rc = rabbitmq_http_client::api::ClientBuilder::new()
        .with_endpoint(format!("https://localhost:{api_port}/api"))
        .with_basic_auth_credentials("guest", "guest")
        .with_client(https_client(&ca.pem()))
        .build()
        .unwrap();
    let o = rc.overview().await.expect("overview over HTTPS");
    assert_eq!(o.product_name, "Warren");
    assert!(o.listeners.iter().any(|l| l.protocol == "https"));
    assert!(o.listeners.iter().any(|l| l.protocol == "amqp/ssl"));
    rc.declare_queue(
        "/",
        &rabbitmq_http_client::requests::QueueParams::new_durable_classic_queue("https.q", None),
    )
    .await
    .expect("declare over HTTPS");
    assert!(rc
        .list_queues()
        .await
        .unwrap()
        .iter()
        .any(|q| q.name == "https.q"));

    let http = https_client(&ca.pem());
    let metrics = http
        .get(format!("https://localhost:{metrics_port}/metrics"))
        .send()
        .await
        .expect("metrics over HTTPS")
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("rabbitmq_identity_info"), "{metrics}");

    // An administrator may reload the certificates over the API; files
    // that do not load answer 400 and leave the old ones in force.
    let reload = || {
        http.post(format!("https://localhost:{api_port}/api/tls/reload"))
            .basic_auth("guest", Some("guest"))
            .send()
    };
    assert_eq!(reload().await.unwrap().status().as_u16(), 204);
    std::fs::write(certs.path().join("key.pem"), "not a key").unwrap();
    let refused = reload().await.unwrap();
    assert_eq!(refused.status().as_u16(), 400);
    assert!(refused.text().await.unwrap().contains("keyfile"));
    rc.overview()
        .await
        .expect("still served with the old certificate");
}

/// A user without a password, with every permission on "/".
fn add_certificate_user(b: &TestBroker, name: &str) {
    let users = &b.server.as_ref().unwrap().broker.users;
    users
        .put_user(warren::access::User {
            name: name.to_string(),
            password_hash: String::new(),
            algorithm: Default::default(),
            tags: Vec::new(),
            limits: Default::default(),
        })
        .unwrap();
    users.set_permission(name, "/", ".*", ".*", ".*").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_logs_in_the_user_the_certificate_names() {
    let (ca, certs) = ca_and_server("Warren test CA", "localhost");
    let (b, addr) = start_tls(certs.path(), false).await;
    // DER order O, OU, CN: RFC 2253 puts the last first, and escapes ",".
    let client = ca.issue_with(
        &[
            (DnType::OrganizationName, "Example, Inc."),
            (DnType::OrganizationalUnitName, "ops"),
            (DnType::CommonName, "app"),
        ],
        false,
        false,
        &[],
    );
    let dn = "CN=app,OU=ops,O=Example\\, Inc.";
    let uri = format!(
        "amqps://localhost:{}/%2f?auth_mechanism=external",
        addr.port()
    );
    // No such user yet: refused.
    assert!(connect_tls_uri(&uri, &ca.pem(), Some(&client))
        .await
        .is_err());
    add_certificate_user(&b, dn);
    let conn = connect_tls_uri(&uri, &ca.pem(), Some(&client))
        .await
        .expect("EXTERNAL as the certificate's subject");
    round_trip(&conn, "external.q").await;
    // Without a certificate, EXTERNAL is not offered.
    assert!(connect_tls_uri(&uri, &ca.pem(), None).await.is_err());
    // Nor on the plain port.
    let plain = format!("amqp://{}/%2f?auth_mechanism=external", b.addr);
    assert!(Connection::connect(&plain, ConnectionProperties::default())
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_can_take_the_common_name_or_a_subject_alternative_name() {
    let (ca, certs) = ca_and_server("Warren test CA", "localhost");
    let client = ca.issue_with(
        &[
            (DnType::OrganizationName, "Example"),
            (DnType::CommonName, "by-cn"),
        ],
        false,
        false,
        &["first.example", "by-san.example"],
    );
    let uri = |addr: std::net::SocketAddr| {
        format!(
            "amqps://localhost:{}/%2f?auth_mechanism=external",
            addr.port()
        )
    };
    let (b, addr) = start_tls_with(certs.path(), false, |c| {
        c.tls.ssl_cert_login_from = warren::config::CertLoginFrom::CommonName;
    })
    .await;
    add_certificate_user(&b, "by-cn");
    let conn = connect_tls_uri(&uri(addr), &ca.pem(), Some(&client))
        .await
        .expect("EXTERNAL as the common name");
    round_trip(&conn, "cn.q").await;
    drop(b);

    let (b, addr) = start_tls_with(certs.path(), false, |c| {
        c.tls.ssl_cert_login_from = warren::config::CertLoginFrom::SubjectAlternativeName;
        c.tls.ssl_cert_login_san_type = warren::config::SanType::Dns;
        c.tls.ssl_cert_login_san_index = 1;
    })
    .await;
    add_certificate_user(&b, "by-san.example");
    let conn = connect_tls_uri(&uri(addr), &ca.pem(), Some(&client))
        .await
        .expect("EXTERNAL as the second DNS name");
    round_trip(&conn, "san.q").await;
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A second client: amqprs (its rustls TLS adaptor), with and without a
/// client certificate where one is required.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqprs_talks_over_mutual_tls_too() {
    use amqprs::channel::{BasicGetArguments, BasicPublishArguments, QueueDeclareArguments};
    use amqprs::connection::OpenConnectionArguments;
    use amqprs::tls::TlsAdaptor;
    let (ca, certs) = ca_and_server("Warren test CA", "localhost");
    let client = ca.issue("amqprs", false, false);
    let (cert, key) = (
        certs.path().join("client.pem"),
        certs.path().join("client.key"),
    );
    std::fs::write(&cert, &client.cert).unwrap();
    std::fs::write(&key, &client.key).unwrap();
    let ca_file = certs.path().join("ca.pem");
    let (_b, addr) = start_tls(certs.path(), true).await;

    let open = |tls: TlsAdaptor| {
        let mut args = OpenConnectionArguments::new("localhost", addr.port(), "guest", "guest");
        args.tls_adaptor(tls);
        async move {
            tokio::time::timeout(
                Duration::from_secs(10),
                amqprs::connection::Connection::open(&args),
            )
            .await
            .expect("opened or refused within 10 s")
        }
    };
    let without = TlsAdaptor::without_client_auth(Some(&ca_file), "localhost".into()).unwrap();
    assert!(open(without).await.is_err(), "a certificate is required");
    let with = TlsAdaptor::with_client_auth(Some(&ca_file), &cert, &key, "localhost".into())
        .expect("the client's files");
    let conn = open(with).await.expect("amqprs over mutual TLS");
    let ch = conn.open_channel(None).await.unwrap();
    ch.queue_declare(QueueDeclareArguments::new("amqprs.q"))
        .await
        .unwrap();
    ch.basic_publish(
        amqprs::BasicProperties::default(),
        b"from amqprs".to_vec(),
        BasicPublishArguments::new("", "amqprs.q"),
    )
    .await
    .unwrap();
    let mut got = None;
    for _ in 0..100 {
        let mut args = BasicGetArguments::new("amqprs.q");
        args.no_ack = true;
        got = ch.basic_get(args).await.unwrap();
        if got.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got.map(|(_, _, body)| body), Some(b"from amqprs".to_vec()));
    let _ = conn.close().await;
}

/// Node-to-node links (for the Raft port): the node's certificate both
/// ways, the peer's certificate required even where clients may come
/// without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_links_require_a_certificate_from_the_cluster_ca() {
    let (ca, certs) = ca_and_server("Warren cluster CA", "node-1");
    let settings = warren::config::TlsConfig {
        certfile: Some(certs.path().join("cert.pem")),
        keyfile: Some(certs.path().join("key.pem")),
        cacertfile: Some(certs.path().join("ca.pem")),
        // What clients get does not loosen the links.
        verify: Some(Verify::None),
        ..Default::default()
    };
    let node = warren::tls::cluster::cluster(&settings).expect("cluster TLS");
    let no_ca = warren::config::TlsConfig {
        cacertfile: None,
        ..settings.clone()
    };
    assert!(warren::tls::cluster::cluster(&no_ca).is_err());

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&node.server));
    let server = tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for _ in 0..2 {
            let (tcp, _) = listener.accept().await.unwrap();
            let r = acceptor.accept(tcp).await;
            if let Ok(mut s) = r {
                s.write_all(b"ok").await.unwrap();
                s.flush().await.unwrap();
                outcomes.push(true);
            } else {
                outcomes.push(false);
            }
        }
        outcomes
    });
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    // A peer node: accepted, and it verified us.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut peer = tokio_rustls::TlsConnector::from(Arc::clone(&node.client))
        .connect(name.clone(), tcp)
        .await
        .expect("node to node");
    let mut buf = [0u8; 2];
    peer.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ok");
    // Something without a certificate: refused.
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let anonymous = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    if let Ok(mut s) = tokio_rustls::TlsConnector::from(Arc::new(anonymous))
        .connect(name, tcp)
        .await
    {
        // TLS 1.3 reports the refusal on the first read.
        let mut buf = [0u8; 2];
        assert!(s.read_exact(&mut buf).await.is_err());
    }
    assert_eq!(server.await.unwrap(), [true, false]);
}

/// The binary reloads its certificate files on SIGHUP; a connection made
/// before goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate_files() {
    let (ca, certs) = ca_and_server("Warren test CA", "before-sighup");
    let data = tempfile::tempdir().unwrap();
    let tls_port = child::free_port().to_string();
    let (cert, key) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
    let b = child::ChildBroker::spawn(
        data.path(),
        &data.path().join("warren.log"),
        &[
            "--amqps-port",
            &tls_port,
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--management-tls-port",
            "off",
            "--prometheus-tls-port",
            "off",
        ],
    );
    let _plain = b.connect().await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{tls_port}").parse().unwrap();
    assert!(contains(
        &served_certificate(addr, &ca.pem()).await,
        b"before-sighup"
    ));
    let conn = connect_tls(addr, &ca.pem(), None).await.expect("AMQPS");

    write_files(certs.path(), &ca.issue("after-sighup", true, false), &ca);
    b.signal(libc::SIGHUP);
    let mut reloaded = false;
    for _ in 0..100 {
        if contains(&served_certificate(addr, &ca.pem()).await, b"after-sighup") {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reloaded, "SIGHUP reloaded the files: {}", b.log_tail());
    round_trip(&conn, "before.sighup").await;
    assert!(b.is_running());
    assert!(!b.log_tail().contains("panicked"), "{}", b.log_tail());
}

/// RSA (PKCS#1) and EC (SEC1) keys, a chain in certfile (the client
/// trusts only the root), and AMQPS alone with the plain port off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa_and_ec_keys_and_a_chain_serve_amqps_alone() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    let root = std::fs::read_to_string(fixtures.join("root.pem")).unwrap();
    for (chain, key) in [
        ("rsa-chain.pem", "rsa-pkcs1.key"),
        ("ec-chain.pem", "ec-sec1.key"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = config(tmp.path());
        c.port = Port::Off;
        c.amqps_port = Some(Port::On(0));
        c.management_tls_port = Some(Port::Off);
        c.prometheus_tls_port = Some(Port::Off);
        c.tls.certfile = Some(fixtures.join(chain));
        c.tls.keyfile = Some(fixtures.join(key));
        let b = start_in(tmp, c).await;
        let server = b.server.as_ref().unwrap();
        assert_eq!(server.addr.port(), 0, "no plain listener");
        let addr = server.amqps_addr.expect("AMQPS");
        let conn = connect_tls(addr, &root, None)
            .await
            .unwrap_or_else(|e| panic!("{chain}: {e:?}"));
        round_trip(&conn, "alone.q").await;
    }
}

/// A raw stream protocol frame: key, version 1, then `body`.
fn stream_frame(key: u16, body: &[u8]) -> Vec<u8> {
    let mut f = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    f.extend_from_slice(&key.to_be_bytes());
    f.extend_from_slice(&1u16.to_be_bytes());
    f.extend_from_slice(body);
    f
}

/// A stream protocol string: its length (u16), then its bytes.
fn stream_string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u16).to_be_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

/// Reads frames until one with `key` (a response has the high bit set);
/// its body after the key and version.
async fn stream_read<S: tokio::io::AsyncRead + Unpin>(s: &mut S, key: u16) -> Vec<u8> {
    loop {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.expect("a frame");
        let mut f = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut f).await.expect("its body");
        if u16::from_be_bytes([f[0], f[1]]) == key {
            return f[4..].to_vec();
        }
    }
}

/// A stream protocol handshake over TLS with `client`'s certificate, up
/// to SASL: the mechanisms offered and the answer to EXTERNAL (a response
/// code), then (if it was OK) tune and open of "/".
async fn stream_external(
    addr: std::net::SocketAddr,
    ca: &str,
    client: &Issued,
) -> (String, u16, Option<u16>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let chain: Vec<_> = CertificateDer::pem_slice_iter(client.cert.as_bytes())
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_slice(client.key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake");
    let correlation = 1u32.to_be_bytes();
    // Peer properties (none), then the SASL handshake.
    let mut body = correlation.to_vec();
    body.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&stream_frame(17, &body)).await.unwrap();
    stream_read(&mut s, 0x8000 | 17).await;
    s.write_all(&stream_frame(18, &correlation)).await.unwrap();
    let r = stream_read(&mut s, 0x8000 | 18).await;
    let count = u32::from_be_bytes(r[6..10].try_into().unwrap()) as usize;
    let (mut at, mut mechanisms) = (10, Vec::new());
    for _ in 0..count {
        let n = u16::from_be_bytes([r[at], r[at + 1]]) as usize;
        mechanisms.push(String::from_utf8(r[at + 2..at + 2 + n].to_vec()).unwrap());
        at += 2 + n;
    }
    let mut body = correlation.to_vec();
    body.extend_from_slice(&stream_string("EXTERNAL"));
    body.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&stream_frame(19, &body)).await.unwrap();
    let r = stream_read(&mut s, 0x8000 | 19).await;
    let code = u16::from_be_bytes([r[4], r[5]]);
    if code != 1 {
        return (mechanisms.join(" "), code, None);
    }
    // The server's tune; answered with the same values; then open "/".
    let tune = stream_read(&mut s, 20).await;
    s.write_all(&stream_frame(20, &tune)).await.unwrap();
    let mut body = correlation.to_vec();
    body.extend_from_slice(&stream_string("/"));
    s.write_all(&stream_frame(21, &body)).await.unwrap();
    let r = stream_read(&mut s, 0x8000 | 21).await;
    (
        mechanisms.join(" "),
        code,
        Some(u16::from_be_bytes([r[4], r[5]])),
    )
}

/// The stream protocol on its TLS port: RabbitMQ's Rust stream client
/// verifies the server and publishes and consumes over it, and a client
/// certificate logs in with SASL EXTERNAL as on AMQPS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_protocol_over_tls_with_plain_and_external() {
    use futures::StreamExt;
    use rabbitmq_stream_client::types::{Message, OffsetSpecification};
    use rabbitmq_stream_client::{Environment, TlsConfiguration};
    let (ca, certs) = ca_and_server("Warren test CA", "localhost");
    let (b, _) = start_tls_with(certs.path(), false, |c| {
        c.stream_tls_port = Some(Port::On(0));
    })
    .await;
    let server = b.server.as_ref().unwrap();
    assert_eq!(server.stream_addr, None, "the plain stream port is off");
    let addr = server.stream_tls_addr.expect("the stream TLS listener");
    let tls = TlsConfiguration::builder()
        .add_root_certificates(certs.path().join("ca.pem"))
        .build()
        .unwrap();
    let env = Environment::builder()
        .host("localhost")
        .port(addr.port())
        .tls(tls)
        .build()
        .await
        .expect("PLAIN over TLS");
    env.stream_creator().create("secure").await.unwrap();
    let producer = env.producer().build("secure").await.unwrap();
    let m = Message::builder().body(b"over tls".to_vec()).build();
    assert!(producer.send_with_confirm(m).await.unwrap().confirmed());
    let mut consumer = env
        .consumer()
        .offset(OffsetSpecification::First)
        .build("secure")
        .await
        .unwrap();
    let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("a delivery in time")
        .unwrap()
        .unwrap();
    assert_eq!(d.message().data(), Some(&b"over tls"[..]));
    // EXTERNAL: offered with a verified certificate; the user must exist.
    let client = ca.issue("stream-app", false, false);
    let (mechanisms, code, _) = stream_external(addr, &ca.pem(), &client).await;
    assert_eq!(mechanisms, "PLAIN EXTERNAL");
    assert_eq!(code, 0x08, "no such user: authentication failure");
    add_certificate_user(&b, "CN=stream-app");
    let (_, code, opened) = stream_external(addr, &ca.pem(), &client).await;
    assert_eq!((code, opened), (1, Some(1)), "logged in and opened /");
    // Plain bytes on the TLS port are closed at once.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(&stream_frame(17, &[0, 0, 0, 1, 0, 0, 0, 0]))
        .await
        .unwrap();
    assert!(ends_soon(&mut s).await);
}
