//! `VHost::route`: from a published message to the set of queues it lands
//! in, following exchange-to-exchange bindings and alternate exchanges, each
//! exchange visited at most once (cycles are legal in AMQP and must end),
//! with a worklist, so no graph of exchanges can exhaust the stack.

use std::collections::HashSet;
use std::sync::Arc;

use amq_protocol::types::{AMQPValue, FieldTable};

use super::error::{Error, Result};
use super::stats::Tally;
use super::{Destination, Exchange, VHost};
use crate::dedup::{Admit, Dedup, Token};
use crate::exchange::ExchangeKind;
use crate::message::Message;
use crate::queue::Queue;

/// Scratch space for routing, reused across publishes of one channel.
#[derive(Default)]
pub struct RouteScratch {
    dests: Vec<Destination>,
    /// Exchanges reached but not yet routed through.
    stack: Vec<Arc<Exchange>>,
    visited: Visited,
    /// Message counts for the exchange published to (stats.rs).
    tally: Tally,
    /// What routing does with the exchange's deduplication cache.
    pub dedup: DedupMode,
    /// With `DedupMode::Defer`: the cache the caller must ask.
    deferred: Option<Arc<Dedup>>,
    /// The key the last route's exchange remembered (`DedupMode::Check`).
    admitted: Option<Admitted>,
}

/// A key an exchange's cache remembered for a message: the caller takes
/// it back (`forget`) if the message is refused after all.
pub struct Admitted(Arc<Dedup>, Token);

impl Admitted {
    /// Asks `dedup` about `msg`: None for a duplicate, else what to take
    /// back if it is refused (nothing, for a message without a key).
    pub fn ask(dedup: &Arc<Dedup>, msg: &Message) -> Option<Option<Admitted>> {
        match dedup.admit(msg) {
            Admit::Duplicate => None,
            Admit::New(t) => Some(Some(Admitted(Arc::clone(dedup), t))),
            Admit::Pass => Some(None),
        }
    }

    /// The message was refused (a nack to its publisher): its retry must
    /// not be a duplicate.
    pub fn forget(self) {
        self.0.forget(self.1);
    }
}

impl RouteScratch {
    /// Adds the message counts kept here to their exchange.
    pub fn flush_stats(&mut self) {
        self.tally.flush();
    }

    /// The deduplication cache the last route left to the caller
    /// (`DedupMode::Defer`).
    pub fn take_deferred(&mut self) -> Option<Arc<Dedup>> {
        self.deferred.take()
    }

    /// The key the last route's exchange remembered, if it did.
    pub fn take_admitted(&mut self) -> Option<Admitted> {
        self.admitted.take()
    }

    /// A scratch for a dead-lettered copy: the same message moving on, so
    /// deduplication lets it through (see `Queue::push_dead_lettered`).
    pub fn for_dead_letters() -> RouteScratch {
        RouteScratch {
            dedup: DedupMode::Skip,
            ..Default::default()
        }
    }
}

/// What routing does with the deduplication cache of the exchange a
/// message is published to (`x-message-deduplication`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum DedupMode {
    /// Asks it: a duplicate goes nowhere (`Routed::Duplicate`).
    #[default]
    Check,
    /// Leaves it to the caller (`RouteScratch::take_deferred`): a
    /// transaction decides at commit, so a rolled back publish is not
    /// remembered.
    Defer,
    /// Lets the message through.
    Skip,
}

/// Where a routed message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    /// To the queues the route left in `out` (none, perhaps).
    Queues,
    /// Held for this many ms by its exchange's type (a delayed-message
    /// exchange): `out` says where it would go now, for the mandatory
    /// check.
    Hold(u64),
    /// Nowhere: the exchange's deduplication cache saw its key. `durable`:
    /// the cache is kept in the store (its confirm waits for a commit).
    Duplicate { durable: bool },
}

/// The exchanges one publish has reached, by address: the first without
/// hashing (most publishes reach one), the rest in a set, so a graph of
/// any size is walked in time proportional to it.
#[derive(Default)]
struct Visited {
    first: usize,
    more: HashSet<usize>,
}

impl Visited {
    fn start(&mut self, x: &Arc<Exchange>) {
        self.first = Arc::as_ptr(x) as usize;
        // clear() costs the set's capacity, even when empty.
        if !self.more.is_empty() {
            self.more.clear();
        }
    }

    /// Records `x`; false if it was reached before.
    fn insert(&mut self, x: &Arc<Exchange>) -> bool {
        let a = Arc::as_ptr(x) as usize;
        a != self.first && self.more.insert(a)
    }
}

impl VHost {
    /// Finds the queues `msg` goes to and appends them to `out` (each once),
    /// or says the exchange holds it or drops it as a duplicate (`Routed`).
    pub fn route(
        &self,
        msg: &Message,
        scratch: &mut RouteScratch,
        out: &mut Vec<Arc<Queue>>,
    ) -> Result<Routed> {
        self.route_inner(msg, scratch, out, true)
    }

    /// Holds `msg` (published to a delayed-message exchange of this vhost)
    /// for `delay_ms`; stored now, durable after the next flush.
    pub fn hold(&self, msg: &Message, delay_ms: u64) -> crate::store::Result<()> {
        self.delayed.hold(&self.store, &self.name, msg, delay_ms)?;
        if let Some(x) = self.exchange(&msg.exchange_str()) {
            x.held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Routes a held message of a delayed-message exchange that is now due
    /// (see delayed.rs): with the headers the exchange's type sets on
    /// release, to the queues it routes to now (each copy written at once,
    /// before the held record goes). A deleted exchange drops it, as in
    /// RabbitMQ.
    pub fn release_held(&self, delay_ms: u64, mut msg: Message) {
        let Some(x) = self.exchange(&msg.exchange_str()) else {
            return;
        };
        let _ = x.held.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |n| n.checked_sub(1),
        );
        if let Some(plugin) = &x.plugin {
            for (name, value) in plugin.released(delay_ms) {
                msg = msg.with_header(name, value);
            }
        }
        let mut scratch = RouteScratch::default();
        let mut routes = Vec::new();
        if self
            .route_released(&msg, &mut scratch, &mut routes)
            .is_err()
        {
            return;
        }
        let msg = Arc::new(msg);
        for q in routes {
            if let Err(e) = q.push_written(&msg) {
                tracing::error!(
                    queue = q.name(),
                    "cannot enqueue a released delayed message: {e}"
                );
            }
        }
    }

    /// Routes a held message that is now due (never held again).
    pub fn route_released(
        &self,
        msg: &Message,
        scratch: &mut RouteScratch,
        out: &mut Vec<Arc<Queue>>,
    ) -> Result<()> {
        self.route_inner(msg, scratch, out, false).map(|_| ())
    }

    fn route_inner(
        &self,
        msg: &Message,
        scratch: &mut RouteScratch,
        out: &mut Vec<Arc<Queue>>,
        may_hold: bool,
    ) -> Result<Routed> {
        scratch.admitted = None;
        scratch.deferred = None;
        let name = std::str::from_utf8(msg.exchange())
            .map_err(|_| Error::not_found(format!("no {}", self.describe("exchange", "?"))))?;
        let key = String::from_utf8_lossy(msg.routing_key());
        // Sender-selected distribution: CC and BCC headers add routing keys.
        let extra = sender_selected_keys(msg);
        let before = out.len();
        if name.is_empty() {
            // The default exchange: every queue is bound by its own name.
            for k in std::iter::once(key.as_ref()).chain(extra.iter().map(String::as_str)) {
                if let Some(q) = self.queue(k) {
                    out.push(q);
                }
            }
            if !extra.is_empty() {
                dedup(out);
            }
            scratch
                .tally
                .count(&self.default_stats, out.len().saturating_sub(before));
            return Ok(Routed::Queues);
        }
        let x = self
            .exchange(name)
            .ok_or_else(|| Error::not_found(format!("no {}", self.describe("exchange", name))))?;
        if x.internal {
            return Err(Error::access_refused(format!(
                "cannot publish to internal {}",
                self.describe("exchange", name)
            )));
        }
        // A released message was checked when it was held.
        if let (true, Some(d)) = (may_hold, &x.dedup) {
            match scratch.dedup {
                DedupMode::Check => match Admitted::ask(d, msg) {
                    None => {
                        scratch.tally.count(&x.stats, 0);
                        return Ok(Routed::Duplicate {
                            durable: d.durable(),
                        });
                    }
                    Some(admitted) => scratch.admitted = admitted,
                },
                DedupMode::Defer => scratch.deferred = Some(Arc::clone(d)),
                DedupMode::Skip => {}
            }
        }
        let mut hold = None;
        if let (true, Some(plugin)) = (may_hold, &x.plugin) {
            let headers = msg.headers();
            let view = warren_plugin_api::MessageView {
                routing_key: &key,
                headers: headers.as_ref(),
                raw_properties: msg.properties(),
            };
            if let warren_plugin_api::Disposition::Delay(ms) = plugin.on_publish(&view) {
                hold = Some(ms);
            }
        }
        let mut headers = None;
        let mut nested = self.route_exchange(&x, msg, &key, &mut headers, scratch, out);
        for k in &extra {
            self.route_exchange(&x, msg, k, &mut headers, scratch, out);
            nested = true;
        }
        if nested {
            dedup(out);
        }
        // Counted when published (a held message routes nowhere yet); a
        // released one is not counted again.
        if may_hold {
            let routed = match hold {
                Some(_) => 0,
                None => out.len().saturating_sub(before),
            };
            scratch.tally.count(&x.stats, routed);
        }
        Ok(hold.map_or(Routed::Queues, Routed::Hold))
    }

    /// Routes through `x` and every exchange reached from it (exchange
    /// bindings, alternate exchanges), each once, with a worklist rather
    /// than recursion; returns whether more than one exchange took part
    /// (so duplicates are possible).
    fn route_exchange(
        &self,
        x: &Arc<Exchange>,
        msg: &Message,
        key: &str,
        headers: &mut Option<Option<FieldTable>>,
        scratch: &mut RouteScratch,
        out: &mut Vec<Arc<Queue>>,
    ) -> bool {
        scratch.visited.start(x);
        scratch.stack.clear();
        self.route_one(x, msg, key, headers, scratch, out);
        let mut nested = false;
        while let Some(next) = scratch.stack.pop() {
            nested = true;
            self.route_one(&next, msg, key, headers, scratch, out);
        }
        nested
    }

    /// Routes through `x` alone: queues go to `out`, exchanges not reached
    /// before onto the worklist.
    fn route_one(
        &self,
        x: &Arc<Exchange>,
        msg: &Message,
        key: &str,
        headers: &mut Option<Option<FieldTable>>,
        scratch: &mut RouteScratch,
        out: &mut Vec<Arc<Queue>>,
    ) {
        // Headers are decoded only if a headers exchange is on the path.
        let table = if x.kind == Some(ExchangeKind::Headers)
            || (x.kind.is_none() && msg.meta.has_headers)
        {
            headers.get_or_insert_with(|| msg.headers()).as_ref()
        } else {
            None
        };
        let RouteScratch {
            dests,
            stack,
            visited,
            ..
        } = scratch;
        dests.clear();
        x.bindings.read().route(key, table, msg, dests);
        let matched = !dests.is_empty();
        for d in dests.drain(..) {
            match d {
                Destination::Queue(q) => out.push(q),
                Destination::Exchange(next) => {
                    if visited.insert(&next) {
                        stack.push(next);
                    }
                }
            }
        }
        // The alternate exchange takes what this exchange's own bindings
        // did not match (RabbitMQ), not what found no queue downstream.
        if !matched {
            if let Some(ae) = x.with_alternate(|n| self.exchange(n)) {
                if visited.insert(&ae) {
                    stack.push(ae);
                }
            }
        }
    }
}

/// Leaves each queue in `out` once (order is not kept for long lists).
fn dedup(out: &mut Vec<Arc<Queue>>) {
    if out.len() > 16 {
        out.sort_unstable_by_key(|q| Arc::as_ptr(q) as usize);
        out.dedup_by(|a, b| Arc::ptr_eq(a, b));
        return;
    }
    let mut i = 0;
    while i < out.len() {
        if out[..i].iter().any(|q| Arc::ptr_eq(q, &out[i])) {
            out.swap_remove(i);
        } else {
            i += 1;
        }
    }
}

/// Whether the encoded properties may hold a header named `name` (a cheap
/// test on the wire bytes before decoding the table).
fn may_have_header(msg: &Message, name: &[u8]) -> bool {
    msg.meta.has_headers
        && msg
            .properties()
            .windows(name.len() + 1)
            .any(|w| w[0] as usize == name.len() && &w[1..] == name)
}

/// The routing keys of the CC and BCC headers (arrays of strings).
fn sender_selected_keys(msg: &Message) -> Vec<String> {
    if !may_have_header(msg, b"CC") && !may_have_header(msg, b"BCC") {
        return Vec::new();
    }
    let Some(headers) = msg.headers() else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for name in ["CC", "BCC"] {
        if let Some(AMQPValue::FieldArray(a)) = headers.inner().get(name) {
            for v in a.as_slice() {
                if let Some(key) = crate::wire::value::text(v) {
                    keys.push(key);
                }
            }
        }
    }
    keys
}

/// The message without its BCC header, if it has one: BCC recipients are
/// not shown to anyone (RabbitMQ's sender-selected distribution). Only the
/// headers table is rewritten; every other property keeps its bytes.
pub fn strip_bcc(msg: &Message) -> Option<Message> {
    if !may_have_header(msg, b"BCC") {
        return None;
    }
    msg.without_header("BCC")
}
