//! Held messages of delayed-message exchanges: one sled tree keyed by due
//! time (ms, BE) ++ a sequence, so the next due message is the first key
//! and a million held messages cost disk, not memory. The value records
//! the vhost, the delay (for the header rewrite on release), whether the
//! message is persistent, and the message record itself.

use bytes::{BufMut, Bytes, BytesMut};

use super::messages::{decode_message, encode_message};
use super::{Error, Result, Store};
use crate::message::Message;
use crate::wire::FieldReader;

/// A held message that is due.
pub struct DueMessage {
    pub key: [u8; 16],
    pub vhost: String,
    pub delay_ms: u64,
    pub message: Message,
}

fn key(due: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&due.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn decode(k: &[u8], v: &[u8]) -> Result<(bool, DueMessage)> {
    let bad = || Error::Corrupt("delayed message".into());
    let key: [u8; 16] = k.try_into().map_err(|_| bad())?;
    let mut r = FieldReader::new(v);
    let persistent = r.u8().ok_or_else(bad)? == 1;
    let vhost = String::from_utf8_lossy(r.short_str().ok_or_else(bad)?).into_owned();
    let delay_ms = r.u64().ok_or_else(bad)?;
    let at = v.len() - r.remaining();
    let message = decode_message(Bytes::copy_from_slice(&v[at..]))?;
    Ok((
        persistent,
        DueMessage {
            key,
            vhost,
            delay_ms,
            message,
        },
    ))
}

pub(super) fn split(key: &[u8]) -> Option<(u64, u64)> {
    let due = <[u8; 8]>::try_from(key.get(..8)?).ok()?;
    let seq = <[u8; 8]>::try_from(key.get(8..16)?).ok()?;
    Some((u64::from_be_bytes(due), u64::from_be_bytes(seq)))
}

/// Applies `Op::Hold`.
pub(super) fn hold(
    tree: &sled::Tree,
    due: u64,
    seq: u64,
    vhost: &str,
    delay_ms: u64,
    msg: &Message,
) -> Result<()> {
    let mut record = BytesMut::new();
    encode_message(msg, false, &mut record);
    let mut v = BytesMut::with_capacity(record.len() + vhost.len() + 16);
    v.put_u8(msg.persistent() as u8);
    crate::wire::put_short_str(&mut v, vhost.as_bytes());
    v.put_u64(delay_ms);
    v.extend_from_slice(&record);
    tree.insert(key(due, seq), &v[..])?;
    Ok(())
}

/// Applies `Op::Unhold`.
pub(super) fn unhold(tree: &sled::Tree, key: &[u8]) -> Result<()> {
    tree.remove(key)?;
    Ok(())
}

/// Forgets every message held for `vhost` (part of `Op::DeleteVhost`: a
/// vhost made again with the same name must not receive them).
pub(super) fn forget_vhost(tree: &sled::Tree, vhost: &str) -> Result<()> {
    let mut batch = sled::Batch::default();
    for item in tree.iter() {
        let (k, v) = item?;
        let mut r = FieldReader::new(&v);
        let _persistent = r.u8();
        if r.short_str() == Some(vhost.as_bytes()) {
            batch.remove(k);
        }
    }
    tree.apply_batch(batch)?;
    Ok(())
}

impl Store {
    /// Up to `limit` held messages due by `now`, earliest first.
    pub fn due_delayed(&self, now: u64, limit: usize) -> Result<Vec<DueMessage>> {
        let mut out = Vec::new();
        let released = self.released_not_applied();
        let due = self.delayed.range(..key(now, u64::MAX)).filter(|item| {
            item.as_ref()
                .map_or(true, |(k, _)| !released.contains(&k[..]))
        });
        for item in due.take(limit) {
            let (k, v) = item?;
            match decode(&k, &v) {
                Ok((_, m)) => out.push(m),
                Err(e) => {
                    tracing::error!("dropping an unreadable delayed message: {e}");
                    self.remove_delayed(&k)?;
                }
            }
        }
        Ok(out)
    }

    /// When the next held message is due.
    pub fn next_delayed(&self) -> Result<Option<u64>> {
        let released = self.released_not_applied();
        for item in self.delayed.iter() {
            let (k, _) = item?;
            if released.contains(&k[..]) {
                continue;
            }
            return Ok(<[u8; 8]>::try_from(&k[..8]).ok().map(u64::from_be_bytes));
        }
        Ok(None)
    }

    /// Held messages released whose unhold a replicated journal has not
    /// applied yet (empty on a single node).
    fn released_not_applied(&self) -> std::collections::HashSet<Vec<u8>> {
        if !self.applier.is_staging() {
            return Default::default();
        }
        self.applier.unholding.lock().clone()
    }

    /// At start: drops held transient messages (they do not survive a
    /// restart) and returns (vhost, exchange) of each one kept, and the
    /// highest sequence used.
    pub fn recover_delayed(&self) -> Result<(Vec<(String, String)>, u64)> {
        let mut kept = Vec::new();
        let mut max_seq = 0;
        for item in self.delayed.iter() {
            let (k, v) = item?;
            let (persistent, m) = match decode(&k, &v) {
                Ok(x) => x,
                Err(_) => {
                    self.remove_delayed(&k)?;
                    continue;
                }
            };
            if !persistent {
                self.remove_delayed(&k)?;
                continue;
            }
            max_seq = max_seq.max(split(&m.key).map_or(0, |(_, seq)| seq));
            kept.push((m.vhost, m.message.exchange_str().into_owned()));
        }
        Ok((kept, max_seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Meta;

    #[test]
    fn held_messages_come_due_in_order_and_unreadable_records_go() {
        let s = Store::temporary().unwrap();
        let m = Message::new(
            b"x",
            b"k",
            &[0x10, 0, 2],
            b"b",
            Meta::default().with_delivery_mode(2),
        );
        s.put_delayed(20, 2, "/", 5, &m).unwrap();
        s.put_delayed(10, 1, "/", 5, &m).unwrap();
        s.delayed.insert(b"short", &b"junk"[..]).unwrap();
        let (kept, max_seq) = s.recover_delayed().unwrap();
        assert_eq!(kept.len(), 2);
        assert_eq!(max_seq, 2);
        assert!(
            s.delayed.get(b"short").unwrap().is_none(),
            "the bad record went"
        );
        assert_eq!(s.next_delayed().unwrap(), Some(10));
        let due = s.due_delayed(15, 10).unwrap();
        assert_eq!(due.len(), 1);
        s.remove_delayed(&due[0].key).unwrap();
        assert_eq!(s.next_delayed().unwrap(), Some(20));
    }
}
