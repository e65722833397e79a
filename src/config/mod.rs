//! Configuration: defaults that work with no file, a TOML file
//! (`--config FILE`), and command-line flags, later ones winning.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Parser;
use serde::Deserialize;

mod cluster;
pub mod command;
mod disk;
mod management;
mod port;
mod tls;
pub use cluster::{parse_peers, read_secret, ClusterConfig, Peer};
pub use command::{ClusterCommand, Command};
pub use disk::{parse_bytes, DiskFreeLimit, DEFAULT_DISK_FREE_LIMIT};
pub use management::ManagementConfig;
pub use port::Port;
pub use tls::{CertLoginFrom, SanType, TlsConfig, Verify};

/// The longest read pause that may be configured (1 ms).
pub const MAX_READ_PAUSE_US: u64 = 1_000;

/// Everything that can be set.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the AMQP listener binds.
    pub bind: IpAddr,
    /// AMQP port (0 = any free port, off = no AMQP listener).
    pub port: Port,
    /// AMQPS port (0 = any free port, off = none); unset: 5671 when
    /// `tls.certfile` is set, else off.
    pub amqps_port: Option<Port>,
    /// TLS settings for every TLS listener (RabbitMQ's ssl_options).
    pub tls: TlsConfig,
    /// RabbitMQ's stream protocol port (0 = any free port, off = none);
    /// it binds `bind`.
    pub stream_port: Port,
    /// The stream protocol over TLS (0 = any free port, off = none); unset:
    /// 5551 when `tls.certfile` is set and `stream_port` is on, else off.
    /// It binds `bind` and uses the `[tls]` certificate and client rules.
    pub stream_tls_port: Option<Port>,
    /// The host the stream protocol's Metadata names for this node
    /// (RabbitMQ's stream.advertised_host); unset: the address the client
    /// connected to.
    pub stream_advertised_host: Option<String>,
    /// The port Metadata names (stream.advertised_port); unset: the
    /// listener's.
    pub stream_advertised_port: Option<u16>,
    /// The port Metadata names to a client of the TLS listener
    /// (stream.advertised_tls_port); unset: that listener's.
    pub stream_advertised_tls_port: Option<u16>,
    /// Milliseconds a client has for the AMQP handshake, after TLS's if
    /// any (RabbitMQ's handshake_timeout).
    pub handshake_timeout: u64,
    /// Address the management (HTTP API) listener binds.
    pub management_bind: IpAddr,
    /// Management (HTTP API) port (0 = any free port, off = none).
    pub management_port: Port,
    /// The HTTP API's limits and cross-origin rules (`[management]`).
    pub management: ManagementConfig,
    /// Prometheus metrics port (0 = any free port, off = none); it binds
    /// `management_bind`.
    pub prometheus_port: Port,
    /// HTTPS management API port; unset: 15671 with a certificate.
    pub management_tls_port: Option<Port>,
    /// HTTPS metrics port; unset: 15691 with a certificate.
    pub prometheus_tls_port: Option<Port>,
    /// The HTTPS API's own TLS settings (`[management_tls]`); unset: `tls`.
    pub management_tls: Option<TlsConfig>,
    /// The HTTPS metrics' own TLS settings (`[prometheus_tls]`); unset: `tls`.
    pub prometheus_tls: Option<TlsConfig>,
    /// Where the store lives.
    pub data_dir: PathBuf,
    /// Largest frame the broker proposes at tune, bytes.
    pub frame_max: u32,
    /// Most channels per connection the broker proposes at tune.
    pub channel_max: u16,
    /// Heartbeat interval the broker proposes at tune, seconds (0 = off).
    pub heartbeat: u16,
    /// Largest message body accepted, bytes (RabbitMQ 3.10: 128 MiB).
    pub max_message_size: u64,
    /// Log filter when RUST_LOG is not set.
    pub log_level: String,
    /// The user created on first start.
    pub default_user: String,
    /// Its password.
    pub default_pass: String,
    /// Users that may only connect from loopback (RabbitMQ's loopback_users).
    pub loopback_users: Vec<String>,
    /// sled's page cache, MiB.
    pub store_cache_mb: u64,
    /// Memory alarm threshold as a fraction of the machine's RAM
    /// (RabbitMQ's vm_memory_high_watermark.relative); 0 disables it.
    pub memory_high_watermark: f64,
    /// Memory alarm threshold in MiB; overrides the fraction when set
    /// (vm_memory_high_watermark.absolute).
    pub memory_limit_mb: u64,
    /// Free space on the data directory's filesystem under which the
    /// free-disk alarm is raised (RabbitMQ's disk_free_limit; disk.rs).
    pub disk_free_limit: DiskFreeLimit,
    /// How long the reader pauses between reads of a connection that
    /// streams publishes or acks, microseconds (0 = never pause); see
    /// amqp/coalesce.rs.
    pub read_pause_us: u64,
    /// How long a connection refused during the handshake (a wrong
    /// password, an unknown vhost, a protocol error) is held before its
    /// socket is closed, milliseconds: the client reads the close before
    /// the socket ends, and password guessing slows (RabbitMQ: 3 s).
    pub handshake_close_delay_ms: u64,
    /// A connection whose unsent bytes reach this many is not read, and
    /// its consumers get nothing, until its peer has taken half of them.
    pub outbox_high_water_bytes: u64,
    /// A peer that takes none of what is sent to it for this long is
    /// disconnected, milliseconds (RabbitMQ's tcp_listen_options.send_timeout;
    /// 0 = never).
    pub send_timeout_ms: u64,
    /// Most open connections on the node (0 = no limit; RabbitMQ's
    /// connection_max, unlimited there).
    pub connection_max: u64,
    /// Most consumers on one channel (0 = no limit; RabbitMQ 3.12.14+'s
    /// consumer_max_per_channel, unlimited there).
    pub consumer_max_per_channel: u64,
    /// Most queues in one vhost (0 = no limit; RabbitMQ's max-queues vhost
    /// limit, unlimited there).
    pub vhost_max_queues: u64,
    /// How long a delivery may stay unacked before it is requeued and its
    /// consumer cancelled, milliseconds (0 = never; RabbitMQ's
    /// consumer_timeout). Queue and consumer `x-consumer-timeout` win.
    pub consumer_timeout: u64,
    /// A definitions file (RabbitMQ's JSON) imported at every start
    /// (RabbitMQ's load_definitions); a file with anything wrong stops the
    /// start, naming it.
    pub load_definitions: Option<PathBuf>,
    /// Mirroring (`[cluster]`).
    pub cluster: ClusterConfig,
    /// Static shovels (`[shovels.NAME]`, the keys of a dynamic shovel's
    /// definition), started with the broker (on a cluster's leader); the
    /// broker checks them before it starts (crate::shovel::check_static).
    pub shovels: std::collections::BTreeMap<String, serde_json::Value>,
    /// The directory under which a shovel or federation URI may name TLS
    /// files (`cacertfile`, `certfile`, `keyfile`); none: no URI may name
    /// one. A URI is set by a vhost's policymakers, who must not make the
    /// broker present its own key; every vhost's share the directory.
    pub link_tls_dir: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bind: IpAddr::from([0, 0, 0, 0]),
            port: Port::On(5672),
            amqps_port: None,
            tls: TlsConfig::default(),
            stream_port: Port::On(5552),
            stream_tls_port: None,
            stream_advertised_host: None,
            stream_advertised_port: None,
            stream_advertised_tls_port: None,
            management: ManagementConfig::default(),
            handshake_timeout: 10_000,
            management_bind: IpAddr::from([0, 0, 0, 0]),
            management_port: Port::On(15672),
            prometheus_port: Port::On(15692),
            management_tls_port: None,
            prometheus_tls_port: None,
            management_tls: None,
            prometheus_tls: None,
            data_dir: PathBuf::from("warren-data"),
            cluster: ClusterConfig::default(),
            frame_max: 131_072,
            channel_max: 2047,
            heartbeat: 60,
            max_message_size: 128 << 20,
            log_level: "info".into(),
            default_user: "guest".into(),
            default_pass: "guest".into(),
            loopback_users: vec!["guest".into()],
            store_cache_mb: 64,
            memory_high_watermark: 0.4,
            memory_limit_mb: 0,
            disk_free_limit: DiskFreeLimit::default(),
            read_pause_us: 100,
            handshake_close_delay_ms: 3000,
            outbox_high_water_bytes: 4 << 20,
            send_timeout_ms: 15_000,
            connection_max: 65_536,
            consumer_max_per_channel: 10_000,
            vhost_max_queues: 1_000_000,
            consumer_timeout: 1_800_000,
            load_definitions: None,
            shovels: std::collections::BTreeMap::new(),
            link_tls_dir: None,
        }
    }
}

/// Command-line flags; each overrides the file.
#[derive(Debug, Parser)]
#[command(
    name = "warren",
    version,
    about = "Warren: an AMQP 0-9-1 message broker, a drop-in replacement for RabbitMQ"
)]
pub struct Cli {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on for AMQP [default: 0.0.0.0].
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<IpAddr>,
    /// AMQP port; 0 = any free port, off = none [default: 5672].
    #[arg(long, value_name = "N|off")]
    pub port: Option<Port>,
    /// AMQPS port (default 5671 when a certificate is configured).
    #[arg(long, value_name = "N|off")]
    pub amqps_port: Option<Port>,
    /// PEM server certificate and chain (tls.certfile).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (tls.keyfile).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates for client certificates (tls.cacertfile).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Verify client certificates: peer or none (tls.verify).
    #[arg(long, value_name = "peer|none")]
    pub tls_verify: Option<Verify>,
    /// Refuse TLS clients without a certificate (tls.fail_if_no_peer_cert).
    #[arg(long)]
    pub tls_fail_if_no_peer_cert: bool,
    /// RabbitMQ's stream protocol port; 0 = any free port, off = none
    /// [default: 5552].
    #[arg(long, value_name = "N|off")]
    pub stream_port: Option<Port>,
    /// The stream protocol over TLS; 0 = any free port, off = none
    /// [default: 5551 when a certificate is configured and --stream-port
    /// is on].
    #[arg(long, value_name = "N|off")]
    pub stream_tls_port: Option<Port>,
    /// The host the stream protocol's Metadata names for this node
    /// (behind NAT, containers or a load balancer) [default: the address
    /// the client connected to].
    #[arg(long, value_name = "HOST")]
    pub stream_advertised_host: Option<String>,
    /// The port Metadata names for this node [default: the listener's].
    #[arg(long, value_name = "N")]
    pub stream_advertised_port: Option<u16>,
    /// The port Metadata names for this node to TLS clients [default: the
    /// TLS listener's].
    #[arg(long, value_name = "N")]
    pub stream_advertised_tls_port: Option<u16>,
    /// Address the management HTTP API listens on [default: 0.0.0.0].
    #[arg(long, value_name = "ADDR")]
    pub management_bind: Option<IpAddr>,
    /// Management HTTP API port; 0 = any free port, off = none [default: 15672].
    #[arg(long, value_name = "N|off")]
    pub management_port: Option<Port>,
    /// Prometheus metrics port; 0 = any free port, off = none [default: 15692].
    #[arg(long, value_name = "N|off")]
    pub prometheus_port: Option<Port>,
    /// HTTPS management API port (default 15671 with a certificate).
    #[arg(long, value_name = "N|off")]
    pub management_tls_port: Option<Port>,
    /// HTTPS metrics port (default 15691 with a certificate).
    #[arg(long, value_name = "N|off")]
    pub prometheus_tls_port: Option<Port>,
    /// Data directory [default: ./warren-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// frame_max proposed to clients, bytes; 0 = no limit [default: 131072].
    #[arg(long, value_name = "BYTES")]
    pub frame_max: Option<u32>,
    /// channel_max proposed to clients [default: 2047].
    #[arg(long, value_name = "N")]
    pub channel_max: Option<u16>,
    /// Heartbeat interval proposed to clients, seconds; 0 disables [default: 60].
    #[arg(long, value_name = "SECS")]
    pub heartbeat: Option<u16>,
    /// Largest accepted message body, bytes [default: 134217728].
    #[arg(long, value_name = "BYTES")]
    pub max_message_size: Option<u64>,
    /// Log level or filter (RUST_LOG wins) [default: info].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// sled page cache size, MiB [default: 64].
    #[arg(long, value_name = "MIB")]
    pub store_cache_mb: Option<u64>,
    /// Memory alarm threshold, a fraction of RAM; 0 disables [default: 0.4].
    #[arg(long, value_name = "FRACTION")]
    pub memory_high_watermark: Option<f64>,
    /// Memory alarm threshold in MiB (overrides the fraction).
    #[arg(long, value_name = "MIB")]
    pub memory_limit_mb: Option<u64>,
    /// Free-disk alarm threshold: bytes, a size (50MB, 2GiB) or mem_relative:F [default: 50MB].
    #[arg(long, value_name = "SIZE")]
    pub disk_free_limit: Option<DiskFreeLimit>,
    /// Pause between reads of a streaming connection, microseconds; 0 never pauses [default: 100].
    #[arg(long, value_name = "US")]
    pub read_pause_us: Option<u64>,
    /// How long a connection refused during the handshake is held before it is closed, ms [default: 3000].
    #[arg(long, value_name = "MS")]
    pub handshake_close_delay_ms: Option<u64>,
    /// Unsent bytes at which a connection stops being read [default: 4194304].
    #[arg(long, value_name = "BYTES")]
    pub outbox_high_water_bytes: Option<u64>,
    /// Disconnect a peer that takes nothing for this long, ms; 0 = never [default: 15000].
    #[arg(long, value_name = "MS")]
    pub send_timeout_ms: Option<u64>,
    /// Most open connections on the node; 0 = no limit [default: 65536].
    #[arg(long, value_name = "N")]
    pub connection_max: Option<u64>,
    /// Most consumers on one channel; 0 = no limit [default: 10000].
    #[arg(long, value_name = "N")]
    pub consumer_max_per_channel: Option<u64>,
    /// Most queues in one vhost; 0 = no limit [default: 1000000].
    #[arg(long, value_name = "N")]
    pub vhost_max_queues: Option<u64>,
    /// How long a delivery may stay unacked, ms; 0 = never [default: 1800000].
    #[arg(long, value_name = "MS")]
    pub consumer_timeout: Option<u64>,
    /// Definitions file (RabbitMQ JSON) to import at start (load_definitions).
    #[arg(long = "definitions", value_name = "FILE")]
    pub load_definitions: Option<PathBuf>,
    /// This node's id in a cluster (1 and up); none: a single node.
    #[arg(long, value_name = "N")]
    pub node_id: Option<u64>,
    /// The port of this node's Raft listener (cluster nodes).
    #[arg(long, value_name = "PORT")]
    pub raft_port: Option<u16>,
    /// Every cluster member, this node included: "1=HOST:RAFTPORT,2=...".
    #[arg(long, value_name = "LIST")]
    pub peers: Option<String>,
    /// A file with the secret every member proves it knows on the Raft
    /// port (cluster.secret_file).
    #[arg(long, value_name = "FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Operate a cluster instead of running a node.
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Config {
    /// The AMQPS listener's port: as set, else 5671 with a certificate.
    pub fn amqps_port(&self) -> Port {
        match (self.amqps_port, self.tls.enabled()) {
            (Some(p), _) => p,
            (None, true) => Port::On(5671),
            (None, false) => Port::Off,
        }
    }

    /// The stream protocol's TLS port: as set, else 5551 with a
    /// certificate while the plain stream port is on.
    pub fn stream_tls_port(&self) -> Port {
        let plain = self.stream_port.get().is_some();
        match (self.stream_tls_port, self.tls.enabled() && plain) {
            (Some(p), _) => p,
            (None, true) => Port::On(5551),
            (None, false) => Port::Off,
        }
    }

    /// The HTTPS API's TLS settings, if it has a certificate.
    pub fn management_tls(&self) -> Option<&TlsConfig> {
        self.management_tls
            .as_ref()
            .or(Some(&self.tls))
            .filter(|t| t.enabled())
    }

    /// The HTTPS metrics' TLS settings, if it has a certificate.
    pub fn prometheus_tls(&self) -> Option<&TlsConfig> {
        self.prometheus_tls
            .as_ref()
            .or(Some(&self.tls))
            .filter(|t| t.enabled())
    }

    /// The HTTPS API's port: as set, else 15671 with a certificate.
    pub fn management_tls_port(&self) -> Port {
        match (self.management_tls_port, self.management_tls().is_some()) {
            (Some(p), _) => p,
            (None, true) => Port::On(15671),
            (None, false) => Port::Off,
        }
    }

    /// The HTTPS metrics' port: as set, else 15691 with a certificate.
    pub fn prometheus_tls_port(&self) -> Port {
        match (self.prometheus_tls_port, self.prometheus_tls().is_some()) {
            (Some(p), _) => p,
            (None, true) => Port::On(15691),
            (None, false) => Port::Off,
        }
    }

    /// The AMQP handshake timeout.
    pub fn handshake_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.handshake_timeout)
    }

    /// The send timeout (`send_timeout_ms`, 0 = never).
    pub fn send_timeout(&self) -> std::time::Duration {
        match self.send_timeout_ms {
            0 => std::time::Duration::from_secs(u64::MAX / 4),
            ms => std::time::Duration::from_millis(ms),
        }
    }
}

impl Cli {
    /// Defaults, then the file, then the flags.
    pub fn into_config(self) -> Result<Config, String> {
        let mut c = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
            None => Config::default(),
        };
        if let Some(v) = self.bind {
            c.bind = v;
        }
        if let Some(v) = self.port {
            c.port = v;
        }
        if let Some(v) = self.amqps_port {
            c.amqps_port = Some(v);
        }
        if let Some(v) = self.tls_cert {
            c.tls.certfile = Some(v);
        }
        if let Some(v) = self.tls_key {
            c.tls.keyfile = Some(v);
        }
        if let Some(v) = self.tls_ca {
            c.tls.cacertfile = Some(v);
        }
        if let Some(v) = self.tls_verify {
            c.tls.verify = Some(v);
        }
        if self.tls_fail_if_no_peer_cert {
            c.tls.fail_if_no_peer_cert = true;
        }
        if let Some(v) = self.stream_port {
            c.stream_port = v;
        }
        if let Some(v) = self.stream_tls_port {
            c.stream_tls_port = Some(v);
        }
        if let Some(v) = self.stream_advertised_host {
            c.stream_advertised_host = Some(v);
        }
        if let Some(v) = self.stream_advertised_port {
            c.stream_advertised_port = Some(v);
        }
        if let Some(v) = self.stream_advertised_tls_port {
            c.stream_advertised_tls_port = Some(v);
        }
        if let Some(v) = self.management_bind {
            c.management_bind = v;
        }
        if let Some(v) = self.management_port {
            c.management_port = v;
        }
        if let Some(v) = self.prometheus_port {
            c.prometheus_port = v;
        }
        if let Some(v) = self.management_tls_port {
            c.management_tls_port = Some(v);
        }
        if let Some(v) = self.prometheus_tls_port {
            c.prometheus_tls_port = Some(v);
        }
        if let Some(v) = self.data_dir {
            c.data_dir = v;
        }
        if let Some(v) = self.frame_max {
            c.frame_max = v;
        }
        if let Some(v) = self.channel_max {
            c.channel_max = v;
        }
        if let Some(v) = self.heartbeat {
            c.heartbeat = v;
        }
        if let Some(v) = self.max_message_size {
            c.max_message_size = v;
        }
        if let Some(v) = self.log_level {
            c.log_level = v;
        }
        if let Some(v) = self.store_cache_mb {
            c.store_cache_mb = v;
        }
        if let Some(v) = self.memory_high_watermark {
            c.memory_high_watermark = v;
        }
        if let Some(v) = self.memory_limit_mb {
            c.memory_limit_mb = v;
        }
        if let Some(v) = self.disk_free_limit {
            c.disk_free_limit = v;
        }
        if let Some(v) = self.read_pause_us {
            c.read_pause_us = v;
        }
        if let Some(v) = self.handshake_close_delay_ms {
            c.handshake_close_delay_ms = v;
        }
        if let Some(v) = self.outbox_high_water_bytes {
            c.outbox_high_water_bytes = v;
        }
        if let Some(v) = self.send_timeout_ms {
            c.send_timeout_ms = v;
        }
        if let Some(v) = self.connection_max {
            c.connection_max = v;
        }
        if let Some(v) = self.consumer_max_per_channel {
            c.consumer_max_per_channel = v;
        }
        if let Some(v) = self.vhost_max_queues {
            c.vhost_max_queues = v;
        }
        if let Some(v) = self.load_definitions {
            c.load_definitions = Some(v);
        }
        if let Some(v) = self.consumer_timeout {
            c.consumer_timeout = v;
        }
        if let Some(v) = self.node_id {
            c.cluster.node_id = Some(v);
        }
        if let Some(v) = self.raft_port {
            c.cluster.raft_port = Some(v);
        }
        if let Some(v) = &self.peers {
            c.cluster.peers = parse_peers(v)?;
        }
        if let Some(v) = &self.cluster_secret_file {
            c.cluster.secret_file = Some(v.clone());
        }
        if c.max_message_size > MAX_MESSAGE_SIZE {
            // RabbitMQ refuses more too; the message store keeps lengths
            // below 1 GiB.
            return Err(format!(
                "max_message_size must be at most {MAX_MESSAGE_SIZE} (512 MiB), not {}",
                c.max_message_size
            ));
        }
        c.cluster.check()?;
        c.tls.check()?;
        c.management.check()?;
        c.disk_free_limit.check()?;
        if c.amqps_port.and_then(Port::get).is_some() && !c.tls.enabled() {
            return Err(
                "amqps_port needs tls.certfile and tls.keyfile (--tls-cert, --tls-key)".into(),
            );
        }
        if c.stream_tls_port.and_then(Port::get).is_some() && !c.tls.enabled() {
            return Err(
                "stream_tls_port needs tls.certfile and tls.keyfile (--tls-cert, --tls-key)".into(),
            );
        }
        if c.default_pass.is_empty() {
            return Err(
                "default_pass is blank: a blank password never logs in; give the default user a \
                 password"
                    .into(),
            );
        }
        if c.handshake_timeout == 0 {
            return Err("handshake_timeout must be above 0".into());
        }
        if c.outbox_high_water_bytes < 4096 {
            return Err("outbox_high_water_bytes must be at least 4096".into());
        }
        if c.read_pause_us > MAX_READ_PAUSE_US {
            return Err(format!("read_pause_us must be at most {MAX_READ_PAUSE_US}"));
        }
        if !(0.0..=1.0).contains(&c.memory_high_watermark) {
            return Err("memory_high_watermark must be between 0 and 1".into());
        }
        // 0 means no limit, as in RabbitMQ.
        if c.frame_max != 0 && c.frame_max < crate::wire::FRAME_MIN_SIZE {
            return Err(format!(
                "frame_max must be 0 (no limit) or at least {}",
                crate::wire::FRAME_MIN_SIZE
            ));
        }
        Ok(c)
    }
}

/// The largest max_message_size, as RabbitMQ's.
pub const MAX_MESSAGE_SIZE: u64 = 512 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_message_size_is_at_most_512_mib() {
        let at = |v: &str| Cli::parse_from(["warren", "--max-message-size", v]).into_config();
        assert_eq!(at("536870912").unwrap().max_message_size, 512 << 20);
        let e = at("536870913").unwrap_err();
        assert!(e.contains("at most 536870912"), "{e}");
    }

    #[test]
    fn file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(&path, "port = 6000\nheartbeat = 5\n").unwrap();
        let cli = Cli::parse_from([
            "warren",
            "--config",
            path.to_str().unwrap(),
            "--port",
            "7000",
        ]);
        let c = cli.into_config().unwrap();
        assert_eq!(c.port, Port::On(7000));
        assert_eq!(c.heartbeat, 5);
        assert_eq!(c.frame_max, 131_072);
    }

    #[test]
    fn static_shovels_are_read_with_their_keys_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        let text = "[shovels.orders-in]\nsrc-uri = \"amqp://u:p@rabbit/%2F\"\n\
                    src-queue = \"orders\"\ndest-uri = [\"amqp://u:p@/%2F\"]\n\
                    dest-queue = \"orders\"\nsrc-prefetch-count = 10\n";
        std::fs::write(&path, text).unwrap();
        let c = Cli::parse_from(["warren", "--config", path.to_str().unwrap()])
            .into_config()
            .unwrap();
        let s = &c.shovels["orders-in"];
        assert_eq!(s["src-queue"], "orders");
        assert_eq!(s["src-prefetch-count"], 10);
        assert_eq!(s["dest-uri"][0], "amqp://u:p@/%2F");
    }

    #[test]
    fn tls_listeners_are_on_once_a_certificate_is_configured() {
        let none = Cli::parse_from(["warren"]).into_config().unwrap();
        assert_eq!(none.amqps_port(), Port::Off);
        assert_eq!(none.management_tls_port(), Port::Off);
        assert_eq!(none.prometheus_tls_port(), Port::Off);
        let c = Cli::parse_from([
            "warren",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--port",
            "off",
        ])
        .into_config()
        .unwrap();
        assert_eq!(c.port, Port::Off);
        assert_eq!(c.amqps_port(), Port::On(5671));
        assert_eq!(c.management_tls_port(), Port::On(15671));
        assert_eq!(c.prometheus_tls_port(), Port::On(15691));
        assert_eq!(c.stream_tls_port(), Port::On(5551));
        assert_eq!(none.stream_tls_port(), Port::Off);
        let off = Cli::parse_from([
            "warren",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--amqps-port",
            "off",
        ])
        .into_config()
        .unwrap();
        assert_eq!(off.amqps_port(), Port::Off);
        assert!(Cli::parse_from(["warren", "--amqps-port", "5671"])
            .into_config()
            .is_err());
        // The stream protocol's TLS port follows its plain port unless set.
        let tls = ["warren", "--tls-cert", "c.pem", "--tls-key", "k.pem"];
        let streams_off = [&tls[..], &["--stream-port", "off"]].concat();
        let c = Cli::parse_from(streams_off).into_config().unwrap();
        assert_eq!(c.stream_tls_port(), Port::Off);
        let only_tls = [
            &tls[..],
            &["--stream-port", "off", "--stream-tls-port", "7551"],
        ]
        .concat();
        let c = Cli::parse_from(only_tls).into_config().unwrap();
        assert_eq!(c.stream_tls_port(), Port::On(7551));
        assert!(Cli::parse_from(["warren", "--stream-tls-port", "5551"])
            .into_config()
            .is_err());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(&path, "prot = 1\n").unwrap();
        assert!(
            Cli::parse_from(["warren", "--config", path.to_str().unwrap()])
                .into_config()
                .is_err()
        );
    }
}
