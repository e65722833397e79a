//! What a stream's readers share: the last few batches one of them
//! encoded (the stream protocol's chunks), each under the offset it
//! starts at and a key of the encoding's, so a reader that comes to the
//! same offsets with the same key sends the same bytes without reading
//! or encoding them again. Ten readers of one stream read it once. The
//! values are opaque here: the layer that encodes them owns their type.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

/// Batches kept per stream, newest last.
const KEPT: usize = 8;

/// A shared value.
pub type Encoded = Arc<dyn Any + Send + Sync>;

#[derive(Default)]
pub struct Shared {
    recent: Mutex<VecDeque<(u64, u64, Encoded)>>,
}

impl Shared {
    /// The batch starting at `first` with `key`, if one is kept.
    pub fn get(&self, first: u64, key: u64) -> Option<Encoded> {
        let recent = self.recent.lock();
        recent
            .iter()
            .rev()
            .find(|(f, k, _)| (*f, *k) == (first, key))
            .map(|(_, _, e)| Arc::clone(e))
    }

    /// Keeps `value`, the batch starting at `first` with `key` (the
    /// oldest kept goes if there are `KEPT`).
    pub fn put(&self, first: u64, key: u64, value: Encoded) {
        let mut recent = self.recent.lock();
        if recent.iter().any(|(f, k, _)| (*f, *k) == (first, key)) {
            return;
        }
        if recent.len() == KEPT {
            recent.pop_front();
        }
        recent.push_back((first, key, value));
    }

    /// Drops what is kept (the stream's offsets below `first` went).
    pub fn forget_below(&self, first: u64) {
        self.recent.lock().retain(|(f, _, _)| *f >= first);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_found_by_its_offset_and_key_until_newer_ones_push_it_out() {
        let s = Shared::default();
        s.put(0, 7, Arc::new("a"));
        let a = s.get(0, 7).unwrap();
        assert_eq!(a.downcast_ref::<&str>(), Some(&"a"));
        assert!(s.get(0, 8).is_none() && s.get(1, 7).is_none());
        for i in 1..=KEPT as u64 {
            s.put(i, 7, Arc::new(i));
        }
        assert!(s.get(0, 7).is_none());
        assert!(s.get(KEPT as u64, 7).is_some());
        s.forget_below(KEPT as u64);
        assert!(s.get(1, 7).is_none() && s.get(KEPT as u64, 7).is_some());
    }
}
