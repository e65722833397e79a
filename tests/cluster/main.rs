//! The cluster tests, one test binary: each module is one concern, and
//! starts its own nodes (child processes of the release binary) on
//! free ports with temp dirs. One binary, not one per file: linking
//! a test binary per file cost CI most of its build time. Two cluster
//! tests are binaries of their own, to run alone (cargo runs one test
//! binary at a time): tests/cluster_nemesis.rs loads the machine on
//! purpose, and tests/cluster_large_message.rs, a 100 MiB message over
//! slow links, lost its election deadline beside it.

#[path = "../cluster_support/mod.rs"]
mod cluster_support;
#[path = "../common/mod.rs"]
mod common;
#[path = "../helpers/mod.rs"]
mod helpers;
#[path = "../stream_support/mod.rs"]
mod stream_support;

mod cluster;
mod cluster_alarm;
mod cluster_backpressure;
mod cluster_clients;
mod cluster_commit_delivery;
mod cluster_deduplication;
mod cluster_join;
mod cluster_journal;
mod cluster_links;
mod cluster_ops;
mod cluster_paging;
mod cluster_partition;
mod cluster_paused_leader;
mod cluster_stall;
mod cluster_step_down;
mod cluster_stream_protocol;
mod cluster_streams;
mod cluster_upgrade;
