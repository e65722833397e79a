//! Where each member serves RabbitMQ's stream protocol, for its Metadata:
//! a node's listeners (server.rs while it leads, server/follow.rs while it
//! follows) set its own address, and while it leads it asks every member
//! for theirs with its resources (resources.rs, rpc.rs `STREAM_END`), so
//! Metadata names the leader for publishers and the members that answer
//! as replicas for consumers, as RabbitMQ's does.

use std::net::SocketAddr;

use super::Cluster;
use crate::config::Config;

/// A member's stream protocol address as its clients reach it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamEnd {
    pub host: String,
    /// The plain listener's port, if it is on.
    pub port: Option<u16>,
    /// The TLS listener's port, if it is on.
    pub tls_port: Option<u16>,
}

impl StreamEnd {
    /// The address of a node whose stream listeners bound `plain` and
    /// `tls`: the configured advertised host, else the node's host in
    /// `--peers` (what the members reach it by), else the bound address;
    /// the configured advertised ports (plain and TLS), else each
    /// listener's. None if neither listener is on.
    pub fn of(c: &Config, plain: Option<SocketAddr>, tls: Option<SocketAddr>) -> Option<StreamEnd> {
        let bound = plain.or(tls)?;
        let host = c.stream_advertised_host.clone();
        let host = host.or_else(|| c.cluster.own_host());
        let port = |a: Option<SocketAddr>, set: Option<u16>| a.map(|a| set.unwrap_or(a.port()));
        Some(StreamEnd {
            host: host.unwrap_or_else(|| bound.ip().to_string()),
            port: port(plain, c.stream_advertised_port),
            tls_port: port(tls, c.stream_advertised_tls_port),
        })
    }

    /// The port a client that spoke TLS (or not) connects to.
    pub fn port_for(&self, tls: bool) -> Option<u16> {
        match tls {
            true => self.tls_port,
            false => self.port,
        }
    }
}

impl Cluster {
    /// Sets where this node's stream listeners are (None: off).
    pub fn set_stream_end(&self, end: Option<StreamEnd>) {
        *self.own_stream_end.write() = end;
    }

    /// Where this node's stream listeners are, if on.
    pub fn stream_end(&self) -> Option<StreamEnd> {
        self.own_stream_end.read().clone()
    }

    /// The other members' stream addresses, as they last answered this
    /// leader (by id; a member that does not answer is left out).
    pub fn member_stream_ends(&self) -> Vec<(u64, StreamEnd)> {
        let ends = self.stream_ends.lock();
        ends.iter().map(|(&id, e)| (id, e.clone())).collect()
    }

    pub(super) fn record_stream_end(&self, id: u64, end: Option<StreamEnd>) {
        let mut ends = self.stream_ends.lock();
        match end {
            Some(e) => ends.insert(id, e),
            None => ends.remove(&id),
        };
    }
}
