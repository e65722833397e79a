//! `ConnCtx`: the state of one open connection that every channel handler
//! may use (its vhost, user, outbox, negotiated limits, the client's
//! capabilities), kept apart from the read loop (connection.rs) so that
//! channels and flow control depend on it and not on the loop.

use std::sync::Arc;

use amq_protocol::protocol::AMQPClass;
use amq_protocol::types::{AMQPValue, FieldTable};
use tokio::sync::watch;

use super::codec;
use super::outbox::Outbox;
use crate::broker::Broker;
use crate::queue::Queue;
use crate::vhost::VHost;

/// What the client said it can do (client-properties capabilities).
#[derive(Debug, Default, Clone, Copy)]
pub struct ClientCaps {
    pub consumer_cancel_notify: bool,
    pub authentication_failure_close: bool,
    pub connection_blocked: bool,
}

/// Connection state every channel handler may use.
pub struct ConnCtx {
    /// This connection's place under connection_max, given back on drop.
    pub(super) _slot: crate::broker::ConnectionSlot,
    /// Its entry in the broker's connection registry (and its user's
    /// channel count), taken out on drop.
    pub registration: crate::broker::connections::Registration,
    /// How the registry closes it.
    pub closer: Arc<Closer>,
    /// What all connections share (reply-to consumers, timeouts).
    pub node: Arc<super::node::Node>,
    pub id: u64,
    pub broker: Arc<Broker>,
    pub vhost: Arc<VHost>,
    pub outbox: Arc<Outbox>,
    pub frame_max: u32,
    pub caps: ClientCaps,
    pub user: String,
    /// What the user may do here (authz.rs).
    pub authz: super::authz::Authz,
    /// Exclusive queues this connection declared (deleted when it closes).
    pub exclusive_queues: Vec<Arc<Queue>>,
    /// The store's completed-flush epoch, for confirms.
    pub flushed: watch::Receiver<u64>,
    /// Whether this connection published since the read loop last looked
    /// (a resource alarm blocks a connection when it publishes).
    pub published: bool,
}

impl ConnCtx {
    /// Waits for a flush if definitions changed since `version` (durable
    /// declare / bind / delete answer only once they are on disk).
    pub async fn sync_definitions(&self, version: u64) -> crate::store::Result<()> {
        if self.broker.store.defs_version() != version {
            self.broker.store.sync().await?;
        }
        Ok(())
    }

    /// Like `sync_definitions`, and on a cluster's leader also when a
    /// durable entity was declared again or passively (no definition
    /// changed here): another connection's declare of it may not be
    /// committed yet, and its declare-ok must not come first.
    pub async fn sync_declared(&self, version: u64, durable: bool) -> crate::store::Result<()> {
        if durable && self.broker.store.delivers_after_commit() {
            return self.broker.store.sync().await;
        }
        self.sync_definitions(version).await
    }

    /// 403 unless the user has `access` to the `kind` ("queue",
    /// "exchange") `name` in this vhost.
    pub fn check(
        &mut self,
        access: crate::access::Access,
        kind: &str,
        name: &str,
    ) -> Result<(), super::error::ProtocolError> {
        self.authz.check(&self.broker.users, access, kind, name)
    }

    /// 403 unless the user's topic permissions on `exchange` (when it is a
    /// topic exchange and they have some there) allow `access` with
    /// `routing_key`.
    pub fn check_topic(
        &mut self,
        access: crate::access::Access,
        exchange: &[u8],
        routing_key: &[u8],
    ) -> Result<(), super::error::ProtocolError> {
        let Some(t) = self.authz.topic_for(&self.broker.users, exchange) else {
            return Ok(());
        };
        let is_topic = self
            .vhost
            .exchange(&t.exchange)
            .is_some_and(|x| x.kind == Some(crate::exchange::ExchangeKind::Topic));
        if !is_topic {
            return Ok(());
        }
        self.authz.check_topic(&t, access, routing_key)
    }

    /// Sends a method frame on `channel`.
    pub fn send(&self, channel: u16, method: AMQPClass) {
        self.outbox
            .send(|out| codec::put_method(out, channel, method));
    }
}

/// Closes a connection from outside (vhost or user deleted, the
/// management API): sets the reason and wakes the read loop, which sends
/// connection.close 320 with it.
pub struct Closer {
    reason: std::sync::OnceLock<String>,
    outbox: std::sync::Weak<Outbox>,
    /// Bytes and reads from the socket (the read loop's, one load and
    /// store per read).
    recv_oct: std::sync::atomic::AtomicU64,
    recv_cnt: std::sync::atomic::AtomicU64,
}

impl Closer {
    pub fn new(outbox: &Arc<Outbox>) -> Closer {
        Closer {
            reason: std::sync::OnceLock::new(),
            outbox: Arc::downgrade(outbox),
            recv_oct: Default::default(),
            recv_cnt: Default::default(),
        }
    }

    /// One read of `n` bytes (only the connection's read loop calls this).
    pub fn received(&self, n: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let (oct, cnt) = (&self.recv_oct, &self.recv_cnt);
        oct.store(oct.load(Relaxed) + n as u64, Relaxed);
        cnt.store(cnt.load(Relaxed) + 1, Relaxed);
    }

    /// Why the connection must close, once asked to.
    pub fn reason(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }
}

impl crate::broker::connections::Control for Closer {
    fn force_close(&self, reason: &str) {
        let _ = self.reason.set(reason.to_string());
        if let Some(outbox) = self.outbox.upgrade() {
            outbox.wake_reader();
        }
    }

    fn io(&self) -> crate::broker::connections::Io {
        use std::sync::atomic::Ordering::Relaxed;
        let (send_oct, send_cnt) = self.outbox.upgrade().map_or((0, 0), |o| o.sent());
        crate::broker::connections::Io {
            recv_oct: self.recv_oct.load(Relaxed),
            recv_cnt: self.recv_cnt.load(Relaxed),
            send_oct,
            send_cnt,
        }
    }
}

/// The capabilities a client announced in its client-properties.
pub fn client_caps(props: &FieldTable) -> ClientCaps {
    let mut caps = ClientCaps::default();
    if let Some(AMQPValue::FieldTable(t)) = props.inner().get("capabilities") {
        let on = |k: &str| matches!(t.inner().get(k), Some(AMQPValue::Boolean(true)));
        caps.consumer_cancel_notify = on("consumer_cancel_notify");
        caps.authentication_failure_close = on("authentication_failure_close");
        caps.connection_blocked = on("connection.blocked");
    }
    caps
}
