//! Frames a stranger to the cluster might send a member's Raft port, for
//! the tests that check it gets nothing for them.

/// A RAFT connection carrying a well-formed vote for a far higher term
/// from member 1 (kind 2): a leader that took it would step down.
pub fn vote() -> Vec<u8> {
    let req = openraft::raft::VoteRequest::<u64>::new(openraft::Vote::new(1 << 40, 1), None);
    let body = bincode::serialize(&req).unwrap();
    let mut vote = vec![b'R'];
    vote.extend_from_slice(&(body.len() as u32 + 1).to_be_bytes());
    vote.push(2);
    vote.extend_from_slice(&body);
    vote
}

/// A PROXY connection with a header claiming a loopback AMQP client,
/// then AMQP's protocol header: a member that took it would answer
/// connection.start.
pub fn proxy() -> Vec<u8> {
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
    forged
}
