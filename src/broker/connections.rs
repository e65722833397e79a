//! The connection registry: every open connection (AMQP 0-9-1 and the
//! stream protocol), with what the
//! management API shows of it and a way to close it. Registering checks
//! the vhost's and the user's connection limits (in RabbitMQ's order) and
//! counts in one step under one lock; connections open and close rarely
//! next to the messages they carry, so nothing on the message path takes
//! it. Each user's open channels are counted on an atomic the user's
//! connections share, for max-channels.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use amq_protocol::types::FieldTable;
use parking_lot::Mutex;

use super::message_sizes::Sizes;
use crate::rates::Rates;

/// What the AMQP layer gives the registry to close a connection.
pub trait Control: Send + Sync {
    /// Closes the connection with 320 CONNECTION_FORCED and `reason`.
    fn force_close(&self, reason: &str);

    /// What its socket carried so far.
    fn io(&self) -> Io {
        Io::default()
    }
}

/// Bytes and socket reads / writes of a connection (RabbitMQ's recv_oct,
/// recv_cnt, send_oct, send_cnt).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Io {
    pub recv_oct: u64,
    pub recv_cnt: u64,
    pub send_oct: u64,
    pub send_cnt: u64,
}

/// The protocol a connection speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Amqp091,
    /// RabbitMQ's stream protocol.
    Stream,
}

impl Protocol {
    /// As the management API names it.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Amqp091 => "AMQP 0-9-1",
            Protocol::Stream => "stream",
        }
    }
}

/// What is known of a connection from its handshake.
#[derive(Debug, Clone)]
pub struct Info {
    pub id: u64,
    pub protocol: Protocol,
    /// "peer -> local", as RabbitMQ names connections.
    pub name: String,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub user: String,
    pub vhost: String,
    /// When it opened, ms since the epoch.
    pub connected_at: u64,
    pub client_properties: FieldTable,
    pub frame_max: u32,
    pub channel_max: u16,
    pub heartbeat: u16,
    pub auth_mechanism: String,
    /// Over TLS (AMQPS, or the stream protocol's TLS port).
    pub tls: bool,
}

/// Messages a channel (or all channels) handled, as rabbitmq_prometheus
/// counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageCounters {
    pub received: u64,
    pub received_confirm: u64,
    pub routed: u64,
    pub unroutable_dropped: u64,
    pub unroutable_returned: u64,
    pub confirmed: u64,
    pub delivered_consume_manual_ack: u64,
    pub delivered_consume_auto_ack: u64,
    pub delivered_get_manual_ack: u64,
    pub delivered_get_auto_ack: u64,
    pub get_empty: u64,
    pub redelivered: u64,
    pub acknowledged: u64,
}

impl MessageCounters {
    /// How many counters there are.
    pub const LEN: usize = 13;

    /// The values, in field order.
    pub fn values(&self) -> [u64; Self::LEN] {
        [
            self.received,
            self.received_confirm,
            self.routed,
            self.unroutable_dropped,
            self.unroutable_returned,
            self.confirmed,
            self.delivered_consume_manual_ack,
            self.delivered_consume_auto_ack,
            self.delivered_get_manual_ack,
            self.delivered_get_auto_ack,
            self.get_empty,
            self.redelivered,
            self.acknowledged,
        ]
    }

    /// Adds `o` in.
    pub fn add(&mut self, o: &MessageCounters) {
        self.received += o.received;
        self.received_confirm += o.received_confirm;
        self.routed += o.routed;
        self.unroutable_dropped += o.unroutable_dropped;
        self.unroutable_returned += o.unroutable_returned;
        self.confirmed += o.confirmed;
        self.delivered_consume_manual_ack += o.delivered_consume_manual_ack;
        self.delivered_consume_auto_ack += o.delivered_consume_auto_ack;
        self.delivered_get_manual_ack += o.delivered_get_manual_ack;
        self.delivered_get_auto_ack += o.delivered_get_auto_ack;
        self.get_empty += o.get_empty;
        self.redelivered += o.redelivered;
        self.acknowledged += o.acknowledged;
    }
}

/// What the management API shows of one channel, read when asked.
#[derive(Debug, Clone, Default)]
pub struct ChannelSnapshot {
    pub counters: MessageCounters,
    /// The sizes of the message bodies it received.
    pub sizes: Sizes,
    /// The counters' rates per second, in `MessageCounters::values` order.
    pub rates: [f64; MessageCounters::LEN],
    pub number: u16,
    pub prefetch: u32,
    pub global_prefetch: u32,
    pub consumers: u32,
    pub unacked: u32,
    pub unconfirmed: u32,
    pub confirm: bool,
    pub transactional: bool,
}

/// A channel as the AMQP layer shows it to the registry.
pub trait ChannelView: Send + Sync {
    /// Its state now.
    fn snapshot(&self) -> ChannelSnapshot;

    /// Samples its counters for their rates (every few seconds).
    fn sample(&self, _now_ms: u64) {}
}

/// An open connection.
pub struct Tracked {
    pub info: Info,
    pub control: Arc<dyn Control>,
    /// Its open channels, by number.
    pub channels: Mutex<std::collections::BTreeMap<u16, Arc<dyn ChannelView>>>,
    /// recv_oct and send_oct, sampled for their rates.
    io_rates: Mutex<Rates<2>>,
    /// A stream connection's publishers and consumers.
    pub stream: Option<Arc<dyn super::stream_clients::StreamView>>,
}

impl Tracked {
    /// A connection known by `info`, closed through `control`.
    pub fn new(info: Info, control: Arc<dyn Control>) -> Tracked {
        Tracked {
            info,
            control,
            channels: Mutex::new(Default::default()),
            io_rates: Mutex::new(Rates::default()),
            stream: None,
        }
    }

    /// A stream connection, whose publishers and consumers `view` shows.
    pub fn with_stream(mut self, view: Arc<dyn super::stream_clients::StreamView>) -> Tracked {
        self.stream = Some(view);
        self
    }

    /// Its socket's counters, and the rates of recv_oct and send_oct.
    pub fn io(&self) -> (Io, [f64; 2]) {
        (self.control.io(), *self.io_rates.lock().per_sec())
    }

    /// Samples its counters and its channels' for their rates.
    pub fn sample(&self, now_ms: u64) {
        let io = self.control.io();
        self.io_rates
            .lock()
            .sample(now_ms, [io.recv_oct, io.send_oct]);
        let views: Vec<_> = self.channels.lock().values().cloned().collect();
        for v in views {
            v.sample(now_ms);
        }
    }

    /// Its channels' state now.
    pub fn channel_snapshots(&self) -> Vec<ChannelSnapshot> {
        let views: Vec<_> = self.channels.lock().values().cloned().collect();
        views.iter().map(|v| v.snapshot()).collect()
    }
}

/// Why a connection was not registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The vhost's max-connections.
    VhostLimit(u64),
    /// The user's max-connections.
    UserLimit(u64),
}

#[derive(Default)]
struct Registry {
    /// Connections ever opened and closed.
    opened: u64,
    closed: u64,
    by_id: HashMap<u64, Arc<Tracked>>,
    per_vhost: HashMap<String, u64>,
    per_user: HashMap<String, u64>,
    /// Open channels by user, shared by the user's connections.
    channels: HashMap<String, Arc<AtomicU64>>,
}

fn decrement(map: &mut HashMap<String, u64>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// Every open connection.
#[derive(Default)]
pub struct Connections {
    inner: Mutex<Registry>,
    /// What closed channels counted (so counters never go back).
    retired: Arc<Mutex<Retired>>,
    /// Channels ever opened and closed.
    channels_opened: Arc<AtomicU64>,
    channels_closed: Arc<AtomicU64>,
}

/// What closed channels counted, in all and per vhost.
#[derive(Default)]
struct Retired {
    all: MessageCounters,
    sizes: Sizes,
    per_vhost: HashMap<String, MessageCounters>,
}

/// Node-wide totals, for metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub connections_opened: u64,
    pub connections_closed: u64,
    pub channels_opened: u64,
    pub channels_closed: u64,
    pub messages: MessageCounters,
    /// The sizes of the message bodies published.
    pub sizes: Sizes,
    /// Open channels that have published (RabbitMQ's publishers).
    pub publishers: u64,
}

impl Connections {
    /// Registers a connection unless its vhost (`vhost_max`) or its user
    /// (`user_max`) has as many as allowed already.
    pub fn register(
        self: &Arc<Self>,
        tracked: Tracked,
        vhost_max: Option<u64>,
        user_max: Option<u64>,
    ) -> Result<Registration, Refused> {
        let mut r = self.inner.lock();
        let info = &tracked.info;
        let in_vhost = r.per_vhost.get(&info.vhost).copied().unwrap_or(0);
        if let Some(max) = vhost_max.filter(|&m| in_vhost >= m) {
            return Err(Refused::VhostLimit(max));
        }
        let of_user = r.per_user.get(&info.user).copied().unwrap_or(0);
        if let Some(max) = user_max.filter(|&m| of_user >= m) {
            return Err(Refused::UserLimit(max));
        }
        let (vhost, user, id) = (info.vhost.clone(), info.user.clone(), info.id);
        *r.per_vhost.entry(vhost).or_default() += 1;
        *r.per_user.entry(user.clone()).or_default() += 1;
        let channels = Arc::clone(r.channels.entry(user).or_default());
        let tracked = Arc::new(tracked);
        r.by_id.insert(id, Arc::clone(&tracked));
        r.opened += 1;
        Ok(Registration {
            registry: Arc::clone(self),
            tracked,
            channels,
        })
    }

    /// Every open connection, by id.
    pub fn list(&self) -> Vec<Arc<Tracked>> {
        let mut all: Vec<_> = self.inner.lock().by_id.values().cloned().collect();
        all.sort_by_key(|t| t.info.id);
        all
    }

    /// The connection with id `id`.
    pub fn get(&self, id: u64) -> Option<Arc<Tracked>> {
        self.inner.lock().by_id.get(&id).cloned()
    }

    /// The connection called `name`.
    pub fn by_name(&self, name: &str) -> Option<Arc<Tracked>> {
        let r = self.inner.lock();
        r.by_id.values().find(|t| t.info.name == name).cloned()
    }

    /// Connections and channels opened and closed, and every channel's
    /// message counters (open ones now, closed ones as they ended).
    pub fn totals(&self) -> Totals {
        let (opened, closed, open) = {
            let r = self.inner.lock();
            (
                r.opened,
                r.closed,
                r.by_id.values().cloned().collect::<Vec<_>>(),
            )
        };
        // Under the retired lock, which a closing channel takes before it
        // leaves its connection: each channel is counted once.
        let retired = self.retired.lock();
        let (mut messages, mut sizes, mut publishers) = (retired.all, retired.sizes, 0);
        for t in open {
            for c in t.channel_snapshots() {
                messages.add(&c.counters);
                sizes.add(&c.sizes);
                publishers += (c.counters.received > 0) as u64;
            }
        }
        drop(retired);
        Totals {
            connections_opened: opened,
            connections_closed: closed,
            channels_opened: self.channels_opened.load(Ordering::Relaxed),
            channels_closed: self.channels_closed.load(Ordering::Relaxed),
            messages,
            sizes,
            publishers,
        }
    }

    /// Every channel's message counters summed per vhost (open ones now,
    /// closed ones as they ended).
    pub fn by_vhost(&self) -> HashMap<String, MessageCounters> {
        let open: Vec<_> = self.inner.lock().by_id.values().cloned().collect();
        let retired = self.retired.lock();
        let mut per = retired.per_vhost.clone();
        for t in open {
            let sum = per.entry(t.info.vhost.clone()).or_default();
            for c in t.channel_snapshots() {
                sum.add(&c.counters);
            }
        }
        per
    }

    /// Forgets what closed channels counted in vhosts `keep` refuses
    /// (deleted ones).
    pub fn retain_vhosts(&self, keep: impl Fn(&str) -> bool) {
        self.retired.lock().per_vhost.retain(|v, _| keep(v));
    }

    /// How many connections are open.
    pub fn count(&self) -> usize {
        self.inner.lock().by_id.len()
    }

    /// Closes every connection to `vhost` with `reason`; how many.
    pub fn close_vhost(&self, vhost: &str, reason: &str) -> usize {
        self.close_where(|i| i.vhost == vhost, reason)
    }

    /// Closes every connection of `user` with `reason`; how many.
    pub fn close_user(&self, user: &str, reason: &str) -> usize {
        self.close_where(|i| i.user == user, reason)
    }

    fn close_where(&self, pick: impl Fn(&Info) -> bool, reason: &str) -> usize {
        let picked: Vec<_> = {
            let r = self.inner.lock();
            r.by_id
                .values()
                .filter(|t| pick(&t.info))
                .cloned()
                .collect()
        };
        for t in &picked {
            t.control.force_close(reason);
        }
        picked.len()
    }

    fn forget(&self, id: u64) {
        let mut r = self.inner.lock();
        let Some(t) = r.by_id.remove(&id) else {
            return;
        };
        r.closed += 1;
        decrement(&mut r.per_vhost, &t.info.vhost);
        decrement(&mut r.per_user, &t.info.user);
        if !r.per_user.contains_key(&t.info.user) {
            r.channels.remove(&t.info.user);
        }
    }
}

/// A registered connection; dropping it takes the connection out.
pub struct Registration {
    registry: Arc<Connections>,
    tracked: Arc<Tracked>,
    channels: Arc<AtomicU64>,
}

impl Registration {
    /// Counts channel `number` (shown by `view`) against the user's
    /// channels, unless `max` are open; it is counted and shown until the
    /// returned slot is dropped.
    pub fn open_channel(
        &self,
        max: Option<u64>,
        number: u16,
        view: Arc<dyn ChannelView>,
    ) -> Option<ChannelSlot> {
        let before = self.channels.fetch_add(1, Ordering::AcqRel);
        if max.is_some_and(|max| before >= max) {
            self.channels.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        self.tracked.channels.lock().insert(number, view);
        self.registry
            .channels_opened
            .fetch_add(1, Ordering::Relaxed);
        Some(ChannelSlot {
            user: Arc::clone(&self.channels),
            tracked: Arc::clone(&self.tracked),
            number,
            retired: Arc::clone(&self.registry.retired),
            closed: Arc::clone(&self.registry.channels_closed),
        })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.forget(self.tracked.info.id);
    }
}

/// One open channel, counted against its user's max-channels and shown
/// with its connection.
pub struct ChannelSlot {
    user: Arc<AtomicU64>,
    tracked: Arc<Tracked>,
    number: u16,
    retired: Arc<Mutex<Retired>>,
    closed: Arc<AtomicU64>,
}

impl Drop for ChannelSlot {
    fn drop(&mut self) {
        self.user.fetch_sub(1, Ordering::AcqRel);
        let mut retired = self.retired.lock();
        let view = self.tracked.channels.lock().remove(&self.number);
        if let Some(v) = view {
            let snapshot = v.snapshot();
            let counters = snapshot.counters;
            retired.all.add(&counters);
            retired.sizes.add(&snapshot.sizes);
            retired
                .per_vhost
                .entry(self.tracked.info.vhost.clone())
                .or_default()
                .add(&counters);
        }
        drop(retired);
        self.closed.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Noop(Mutex<Vec<String>>);
    impl Control for Noop {
        fn force_close(&self, reason: &str) {
            self.0.lock().push(reason.to_string());
        }
    }

    struct NoView;
    impl ChannelView for NoView {
        fn snapshot(&self) -> ChannelSnapshot {
            ChannelSnapshot::default()
        }
    }

    fn tracked(id: u64, user: &str, vhost: &str, control: Arc<Noop>) -> Tracked {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        Tracked::new(
            Info {
                id,
                protocol: Protocol::Amqp091,
                name: format!("c{id}"),
                peer: addr,
                local: addr,
                user: user.into(),
                vhost: vhost.into(),
                connected_at: 0,
                client_properties: FieldTable::default(),
                frame_max: 0,
                channel_max: 0,
                heartbeat: 0,
                auth_mechanism: "PLAIN".into(),
                tls: false,
            },
            control,
        )
    }

    #[test]
    fn limits_count_open_connections_and_channels() {
        let reg = Arc::new(Connections::default());
        let c = Arc::new(Noop(Mutex::new(Vec::new())));
        let a = reg
            .register(tracked(1, "u", "v", Arc::clone(&c)), Some(2), Some(1))
            .unwrap();
        assert_eq!(
            reg.register(tracked(2, "u", "v", Arc::clone(&c)), Some(2), Some(1))
                .err(),
            Some(Refused::UserLimit(1))
        );
        let b = reg
            .register(tracked(3, "w", "v", Arc::clone(&c)), Some(2), None)
            .unwrap();
        assert_eq!(
            reg.register(tracked(4, "x", "v", Arc::clone(&c)), Some(2), None)
                .err(),
            Some(Refused::VhostLimit(2))
        );
        let ch1 = a.open_channel(Some(1), 1, Arc::new(NoView)).unwrap();
        assert!(a.open_channel(Some(1), 2, Arc::new(NoView)).is_none());
        assert_eq!(reg.get(1).unwrap().channel_snapshots().len(), 1);
        drop(ch1);
        assert!(reg.get(1).unwrap().channel_snapshots().is_empty());
        assert!(a.open_channel(Some(1), 3, Arc::new(NoView)).is_some());
        assert_eq!(reg.close_vhost("v", "vhost 'v' is deleted"), 2);
        assert_eq!(c.0.lock().len(), 2);
        drop(a);
        drop(b);
        assert_eq!(reg.count(), 0);
        assert!(reg.inner.lock().per_vhost.is_empty());
    }
}
