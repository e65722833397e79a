//! The single-node tests, one test binary: each module is one concern,
//! and each test starts its own broker on free ports with a temp
//! dir. One binary, not one per file: linking a test binary per file cost
//! CI most of its build time.

#[path = "../common/mod.rs"]
mod common;
#[path = "../helpers/mod.rs"]
mod helpers;
#[path = "../stream_support/mod.rs"]
mod stream_support;

mod api_checks;
mod api_connections;
mod api_guard;
mod backpressure;
mod buffer_pinning;
mod cluster_secret;
mod confirms;
mod connection;
mod consistent_hash_exchange;
mod consume_ack;
mod consumer_timeout;
mod crash;
mod deduplication;
mod definitions;
mod delayed_message_exchange;
mod direct_reply_to;
mod disk_alarm;
mod durability;
mod exchange_routing;
mod federation;
mod federation_rabbitmq;
mod field_tables;
mod fuzz_corpus;
mod get;
mod grafana_dashboard;
mod handshake_refusals;
mod layers;
mod limits;
mod link_tls;
mod management_api;
mod memory_alarm;
mod permissions;
mod policies;
mod prometheus;
mod protocol_errors;
mod publish_consume;
mod queue_features;
mod queue_move;
mod queues;
mod quorum_queues;
mod read_coalescing;
mod redelivered_after_stop;
mod samples;
mod shovel_rabbitmq;
mod shovels;
mod shutdown;
mod single_active_consumer;
mod store_migration;
mod stream_management;
mod stream_protocol;
mod stream_protocol_filtering;
mod stream_readers;
mod stream_single_active;
mod streams;
mod tenancy;
mod tls;
mod topology;
mod transient_paging;
mod ttl_dead_letter;
mod ttl_paged;
mod tx;
mod unbind;
mod users;
mod web_ui;
