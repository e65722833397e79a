//! Message deduplication on an exchange or a queue (the
//! `x-message-deduplication` argument; LavinMQ's and the community
//! RabbitMQ plugin's names, args.rs). A message's key is the value of the
//! header the owner names (`x-deduplication-header` by default), else its
//! `message-id` property; a message with neither passes. A key seen
//! within the cache's size and TTL makes the message a duplicate: the
//! owner drops it, counts it, and the publisher's confirm is sent as for
//! any other message.
//!
//! Unlike LavinMQ's cache (memory only) the cache of a durable owner is
//! durable and, in a cluster, replicated: each new entry is written
//! through the journal before the group commit that confirms its message
//! (a deferred write, as a durable queue's messages are), into a ring of
//! `x-cache-size` slots (store/dedup.rs), and read back at start and on a
//! new leader. Keys are kept as 16 bytes of their SHA-256, so a cache's
//! memory does not depend on what publishers put in the header.

pub mod args;
mod ring;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

pub use args::DedupArgs;
use ring::{Key, Ring};

use crate::message::Message;
use crate::store::dedup::Entry;
use crate::store::{self, DeferredWrites, Store};
use crate::wire::props::Field;
use crate::wire::table;

/// The header a message may carry to keep its entry for a TTL of its own
/// (ms), as in LavinMQ and the plugin.
const TTL_HEADER: &[u8] = b"x-cache-ttl";

/// What `Dedup::admit` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// The message has no key: it passes, nothing is remembered.
    Pass,
    /// Its key is new, and now remembered.
    New(Token),
    /// Its key was seen: the message is a duplicate.
    Duplicate,
}

/// A key `admit` remembered, for `Dedup::forget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    key: Key,
    seq: u64,
}

/// An exchange's or a queue's deduplication cache.
pub struct Dedup {
    args: DedupArgs,
    ring: Mutex<Ring>,
    durable: Option<Durable>,
    /// Messages dropped as duplicates.
    dropped: AtomicU64,
    /// Their rate (the management sampler's).
    rates: Mutex<crate::rates::Rates<1>>,
}

/// Where a durable owner's new entries go.
struct Durable {
    owner: Vec<u8>,
    store: Arc<Store>,
    /// Entries to write before the next commit, in seq order; None once
    /// the owner is deleted (nothing more is written).
    pending: Mutex<Option<Vec<Entry>>>,
    registered: AtomicBool,
}

impl Dedup {
    /// A cache with `args`; with `durable` (the owner's bytes, see
    /// store/dedup.rs, and the store) it is kept in the store, and with
    /// `restore` it starts with what is stored there (an owner recovered
    /// at start or by a new leader; a new one starts empty, whatever a
    /// deleted namesake's deletion has not removed yet).
    pub fn open(
        args: DedupArgs,
        durable: Option<(Vec<u8>, Arc<Store>)>,
        restore: bool,
    ) -> store::Result<Arc<Dedup>> {
        let (ring, durable) = match durable {
            None => (Ring::new(args.size), None),
            Some((owner, store)) => {
                let stored = match restore {
                    true => store.dedup_entries(&owner)?,
                    false => Vec::new(),
                };
                let ring = Ring::restore(args.size, stored, crate::util::now_ms());
                let d = Durable {
                    owner,
                    store,
                    pending: Mutex::new(Some(Vec::new())),
                    registered: AtomicBool::new(false),
                };
                (ring, Some(d))
            }
        };
        Ok(Arc::new(Dedup {
            args,
            ring: Mutex::new(ring),
            durable,
            dropped: AtomicU64::new(0),
            rates: Default::default(),
        }))
    }

    /// Whether `msg` passes (no key), is new (now remembered: `forget`
    /// takes it back if the message does not get in after all) or is a
    /// duplicate (counted).
    pub fn admit(self: &Arc<Self>, msg: &Message) -> Admit {
        let Some(key) = key_of(msg, self.args.header.as_bytes()) else {
            return Admit::Pass;
        };
        let now = crate::util::now_ms();
        let ttl = msg
            .raw_headers()
            .and_then(|h| table::get(h, TTL_HEADER))
            .and_then(|v| v.as_int())
            .and_then(|n| u64::try_from(n).ok())
            .or(self.args.ttl_ms);
        let expires = ttl.map_or(0, |t| now.saturating_add(t).max(1));
        let mut ring = self.ring.lock();
        if ring.holds(&key, now) {
            drop(ring);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Admit::Duplicate;
        }
        let entry = ring.insert(key, expires);
        self.write(entry);
        Admit::New(Token {
            key,
            seq: entry.seq,
        })
    }

    /// Takes back what `admit` remembered: the message it let in was
    /// refused after all (a queue's reject-publish, a store error), so its
    /// publisher's retry must not be a duplicate.
    pub fn forget(self: &Arc<Self>, t: Token) {
        let mut ring = self.ring.lock();
        if let Some(entry) = ring.forget(&t.key, t.seq) {
            self.write(entry);
        }
    }

    /// Queues `entry` for the store (a durable cache), under the ring's
    /// lock, so entries queue in seq order.
    fn write(self: &Arc<Self>, entry: Entry) {
        let Some(d) = &self.durable else { return };
        if let Some(p) = d.pending.lock().as_mut() {
            p.push(entry);
        }
        if !d.registered.swap(true, Ordering::AcqRel) {
            let me: Weak<dyn DeferredWrites> = Arc::downgrade(self) as Weak<Dedup>;
            d.store.defer(me);
        }
    }

    /// Whether the cache is kept in the store (a duplicate's confirm then
    /// waits for the commit that makes its original's entry durable).
    pub fn durable(&self) -> bool {
        self.durable.is_some()
    }

    /// Messages dropped as duplicates.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Duplicates dropped a second, between the last two samples.
    pub fn rate(&self) -> f64 {
        self.rates.lock().per_sec()[0]
    }

    /// Takes a sample (the management sampler, every few seconds).
    pub fn sample(&self, now_ms: u64) {
        let n = self.dropped();
        self.rates.lock().sample(now_ms, [n]);
    }

    /// Entries remembered.
    pub fn len(&self) -> usize {
        self.ring.lock().len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The owner is deleted: nothing more is written (call before its
    /// deletion is submitted to the store, so no entry follows it).
    pub fn close(&self) {
        if let Some(d) = &self.durable {
            *d.pending.lock() = None;
        }
    }
}

impl DeferredWrites for Dedup {
    fn write_deferred(&self) -> store::Result<()> {
        let Some(d) = &self.durable else {
            return Ok(());
        };
        d.registered.store(false, Ordering::Release);
        // Held while writing: a close waits, so nothing is written after
        // the owner's deletion.
        let mut pending = d.pending.lock();
        let Some(list) = pending.as_mut() else {
            return Ok(());
        };
        let newest = list.last().map_or(0, |e| e.seq);
        let size = self.args.size;
        let mut at = 0;
        while at < list.len() {
            let e = list[at];
            // An entry a newer one in the list replaces is not written.
            if e.seq + size > newest {
                if let Err(err) = d.store.put_dedup(&d.owner, &e) {
                    list.drain(..at);
                    // The registry keeps a holder that failed registered.
                    d.registered.store(true, Ordering::Release);
                    return Err(err);
                }
            }
            at += 1;
        }
        list.clear();
        Ok(())
    }
}

/// The key of `msg`: a digest of header `header`'s value (strings by
/// their bytes, integers by their value whatever their width, any other
/// value by its encoding), else of its message-id.
fn key_of(msg: &Message, header: &[u8]) -> Option<Key> {
    let mut h = Sha256::new();
    let value = msg.raw_headers().and_then(|t| table::get(t, header));
    match value {
        Some(v) => {
            if let Some(s) = v.as_long_str().or_else(|| byte_array(&v)) {
                h.update(b"s");
                h.update(s);
            } else if let Some(n) = v.as_int() {
                h.update(b"i");
                h.update(n.to_be_bytes());
            } else {
                h.update([v.tag]);
                h.update(v.bytes);
            }
        }
        None => {
            let id = msg.short_property(Field::MessageId)?;
            h.update(b"s");
            h.update(id);
        }
    }
    let digest = h.finalize();
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    Some(key)
}

fn byte_array<'a>(v: &table::Value<'a>) -> Option<&'a [u8]> {
    (v.tag == b'x').then(|| v.bytes.get(4..)).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Meta;
    use amq_protocol::types::AMQPValue;

    fn msg(headers: &[(&str, AMQPValue)], message_id: Option<&str>) -> Message {
        let mut m = Message::new(b"", b"q", &[0, 0], b"body", Meta::default());
        for (k, v) in headers {
            m = m.with_header(k, v.clone());
        }
        if let Some(id) = message_id {
            m = m.with_short_property(Field::MessageId, id.as_bytes());
        }
        m
    }

    fn cache(size: u64, ttl_ms: Option<u64>) -> Arc<Dedup> {
        let args = DedupArgs {
            size,
            ttl_ms,
            header: args::DEFAULT_HEADER.into(),
        };
        Dedup::open(args, None, false).unwrap()
    }

    fn with_key(v: AMQPValue) -> Message {
        msg(&[(args::DEFAULT_HEADER, v)], None)
    }

    fn admits(c: &Arc<Dedup>, m: &Message) -> bool {
        c.admit(m) != Admit::Duplicate
    }

    #[test]
    fn a_forgotten_key_is_new_again() {
        let c = cache(10, None);
        let a = with_key(AMQPValue::LongString("a".into()));
        let Admit::New(t) = c.admit(&a) else {
            panic!("new")
        };
        c.forget(t);
        assert!(matches!(c.admit(&a), Admit::New(_)));
        assert_eq!(c.admit(&a), Admit::Duplicate);
        assert_eq!(c.admit(&msg(&[], None)), Admit::Pass);
    }

    #[test]
    fn a_key_seen_before_is_a_duplicate() {
        let c = cache(10, None);
        let a = with_key(AMQPValue::LongString("a".into()));
        assert!(admits(&c, &a));
        assert!(!admits(&c, &a));
        assert!(admits(&c, &with_key(AMQPValue::LongString("b".into()))));
        // Integers compare by value, whatever their width.
        assert!(admits(&c, &with_key(AMQPValue::ShortInt(7))));
        assert!(!admits(&c, &with_key(AMQPValue::LongLongInt(7))));
        assert_eq!(c.dropped(), 2);
    }

    #[test]
    fn the_message_id_serves_when_the_header_is_absent() {
        let c = cache(10, None);
        assert!(admits(&c, &msg(&[], Some("id-1"))));
        assert!(!admits(&c, &msg(&[], Some("id-1"))));
        // The header wins over the message-id.
        let h = AMQPValue::LongString("h".into());
        assert!(admits(
            &c,
            &msg(&[(args::DEFAULT_HEADER, h.clone())], Some("id-1"))
        ));
        // Nothing to key on: never a duplicate.
        assert!(admits(&c, &msg(&[], None)));
        assert!(admits(&c, &msg(&[], None)));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn a_message_ttl_header_wins_over_the_cache_ttl() {
        let c = cache(10, None);
        let short = msg(
            &[
                (args::DEFAULT_HEADER, AMQPValue::LongString("k".into())),
                ("x-cache-ttl", AMQPValue::LongInt(1)),
            ],
            None,
        );
        assert!(admits(&c, &short));
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(admits(&c, &short), "its 1 ms TTL has passed");
    }
}
