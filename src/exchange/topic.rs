//! The topic exchange table: a trie over the dot-separated words of binding
//! keys, walked once per message. In binding keys `*` matches exactly one
//! word and `#` zero or more; every other word (including an empty one, as in
//! "a..b") matches itself. As in RabbitMQ, the empty key "" has no words at
//! all, so it matches the bindings "", "#", "#.#" but not "*".

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use super::{same_args, Change, DestSet, FieldTable};

/// A binding stored at a trie node: its original key (for identity and
/// listing; several keys can share a node, e.g. "a.#" and "a.#.#") and args.
type Item = (Box<str>, FieldTable);

/// One trie node: the bindings whose pattern ends here, and the edges.
#[derive(Clone, Debug)]
struct Node<D> {
    words: HashMap<Box<str>, Node<D>>,
    star: Option<Box<Node<D>>>,
    /// A `#` child never has a `#` child itself: runs of `#` are collapsed.
    hash: Option<Box<Node<D>>>,
    bindings: DestSet<D, Item>,
}

impl<D> Default for Node<D> {
    fn default() -> Self {
        Self {
            words: HashMap::new(),
            star: None,
            hash: None,
            bindings: DestSet::default(),
        }
    }
}

impl<D> Node<D> {
    fn is_empty(&self) -> bool {
        self.bindings.is_empty()
            && self.words.is_empty()
            && self.star.is_none()
            && self.hash.is_none()
    }

    /// The node for `words`, creating the path as needed.
    fn descend_create(&mut self, words: &[&str]) -> &mut Node<D> {
        let mut node = self;
        for &w in words {
            node = match w {
                "*" => node.star.get_or_insert_with(Default::default),
                "#" => node.hash.get_or_insert_with(Default::default),
                _ => node.words.entry(w.into()).or_default(),
            };
        }
        node
    }

    /// Applies `f` to the node for `words` if it exists, then prunes the
    /// nodes of the path that became empty.
    fn at_path<R>(&mut self, words: &[&str], f: &mut impl FnMut(&mut Node<D>) -> R) -> Option<R> {
        let Some((&w, rest)) = words.split_first() else {
            return Some(f(self));
        };
        match w {
            "*" | "#" => {
                let edge = if w == "*" {
                    &mut self.star
                } else {
                    &mut self.hash
                };
                let child = edge.as_deref_mut()?;
                let r = child.at_path(rest, f);
                if child.is_empty() {
                    *edge = None;
                }
                r
            }
            _ => {
                let child = self.words.get_mut(w)?;
                let r = child.at_path(rest, f);
                if child.is_empty() {
                    self.words.remove(w);
                }
                r
            }
        }
    }
}

/// Splits a binding key into trie words the way RabbitMQ splits keys ("" has
/// no words, "a..b" has three), collapsing runs of `#`, which match exactly
/// what a single `#` matches.
fn pattern_words(key: &str) -> Vec<&str> {
    let mut words: Vec<&str> = Vec::new();
    if key.is_empty() {
        return words;
    }
    for w in key.split('.') {
        if w == "#" && words.last() == Some(&"#") {
            continue;
        }
        words.push(w);
    }
    words
}

/// Binding keys with more words than this are kept out of the trie, so that
/// no recursion over the trie (routing, unbinding, dropping, cloning) goes
/// deeper. AMQP keys (short strings, at most 255 bytes) have at most 128.
const MAX_DEPTH: usize = 128;

/// Bindings of a topic exchange.
#[derive(Clone, Debug)]
pub struct TopicTrie<D> {
    root: Node<D>,
    /// Bindings whose keys are too long for the trie (see `MAX_DEPTH`),
    /// matched one by one, without recursion.
    long: DestSet<D, Item>,
    /// dest -> trie paths (normalised keys) of the nodes it has bindings at.
    by_dest: HashMap<D, Vec<Box<str>>>,
    len: usize,
}

impl<D> Default for TopicTrie<D> {
    fn default() -> Self {
        Self {
            root: Node::default(),
            long: DestSet::default(),
            by_dest: HashMap::new(),
            len: 0,
        }
    }
}

impl<D: Clone + Eq + Hash> TopicTrie<D> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the binding (key, args, dest); false if it already exists.
    pub fn bind(&mut self, key: &str, args: &FieldTable, dest: D) -> bool {
        let words = pattern_words(key);
        let item = (key.into(), args.clone());
        let same = |(k, a): &Item| &**k == key && same_args(a, args);
        if words.len() > MAX_DEPTH {
            if self.long.insert(dest, item, same) == Change::Nothing {
                return false;
            }
        } else {
            let node = self.root.descend_create(&words);
            match node.bindings.insert(dest.clone(), item, same) {
                Change::Nothing => return false,
                Change::Binding => {}
                Change::Destination => {
                    let path = words.join(".").into();
                    self.by_dest.entry(dest).or_default().push(path);
                }
            }
        }
        self.len += 1;
        true
    }

    /// Removes the binding (key, args, dest); false if there was none.
    pub fn unbind(&mut self, key: &str, args: &FieldTable, dest: &D) -> bool {
        let words = pattern_words(key);
        let same = |(k, a): &Item| &**k == key && same_args(a, args);
        if words.len() > MAX_DEPTH {
            if self.long.remove(dest, same) == Change::Nothing {
                return false;
            }
        } else {
            let change = self
                .root
                .at_path(&words, &mut |n| n.bindings.remove(dest, same));
            match change.unwrap_or(Change::Nothing) {
                Change::Nothing => return false,
                Change::Binding => {}
                Change::Destination => self.forget_path(dest, &words.join(".")),
            }
        }
        self.len -= 1;
        true
    }

    /// Drops `path` from the trie paths recorded for `dest`.
    fn forget_path(&mut self, dest: &D, path: &str) {
        if let Some(paths) = self.by_dest.get_mut(dest) {
            if let Some(i) = paths.iter().position(|p| &**p == path) {
                paths.swap_remove(i);
            }
            if paths.is_empty() {
                self.by_dest.remove(dest);
            }
        }
    }

    /// Removes every binding to `dest`; returns how many.
    pub fn unbind_all(&mut self, dest: &D) -> usize {
        let mut removed = self.long.remove_dest(dest);
        for path in self.by_dest.remove(dest).unwrap_or_default() {
            let words = pattern_words(&path);
            let n = self
                .root
                .at_path(&words, &mut |n| n.bindings.remove_dest(dest));
            removed += n.unwrap_or(0);
        }
        self.len -= removed;
        removed
    }

    /// Appends the destinations whose binding keys match `routing_key` to
    /// `out`, each once. Allocates nothing in the common case (at most 64
    /// destinations from several patterns, at most 16 nested `#` nodes).
    pub fn route(&self, routing_key: &str, out: &mut Vec<D>) {
        if self.len == 0 {
            return;
        }
        let start = out.len();
        let mut walk = Walk {
            key_len: routing_key.len(),
            memo: Memo::default(),
            sink: Sink {
                out,
                start,
                seen: None,
            },
        };
        walk.node(&self.root, key_words(routing_key), false);
        for slot in self.long.slots() {
            if slot.items.iter().any(|(k, _)| glob(k, routing_key)) {
                walk.sink.push(&slot.dest);
            }
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
        let mut nodes = Vec::new();
        let mut stack = vec![&self.root];
        while let Some(n) = stack.pop() {
            if !n.bindings.is_empty() {
                nodes.push(n);
            }
            stack.extend(n.words.values());
            stack.extend(n.star.as_deref());
            stack.extend(n.hash.as_deref());
        }
        nodes
            .into_iter()
            .flat_map(|n| n.bindings.iter())
            .chain(self.long.iter())
            .map(|(d, (k, a))| (&**k, a, d))
    }

    /// True if any binding leads to `dest`.
    pub fn has_destination(&self, dest: &D) -> bool {
        self.by_dest.contains_key(dest) || self.long.contains(dest)
    }
}

// ---------------------------------------------------------------------------
// Matching.

/// The routing-key words not consumed yet: `None` when there are none left,
/// otherwise a non-empty dot-separated list (`Some("")` is one empty word).
/// Always a suffix of the routing key.
type Words<'k> = Option<&'k str>;

/// All the words of a routing key ("" has none).
fn key_words(key: &str) -> Words<'_> {
    if key.is_empty() {
        None
    } else {
        Some(key)
    }
}

/// Does binding key `pattern` match `key`? A loop with constant memory, for
/// the keys too long for the trie: the classic wildcard algorithm, where on a
/// mismatch the most recent `#` absorbs one more word (backtracking further
/// is never needed: a later `#` can absorb whatever an earlier one would).
fn glob(pattern: &str, key: &str) -> bool {
    let (mut p, mut k) = (key_words(pattern), key_words(key));
    // (pattern after the last '#', key words that '#' has not absorbed)
    let mut retry: Option<(Words, Words)> = None;
    loop {
        match p {
            Some(ps) => {
                let (pw, p_rest) = split_first(ps);
                if pw == "#" {
                    retry = Some((p_rest, k));
                    p = p_rest;
                    continue;
                }
                if let Some(ks) = k {
                    let (kw, k_rest) = split_first(ks);
                    if pw == "*" || pw == kw {
                        (p, k) = (p_rest, k_rest);
                        continue;
                    }
                }
            }
            None if k.is_none() => return true,
            None => {}
        }
        match retry {
            Some((p_after, Some(ks))) => {
                let k_rest = split_first(ks).1;
                retry = Some((p_after, k_rest));
                (p, k) = (p_after, k_rest);
            }
            _ => return false,
        }
    }
}

/// The first word and the rest.
fn split_first(s: &str) -> (&str, Words<'_>) {
    match s.split_once('.') {
        Some((w, rest)) => (w, Some(rest)),
        None => (s, None),
    }
}

/// State of one trie walk.
struct Walk<'o, D> {
    key_len: usize,
    memo: Memo,
    sink: Sink<'o, D>,
}

impl<D: Clone + Eq + Hash> Walk<'_, D> {
    /// Position of `words` in the routing key (grows as words are consumed).
    fn offset(&self, words: Words) -> usize {
        match words {
            None => self.key_len + 1,
            Some(s) => self.key_len - s.len(),
        }
    }

    /// Matches the remaining `words` against the patterns below `node`;
    /// `nested` is true when some ancestor of `node` is a `#` node.
    fn node(&mut self, node: &Node<D>, words: Words, nested: bool) {
        match words {
            None => self.sink.emit(&node.bindings),
            Some(s) => {
                let (w, rest) = split_first(s);
                if let Some(child) = node.words.get(w) {
                    self.node(child, rest, nested);
                }
                if let Some(child) = &node.star {
                    self.node(child, rest, nested);
                }
            }
        }
        if let Some(child) = &node.hash {
            self.hash(child, words, nested);
        }
    }

    /// Enters the `#` node `h` with `words` left; the `#` absorbs any number
    /// of them. A `#` below another `#` can be entered at many positions;
    /// the memo makes sure each position is walked once, which keeps keys
    /// like "#.a.#.a.#.a.#.b" polynomial instead of exponential.
    fn hash(&mut self, h: &Node<D>, words: Words, nested: bool) {
        let start = self.offset(words);
        let mut stop = usize::MAX;
        if nested {
            let id = h as *const Node<D> as usize;
            if let Some(done) = self.memo.get(id) {
                if start >= done {
                    return;
                }
                stop = done;
            }
            self.memo.set(id, start);
        }
        let mut cur = words;
        while self.offset(cur) < stop {
            self.node(h, cur, true);
            match cur {
                None => break,
                Some(s) => cur = split_first(s).1,
            }
        }
    }
}

/// For each nested `#` node entered so far (by address), the lowest key
/// position from which it has been walked to the end.
#[derive(Default)]
struct Memo {
    inline: [(usize, usize); 16],
    len: usize,
    spill: HashMap<usize, usize>,
}

impl Memo {
    fn get(&self, id: usize) -> Option<usize> {
        match self.inline[..self.len].iter().find(|e| e.0 == id) {
            Some(e) => Some(e.1),
            None => self.spill.get(&id).copied(),
        }
    }

    fn set(&mut self, id: usize, pos: usize) {
        if let Some(e) = self.inline[..self.len].iter_mut().find(|e| e.0 == id) {
            e.1 = pos;
        } else if self.len < self.inline.len() {
            self.inline[self.len] = (id, pos);
            self.len += 1;
        } else {
            self.spill.insert(id, pos);
        }
    }
}

/// Above this many destinations, deduplication switches from a scan of the
/// output to a hash set.
const LINEAR_DEDUP_MAX: usize = 64;

/// Collects destinations into the caller's vector without duplicates.
struct Sink<'o, D> {
    out: &'o mut Vec<D>,
    /// Where this call's output starts in `out`.
    start: usize,
    /// Everything in `out[start..]`, once that is too long to scan.
    seen: Option<HashSet<D>>,
}

impl<D: Clone + Eq + Hash> Sink<'_, D> {
    fn emit<B>(&mut self, set: &DestSet<D, B>) {
        if set.is_empty() {
            return;
        }
        if self.out.len() == self.start {
            // A set holds each destination once: nothing to compare with.
            set.push_dests(self.out);
            return;
        }
        for slot in set.slots() {
            self.push(&slot.dest);
        }
    }

    fn push(&mut self, dest: &D) {
        let found = &self.out[self.start..];
        if self.seen.is_none() && found.len() > LINEAR_DEDUP_MAX {
            self.seen = Some(found.iter().cloned().collect());
        }
        match &mut self.seen {
            Some(seen) => {
                if seen.insert(dest.clone()) {
                    self.out.push(dest.clone());
                }
            }
            None => {
                if !found.contains(dest) {
                    self.out.push(dest.clone());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    fn routed(t: &TopicTrie<String>, key: &str) -> Vec<String> {
        let mut out = Vec::new();
        t.route(key, &mut out);
        let n = out.len();
        out.sort();
        out.dedup();
        assert_eq!(n, out.len(), "duplicates routing {key:?}");
        out
    }

    fn names(v: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    /// The bindings of RabbitMQ's own topic routing test (routing_SUITE,
    /// formerly unit tests of rabbit_exchange_type_topic), in order.
    fn rabbit_bindings() -> Vec<(&'static str, &'static str, FieldTable)> {
        #[rustfmt::skip]
        let plain = [
            ("a.b.c", "t1"), ("a.*.c", "t2"), ("a.#.b", "t3"), ("a.b.b.c", "t4"),
            ("#", "t5"), ("#.#", "t6"), ("#.b", "t7"), ("*.*", "t8"), ("a.*", "t9"),
            ("*.b.c", "t10"), ("a.#", "t11"), ("a.#.#", "t12"), ("b.b.c", "t13"),
            ("a.b.b", "t14"), ("a.b", "t15"), ("b.c", "t16"), ("", "t17"),
            ("*.*.*", "t18"), ("vodka.martini", "t19"), ("a.b.c", "t20"),
            ("*.#", "t21"), ("#.*.#", "t22"), ("*.#.#", "t23"), ("#.#.#", "t24"),
            ("*", "t25"), ("#.b.#", "t26"),
        ];
        let mut v: Vec<_> = plain
            .iter()
            .map(|&(k, q)| (k, q, FieldTable::default()))
            .collect();
        // Note the aliasing: same key and destination, different arguments.
        v.push(("args-test", "t27", table(&[("foo", s("bar"))])));
        v.push(("args-test", "t27", table(&[("foo", s("baz"))])));
        v
    }

    /// Checks (routing key, space-separated expected destinations) pairs.
    fn check(t: &TopicTrie<String>, cases: &[(&str, &str)]) {
        for (key, expected) in cases {
            let expected: Vec<&str> = expected.split_whitespace().collect();
            assert_eq!(routed(t, key), names(&expected), "routing key {key:?}");
        }
    }

    #[test]
    fn rabbitmq_routing_suite() {
        let mut t = TopicTrie::new();
        let bindings = rabbit_bindings();
        for (k, q, a) in &bindings {
            assert!(t.bind(k, a, q.to_string()));
        }
        assert_eq!(t.len(), 28);
        #[rustfmt::skip]
        check(&t, &[
            ("a.b.c", "t1 t2 t5 t6 t10 t11 t12 t18 t20 t21 t22 t23 t24 t26"),
            ("a.b", "t3 t5 t6 t7 t8 t9 t11 t12 t15 t21 t22 t23 t24 t26"),
            ("a.b.b", "t3 t5 t6 t7 t11 t12 t14 t18 t21 t22 t23 t24 t26"),
            ("", "t5 t6 t17 t24"),
            ("b.c.c", "t5 t6 t18 t21 t22 t23 t24 t26"),
            ("a.a.a.a.a", "t5 t6 t11 t12 t21 t22 t23 t24"),
            ("vodka.gin", "t5 t6 t8 t21 t22 t23 t24"),
            ("vodka.martini", "t5 t6 t8 t19 t21 t22 t23 t24"),
            ("b.b.c", "t5 t6 t10 t13 t18 t21 t22 t23 t24 t26"),
            ("nothing.here.at.all", "t5 t6 t21 t22 t23 t24"),
            ("oneword", "t5 t6 t21 t22 t23 t24 t25"),
            ("args-test", "t5 t6 t21 t22 t23 t24 t25 t27"),
        ]);

        // Remove bindings 1, 5, 11, 19, 21 and 28 (1-based), as the suite does.
        for n in [1, 5, 11, 19, 21, 28] {
            let (k, q, a) = &bindings[n - 1];
            assert!(t.unbind(k, a, &q.to_string()), "binding {n}");
        }
        assert_eq!(t.len(), 22);
        #[rustfmt::skip]
        check(&t, &[
            ("a.b.c", "t2 t6 t10 t12 t18 t20 t22 t23 t24 t26"),
            ("a.b", "t3 t6 t7 t8 t9 t12 t15 t22 t23 t24 t26"),
            ("a.b.b", "t3 t6 t7 t12 t14 t18 t22 t23 t24 t26"),
            ("", "t6 t17 t24"),
            ("b.c.c", "t6 t18 t22 t23 t24 t26"),
            ("a.a.a.a.a", "t6 t12 t22 t23 t24"),
            ("vodka.gin", "t6 t8 t22 t23 t24"),
            ("vodka.martini", "t6 t8 t22 t23 t24"),
            ("b.b.c", "t6 t10 t13 t18 t22 t23 t24 t26"),
            ("nothing.here.at.all", "t6 t22 t23 t24"),
            ("oneword", "t6 t22 t23 t24 t25"),
            ("args-test", "t6 t22 t23 t24 t25 t27"),
        ]);

        // Then everything goes, and nothing matches.
        for (k, q, a) in &bindings {
            t.unbind(k, a, &q.to_string());
        }
        assert!(t.is_empty() && t.root.is_empty() && t.by_dest.is_empty());
        check(&t, &[("a.b.c", ""), ("b.b.c", ""), ("", "")]);
    }

    /// (binding key, routing key, matches?)
    const CASES: &[(&str, &str, bool)] = &[
        // The empty routing key has no words.
        ("", "", true),
        ("#", "", true),
        ("#.#", "", true),
        ("*", "", false),
        ("#.*", "", false),
        ("*.#", "", false),
        ("#.*.#", "", false),
        ("a", "", false),
        ("", "a", false),
        ("", ".", false),
        // Empty words are words.
        ("a..b", "a..b", true),
        ("a.*.b", "a..b", true),
        ("a.#.b", "a..b", true),
        ("a.b", "a..b", false),
        ("*.*.*", "a..b", true),
        ("*.*", ".", true),
        (".", ".", true),
        ("*", ".", false),
        ("#", ".", true),
        ("a.*", "a.", true),
        ("a", "a.", false),
        ("a.#", "a.", true),
        ("a.", "a.", true),
        ("a.", "a", false),
        ("*.a", ".a", true),
        ("..", "..", true),
        ("#.", "a.b.", true),
        ("#.", "a.b", false),
        // '#' matches zero or more words, anywhere.
        ("#", "a", true),
        ("#", "a.b.c", true),
        ("a.#", "a", true),
        ("a.#", "a.b.c", true),
        ("a.#", "b.a", false),
        ("#.a", "a", true),
        ("#.a", "b.b.a", true),
        ("#.a", "a.b", false),
        ("#.a.#", "a", true),
        ("#.a.#", "x.y.a.z", true),
        ("#.a.#", "x.y.z", false),
        ("a.#.#", "a", true),
        ("a.#.#", "a.b.c.d", true),
        ("a.#.b", "a.b", true),
        ("a.#.b", "a.x.y.b", true),
        ("a.#.b", "a.b.x", false),
        ("a.#.b.#.c", "a.b.c", true),
        ("a.#.b.#.c", "a.x.b.y.z.c", true),
        ("a.#.b.#.c", "a.c.b", false),
        ("#.b.#.b", "b.b", true),
        ("#.b.#.b", "b", false),
        ("#.#.#.a", "a", true),
        ("#.*", "a", true),
        ("#.*", "a.b.c", true),
        ("*.#", "a", true),
        ("a.*.#", "a", false),
        ("a.*.#", "a.b", true),
        ("a.*.#", "a.b.c.d", true),
        ("#.*.*", "a", false),
        ("#.*.*", "a.b", true),
        ("*.#.*", "a", false),
        ("*.#.*", "a.b", true),
        ("*.#.*", "a.b.c.d", true),
        // '*' matches exactly one word.
        ("*", "a", true),
        ("*", "a.b", false),
        ("a.*.c", "a.b.c", true),
        ("a.*.c", "a.c", false),
        ("a.*.c", "a.b.b.c", false),
        // Wildcards only count as whole words; routing keys are literal.
        ("a*", "ab", false),
        ("a*", "a*", true),
        ("#a", "a", false),
        ("a.#b", "a.#b", true),
        ("a", "*", false),
        ("*", "*", true),
        ("#", "#", true),
        ("a.#", "a.#", true),
        ("a.b", "a.*", false),
        ("a.b", "a.#", false),
        // Case and spacing matter.
        ("A", "a", false),
        (" a", "a", false),
        ("ünï.*", "ünï.cödé", true),
    ];

    #[test]
    fn table_driven_cases() {
        for &(binding, key, expected) in CASES {
            let mut t = TopicTrie::new();
            t.bind(binding, &FieldTable::default(), "q".to_string());
            let hit = !routed(&t, key).is_empty();
            assert_eq!(hit, expected, "binding {binding:?}, routing key {key:?}");
            assert_eq!(hit, reference(binding, key), "reference disagrees");
        }
    }

    fn words(key: &str) -> Vec<&str> {
        if key.is_empty() {
            Vec::new()
        } else {
            key.split('.').collect()
        }
    }

    /// Straightforward backtracking matcher, RabbitMQ's semantics.
    fn reference(binding: &str, key: &str) -> bool {
        fn go(p: &[&str], k: &[&str]) -> bool {
            match p.split_first() {
                None => k.is_empty(),
                Some((&"#", rest)) => (0..=k.len()).any(|i| go(rest, &k[i..])),
                Some((&"*", rest)) => !k.is_empty() && go(rest, &k[1..]),
                Some((w, rest)) => k.first() == Some(w) && go(rest, &k[1..]),
            }
        }
        go(&words(binding), &words(key))
    }

    /// Every dotted string of up to `max` words over `alphabet`.
    fn all_keys(alphabet: &[&str], max: usize) -> Vec<String> {
        let mut out = vec![String::new()];
        let mut layer: Vec<Vec<&str>> = vec![vec![]];
        for _ in 0..max {
            let mut next = Vec::new();
            for prefix in &layer {
                for w in alphabet {
                    let mut p = prefix.clone();
                    p.push(w);
                    out.push(p.join("."));
                    next.push(p);
                }
            }
            layer = next;
        }
        out.sort();
        out.dedup();
        out
    }

    #[test]
    fn exhaustive_against_reference() {
        let patterns = all_keys(&["a", "b", "", "*", "#"], 4);
        let keys = all_keys(&["a", "b", ""], 5);
        let mut t = TopicTrie::new();
        for p in &patterns {
            assert!(t.bind(p, &FieldTable::default(), p.clone()));
            // A second destination sharing every pattern exercises dedup.
            t.bind(p, &FieldTable::default(), "shared".to_string());
        }
        for key in &keys {
            let mut expected: Vec<String> = patterns
                .iter()
                .filter(|p| reference(p, key))
                .cloned()
                .collect();
            if !expected.is_empty() {
                expected.push("shared".to_string());
            }
            expected.sort();
            assert_eq!(routed(&t, key), expected, "routing key {key:?}");
        }
        for p in &patterns {
            assert!(t.unbind(p, &FieldTable::default(), p));
        }
        assert_eq!(t.unbind_all(&"shared".to_string()), patterns.len());
        assert!(t.is_empty() && t.root.is_empty() && t.by_dest.is_empty());
    }

    #[test]
    fn glob_agrees_with_reference() {
        let patterns = all_keys(&["a", "b", "", "*", "#"], 4);
        let keys = all_keys(&["a", "b", ""], 5);
        for p in &patterns {
            for k in &keys {
                assert_eq!(glob(p, k), reference(p, k), "pattern {p:?}, key {k:?}");
            }
        }
        for &(binding, key, expected) in CASES {
            assert_eq!(glob(binding, key), expected, "{binding:?} {key:?}");
        }
    }

    #[test]
    fn keys_too_long_for_the_trie() {
        let none = FieldTable::default();
        let n = 20_000;
        let key = vec!["a"; n].join(".");
        let long_star = vec!["*"; n].join(".");
        let long_hash = vec!["#.a"; n / 2].join(".");
        let mut t = TopicTrie::new();
        assert!(t.bind(&long_star, &none, 1u32));
        assert!(!t.bind(&long_star, &none, 1u32));
        assert!(t.bind(&long_hash, &none, 2u32));
        assert!(t.bind(&key, &none, 3u32));
        assert!(t.bind("#", &none, 3u32));
        assert!(t.bind("#.b", &none, 4u32));
        assert_eq!(t.len(), 5);
        assert!(t.root.words.is_empty() && t.root.star.is_none());
        let mut out = Vec::new();
        t.route(&key, &mut out);
        out.sort();
        assert_eq!(out, [1, 2, 3]);
        out.clear();
        t.route(&(key.clone() + ".b"), &mut out);
        out.sort();
        assert_eq!(out, [3, 4]);
        assert_eq!(t.iter().count(), 5);
        assert!(t.has_destination(&1));
        assert!(t.unbind(&long_star, &none, &1));
        assert!(!t.unbind(&long_star, &none, &1));
        assert!(!t.has_destination(&1));
        assert_eq!(t.unbind_all(&3), 2);
        assert_eq!(t.unbind_all(&2), 1);
        assert_eq!(t.len(), 1);
        let copy = t.clone();
        drop(t);
        assert_eq!(copy.len(), 1);
    }

    #[test]
    fn nested_hashes_stay_polynomial() {
        let key = vec!["a"; 127].join(".");
        let mut t = TopicTrie::new();
        let evil = [
            "#.a.#.a.#.a.#.a.#.a.#.a.#.a.#.a.#.a.#.a.#.b",
            "#.*.#.*.#.*.#.*.#.*.#.*.#.*.#.*.#.*.#.*.#.b",
            "*.#.a.#.*.#.a.#.*.#.a.#.*.#.a.#.*.#.a.#.c",
        ];
        for (i, b) in evil.iter().enumerate() {
            t.bind(b, &FieldTable::default(), format!("evil{i}"));
        }
        t.bind("#.a.#.a.#.a.#.a.#.a", &FieldTable::default(), "ok".into());
        let started = std::time::Instant::now();
        assert_eq!(routed(&t, &key), ["ok"]);
        assert!(
            started.elapsed().as_secs() < 5,
            "took {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn many_nested_hash_nodes_spill_the_memo() {
        let mut t = TopicTrie::new();
        for i in 0..40 {
            t.bind(
                &format!("#.x{i}.#.y"),
                &FieldTable::default(),
                format!("q{i}"),
            );
        }
        let key = (0..40)
            .map(|i| format!("x{i}"))
            .collect::<Vec<_>>()
            .join(".")
            + ".y";
        assert_eq!(routed(&t, &key).len(), 40);
        assert_eq!(routed(&t, "x3.z").len(), 0);
        assert_eq!(routed(&t, "x3.z.y"), ["q3"]);
    }

    #[test]
    fn destination_matched_by_several_patterns_appears_once() {
        let none = FieldTable::default();
        let mut t = TopicTrie::new();
        for p in ["a.*", "*.b", "#", "a.b", "a.#.#", "a.#", "#.b"] {
            t.bind(p, &none, "q".to_string());
        }
        t.bind("a.b", &none, "r".to_string());
        assert_eq!(routed(&t, "a.b"), ["q", "r"]);
        // Many destinations from several patterns: hash-set dedup path.
        for i in 0..100 {
            t.bind("a.*", &none, format!("d{i}"));
            t.bind("#.b", &none, format!("d{i}"));
        }
        assert_eq!(routed(&t, "a.b").len(), 102);
    }

    #[test]
    fn equivalent_keys_share_a_node_but_stay_distinct_bindings() {
        let none = FieldTable::default();
        let q = "q".to_string();
        let mut t = TopicTrie::new();
        assert!(t.bind("a.#", &none, q.clone()));
        assert!(t.bind("a.#.#", &none, q.clone()));
        assert!(!t.bind("a.#.#", &none, q.clone()));
        assert_eq!(t.len(), 2);
        let mut keys: Vec<&str> = t.iter().map(|(k, _, _)| k).collect();
        keys.sort();
        assert_eq!(keys, ["a.#", "a.#.#"]);
        assert!(t.unbind("a.#", &none, &q));
        assert!(!t.unbind("a.#", &none, &q));
        assert_eq!(routed(&t, "a.z"), ["q"]);
        assert!(t.has_destination(&q));
        assert!(t.unbind("a.#.#", &none, &q));
        assert!(!t.has_destination(&q));
        assert!(t.root.is_empty());
    }

    #[test]
    fn unbind_all_and_pruning() {
        let none = FieldTable::default();
        let args = table(&[("k", s("v"))]);
        let mut t = TopicTrie::new();
        for i in 0..20 {
            let q = format!("q{i}");
            t.bind(&format!("user.{i}.#"), &none, q.clone());
            t.bind(&format!("user.{i}.#"), &args, q.clone());
            t.bind("user.*.#.#", &none, q.clone());
            t.bind("", &none, q);
        }
        assert_eq!(t.len(), 80);
        assert_eq!(t.unbind_all(&"q7".to_string()), 4);
        assert_eq!(t.len(), 76);
        assert_eq!(routed(&t, "user.7.x").len(), 19);
        assert!(!routed(&t, "").contains(&"q7".to_string()));
        for i in 0..20 {
            t.unbind_all(&format!("q{i}"));
        }
        assert!(t.is_empty() && t.root.is_empty() && t.by_dest.is_empty());
        assert_eq!(t.iter().count(), 0);
    }

    #[test]
    fn longest_short_string_keys() {
        // 255 bytes is the most an AMQP short string holds.
        let dots = ".".repeat(255); // 256 empty words
        let stars = vec!["*"; 128].join(".");
        let hashes = vec!["#"; 128].join(".");
        let mixed = vec!["#.a"; 64].join(".");
        let key_a = vec!["a"; 128].join(".");
        let mut t = TopicTrie::new();
        for (i, b) in [&dots, &stars, &hashes, &mixed].into_iter().enumerate() {
            assert!(b.len() <= 255);
            t.bind(b, &FieldTable::default(), i as u32);
        }
        let mut out = Vec::new();
        t.route(&dots, &mut out);
        out.sort();
        assert_eq!(out, [0, 2]);
        out.clear();
        t.route(&key_a, &mut out);
        out.sort();
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(t.unbind_all(&0), 1);
        assert!(t.unbind(&mixed, &FieldTable::default(), &3));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn unbind_of_missing_paths_is_harmless() {
        let none = FieldTable::default();
        let mut t = TopicTrie::new();
        t.bind("a.b", &none, 1u32);
        assert!(!t.unbind("a.b.c", &none, &1));
        assert!(!t.unbind("a", &none, &1));
        assert!(!t.unbind("a.*", &none, &1));
        assert!(!t.unbind("a.#", &none, &1));
        assert!(!t.unbind("", &none, &1));
        assert!(!t.unbind("a.b", &none, &2));
        assert_eq!(t.len(), 1);
        let mut out = Vec::new();
        t.route("a.b", &mut out);
        assert_eq!(out, [1]);
    }
}
