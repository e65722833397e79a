//! A cluster never leaves its Raft port open: a node given no secret
//! makes one into its data dir (mode 0600) and says how to share it, and
//! whoever cannot prove it gets nothing, neither a carried client (a
//! forged PROXY header naming loopback) nor a Raft message (a forged
//! vote). Silent connections are closed (the handshake has a time limit)
//! and one address may hold only a few that have not proved it. The
//! TLS-between-members case: tests/cluster/cluster_clients.rs.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::child::{free_port, ChildBroker};
use common::forged;
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
    let forged = forged::proxy();
    // Only the secret's challenge comes back (64 bytes), not
    // connection.start.
    let got = stranger(port, &forged).await;
    assert_eq!(got.len(), 64, "a stranger was served: {got:?}");
    // A RAFT connection and a well-formed vote for a higher term from a
    // node the membership names (it would depose a leader it reached):
    // the challenge again, nothing else.
    let mut vote = forged::vote();
    // At least a challenge's and a proof's worth, whatever the vote's size.
    vote.resize(vote.len().max(64), 0);
    let got = stranger(port, &vote).await;
    assert_eq!(got.len(), 64, "a stranger was answered: {got:?}");
    // Still serving, and the log says why the strangers were refused.
    assert_connection_works(&b.connect().await).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("cluster secret"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    b.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_strangers_are_closed_and_one_address_holds_few_connections() {
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
    let _c = b.connect().await;
    let port: u16 = raft.parse().unwrap();
    let connect = || tokio::net::TcpStream::connect(("127.0.0.1", port));
    // Whether the member closed `s`: a silent socket gets nothing, so
    // one still open has nothing to read yet.
    let closed = |s: &tokio::net::TcpStream| {
        let mut buf = [0u8; 1];
        !matches!(s.try_read(&mut buf), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
    };
    // Sixteen silent sockets from one address are held while they may
    // still prove the secret; a seventeenth is closed at once, while
    // they are still open.
    let mut idle = Vec::new();
    for _ in 0..16 {
        idle.push(connect().await.unwrap());
    }
    let mut over = connect().await.unwrap();
    let mut rest = Vec::new();
    let read = over.read_to_end(&mut rest);
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the 17th is closed")
        .ok();
    assert!(rest.is_empty(), "the 17th got {rest:?}");
    assert!(
        idle.iter().all(|s| !closed(s)),
        "the 17th was not refused before the 16 went"
    );
    // The silent ones do not hold the port for good: the handshake has a
    // time limit. Then the address is served again: the challenge comes
    // back for the connecting side's.
    for s in &mut idle {
        let mut got = Vec::new();
        let read = s.read_to_end(&mut got);
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("a silent connection is closed")
            .ok();
        assert!(got.is_empty());
    }
    let mut again = connect().await.unwrap();
    again.write_all(&[7u8; 32]).await.unwrap();
    let mut challenge = [0u8; 64];
    tokio::time::timeout(Duration::from_secs(10), again.read_exact(&mut challenge))
        .await
        .expect("the challenge")
        .expect("served again once they went");
    assert_connection_works(&b.connect().await).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("still to prove the cluster secret"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    b.kill();
}
