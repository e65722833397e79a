//! Network namespaces for cluster tests: each node in its own namespace,
//! joined to the test by a bridge; partitions by blackhole routes inside
//! a node's namespace, slow links by tc. Needs root and iproute2 (.ci/run
//! installs it and sets WARREN_REQUIRE_NETNS, so there a test cannot
//! skip).

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether a test without namespaces must fail rather than skip.
pub fn required() -> bool {
    std::env::var_os("WARREN_REQUIRE_NETNS").is_some()
}

/// Namespaces on a bridge, one per node; removed on drop.
pub struct Net {
    tag: String,
    prefix: String,
    made: Vec<String>,
    /// How many namespaces.
    count: usize,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

impl Net {
    /// Three namespaces on a bridge, or None where they cannot be made
    /// (not root, no iproute2).
    pub fn new() -> Option<Net> {
        Self::with(3)
    }

    /// `count` namespaces on a bridge (see `new`).
    pub fn with(count: usize) -> Option<Net> {
        // Named for this process and this net within it: the cluster
        // tests share one process, and two of them may make nets at once.
        static MADE: AtomicU32 = AtomicU32::new(0);
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let letter = char::from(b'a' + (n % 26) as u8);
        let tag = format!("{}{letter}", pid % 100_000);
        let prefix = format!("10.{}.{}", 200 + pid % 50, ((pid / 50) + n) % 250);
        let mut net = Net {
            tag: tag.clone(),
            prefix: prefix.clone(),
            made: Vec::new(),
            count,
        };
        let br = format!("wb{tag}");
        if !ip(&["link", "add", &br, "type", "bridge"]) {
            return None;
        }
        net.made.push(format!("link:{br}"));
        let up = ip(&["link", "set", &br, "up"])
            && ip(&["addr", "add", &format!("{prefix}.254/24"), "dev", &br]);
        if !up {
            return None;
        }
        for i in 1..=count {
            let ns = net.ns(i);
            let (v, peer) = (format!("wv{tag}{i}"), format!("wp{tag}{i}"));
            let ok = ip(&["netns", "add", &ns])
                && {
                    net.made.push(format!("netns:{ns}"));
                    true
                }
                && ip(&["link", "add", &v, "type", "veth", "peer", "name", &peer])
                && {
                    net.made.push(format!("link:{v}"));
                    true
                }
                && ip(&["link", "set", &peer, "netns", &ns])
                && ip(&["link", "set", &v, "master", &br])
                && ip(&["link", "set", &v, "up"])
                && ip(&[
                    "netns",
                    "exec",
                    &ns,
                    "ip",
                    "addr",
                    "add",
                    &format!("{}/24", net.host(i)),
                    "dev",
                    &peer,
                ])
                && ip(&["netns", "exec", &ns, "ip", "link", "set", &peer, "up"])
                && ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
            if !ok {
                return None;
            }
        }
        Some(net)
    }

    /// The namespace of node `i` (1-based).
    pub fn ns(&self, i: usize) -> String {
        format!("wn{}-{i}", self.tag)
    }

    /// The address of node `i` (1-based).
    pub fn host(&self, i: usize) -> String {
        format!("{}.{i}", self.prefix)
    }

    /// Cuts node `i` (1-based) off from the other nodes, or heals it.
    pub fn isolate(&self, i: usize, cut: bool) {
        for j in 1..=self.count {
            if j != i {
                let verb = if cut { "add" } else { "del" };
                let dst = format!("{}/32", self.host(j));
                assert!(
                    ip(&[
                        "netns",
                        "exec",
                        &self.ns(i),
                        "ip",
                        "route",
                        verb,
                        "blackhole",
                        &dst
                    ]),
                    "ip route {verb} blackhole {dst}"
                );
            }
        }
    }
}

impl Net {
    /// Node `i`'s (1-based) interface, inside its namespace.
    pub fn dev(&self, i: usize) -> String {
        format!("wp{}{i}", self.tag)
    }

    /// Limits what node `i` (1-based) sends to `rate` (tc's syntax, e.g.
    /// "100mbit").
    pub fn limit(&self, i: usize, rate: &str) {
        let dev = self.dev(i);
        let ok = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns(i),
                "tc",
                "qdisc",
                "add",
                "dev",
                &dev,
            ])
            .args([
                "root", "tbf", "rate", rate, "burst", "64kb", "latency", "100ms",
            ])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "tc qdisc add dev {dev} root tbf rate {rate}");
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for m in self.made.iter().rev() {
            match m.split_once(':') {
                Some(("link", l)) => {
                    ip(&["link", "del", l]);
                }
                Some(("netns", n)) => {
                    ip(&["netns", "del", n]);
                }
                _ => {}
            }
        }
    }
}
