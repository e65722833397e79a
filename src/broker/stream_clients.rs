//! What the management API shows of a stream protocol connection beyond
//! what every connection has: its publishers and its consumers
//! (RabbitMQ's /api/stream/publishers and /api/stream/consumers). The
//! stream protocol's connections implement `StreamView`; the registry
//! keeps it beside the connection.

/// A stream connection's publishers and consumers, read when asked.
pub trait StreamView: Send + Sync {
    fn publishers(&self) -> Vec<StreamPublisher>;
    fn consumers(&self) -> Vec<StreamConsumer>;
}

/// One publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPublisher {
    pub id: u8,
    pub stream: String,
    /// Its reference ("" without one, as RabbitMQ shows it).
    pub reference: String,
    /// Messages it sent, confirmed, and refused.
    pub published: u64,
    pub confirmed: u64,
    pub errored: u64,
}

/// One consumer (a subscription).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConsumer {
    pub id: u8,
    pub stream: String,
    /// Chunks it may be sent now.
    pub credits: u64,
    /// Messages it was sent.
    pub consumed: u64,
    /// The offset it reads next, and how far behind the stream's end.
    pub offset: u64,
    pub offset_lag: u64,
    /// The properties it subscribed with.
    pub properties: Vec<(String, String)>,
    /// Whether it reads (a single active consumer waiting is not).
    pub active: bool,
}
