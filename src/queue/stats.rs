//! What the management API and metrics show of a queue: its depth and
//! consumers, the policies in force, and message counters with their
//! rates. The counters are plain integers in the queue's state, bumped
//! under the lock each operation already holds: no atomic and no lock of
//! their own per message. A sampler calls `sample` every few seconds; a
//! queue keeps its last sample and rates, and a history of the last minutes
//! only while its depth or counters change (an idle queue keeps none).

use super::Queue;
use crate::message::Message;
use crate::rates::Rates;

/// Counted operations, in the order `Counters::ALL` names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub publish: u64,
    pub deliver: u64,
    pub deliver_no_ack: u64,
    pub get: u64,
    pub get_no_ack: u64,
    pub ack: u64,
    pub redeliver: u64,
}

impl Counters {
    /// RabbitMQ's names for them.
    pub const NAMES: [&'static str; 7] = [
        "publish",
        "deliver",
        "deliver_no_ack",
        "get",
        "get_no_ack",
        "ack",
        "redeliver",
    ];

    /// The values, in `NAMES` order.
    pub fn values(&self) -> [u64; 7] {
        [
            self.publish,
            self.deliver,
            self.deliver_no_ack,
            self.get,
            self.get_no_ack,
            self.ack,
            self.redeliver,
        ]
    }
}

/// What a queue's history holds, by the API's names: three depths, then
/// three running totals.
pub const HISTORY: [&str; 6] = [
    "messages",
    "messages_ready",
    "messages_unacknowledged",
    "publish",
    "deliver_get",
    "ack",
];

/// Counters and their rates.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub counters: Counters,
    sampled: Rates<7>,
}

impl Stats {
    /// Takes a sample at `now_ms`: the rates since the previous one.
    pub fn sample(&mut self, now_ms: u64) {
        self.sampled.sample(now_ms, self.counters.values());
    }

    /// Per second, between the last two samples, in `Counters::NAMES` order.
    pub fn rates(&self) -> &[f64; 7] {
        self.sampled.per_sec()
    }
}

/// A queue as the API shows it, read in one go.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub ready: u64,
    pub unacked: u64,
    pub consumers: u32,
    /// Body bytes of the ready and the unacked messages.
    pub ready_bytes: u64,
    pub unacked_bytes: u64,
    /// Ready messages in memory, and their body bytes.
    pub ready_ram: u64,
    pub ready_ram_bytes: u64,
    /// Ready messages left in the store only, and their body bytes.
    pub paged_out: u64,
    pub paged_out_bytes: u64,
    /// About how much memory the queue holds, bytes: its ready messages
    /// in memory and their entries, its unacked messages, its consumers
    /// and its bookkeeping.
    pub memory: u64,
    pub policy: Option<String>,
    pub operator_policy: Option<String>,
    /// When it was last used, ms since the epoch.
    pub idle_since: u64,
    pub stats: Stats,
    /// The change per second of messages, ready and unacked between the
    /// sampler's last two samples.
    pub depth_rates: [f64; 3],
}

/// A queue's depth and consumers, for sums over many queues.
#[derive(Debug, Clone, Copy, Default)]
pub struct Depth {
    pub ready: u64,
    pub unacked: u64,
    pub consumers: u32,
}

impl Queue {
    /// Its depth and consumers now (cheaper than a snapshot).
    pub fn depth(&self) -> Depth {
        if let Some(s) = &self.stream {
            return Depth {
                ready: s.extent().messages(),
                unacked: 0,
                consumers: s.readers() as u32,
            };
        }
        let st = self.state.lock();
        Depth {
            ready: st.ready.len() as u64,
            unacked: st.unacked as u64,
            consumers: st.consumers.len() as u32,
        }
    }

    /// Its state now.
    pub fn snapshot(&self) -> Snapshot {
        let mut st = self.state.lock();
        if let Some(s) = &self.stream {
            s.counters(&mut st.stats.counters);
        }
        let (ready_ram, ready_ram_bytes) = st.ready.in_memory();
        let (paged_out, paged_out_bytes) = st.ready.paged_out();
        let memory = std::mem::size_of::<Self>()
            + st.ready.memory()
            + st.unacked * (std::mem::size_of::<super::Unacked>() + Message::OVERHEAD)
            + st.unacked_bytes
            + st.consumers.len() * std::mem::size_of::<super::Consumer>()
            + (st.expiry.capacity() + st.expiry_deferred.capacity())
                * std::mem::size_of::<(u64, u64)>();
        let stream = self
            .stream
            .as_ref()
            .map(|s| (s.extent(), s.readers() as u32));
        Snapshot {
            ready: stream.map_or(st.ready.len() as u64, |(e, _)| e.messages()),
            unacked: st.unacked as u64,
            consumers: stream.map_or(st.consumers.len() as u32, |(_, n)| n),
            ready_bytes: stream.map_or(st.ready.bytes() as u64, |(e, _)| e.bytes),
            unacked_bytes: st.unacked_bytes as u64,
            ready_ram: ready_ram as u64,
            ready_ram_bytes: ready_ram_bytes as u64,
            paged_out: paged_out as u64,
            paged_out_bytes: paged_out_bytes as u64,
            memory: memory as u64,
            policy: st.policy.clone(),
            operator_policy: st.operator_policy.clone(),
            idle_since: self.last_used.load(std::sync::atomic::Ordering::Relaxed),
            stats: st.stats.clone(),
            depth_rates: [0, 1, 2].map(|i| st.history.rate(i)),
        }
    }

    /// Its consumers, in subscription order.
    pub fn consumer_list(&self) -> Vec<std::sync::Arc<super::Consumer>> {
        if let Some(s) = &self.stream {
            return s.consumers();
        }
        self.state.lock().consumers.list()
    }

    /// Samples its counters (the management sampler, every few seconds);
    /// its depth at the sample.
    pub fn sample_stats(&self, now_ms: u64) -> Depth {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if let Some(s) = &self.stream {
            s.counters(&mut st.stats.counters);
        }
        st.stats.sample(now_ms);
        let stream = self
            .stream
            .as_ref()
            .map(|s| (s.extent(), s.readers() as u32));
        let ready = stream.map_or(st.ready.len() as u64, |(e, _)| e.messages());
        let unacked = st.unacked as u64;
        let c = &st.stats.counters;
        st.history.record(
            now_ms,
            [
                ready + unacked,
                ready,
                unacked,
                c.publish,
                c.deliver + c.deliver_no_ack + c.get + c.get_no_ack,
                c.ack,
            ],
        );
        Depth {
            ready,
            unacked,
            consumers: stream.map_or(st.consumers.len() as u32, |(_, n)| n),
        }
    }

    /// Its samples of the last `age_ms` before `now`, one per `incr_ms`,
    /// newest first, in `HISTORY`'s order.
    pub fn history(
        &self,
        now: u64,
        age_ms: u64,
        incr_ms: u64,
    ) -> Vec<crate::history::Sample<{ HISTORY.len() }>> {
        self.state.lock().history.select(now, age_ms, incr_ms)
    }

    /// The definition its policy and operator policy make together.
    pub fn effective_policy(&self) -> serde_json::Map<String, serde_json::Value> {
        self.state.lock().effective.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_the_change_per_second_between_samples() {
        let mut s = Stats::default();
        s.sample(1_000);
        s.counters.publish = 50;
        s.counters.ack = 10;
        s.sample(6_000);
        assert_eq!(s.rates()[0], 10.0);
        assert_eq!(s.rates()[5], 2.0);
        s.sample(11_000);
        assert_eq!(s.rates()[0], 0.0);
    }
}
