//! `warren cluster ...`: the commands that operate a cluster instead of
//! running a node (carried out by admin.rs).

use std::path::PathBuf;

use clap::{Args, Subcommand};

/// What the binary does instead of running a node.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Shows or changes a cluster's membership.
    #[command(subcommand)]
    Cluster(ClusterCommand),
}

/// The membership commands.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Shows the cluster: term, leader, log indexes, every member.
    Status(#[command(flatten)] Api),
    /// Adds node ID, whose Raft listener is at HOST:PORT: it catches up as
    /// a learner, then votes. Start it first with --node-id ID and --peers
    /// listing the cluster and itself.
    Add {
        /// The new node's id.
        id: u64,
        /// Its Raft listener, HOST:PORT.
        raft: String,
        #[command(flatten)]
        api: Api,
    },
    /// Removes node ID from the cluster.
    Remove {
        id: u64,
        #[command(flatten)]
        api: Api,
    },
    /// Replaces node OLD with node NEW at HOST:PORT: adds NEW (once it
    /// caught up), then removes OLD.
    Replace {
        old: u64,
        new: u64,
        /// NEW's Raft listener, HOST:PORT.
        raft: String,
        #[command(flatten)]
        api: Api,
    },
    /// With the node stopped: makes it the only voter of its cluster, so
    /// that the survivor of a two-node mirror leads alone once started.
    /// Never promote both: the other node is started again only with an
    /// empty data directory, and added back.
    Promote {
        /// The stopped node's data directory.
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        /// Its node id.
        #[arg(long, value_name = "N")]
        node_id: u64,
    },
}

/// Where the management API is, and who asks.
#[derive(Debug, Clone, Args)]
pub struct Api {
    /// Any member's management API (a follower carries the request to the
    /// leader).
    #[arg(long, default_value = "http://localhost:15672")]
    pub url: String,
    /// An administrator's name.
    #[arg(long, short = 'u', default_value = "guest")]
    pub user: String,
    /// Its password.
    #[arg(long, short = 'p', default_value = "guest")]
    pub password: String,
    /// PEM CA to verify an https:// API with (else the system's roots).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
}
