//! Who a member link is from, when members talk over mutual TLS: the CA
//! signs more than member certificates (clients may hold one too), so a
//! certificate the CA signed is not enough. The certificate of a member
//! that connects must name the host of a member's Raft address, as the
//! certificate of the member it connects to must name the host it dialled
//! (link.rs); the members are those the configuration lists and those the
//! Raft membership holds (members added later). A link that fails is
//! closed before anything it sends is read.

use super::link::Link;

/// The host of a Raft address ("host:port", "[v6]:port").
fn host(addr: &str) -> &str {
    addr.rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
}

/// Checks the certificate of the member at the other end of `link`
/// against the hosts of `members` (Raft addresses). A plain link, or one
/// this node made, has nothing to check here.
pub fn check<'a>(link: &Link, members: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
    let Link::Server(tls) = link else {
        return Ok(());
    };
    let Some(cert) = tls.get_ref().1.peer_certificates().and_then(|c| c.first()) else {
        return Err("it presented no certificate".into());
    };
    if members
        .into_iter()
        .any(|m| crate::tls::identity::names_host(cert, host(m)))
    {
        Ok(())
    } else {
        Err(
            "its certificate names no member's host (a certificate from the members' CA is not \
             enough: it must name the member)"
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hosts_of_raft_addresses() {
        assert_eq!(super::host("10.0.0.1:7000"), "10.0.0.1");
        assert_eq!(super::host("[::1]:7000"), "::1");
        assert_eq!(super::host("node1.example.com:7000"), "node1.example.com");
    }
}
