//! A cluster never leaves its Raft port open: a node given no secret
//! makes one into its data dir (mode 0600) and says how to share it, and
//! whoever cannot prove it gets nothing, neither a carried client (a
//! forged PROXY header naming loopback) nor a Raft message (a forged
//! vote). The TLS-between-members case: tests/cluster_clients.rs.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::child::{free_port, ChildBroker};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a stranger gets back for `bytes` on the Raft port at `port`
/// before the member closes the connection.
async fn stranger(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the Raft port");
    let _ = s.write_all(bytes).await;
    let mut got = Vec::new();
    let read = s.read_to_end(&mut got);
    let _ = tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the member closes the connection");
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_secret_makes_one_and_strangers_get_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("log");
    let raft = free_port().to_string();
    let peers = format!("1=127.0.0.1:{raft}");
    let b = ChildBroker::spawn(
        &data,
        &log,
        &["--node-id", "1", "--raft-port", &raft, "--peers", &peers],
    );
    // Serving: it leads its one-member cluster.
    let _c = b.connect().await;
    let file = data.join("cluster-secret");
    let mode = std::fs::metadata(&file)
        .expect("a secret")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("--cluster-secret-file"), "{text}");
    let port: u16 = raft.parse().unwrap();
    // A forged PROXY header claiming a loopback client, then AMQP.
    let header = warren::cluster::ProxyHeader {
        client: "127.0.0.1:1".parse().unwrap(),
        service: warren::cluster::Service::Amqp,
        via: 1,
        tls: false,
        certificate: None,
    };
    let body = bincode::serialize(&header).unwrap();
    let mut forged = vec![b'P'];
    forged.extend_from_slice(&(body.len() as u32 + 1).to_be_bytes());
    forged.push(0);
    forged.extend_from_slice(&body);
    forged.extend_from_slice(b"AMQP\x00\x00\x09\x01");
    // Only the secret's challenge comes back (64 bytes), not
    // connection.start.
    let got = stranger(port, &forged).await;
    assert_eq!(got.len(), 64, "a stranger was served: {got:?}");
    // A RAFT connection and a frame: the challenge again, nothing else.
    let mut vote = vec![b'R', 0, 0, 0, 9, 2];
    vote.extend_from_slice(&[0xff; 8]);
    vote.extend_from_slice(&[0u8; 64]);
    let got = stranger(port, &vote).await;
    assert_eq!(got.len(), 64, "a stranger was answered: {got:?}");
    // Still serving, and the log says why the strangers were refused.
    assert_connection_works(&b.connect().await).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("cluster secret"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    b.kill();
}
