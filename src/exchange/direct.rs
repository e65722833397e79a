//! The direct exchange table: a message goes to the destinations bound with a
//! key equal to its routing key. Binding arguments are part of a binding's
//! identity but play no part in routing.

use std::collections::HashMap;
use std::hash::Hash;

use super::{same_args, Change, DestSet, FieldTable};

/// Bindings of a direct exchange, indexed by key and by destination.
#[derive(Clone, Debug)]
pub struct DirectTable<D> {
    /// key -> the bindings with that key, grouped by destination.
    keys: HashMap<Box<str>, DestSet<D, FieldTable>>,
    /// dest -> the keys it has bindings with (each key once).
    by_dest: HashMap<D, Vec<Box<str>>>,
    len: usize,
}

impl<D> Default for DirectTable<D> {
    fn default() -> Self {
        Self {
            keys: HashMap::new(),
            by_dest: HashMap::new(),
            len: 0,
        }
    }
}

impl<D: Clone + Eq + Hash> DirectTable<D> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the binding (key, args, dest); false if it already exists.
    pub fn bind(&mut self, key: &str, args: &FieldTable, dest: D) -> bool {
        let set = match self.keys.get_mut(key) {
            Some(set) => set,
            None => self.keys.entry(key.into()).or_default(),
        };
        match set.insert(dest.clone(), args.clone(), |a| same_args(a, args)) {
            Change::Nothing => false,
            Change::Binding => {
                self.len += 1;
                true
            }
            Change::Destination => {
                self.len += 1;
                self.by_dest.entry(dest).or_default().push(key.into());
                true
            }
        }
    }

    /// Removes the binding (key, args, dest); false if there was none.
    pub fn unbind(&mut self, key: &str, args: &FieldTable, dest: &D) -> bool {
        let Some(set) = self.keys.get_mut(key) else {
            return false;
        };
        match set.remove(dest, |a| same_args(a, args)) {
            Change::Nothing => false,
            Change::Binding => {
                self.len -= 1;
                true
            }
            Change::Destination => {
                self.len -= 1;
                if set.is_empty() {
                    self.keys.remove(key);
                }
                self.forget_key(dest, key);
                true
            }
        }
    }

    /// Drops `key` from the keys recorded for `dest`.
    fn forget_key(&mut self, dest: &D, key: &str) {
        if let Some(keys) = self.by_dest.get_mut(dest) {
            if let Some(i) = keys.iter().position(|k| &**k == key) {
                keys.swap_remove(i);
            }
            if keys.is_empty() {
                self.by_dest.remove(dest);
            }
        }
    }

    /// Removes every binding to `dest`; returns how many.
    pub fn unbind_all(&mut self, dest: &D) -> usize {
        let Some(keys) = self.by_dest.remove(dest) else {
            return 0;
        };
        let mut removed = 0;
        for key in keys {
            if let Some(set) = self.keys.get_mut(&key) {
                removed += set.remove_dest(dest);
                if set.is_empty() {
                    self.keys.remove(&key);
                }
            }
        }
        self.len -= removed;
        removed
    }

    /// Appends the destinations bound with exactly `routing_key` to `out`.
    pub fn route(&self, routing_key: &str, out: &mut Vec<D>) {
        if let Some(set) = self.keys.get(routing_key) {
            set.push_dests(out);
        }
    }

    /// Number of bindings.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if there are no bindings.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every binding as (key, args, dest).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &FieldTable, &D)> + '_ {
        self.keys
            .iter()
            .flat_map(|(k, set)| set.iter().map(move |(d, a)| (&**k, a, d)))
    }

    /// True if any binding leads to `dest`.
    pub fn has_destination(&self, dest: &D) -> bool {
        self.by_dest.contains_key(dest)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    fn routed(t: &DirectTable<u32>, key: &str) -> Vec<u32> {
        let mut out = Vec::new();
        t.route(key, &mut out);
        out.sort();
        out
    }

    #[test]
    fn routes_on_exact_key_only() {
        let none = FieldTable::default();
        let mut t = DirectTable::new();
        t.bind("a", &none, 1);
        t.bind("a.b", &none, 2);
        t.bind("", &none, 3);
        t.bind("A", &none, 4);
        assert_eq!(routed(&t, "a"), [1]);
        assert_eq!(routed(&t, "a.b"), [2]);
        assert_eq!(routed(&t, ""), [3]);
        assert_eq!(routed(&t, "A"), [4]);
        for miss in ["a.", "a.*", "#", "*", " a", "b", "a.b.c"] {
            assert_eq!(routed(&t, miss), [] as [u32; 0], "{miss:?}");
        }
    }

    #[test]
    fn wildcards_are_literal() {
        let mut t = DirectTable::new();
        t.bind("#", &FieldTable::default(), 1);
        t.bind("*", &FieldTable::default(), 2);
        assert_eq!(routed(&t, "anything"), [] as [u32; 0]);
        assert_eq!(routed(&t, "#"), [1]);
        assert_eq!(routed(&t, "*"), [2]);
    }

    #[test]
    fn arguments_do_not_affect_routing_and_dest_appears_once() {
        let mut t = DirectTable::new();
        t.bind("k", &table(&[("x", s("1"))]), 1);
        t.bind("k", &table(&[("x", s("2"))]), 1);
        t.bind("k", &FieldTable::default(), 2);
        assert_eq!(t.len(), 3);
        let mut out = Vec::new();
        t.route("k", &mut out);
        out.sort();
        assert_eq!(out, [1, 2]);
    }

    #[test]
    fn unbind_cleans_up_indexes() {
        let none = FieldTable::default();
        let mut t = DirectTable::new();
        t.bind("a", &none, 1);
        t.bind("b", &none, 1);
        assert!(t.unbind("a", &none, &1));
        assert!(t.has_destination(&1));
        assert!(t.unbind("b", &none, &1));
        assert!(!t.has_destination(&1));
        assert!(t.keys.is_empty() && t.by_dest.is_empty() && t.is_empty());
    }

    #[test]
    fn unbind_all_removes_only_that_destination() {
        let none = FieldTable::default();
        let args = table(&[("x", s("1"))]);
        let mut t = DirectTable::new();
        for q in 0..50u32 {
            t.bind(&format!("key{}", q % 7), &none, q);
            t.bind(&format!("key{}", q % 7), &args, q);
            t.bind("shared", &none, q);
        }
        assert_eq!(t.len(), 150);
        assert_eq!(t.unbind_all(&10), 3);
        assert_eq!(t.len(), 147);
        assert!(!routed(&t, "shared").contains(&10));
        assert!(!routed(&t, "key3").contains(&10));
        assert_eq!(routed(&t, "shared").len(), 49);
        for q in 0..50 {
            t.unbind_all(&q);
        }
        assert!(t.is_empty() && t.keys.is_empty() && t.by_dest.is_empty());
    }

    #[test]
    fn many_destinations_on_one_key() {
        let none = FieldTable::default();
        let mut t = DirectTable::new();
        for q in 0..1000u32 {
            assert!(t.bind("k", &none, q));
        }
        for q in (0..1000u32).step_by(2) {
            assert!(t.unbind("k", &none, &q));
        }
        let expected: Vec<u32> = (1..1000).step_by(2).collect();
        assert_eq!(routed(&t, "k"), expected);
    }
}
