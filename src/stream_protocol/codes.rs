//! The stream protocol's command keys and response codes, as RabbitMQ
//! numbers them.

/// The bit a response's key carries.
pub const RESPONSE: u16 = 0x8000;

pub const DECLARE_PUBLISHER: u16 = 1;
pub const PUBLISH: u16 = 2;
pub const PUBLISH_CONFIRM: u16 = 3;
pub const PUBLISH_ERROR: u16 = 4;
pub const QUERY_PUBLISHER_SEQUENCE: u16 = 5;
pub const DELETE_PUBLISHER: u16 = 6;
pub const SUBSCRIBE: u16 = 7;
pub const DELIVER: u16 = 8;
pub const CREDIT: u16 = 9;
pub const STORE_OFFSET: u16 = 10;
pub const QUERY_OFFSET: u16 = 11;
pub const UNSUBSCRIBE: u16 = 12;
pub const CREATE_STREAM: u16 = 13;
pub const DELETE_STREAM: u16 = 14;
pub const METADATA: u16 = 15;
pub const METADATA_UPDATE: u16 = 16;
pub const PEER_PROPERTIES: u16 = 17;
pub const SASL_HANDSHAKE: u16 = 18;
pub const SASL_AUTHENTICATE: u16 = 19;
pub const TUNE: u16 = 20;
pub const OPEN: u16 = 21;
pub const CLOSE: u16 = 22;
pub const HEARTBEAT: u16 = 23;
pub const ROUTE: u16 = 24;
pub const PARTITIONS: u16 = 25;
pub const CONSUMER_UPDATE: u16 = 26;
pub const EXCHANGE_COMMAND_VERSIONS: u16 = 27;
pub const STREAM_STATS: u16 = 28;
pub const CREATE_SUPER_STREAM: u16 = 29;
pub const DELETE_SUPER_STREAM: u16 = 30;

pub const OK: u16 = 0x01;
pub const STREAM_DOES_NOT_EXIST: u16 = 0x02;
pub const SUBSCRIPTION_ID_ALREADY_EXISTS: u16 = 0x03;
pub const SUBSCRIPTION_ID_DOES_NOT_EXIST: u16 = 0x04;
pub const STREAM_ALREADY_EXISTS: u16 = 0x05;
pub const STREAM_NOT_AVAILABLE: u16 = 0x06;
pub const SASL_MECHANISM_NOT_SUPPORTED: u16 = 0x07;
pub const AUTHENTICATION_FAILURE: u16 = 0x08;
pub const SASL_ERROR: u16 = 0x09;
pub const AUTHENTICATION_FAILURE_LOOPBACK: u16 = 0x0b;
pub const VIRTUAL_HOST_ACCESS_FAILURE: u16 = 0x0c;
pub const UNKNOWN_FRAME: u16 = 0x0d;
pub const FRAME_TOO_LARGE: u16 = 0x0e;
pub const INTERNAL_ERROR: u16 = 0x0f;
pub const ACCESS_REFUSED: u16 = 0x10;
pub const PRECONDITION_FAILED: u16 = 0x11;
pub const PUBLISHER_DOES_NOT_EXIST: u16 = 0x12;
pub const NO_OFFSET: u16 = 0x13;

/// The versions of each command this server speaks (min, max), for
/// ExchangeCommandVersions: version 1 of each, publish 2 (a filter value
/// per message; clients turn filtering on by it) and deliver 2 (the
/// committed offset, sent to a client that says it takes it).
pub const VERSIONS: &[(u16, u16, u16)] = &[
    (DECLARE_PUBLISHER, 1, 1),
    (PUBLISH, 1, 2),
    (PUBLISH_CONFIRM, 1, 1),
    (PUBLISH_ERROR, 1, 1),
    (QUERY_PUBLISHER_SEQUENCE, 1, 1),
    (DELETE_PUBLISHER, 1, 1),
    (SUBSCRIBE, 1, 1),
    (DELIVER, 1, 2),
    (CREDIT, 1, 1),
    (STORE_OFFSET, 1, 1),
    (QUERY_OFFSET, 1, 1),
    (UNSUBSCRIBE, 1, 1),
    (CREATE_STREAM, 1, 1),
    (DELETE_STREAM, 1, 1),
    (METADATA, 1, 1),
    (METADATA_UPDATE, 1, 1),
    (PEER_PROPERTIES, 1, 1),
    (SASL_HANDSHAKE, 1, 1),
    (SASL_AUTHENTICATE, 1, 1),
    (TUNE, 1, 1),
    (OPEN, 1, 1),
    (CLOSE, 1, 1),
    (HEARTBEAT, 1, 1),
    (EXCHANGE_COMMAND_VERSIONS, 1, 1),
    (STREAM_STATS, 1, 1),
    (ROUTE, 1, 1),
    (PARTITIONS, 1, 1),
    (CONSUMER_UPDATE, 1, 1),
    (CREATE_SUPER_STREAM, 1, 1),
    (DELETE_SUPER_STREAM, 1, 1),
];
