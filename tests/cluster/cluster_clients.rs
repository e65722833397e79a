//! Every member serves clients: a follower carries the management API
//! (HTTP and HTTPS), AMQPS with an EXTERNAL login from the client
//! certificate it verified, the stream protocol over TLS, and answers
//! Prometheus for itself. A two-node
//! mirror that lost a node is promoted by hand with `warren cluster
//! promote`, a node is added back with `warren cluster add`, and a lost
//! node is replaced with `warren cluster replace` under load. Over mutual
//! TLS, a certificate from the members' CA that names no member gets
//! nothing, even with the secret: no Raft answer, no vote taken, no
//! client carried by a forged PROXY header.

use crate::cluster_support;
use crate::common::forged;

use std::time::{Duration, Instant};

use cluster_support::total::durable;
use cluster_support::{count, Cluster};
use lapin::options::*;
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use serde_json::{json, Value};

/// Cluster tests share the machine's two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A CA, a node certificate for localhost and 127.0.0.1 with both uses,
/// and a client certificate for CN=app, written into `dir`; returns the
/// `[tls]` config, the CA's PEM and the client's (certificate, key) PEM.
fn certificates(dir: &std::path::Path) -> (String, String, (String, String)) {
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "cluster CA");
    let ca = p.self_signed(&ca_key).unwrap();
    let issue = |names: Vec<String>, cn: &str, uses: Vec<ExtendedKeyUsagePurpose>| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = uses;
        let cert = p.signed_by(&key, &ca, &ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let both = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let node = issue(vec!["localhost".into(), "127.0.0.1".into()], "node", both);
    let client = issue(vec![], "app", vec![ExtendedKeyUsagePurpose::ClientAuth]);
    let (c, k, a) = (
        dir.join("node.pem"),
        dir.join("node.key"),
        dir.join("ca.pem"),
    );
    std::fs::write(&c, &node.0).unwrap();
    std::fs::write(&k, &node.1).unwrap();
    std::fs::write(&a, ca.pem()).unwrap();
    let toml = format!(
        "prometheus_tls_port = \"off\"\n[tls]\ncertfile = {:?}\nkeyfile = {:?}\ncacertfile = {:?}\n",
        c.display().to_string(),
        k.display().to_string(),
        a.display().to_string()
    );
    (toml, ca.pem(), client)
}

/// reqwest over rustls (ring), trusting `ca` if given.
fn http(ca: Option<&str>) -> reqwest::Client {
    use rustls::pki_types::pem::PemObject;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.unwrap_or("").as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
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

/// A request as guest, retried for 30 s until it gets an answer; its
/// status and JSON (or text as a JSON string).
async fn call(
    client: &reqwest::Client,
    method: &str,
    url: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut req = client
            .request(method.parse().unwrap(), url)
            .basic_auth("guest", Some("guest"));
        if let Some(b) = &body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let err = match req.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
                return (status, v);
            }
            Err(e) => e,
        };
        assert!(Instant::now() < deadline, "{url} never answered: {err:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// lapin over TLS to `uri`, trusting `ca`, presenting `client`.
async fn connect_tls(
    uri: &str,
    ca: &str,
    client: Option<&(String, String)>,
) -> lapin::Result<Connection> {
    let config = OwnedTLSConfig {
        identity: client.map(|(cert, key)| OwnedIdentity::PKCS8 {
            pem: cert.clone().into_bytes(),
            key: key.clone().into_bytes(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_carries_the_api_and_amqps_and_answers_metrics_itself() {
    let _one = ONE_AT_A_TIME.lock().await;
    let certs = tempfile::tempdir().unwrap();
    let (toml, ca, client) = certificates(certs.path());
    // Members that proved the secret are trusted with the certificate
    // they verified (TLS alone proves a CA's certificate, which any
    // client may hold).
    let secret = certs.path().join("secret");
    std::fs::write(&secret, "a cluster secret of some length").unwrap();
    let toml = format!(
        "{toml}[cluster]\nsecret_file = {:?}\n",
        secret.display().to_string()
    );
    let c = Cluster::start_with_tls_clients(3, &toml);
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    let f = (leader + 1) % 3;
    let plain = http(None);
    let leader_name = format!("warren-{}@", c.nodes[leader].id);

    // The API through the follower is the leader's.
    let (status, overview) = call(&plain, "GET", &format!("{}/api/overview", c.api(f)), None).await;
    assert_eq!(status, 200, "{overview}");
    let node = overview["node"].as_str().unwrap_or_default();
    assert!(node.starts_with(&leader_name), "{overview}");
    // A change made through it (a user for the client certificate).
    let (status, v) = call(
        &plain,
        "PUT",
        &format!("{}/api/users/CN%3Dapp", c.api(f)),
        Some(json!({"password_hash": "", "tags": ""})),
    )
    .await;
    assert!(status == 201 || status == 204, "{status} {v}");
    let (status, v) = call(
        &plain,
        "PUT",
        &format!("{}/api/permissions/%2F/CN%3Dapp", c.api(f)),
        Some(json!({"configure": ".*", "write": ".*", "read": ".*"})),
    )
    .await;
    assert!(status == 201 || status == 204, "{status} {v}");
    // A node-local health check is about the follower asked.
    let url = format!("{}/api/health/checks/node-is-quorum-critical", c.api(f));
    assert_eq!(call(&plain, "GET", &url, None).await.0, 200);

    // HTTPS through the follower.
    let https = http(Some(&ca));
    let url = format!("https://localhost:{}/api/whoami", c.nodes[f].https);
    let (status, who) = call(&https, "GET", &url, None).await;
    assert_eq!(status, 200, "{who}");
    assert_eq!(who["name"], "guest");

    // AMQPS through the follower, logged in by the certificate it verified.
    let uri = format!(
        "amqps://localhost:{}/%2f?auth_mechanism=external",
        c.nodes[f].amqps
    );
    let conn = connect_tls(&uri, &ca, Some(&client))
        .await
        .expect("EXTERNAL through a follower");
    let ch = conn.create_channel().await.unwrap();
    let q = "carried.tls";
    ch.queue_declare(q.into(), durable(), FieldTable::default())
        .await
        .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let confirm = ch
        .basic_publish(
            "".into(),
            q.into(),
            BasicPublishOptions::default(),
            b"through a follower",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack());
    let got = ch
        .basic_get(q.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the message");
    assert_eq!(got.delivery.data, b"through a follower");
    // The leader shows the connection as the client's own: TLS, its user.
    let (_, conns) = call(
        &plain,
        "GET",
        &format!("{}/api/connections", c.api(leader)),
        None,
    )
    .await;
    let mine = conns
        .as_array()
        .and_then(|a| a.iter().find(|x| x["user"] == "CN=app"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(mine["ssl"], true, "{conns}");
    assert_eq!(mine["peer_host"], "127.0.0.1", "{conns}");
    let _ = conn.close(200, "done".into()).await;
    // Without a certificate, EXTERNAL is refused there too.
    assert!(connect_tls(&uri, &ca, None).await.is_err());

    // The stream protocol over TLS through the follower: Metadata gives
    // the members' TLS ports, the producer reaches the leader and the
    // consumer a replica, each over TLS.
    stream_over_tls(&c, f, &certs.path().join("ca.pem")).await;

    // Each node answers Prometheus for itself.
    let metrics = |i: usize| format!("http://127.0.0.1:{}/metrics", c.nodes[i].prometheus);
    let (_, text) = call(&plain, "GET", &metrics(f), None).await;
    let text = text.as_str().unwrap_or_default().to_string();
    assert!(text.contains("warren_raft_is_leader 0"), "{text}");
    assert!(text.contains("rabbitmq_raft_log_commit_index"), "{text}");
    let (_, text) = call(&plain, "GET", &metrics(leader), None).await;
    let text = text.as_str().unwrap_or_default().to_string();
    assert!(text.contains("warren_raft_is_leader 1"), "{text}");
    c.assert_no_panics();
}

/// Creates a stream through node `i`'s stream TLS port (trusting `ca`),
/// publishes to it and reads it back.
async fn stream_over_tls(c: &Cluster, i: usize, ca: &std::path::Path) {
    use futures::StreamExt;
    use rabbitmq_stream_client::types::{Message, OffsetSpecification};
    use rabbitmq_stream_client::{Environment, TlsConfiguration};
    let tls = TlsConfiguration::builder()
        .add_root_certificates(ca.to_path_buf())
        .build()
        .unwrap();
    let env = Environment::builder()
        .host("127.0.0.1")
        .port(c.nodes[i].stream_tls)
        .tls(tls)
        .build()
        .await
        .expect("the stream protocol over TLS through a follower");
    // The cluster's version is raised to the one streams need soon after
    // its first election.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = env.stream_creator().create("secure").await {
        assert!(Instant::now() < deadline, "never created: {e:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
}

/// Runs `warren` with `args`; its exit status and what it printed.
fn warren(args: &[&str]) -> (bool, String) {
    let bin = std::env::var("WARREN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_warren").into());
    let out = std::process::Command::new(bin)
        .args(args)
        .output()
        .expect("run warren");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Publishes `n` persistent messages to `queue` through node `i`, all
/// confirmed.
async fn publish(c: &Cluster, i: usize, queue: &str, n: usize) {
    let conn = c
        .connect(i, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(queue.into(), durable(), FieldTable::default())
        .await
        .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut pending = Vec::new();
    for k in 0..n {
        pending.push(
            ch.basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                k.to_string().as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap(),
        );
    }
    for p in pending {
        assert!(p.await.unwrap().is_ack());
    }
    let _ = conn.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_node_mirror_is_promoted_by_hand_and_grows_again() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut c = Cluster::start(2);
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    publish(&c, leader, "mirrored", 200).await;
    // The leader's machine is lost; the survivor alone is no majority.
    c.kill(leader);
    let s = 1 - leader;
    // Stopped, promoted, started again: it leads alone, with everything.
    assert!(c.terminate(s, Duration::from_secs(15)), "{}", c.logs_tail());
    let dir = c.nodes[s].dir.display().to_string();
    let id = c.nodes[s].id.to_string();
    let (ok, out) = warren(&["cluster", "promote", "--data-dir", &dir, "--node-id", &id]);
    assert!(ok, "{out}");
    c.spawn(s);
    let (now, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    assert_eq!(now, s);
    assert_eq!(count(&c, s, "mirrored").await, 200);
    publish(&c, s, "mirrored", 1).await;
    // A new node is added with the command line, through the leader's API.
    let n = c.add_node();
    c.spawn_joining(n);
    let raft = format!("127.0.0.1:{}", c.nodes[n].raft);
    let new_id = c.nodes[n].id.to_string();
    let (ok, out) = warren(&["cluster", "add", &new_id, &raft, "--url", &c.api(s)]);
    assert!(ok, "{out}");
    // Asked through the new follower, the cluster has two voters.
    let (ok, out) = warren(&["cluster", "status", "--url", &c.api(n)]);
    assert!(ok, "{out}");
    let status: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    let voters = status["members"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|x| x["voter"] == true).count());
    assert_eq!(voters, 2, "{out}");
    // Promoting a running node is refused (its store is locked).
    let dir = c.nodes[s].dir.display().to_string();
    let (ok, out) = warren(&["cluster", "promote", "--data-dir", &dir, "--node-id", &id]);
    assert!(!ok && out.contains("stop the node first"), "{out}");
    // Wrong credentials get the API's answer.
    let (ok, out) = warren(&["cluster", "status", "--url", &c.api(s), "-p", "wrong"]);
    assert!(!ok && out.contains("401"), "{out}");
    c.assert_no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raft_port_serves_only_who_knows_the_cluster_secret() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "a cluster secret of some length\n").unwrap();
    let toml = format!(
        "[cluster]\nsecret_file = {:?}\n",
        secret.display().to_string()
    );
    let c = Cluster::start_with(3, &toml);
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    // Members know it: a client through a follower is carried to the leader.
    let f = (leader + 1) % 3;
    publish(&c, f, "guarded", 10).await;
    assert_eq!(count(&c, f, "guarded").await, 10);
    // A stranger is challenged, fails, and gets nothing more.
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", c.nodes[leader].raft))
        .await
        .unwrap();
    raw.write_all(&[7u8; 32]).await.unwrap();
    let mut answer = [0u8; 64];
    tokio::time::timeout(Duration::from_secs(10), raw.read_exact(&mut answer))
        .await
        .expect("the challenge is answered")
        .unwrap();
    // A wrong proof, then a proxied client's header.
    raw.write_all(&[0u8; 32]).await.unwrap();
    let _ = raw.write_all(b"P\0\0\0\x05\0abcd").await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), raw.read(&mut buf))
        .await
        .expect("the member closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0, "a stranger was answered: {:?}", &buf[..n]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.log_has(leader, "cluster secret") {
        assert!(Instant::now() < deadline, "{}", c.logs_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.assert_no_panics();
}

/// Over mutual TLS as the holder of `identity` (certificate, key PEM),
/// trusting `ca`: proves `secret` on the Raft port at `port`, sends
/// `bytes`, and returns what the member sends back until it closes the
/// connection or says nothing more for 3 s. None if the handshake or the
/// proof failed.
async fn raft_exchange_as(
    port: u16,
    ca: &str,
    identity: &(String, String),
    secret: &[u8],
    bytes: &[u8],
) -> Option<Vec<u8>> {
    use hmac::Mac;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    type Hmac = hmac::Hmac<sha2::Sha256>;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let chain: Vec<_> = CertificateDer::pem_slice_iter(identity.0.as_bytes())
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_slice(identity.1.as_bytes()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let mut s = connector.connect(name, tcp).await.ok()?;
    // The secret's challenge, as link.rs proves it.
    let mine = [42u8; 32];
    s.write_all(&mine).await.ok()?;
    let mut answer = [0u8; 64];
    s.read_exact(&mut answer).await.ok()?;
    let mut proof = <Hmac as Mac>::new_from_slice(secret).unwrap();
    proof.update(b"C");
    proof.update(&mine);
    proof.update(&answer[..32]);
    s.write_all(&proof.finalize().into_bytes()).await.ok()?;
    // A member that refuses may close before all of it is written.
    let _ = s.write_all(bytes).await;
    let _ = s.flush().await;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    Some(got)
}

/// A RAFT connection asking for the cluster version (VERSION, kind 5, no
/// body).
const VERSION: [u8; 6] = [b'R', 0, 0, 0, 1, 5];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_the_members_ca_that_names_no_member_gets_no_raft_answer() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (tls, ca, client) = certificates(dir.path());
    let secret = b"a cluster secret of some length";
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, secret).unwrap();
    let toml = format!(
        "amqps_port = \"off\"\nmanagement_tls_port = \"off\"\n{tls}[cluster]\nsecret_file = {:?}\n",
        secret_file.display().to_string()
    );
    let c = Cluster::start_with(1, &toml);
    let (leader, term) = c.wait_leader(0, Duration::from_secs(30)).await;
    let port = c.nodes[0].raft;
    // A member's certificate (it names 127.0.0.1) is answered.
    let node = (
        std::fs::read_to_string(dir.path().join("node.pem")).unwrap(),
        std::fs::read_to_string(dir.path().join("node.key")).unwrap(),
    );
    let answer = raft_exchange_as(port, &ca, &node, secret, &VERSION).await;
    assert!(
        answer.is_some_and(|a| !a.is_empty()),
        "a member is answered: {}",
        c.logs_tail()
    );
    // A client's, from the same CA and with the secret, gets nothing
    // back: not a VERSION answer, not a forged vote's, not the
    // connection.start a forged PROXY header would bring.
    for (what, bytes) in [
        ("VERSION", VERSION.to_vec()),
        ("a forged vote", forged::vote()),
        ("a forged PROXY header", forged::proxy()),
    ] {
        let got = raft_exchange_as(port, &ca, &client, secret, &bytes).await;
        assert_eq!(got, Some(vec![]), "{what} from a non-member was answered");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.log_has(0, "names no member") {
        assert!(Instant::now() < deadline, "{}", c.logs_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The vote deposed nobody: past two election timeouts, the same
    // leader in the same term (a deposed single member would have led
    // again in a term above the forged one).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(c.leader(), Some(leader), "{}", c.logs_tail());
    assert_eq!(c.led_term(leader), Some(term), "{}", c.logs_tail());
    // The same PROXY bytes from a member are carried: connection.start.
    let start = raft_exchange_as(port, &ca, &node, secret, &forged::proxy())
        .await
        .unwrap_or_default();
    assert!(
        start.windows(5).any(|w| w == b"PLAIN"),
        "a member's client was not carried: {start:?}"
    );
    c.assert_no_panics();
}

/// Publishes confirmed persistent messages to `queue` through node `i`
/// until `stop` is set; returns how many were confirmed.
async fn publish_until(
    c: &Cluster,
    i: usize,
    queue: &str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> u32 {
    let conn = c
        .connect(i, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(queue.into(), durable(), FieldTable::default())
        .await
        .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirmed = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mut pending = Vec::new();
        for _ in 0..50 {
            pending.push(
                ch.basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    b"while replacing",
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap(),
            );
        }
        for p in pending {
            assert!(p.await.unwrap().is_ack());
            confirmed += 1;
        }
    }
    let _ = conn.close(200, "done".into()).await;
    confirmed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_node_is_replaced_while_clients_publish() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut c = Cluster::start(3);
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    publish(&c, leader, "replaced", 100).await;
    // A follower's machine is lost.
    let lost = (leader + 1) % 3;
    let kept = (leader + 2) % 3;
    c.kill(lost);
    // Clients go on publishing through the leader while node 4 replaces it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let n = c.add_node();
    c.spawn_joining(n);
    let (confirmed, (ok, out)) = {
        let publishing = publish_until(&c, leader, "replaced", stop.clone());
        let replacing = async {
            let raft = format!("127.0.0.1:{}", c.nodes[n].raft);
            let (old, new, url) = (
                c.nodes[lost].id.to_string(),
                c.nodes[n].id.to_string(),
                c.api(leader),
            );
            let done = tokio::task::spawn_blocking(move || {
                warren(&["cluster", "replace", &old, &new, &raft, "--url", &url])
            })
            .await
            .unwrap();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            done
        };
        tokio::join!(publishing, replacing)
    };
    assert!(ok, "{out}\n{}", c.logs_tail());
    assert!(confirmed > 0);
    let (ok, out) = warren(&["cluster", "status", "--url", &c.api(n)]);
    assert!(ok, "{out}");
    let status: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    let mut voters: Vec<u64> = status["members"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|x| x["voter"] == true)
                .filter_map(|x| x["id"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    voters.sort_unstable();
    let mut want = vec![c.nodes[leader].id, c.nodes[kept].id, c.nodes[n].id];
    want.sort_unstable();
    assert_eq!(voters, want, "{out}");
    // The new member counts in the majority: without the other original
    // follower, the leader still confirms.
    c.kill(kept);
    publish(&c, leader, "replaced", 1).await;
    // And it holds everything: with the old leader gone too and the other
    // follower back, the new member and that follower lead with it all.
    c.kill(leader);
    c.spawn(kept);
    let (now, _) = c.wait_leader(0, Duration::from_secs(60)).await;
    assert!(now == n || now == kept, "{now}");
    assert_eq!(count(&c, now, "replaced").await, 100 + confirmed + 1);
    c.assert_no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_is_replicated_and_survives_losing_the_leader() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::start(3);
    let (leader, term) = c.wait_leader(0, Duration::from_secs(30)).await;
    publish(&c, leader, "dlq", 300).await;
    publish(&c, leader, "orders", 1).await;
    let http = http(None);
    let (status, body) = call(
        &http,
        "POST",
        &format!("{}/api/queues/%2F/dlq/actions", c.api(leader)),
        Some(json!({"action": "move", "destination": "orders", "count": 200})),
    )
    .await;
    assert_eq!(
        (status, &body),
        (200, &json!({"moved": 200})),
        "{}",
        c.logs_tail()
    );
    c.kill(leader);
    let (now, _) = c.wait_leader(term, Duration::from_secs(30)).await;
    assert_eq!(count(&c, now, "orders").await, 201);
    assert_eq!(count(&c, now, "dlq").await, 100);
    c.assert_no_panics();
}

/// `warren cluster promote` made any voter the only one: promoting a
/// stopped member of a 3-node cluster whose other two still formed a
/// majority, or one node of a mirror whose peer still ran, made a second
/// leader with a quorum of its own. It is refused unless the mirror has
/// two voters and the other one does not answer, and the node it leaves
/// out never gets a vote from the promoted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_is_refused_unless_the_peer_is_lost_and_the_old_peer_is_fenced() {
    let _one = ONE_AT_A_TIME.lock().await;
    let promote = |c: &Cluster, i: usize| {
        let dir = c.nodes[i].dir.display().to_string();
        let id = c.nodes[i].id.to_string();
        warren(&["cluster", "promote", "--data-dir", &dir, "--node-id", &id])
    };
    {
        let c = Cluster::start(3);
        let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
        let f = (leader + 1) % 3;
        assert!(c.terminate(f, Duration::from_secs(15)), "{}", c.logs_tail());
        let (ok, out) = promote(&c, f);
        assert!(!ok && out.contains("3 voters"), "{out}");
        c.assert_no_panics();
    }
    let c = Cluster::start(2);
    let (leader, _) = c.wait_leader(0, Duration::from_secs(30)).await;
    publish(&c, leader, "mirrored", 100).await;
    let s = 1 - leader;
    assert!(c.terminate(s, Duration::from_secs(15)), "{}", c.logs_tail());
    // Its peer still runs: refused.
    let (ok, out) = promote(&c, s);
    assert!(!ok && out.contains("answers at"), "{out}");
    // The peer is lost: promoted, it leads alone.
    c.kill(leader);
    let (ok, out) = promote(&c, s);
    assert!(ok, "{out}");
    c.spawn(s);
    let (now, term) = c.wait_leader(0, Duration::from_secs(30)).await;
    assert_eq!(now, s);
    publish(&c, s, "mirrored", 1).await;
    // The old peer comes back with its old state: it never leads again,
    // and the promoted node keeps serving everything it confirmed.
    c.spawn(leader);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(c.leader(), Some(s), "{}", c.logs_tail());
    assert_eq!(c.led_term(s), Some(term), "{}", c.logs_tail());
    assert_eq!(count(&c, s, "mirrored").await, 101);
    c.assert_no_panics();
}
