//! Shovels and federation links over TLS, with the options an `amqps://`
//! URI takes in RabbitMQ (its Erlang client's query): the server checked
//! against the URI's `cacertfile` (not the public roots) and against the
//! name `server_name_indication` gives (`disable`: no name checked), a
//! client certificate from `certfile` and `keyfile` (an encrypted key
//! opened with `password`), `verify=verify_none`; and the files read only
//! under the broker's `link_tls_dir`.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::api::{call, get_json};
use common::certs::{start_tls_with, Ca};
use common::counts::{publish_ids, wait_count};
use common::*;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::ExchangeKind;
use serde_json::{json, Value};
use warren::config::Port;

/// The name the AMQPS broker's certificate carries (with a wildcard, and
/// not localhost): a link to it through `localhost` must say so with
/// `server_name_indication`.
const SERVER_NAME: &str = "rabbit.example";
const WILDCARD: &str = "*.wild.example";

/// A directory holding the CA's ca.pem and a server certificate for
/// `SERVER_NAME` and `WILDCARD` (cert.pem, key.pem).
fn server_files(ca: &Ca) -> tempfile::TempDir {
    let key = rcgen::KeyPair::generate().unwrap();
    let names = vec![SERVER_NAME.to_string(), WILDCARD.to_string()];
    let mut p = rcgen::CertificateParams::new(names).unwrap();
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = p.signed_by(&key, &ca.cert, &ca.key).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    dir
}

/// `key_pem` (PKCS#8) encrypted with `password` (PBES2: PBKDF2-SHA256,
/// AES-256-CBC, what `openssl pkcs8 -topk8` writes).
fn encrypted(key_pem: &str, password: &str) -> String {
    let (_, doc) = pkcs8::der::SecretDocument::from_pem(key_pem).unwrap();
    let info = pkcs8::PrivateKeyInfo::try_from(doc.as_bytes()).unwrap();
    let params =
        pkcs8::pkcs5::pbes2::Parameters::pbkdf2_sha256_aes256cbc(2048, b"linksalt", &[7; 16])
            .unwrap();
    let enc = info.encrypt_with_params(params, password).unwrap();
    enc.to_pem("ENCRYPTED PRIVATE KEY", pkcs8::LineEnding::LF)
        .unwrap()
        .to_string()
}

/// The link files: ca.pem, another CA's other-ca.pem, a client
/// certificate (client.pem) with its key in the clear (client.key),
/// encrypted with "s3cret" (client-enc.key), and both in one file
/// (client-both.pem).
fn link_files(ca: &Ca) -> tempfile::TempDir {
    let client = ca.issue("link-client", false, false);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(d.join("other-ca.pem"), Ca::new("other").pem()).unwrap();
    let both = format!("{}{}", client.cert, client.key);
    std::fs::write(d.join("client-both.pem"), both).unwrap();
    std::fs::write(d.join("client.pem"), &client.cert).unwrap();
    std::fs::write(d.join("client.key"), &client.key).unwrap();
    std::fs::write(d.join("client-enc.key"), encrypted(&client.key, "s3cret")).unwrap();
    dir
}

/// A broker with the API whose links read TLS files under `dir`.
async fn runner(dir: Option<&Path>) -> TestBroker {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    c.management_port = Port::On(0);
    c.prometheus_port = Port::On(0);
    c.link_tls_dir = dir.map(Path::to_path_buf);
    start_in(tmp, c).await
}

/// A broker serving AMQPS with the certificate in `certs`, client
/// certificates required, and the API on.
async fn tls_broker(certs: &Path) -> (TestBroker, u16) {
    let (b, addr) = start_tls_with(certs, true, |c| {
        c.management_port = Port::On(0);
        c.prometheus_port = Port::On(0);
    })
    .await;
    (b, addr.port())
}

/// Shovel `name`'s status entry once its state is `want` (or whatever it
/// is after 20 s).
async fn wait_shovel(b: &TestBroker, name: &str, want: &str) -> Value {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let all = get_json(b, "/shovels").await;
        let me = all
            .as_array()
            .and_then(|a| a.iter().find(|s| s["name"] == name).cloned())
            .unwrap_or(Value::Null);
        if me["state"] == want || Instant::now() > until {
            return me;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// PUTs shovel `name` on `b` from its own queue `name` to queue
/// `name`-out of the broker at `dest_uri`; the status code and body.
async fn shovel(b: &TestBroker, name: &str, dest_uri: &str) -> (u16, String) {
    let def = json!({"value": {
        "src-uri": "amqp://guest:guest@/%2F",
        "src-queue": name,
        "dest-uri": dest_uri,
        "dest-queue": format!("{name}-out"),
        "reconnect-delay": 1,
    }});
    call(
        b,
        "PUT",
        &format!("/parameters/shovel/%2f/{name}"),
        Some(def),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shovels_over_amqps_use_the_uris_ca_name_and_client_certificate() {
    let ca = Ca::new("link-ca");
    let server = server_files(&ca);
    let (dest, port) = tls_broker(server.path()).await;
    let files = link_files(&ca);
    let d = files.path().display().to_string();
    let src = runner(Some(files.path())).await;
    let (_sc, sch) = src.channel().await;
    let uri = |q: &str| format!("amqps://guest:guest@localhost:{port}/%2F?{q}");
    let mtls = format!("cacertfile={d}/ca.pem&certfile={d}/client.pem&keyfile={d}/client.key");
    let named = format!("{mtls}&server_name_indication={SERVER_NAME}");

    let cases: &[(&str, String, bool)] = &[
        // The CA, the client certificate, the name the certificate has.
        ("mtls", uri(&named), true),
        // The key encrypted, opened with the URI's password.
        (
            "encrypted",
            uri(&format!(
                "cacertfile={d}/ca.pem&certfile={d}/client.pem&keyfile={d}/client-enc.key\
                 &password=s3cret&server_name_indication={SERVER_NAME}&verify=verify_peer"
            )),
            true,
        ),
        // No name checked: the chain still is.
        ("no-sni", uri(&format!("{mtls}&server_name_indication=disable")), true),
        (
            "no-sni-other-ca",
            uri(&format!(
                "cacertfile={d}/other-ca.pem&certfile={d}/client.pem&keyfile={d}/client.key\
                 &server_name_indication=disable"
            )),
            false,
        ),
        // The certificate and its key in one file, as OTP reads a
        // certfile without a keyfile.
        (
            "combined",
            uri(&format!(
                "cacertfile={d}/ca.pem&certfile={d}/client-both.pem\
                 &server_name_indication={SERVER_NAME}"
            )),
            true,
        ),
        // A name only a wildcard matches: refused unless asked for, as
        // OTP's default check does.
        (
            "wildcard",
            uri(&format!("{mtls}&server_name_indication=a.wild.example")),
            false,
        ),
        (
            "wildcard-https",
            uri(&format!(
                "{mtls}&server_name_indication=a.wild.example&customize_hostname_check=https"
            )),
            true,
        ),
        // Nothing checked; the client certificate still goes.
        (
            "verify-none",
            uri(&format!(
                "certfile={d}/client.pem&keyfile={d}/client.key&verify=verify_none"
            )),
            true,
        ),
        // localhost is not the certificate's name.
        ("wrong-name", uri(&mtls), false),
        // The public roots do not know this CA.
        (
            "public-roots",
            uri(&format!(
                "certfile={d}/client.pem&keyfile={d}/client.key&server_name_indication={SERVER_NAME}"
            )),
            false,
        ),
        (
            "wrong-password",
            uri(&format!(
                "cacertfile={d}/ca.pem&certfile={d}/client.pem&keyfile={d}/client-enc.key\
                 &password=nope&server_name_indication={SERVER_NAME}"
            )),
            false,
        ),
        (
            "no-password",
            uri(&format!(
                "cacertfile={d}/ca.pem&certfile={d}/client.pem&keyfile={d}/client-enc.key\
                 &server_name_indication={SERVER_NAME}"
            )),
            false,
        ),
        // The server requires a client certificate.
        (
            "no-client-cert",
            uri(&format!(
                "cacertfile={d}/ca.pem&server_name_indication={SERVER_NAME}"
            )),
            false,
        ),
    ];
    for (name, dest_uri, _) in cases {
        declare(&sch, name).await;
        publish_ids(&sch, "", name, 10).await;
        let (s, body) = shovel(&src, name, dest_uri).await;
        assert_eq!(s, 201, "{name}: {body}");
    }
    let (dc, _dch) = dest.channel().await;
    for (name, _, moves) in cases {
        let status = wait_shovel(&src, name, if *moves { "running" } else { "terminated" }).await;
        if *moves {
            assert_eq!(status["state"], "running", "{name}: {status}");
            assert_eq!(
                wait_count(&dc, &format!("{name}-out"), 10).await,
                10,
                "{name}"
            );
        } else {
            assert_eq!(status["state"], "terminated", "{name}: {status}");
        }
    }
    let reason = |name: &str| {
        let name = name.to_string();
        let src = &src;
        async move { wait_shovel(src, &name, "terminated").await["reason"].to_string() }
    };
    let r = reason("wrong-name").await;
    assert!(
        r.contains("localhost") && r.contains("not valid for name"),
        "{r}"
    );
    let r = reason("public-roots").await;
    assert!(r.contains("UnknownIssuer"), "{r}");
    let r = reason("wrong-password").await;
    assert!(r.contains("password does not open the key"), "{r}");
    let r = reason("no-password").await;
    assert!(r.contains("the key is encrypted"), "{r}");
    let r = reason("no-sni-other-ca").await;
    assert!(r.contains("UnknownIssuer"), "{r}");
    let r = reason("wildcard").await;
    assert!(r.contains("only by a wildcard"), "{r}");
    let r = reason("no-client-cert").await;
    assert!(r.contains("CertificateRequired"), "{r}");
    // Nothing of the failed ones reached the destination: their queues
    // were never made there.
    let queues = get_json(&dest, "/queues").await.to_string();
    for (name, _, _) in cases.iter().filter(|c| !c.2) {
        let q = format!("\"{name}-out\"");
        assert!(!queues.contains(&q), "{name}: {queues}");
    }
    // The key's password is shown nowhere.
    let shown = get_json(&src, "/shovels").await.to_string();
    assert!(!shown.contains("s3cret"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_files_are_read_only_under_link_tls_dir() {
    let files = tempfile::tempdir().unwrap();
    let d = files.path().display();
    let src = runner(Some(files.path())).await;
    let bad = |q: &str| format!("amqps://guest:guest@localhost:5671/%2F?{q}");
    for (q, says) in [
        (
            "cacertfile=/etc/ssl/certs/ca-certificates.crt".to_string(),
            "not under link_tls_dir",
        ),
        (format!("cacertfile={d}/../ca.pem"), "without '..'"),
        ("cacertfile=ca.pem".to_string(), "absolute path"),
        (format!("keyfile={d}/k.pem"), "keyfile needs a certfile"),
        // The public roots and no name: anything public would pass.
        (
            "server_name_indication=disable".to_string(),
            "checks no name",
        ),
        (
            "fail_if_no_peer_cert=true".to_string(),
            "a TLS server's option",
        ),
        (
            "verify=verify_sometimes".to_string(),
            "verify_peer or verify_none",
        ),
    ] {
        let (s, body) = shovel(&src, "refused", &bad(&q)).await;
        assert_eq!(s, 400, "{q}: {body}");
        assert!(body.contains(says), "{q}: {body}");
    }
    // TLS options on a plain URI would do nothing: refused.
    let plain = format!("amqp://guest:guest@localhost:5672/%2F?cacertfile={d}/ca.pem");
    let (s, body) = shovel(&src, "refused", &plain).await;
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("amqps:// is TLS"), "{body}");
    // The same for a federation upstream.
    let up =
        json!({"value": {"uri": bad("keyfile=/etc/warren/key.pem&certfile=/etc/warren/cert.pem")}});
    let (s, body) = call(
        &src,
        "PUT",
        "/parameters/federation-upstream/%2f/up",
        Some(up),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("not under link_tls_dir"), "{body}");
    assert_eq!(get_json(&src, "/parameters/shovel").await, json!([]));

    // A broker without link_tls_dir reads no file at all, and says how
    // to allow it; options without files still work.
    let other = runner(None).await;
    let (s, body) = shovel(&other, "refused", &bad(&format!("cacertfile={d}/ca.pem"))).await;
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("link_tls_dir names the directory"), "{body}");
    let (s, body) = shovel(&other, "fine", &bad("verify=verify_none")).await;
    assert_eq!(s, 201, "{body}");
    let (s, body) = call(&other, "DELETE", "/shovels/vhost/%2f/fine", None).await;
    assert_eq!(s, 204, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn federation_links_over_amqps_present_the_uris_client_certificate() {
    let ca = Ca::new("link-ca");
    let server = server_files(&ca);
    let (up, port) = tls_broker(server.path()).await;
    let files = link_files(&ca);
    let d = files.path().display().to_string();
    let down = runner(Some(files.path())).await;
    for (b, name) in [(&up, "upstream-site"), (&down, "downstream-site")] {
        let (s, body) = call(b, "PUT", "/cluster-name", Some(json!({"name": name}))).await;
        assert_eq!(s, 204, "{body}");
    }
    let uri = format!(
        "amqps://guest:guest@localhost:{port}/%2F?cacertfile={d}/ca.pem&certfile={d}/client.pem\
         &keyfile={d}/client-enc.key&password=s3cret&server_name_indication={SERVER_NAME}"
    );
    let value = json!({"value": {"uri": uri, "reconnect-delay": 1}});
    let (s, body) = call(
        &down,
        "PUT",
        "/parameters/federation-upstream/%2f/up",
        Some(value),
    )
    .await;
    assert!(s == 201 || s == 204, "{body}");
    let policy = json!({"pattern": "^fed", "apply-to": "exchanges",
        "definition": {"federation-upstream": "up"}});
    let (s, body) = call(&down, "PUT", "/policies/%2f/federate", Some(policy)).await;
    assert!(s == 201 || s == 204, "{body}");

    let (dc, dch) = down.channel().await;
    dch.exchange_declare(
        "fed.x".into(),
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("exchange");
    declare(&dch, "here").await;
    dch.queue_bind(
        "here".into(),
        "fed.x".into(),
        "k".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("bind");
    // Running, with the upstream's own cluster name (read over TLS too).
    let until = Instant::now() + Duration::from_secs(30);
    let links = loop {
        let links = get_json(&down, "/federation-links").await;
        if links[0]["status"] == "running" || Instant::now() > until {
            break links;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(links[0]["status"], "running", "{links}");
    assert_eq!(links[0]["upstream"], "up", "{links}");
    // The link's binding reaches the upstream, then its messages come.
    let (_uc, uch) = up.channel().await;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let b = get_json(&up, "/exchanges/%2f/fed.x/bindings/source").await;
        if b.as_array().is_some_and(|a| !a.is_empty()) || Instant::now() > until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    publish_ids(&uch, "fed.x", "k", 20).await;
    assert_eq!(wait_count(&dc, "here", 20).await, 20);
}
