//! The fanout exchange table: a message goes to every bound destination,
//! whatever its routing key. Keys and arguments only identify bindings.

use std::hash::Hash;

use super::{same_args, Change, DestSet, FieldTable};

/// Bindings of a fanout exchange, grouped by destination.
#[derive(Clone, Debug)]
pub struct FanoutTable<D> {
    set: DestSet<D, (Box<str>, FieldTable)>,
}

impl<D> Default for FanoutTable<D> {
    fn default() -> Self {
        Self {
            set: DestSet::default(),
        }
    }
}

impl<D: Clone + Eq + Hash> FanoutTable<D> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the binding (key, args, dest); false if it already exists.
    pub fn bind(&mut self, key: &str, args: &FieldTable, dest: D) -> bool {
        let item = (key.into(), args.clone());
        self.set
            .insert(dest, item, |(k, a)| &**k == key && same_args(a, args))
            != Change::Nothing
    }

    /// Removes the binding (key, args, dest); false if there was none.
    pub fn unbind(&mut self, key: &str, args: &FieldTable, dest: &D) -> bool {
        self.set
            .remove(dest, |(k, a)| &**k == key && same_args(a, args))
            != Change::Nothing
    }

    /// Removes every binding to `dest`; returns how many.
    pub fn unbind_all(&mut self, dest: &D) -> usize {
        self.set.remove_dest(dest)
    }

    /// Appends every bound destination to `out`, each once.
    pub fn route(&self, out: &mut Vec<D>) {
        self.set.push_dests(out);
    }

    /// Number of bindings.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// True if there are no bindings.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Every binding as (key, args, dest).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &FieldTable, &D)> + '_ {
        self.set.iter().map(|(d, (k, a))| (&**k, a, d))
    }

    /// True if any binding leads to `dest`.
    pub fn has_destination(&self, dest: &D) -> bool {
        self.set.contains(dest)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    fn routed(t: &FanoutTable<u32>) -> Vec<u32> {
        let mut out = Vec::new();
        t.route(&mut out);
        out.sort();
        out
    }

    #[test]
    fn routes_everything_to_everyone_once() {
        let none = FieldTable::default();
        let mut t = FanoutTable::new();
        assert_eq!(routed(&t), [] as [u32; 0]);
        t.bind("", &none, 1);
        t.bind("a", &none, 1);
        t.bind("b", &table(&[("x", s("y"))]), 1);
        t.bind("", &none, 2);
        assert_eq!(t.len(), 4);
        assert_eq!(routed(&t), [1, 2]);
    }

    #[test]
    fn key_is_part_of_identity() {
        let none = FieldTable::default();
        let mut t = FanoutTable::new();
        assert!(t.bind("a", &none, 1));
        assert!(!t.bind("a", &none, 1));
        assert!(t.bind("b", &none, 1));
        assert!(!t.unbind("c", &none, &1));
        assert!(t.unbind("a", &none, &1));
        assert_eq!(routed(&t), [1]);
        assert!(t.unbind("b", &none, &1));
        assert_eq!(routed(&t), [] as [u32; 0]);
        assert!(!t.has_destination(&1));
    }

    #[test]
    fn large_fanout_and_unbind_all() {
        let none = FieldTable::default();
        let mut t = FanoutTable::new();
        for q in 0..500u32 {
            assert!(t.bind("", &none, q));
            assert!(t.bind("other", &none, q));
        }
        assert_eq!(t.len(), 1000);
        assert_eq!(routed(&t).len(), 500);
        for q in (0..500u32).filter(|q| q % 5 != 0) {
            assert_eq!(t.unbind_all(&q), 2);
        }
        assert_eq!(routed(&t), (0..500).step_by(5).collect::<Vec<_>>());
        assert_eq!(t.len(), 200);
    }
}
