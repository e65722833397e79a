//! The headers exchange table: a message goes to the destinations whose
//! binding arguments match its headers, as RabbitMQ's
//! rabbit_exchange_type_headers decides it:
//!
//! - `x-match` is "all" (the default, also used for any unrecognised value),
//!   "any", "all-with-x" or "any-with-x"; it never takes part in matching
//!   itself. Other arguments starting with "x-" are ignored unless the mode
//!   is one of the "-with-x" ones.
//! - An argument of type void matches when the header is present, whatever
//!   its value. Otherwise values compare like Erlang's `==`: the type is
//!   ignored at the top level, so integers of any width, timestamps and
//!   floats compare numerically (1 matches 1.0) and long strings equal byte
//!   arrays with the same bytes; inside arrays and tables types must agree.
//! - "all" with no arguments left matches every message; "any" with none
//!   matches nothing. A message without headers has an empty table.

use std::hash::Hash;

use amq_protocol::types::AMQPValue;

use crate::wire::type_name;

use super::{same_args, string_bytes, value_eq, Change, DestSet, FieldTable, Floats};

/// One headers binding, with its `x-match` mode decoded once.
#[derive(Clone, Debug)]
struct Binding {
    key: Box<str>,
    args: FieldTable,
    /// "any"/"any-with-x" rather than "all"/"all-with-x".
    any: bool,
    /// "-with-x": arguments starting with "x-" take part in matching.
    with_x: bool,
}

impl Binding {
    fn new(key: &str, args: &FieldTable) -> Self {
        let (any, with_x) = match args.inner().get("x-match").and_then(string_bytes) {
            Some(b"any") => (true, false),
            Some(b"all-with-x") => (false, true),
            Some(b"any-with-x") => (true, true),
            _ => (false, false),
        };
        Self {
            key: key.into(),
            args: args.clone(),
            any,
            with_x,
        }
    }

    fn matches(&self, headers: &FieldTable) -> bool {
        for (name, pattern) in &self.args {
            let name = name.as_str();
            if name == "x-match" || (!self.with_x && name.starts_with("x-")) {
                continue;
            }
            let hit = match headers.inner().get(name) {
                None => false,
                Some(value) => matches!(pattern, AMQPValue::Void) || loose_eq(pattern, value),
            };
            if hit == self.any {
                // First hit decides "any"; first miss decides "all".
                return hit;
            }
        }
        !self.any
    }
}

/// A numeric header value, widened.
#[derive(Clone, Copy)]
enum Num {
    Int(i128),
    Float(f64),
}

fn number(v: &AMQPValue) -> Option<Num> {
    use AMQPValue as V;
    Some(match v {
        V::ShortShortInt(x) => Num::Int((*x).into()),
        V::ShortShortUInt(x) => Num::Int((*x).into()),
        V::ShortInt(x) => Num::Int((*x).into()),
        V::ShortUInt(x) => Num::Int((*x).into()),
        V::LongInt(x) => Num::Int((*x).into()),
        V::LongUInt(x) => Num::Int((*x).into()),
        V::LongLongInt(x) => Num::Int((*x).into()),
        V::Timestamp(x) => Num::Int((*x).into()),
        V::Float(x) => Num::Float((*x).into()),
        V::Double(x) => Num::Float(*x),
        _ => return None,
    })
}

/// Exact numeric equality (Erlang `==`: 1 == 1.0, 1 /= 1.5).
fn num_eq(a: Num, b: Num) -> bool {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x == y,
        (Num::Float(x), Num::Float(y)) => x == y,
        // A float equal to an integer is integral and in range, so the
        // (saturating) cast is exact whenever the answer is true.
        (Num::Int(i), Num::Float(f)) | (Num::Float(f), Num::Int(i)) => {
            f.fract() == 0.0 && f as i128 == i
        }
    }
}

/// The bytes of a string or byte-array value (all Erlang binaries).
fn binary(v: &AMQPValue) -> Option<&[u8]> {
    match v {
        AMQPValue::ByteArray(b) => Some(b.as_slice()),
        _ => string_bytes(v),
    }
}

/// RabbitMQ's comparison of a binding value with a header value: Erlang
/// `==` on the bare values, the type tags being dropped at this level.
fn loose_eq(pattern: &AMQPValue, value: &AMQPValue) -> bool {
    if let (Some(x), Some(y)) = (number(pattern), number(value)) {
        return num_eq(x, y);
    }
    if let (Some(x), Some(y)) = (binary(pattern), binary(value)) {
        return x == y;
    }
    value_eq(pattern, value, Floats::Numeric)
}

/// Bindings of a headers exchange, grouped by destination.
#[derive(Clone, Debug)]
pub struct HeadersTable<D> {
    set: DestSet<D, Binding>,
}

impl<D> Default for HeadersTable<D> {
    fn default() -> Self {
        Self {
            set: DestSet::default(),
        }
    }
}

impl<D: Clone + Eq + Hash> HeadersTable<D> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the binding (key, args, dest); false if it already exists.
    /// An invalid `x-match` is accepted and treated as "all", as RabbitMQ
    /// does for bindings that bypassed validation; see [`validate_args`].
    pub fn bind(&mut self, key: &str, args: &FieldTable, dest: D) -> bool {
        let same = |b: &Binding| &*b.key == key && same_args(&b.args, args);
        self.set.insert(dest, Binding::new(key, args), same) != Change::Nothing
    }

    /// Removes the binding (key, args, dest); false if there was none.
    pub fn unbind(&mut self, key: &str, args: &FieldTable, dest: &D) -> bool {
        let same = |b: &Binding| &*b.key == key && same_args(&b.args, args);
        self.set.remove(dest, same) != Change::Nothing
    }

    /// Removes every binding to `dest`; returns how many.
    pub fn unbind_all(&mut self, dest: &D) -> usize {
        self.set.remove_dest(dest)
    }

    /// Appends to `out` every destination with a binding that matches
    /// `headers` (None: the message has no headers), each once.
    pub fn route(&self, headers: Option<&FieldTable>, out: &mut Vec<D>) {
        let empty = FieldTable::default();
        let headers = headers.unwrap_or(&empty);
        for slot in self.set.slots() {
            if slot.items.iter().any(|b| b.matches(headers)) {
                out.push(slot.dest.clone());
            }
        }
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
        self.set.iter().map(|(d, b)| (&*b.key, &b.args, d))
    }

    /// True if any binding leads to `dest`.
    pub fn has_destination(&self, dest: &D) -> bool {
        self.set.contains(dest)
    }
}

/// Checks the `x-match` argument of a new headers binding as RabbitMQ's
/// `validate_binding` does. On error, returns the text RabbitMQ closes the
/// channel with (after "PRECONDITION_FAILED - "). Erlang's term printing is
/// reproduced for the usual values; exotic floats and non-ASCII bytes are
/// approximated; the caller truncates the text to a short string.
///
/// # Errors
///
/// When `x-match` is present but is not a long string holding "all", "any",
/// "all-with-x" or "any-with-x".
pub fn validate_args(args: &FieldTable) -> Result<(), String> {
    let Some(v) = args.inner().get("x-match") else {
        return Ok(());
    };
    match string_bytes(v) {
        Some(b"all" | b"any" | b"all-with-x" | b"any-with-x") => Ok(()),
        Some(_) => Err(format!(
            "Invalid x-match field value {}; expected all, any, all-with-x, or any-with-x",
            erl_term(v)
        )),
        None => Err(format!(
            "Invalid x-match field type {} (value {}); expected longstr",
            type_name(v),
            erl_term(v)
        )),
    }
}

/// A field value printed the way Erlang's `~p` prints RabbitMQ's decoding.
fn erl_term(v: &AMQPValue) -> String {
    use AMQPValue as V;
    match v {
        V::Boolean(b) => b.to_string(),
        V::Float(x) => erl_float(f64::from(*x)),
        V::Double(x) => erl_float(*x),
        V::DecimalValue(d) => format!("{{{},{}}}", d.scale, d.value),
        V::FieldArray(a) => {
            let items: Vec<String> = a
                .as_slice()
                .iter()
                .map(|x| format!("{{{},{}}}", type_name(x), erl_term(x)))
                .collect();
            format!("[{}]", items.join(","))
        }
        V::FieldTable(t) => {
            let items: Vec<String> = t
                .into_iter()
                .map(|(k, x)| {
                    let name = erl_binary(k.as_str().as_bytes());
                    format!("{{{name},{},{}}}", type_name(x), erl_term(x))
                })
                .collect();
            format!("[{}]", items.join(","))
        }
        V::Void => "undefined".to_owned(),
        _ => match (number(v), binary(v)) {
            (Some(Num::Int(i)), _) => i.to_string(),
            (_, Some(b)) => erl_binary(b),
            _ => String::new(),
        },
    }
}

/// An Erlang binary: `<<"text">>` when printable ASCII, else `<<1,2,3>>`.
fn erl_binary(b: &[u8]) -> String {
    if b.is_empty() {
        "<<>>".to_owned()
    } else if b.iter().all(|c| (0x20..0x7f).contains(c)) {
        let mut s = String::from("<<\"");
        for &c in b {
            if c == b'"' || c == b'\\' {
                s.push('\\');
            }
            s.push(char::from(c));
        }
        s + "\">>"
    } else {
        let bytes: Vec<String> = b.iter().map(|c| c.to_string()).collect();
        format!("<<{}>>", bytes.join(","))
    }
}

/// A float in Erlang's style (always a fraction part: 1.0, 1.0e22).
fn erl_float(x: f64) -> String {
    let s = format!("{x:?}");
    match s.split_once('e') {
        Some((m, e)) if !m.contains('.') => format!("{m}.0e{e}"),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use amq_protocol::types::{DecimalValue, FieldArray};
    use AMQPValue as V;

    /// Does a single binding with `args` match a message with `headers`?
    fn hit(args: &[(&str, V)], headers: Option<&[(&str, V)]>) -> bool {
        let mut t = HeadersTable::new();
        t.bind("", &table(args), 1u32);
        let headers = headers.map(table);
        let mut out = Vec::new();
        t.route(headers.as_ref(), &mut out);
        !out.is_empty()
    }

    fn xm(mode: &str) -> (&'static str, V) {
        ("x-match", s(mode))
    }

    #[test]
    fn all_requires_every_argument() {
        let args = [("a", s("1")), ("b", s("2"))];
        let both = [("a", s("1")), ("b", s("2")), ("c", s("3"))];
        assert!(hit(&args, Some(&both)));
        assert!(!hit(&args, Some(&[("a", s("1"))])));
        assert!(!hit(&args, Some(&[("a", s("1")), ("b", s("x"))])));
        assert!(!hit(&args, None));
        let mut explicit = args.to_vec();
        explicit.push(xm("all"));
        assert!(hit(&explicit, Some(&both)));
        assert!(!hit(&explicit, Some(&[("b", s("2"))])));
    }

    #[test]
    fn any_requires_one_argument() {
        let args = [xm("any"), ("a", s("1")), ("b", s("2"))];
        assert!(hit(&args, Some(&[("a", s("1"))])));
        assert!(hit(&args, Some(&[("a", s("x")), ("b", s("2"))])));
        assert!(!hit(&args, Some(&[("a", s("x")), ("b", s("y"))])));
        assert!(!hit(&args, Some(&[("c", s("1"))])));
        assert!(!hit(&args, None));
    }

    #[test]
    fn empty_patterns() {
        assert!(hit(&[], None), "all with no arguments matches everything");
        assert!(hit(&[], Some(&[("a", s("1"))])));
        assert!(hit(&[xm("all")], None));
        assert!(
            !hit(&[xm("any")], None),
            "any with no arguments matches nothing"
        );
        assert!(!hit(&[xm("any")], Some(&[("a", s("1"))])));
        assert!(hit(&[xm("all-with-x")], None));
        assert!(!hit(
            &[xm("any-with-x")],
            Some(&[("x-match", s("any-with-x"))])
        ));
    }

    #[test]
    fn x_arguments_are_ignored_unless_with_x() {
        let h = [("x-death", s("1")), ("a", s("1"))];
        assert!(
            hit(&[("x-foo", s("bar"))], None),
            "only x- args: all matches"
        );
        assert!(!hit(
            &[xm("any"), ("x-foo", s("bar"))],
            Some(&[("x-foo", s("bar"))])
        ));
        assert!(hit(&[("x-death", s("nope")), ("a", s("1"))], Some(&h)));
        assert!(hit(
            &[xm("all-with-x"), ("x-death", s("1")), ("a", s("1"))],
            Some(&h)
        ));
        assert!(!hit(
            &[xm("all-with-x"), ("x-death", s("2")), ("a", s("1"))],
            Some(&h)
        ));
        assert!(!hit(&[xm("all-with-x"), ("x-other", s("1"))], Some(&h)));
        assert!(hit(
            &[xm("any-with-x"), ("x-death", s("1")), ("b", s("9"))],
            Some(&h)
        ));
        assert!(!hit(&[xm("any-with-x"), ("x-death", s("2"))], Some(&h)));
        // The x-match argument itself never has to be present in the message.
        assert!(hit(
            &[xm("all-with-x"), ("a", s("1"))],
            Some(&[("a", s("1"))])
        ));
    }

    #[test]
    fn unknown_x_match_means_all() {
        let two = [("a", s("1")), ("b", s("2"))];
        for mode in [s("none"), s("ANY"), s(""), V::LongInt(1), V::Boolean(true)] {
            let args = [("x-match", mode.clone()), ("a", s("1")), ("b", s("2"))];
            assert!(hit(&args, Some(&two)), "{mode:?}");
            assert!(!hit(&args, Some(&[("a", s("1"))])), "{mode:?}");
        }
    }

    #[test]
    fn void_argument_matches_on_presence() {
        assert!(hit(&[("a", V::Void)], Some(&[("a", s("anything"))])));
        assert!(hit(&[("a", V::Void)], Some(&[("a", V::Void)])));
        assert!(hit(&[("a", V::Void)], Some(&[("a", V::LongInt(0))])));
        assert!(!hit(&[("a", V::Void)], Some(&[("b", s("1"))])));
        assert!(!hit(&[("a", V::Void)], None));
        assert!(!hit(&[("a", s("1"))], Some(&[("a", V::Void)])));
        assert!(hit(
            &[xm("any"), ("a", V::Void), ("b", s("1"))],
            Some(&[("a", s("x"))])
        ));
    }

    #[test]
    fn numbers_compare_across_types() {
        let ones = [
            V::ShortShortInt(1),
            V::ShortShortUInt(1),
            V::ShortInt(1),
            V::ShortUInt(1),
            V::LongInt(1),
            V::LongUInt(1),
            V::LongLongInt(1),
            V::Timestamp(1),
            V::Float(1.0),
            V::Double(1.0),
        ];
        for p in &ones {
            for v in &ones {
                assert!(
                    hit(&[("n", p.clone())], Some(&[("n", v.clone())])),
                    "{p:?} {v:?}"
                );
            }
        }
        let not_one = [
            V::LongInt(2),
            V::Double(1.5),
            V::Double(f64::NAN),
            V::Double(f64::INFINITY),
            s("1"),
            V::Boolean(true),
            V::DecimalValue(DecimalValue { scale: 0, value: 1 }),
            V::Void,
        ];
        for v in &not_one {
            assert!(
                !hit(&[("n", V::LongInt(1))], Some(&[("n", v.clone())])),
                "{v:?}"
            );
        }
        assert!(hit(
            &[("n", V::LongInt(-1))],
            Some(&[("n", V::Double(-1.0))])
        ));
        assert!(hit(
            &[("n", V::Double(0.0))],
            Some(&[("n", V::Double(-0.0))])
        ));
        assert!(!hit(
            &[("n", V::Double(0.1))],
            Some(&[("n", V::Float(0.1))])
        ));
        assert!(hit(&[("n", V::Double(0.5))], Some(&[("n", V::Float(0.5))])));
        let big = V::Timestamp(u64::MAX);
        assert!(!hit(
            &[("n", V::LongLongInt(-1))],
            Some(&[("n", big.clone())])
        ));
        // Exact comparison: 2^64 as a double is not u64::MAX, 2^53 is 2^53.
        assert!(!hit(
            &[("n", V::Double(18_446_744_073_709_551_616.0))],
            Some(&[("n", big)])
        ));
        let p53 = 9_007_199_254_740_992u64;
        assert!(hit(
            &[("n", V::Double(p53 as f64))],
            Some(&[("n", V::Timestamp(p53))])
        ));
        assert!(!hit(
            &[("n", V::Double(p53 as f64))],
            Some(&[("n", V::Timestamp(p53 + 1))])
        ));
        assert!(!hit(
            &[("n", V::Double(f64::NAN))],
            Some(&[("n", V::Double(f64::NAN))])
        ));
    }

    #[test]
    fn strings_and_other_values() {
        let bytes = V::ByteArray(b"abc".to_vec().into());
        assert!(hit(&[("k", s("abc"))], Some(&[("k", bytes.clone())])));
        assert!(hit(&[("k", bytes.clone())], Some(&[("k", s("abc"))])));
        assert!(!hit(&[("k", s("abc"))], Some(&[("k", s("ABC"))])));
        assert!(!hit(&[("k", s("abc"))], Some(&[("k", s("abc "))])));
        assert!(hit(
            &[("k", V::Boolean(false))],
            Some(&[("k", V::Boolean(false))])
        ));
        assert!(!hit(
            &[("k", V::Boolean(false))],
            Some(&[("k", V::Boolean(true))])
        ));
        assert!(!hit(
            &[("k", V::Boolean(false))],
            Some(&[("k", V::LongInt(0))])
        ));
        let d = |scale, value| V::DecimalValue(DecimalValue { scale, value });
        assert!(hit(&[("k", d(2, 100))], Some(&[("k", d(2, 100))])));
        assert!(!hit(&[("k", d(2, 100))], Some(&[("k", d(1, 10))])));
    }

    #[test]
    fn arrays_and_tables_compare_with_types() {
        let arr = |v: Vec<V>| V::FieldArray(FieldArray::from(v));
        let a = arr(vec![V::LongInt(1), s("x")]);
        assert!(hit(&[("k", a.clone())], Some(&[("k", a.clone())])));
        assert!(!hit(
            &[("k", a.clone())],
            Some(&[("k", arr(vec![V::LongLongInt(1), s("x")]))])
        ));
        assert!(!hit(
            &[("k", a.clone())],
            Some(&[("k", arr(vec![s("x"), V::LongInt(1)]))])
        ));
        assert!(!hit(
            &[("k", a.clone())],
            Some(&[("k", arr(vec![V::LongInt(1)]))])
        ));
        let t = V::FieldTable(table(&[("n", V::Double(1.0))]));
        assert!(hit(&[("k", t.clone())], Some(&[("k", t.clone())])));
        let t2 = V::FieldTable(table(&[("n", V::LongInt(1))]));
        assert!(!hit(&[("k", t.clone())], Some(&[("k", t2)])));
        assert!(!hit(&[("k", t)], Some(&[("k", a)])));
    }

    #[test]
    fn destination_once_even_if_several_bindings_match() {
        let mut t = HeadersTable::new();
        t.bind("", &table(&[("a", s("1"))]), 1u32);
        t.bind("", &table(&[("b", s("2"))]), 1u32);
        t.bind("other", &table(&[("a", s("1"))]), 1u32);
        t.bind("", &table(&[("b", s("2"))]), 2u32);
        assert_eq!(t.len(), 4);
        let h = table(&[("a", s("1")), ("b", s("2"))]);
        let mut out = Vec::new();
        t.route(Some(&h), &mut out);
        out.sort();
        assert_eq!(out, [1, 2]);
        out.clear();
        t.route(Some(&table(&[("a", s("1"))])), &mut out);
        assert_eq!(out, [1]);
        assert_eq!(t.unbind_all(&1), 3);
        assert!(t.has_destination(&2) && !t.has_destination(&1));
    }

    #[test]
    fn validation_messages() {
        for ok in ["all", "any", "all-with-x", "any-with-x"] {
            assert_eq!(validate_args(&table(&[xm(ok)])), Ok(()));
        }
        assert_eq!(validate_args(&FieldTable::default()), Ok(()));
        assert_eq!(validate_args(&table(&[("a", V::LongInt(1))])), Ok(()));
        assert_eq!(
            validate_args(&table(&[xm("none")])).unwrap_err(),
            "Invalid x-match field value <<\"none\">>; expected all, any, all-with-x, or any-with-x"
        );
        assert_eq!(
            validate_args(&table(&[xm("q\"\\")])).unwrap_err(),
            "Invalid x-match field value <<\"q\\\"\\\\\">>; expected all, any, all-with-x, or any-with-x"
        );
        let bad = |v: V| validate_args(&table(&[("x-match", v)])).unwrap_err();
        assert_eq!(
            bad(V::LongInt(1)),
            "Invalid x-match field type signedint (value 1); expected longstr"
        );
        assert_eq!(
            bad(V::Boolean(true)),
            "Invalid x-match field type bool (value true); expected longstr"
        );
        assert_eq!(
            bad(V::ByteArray(vec![1, 2].into())),
            "Invalid x-match field type binary (value <<1,2>>); expected longstr"
        );
        assert_eq!(
            bad(V::Double(1.0)),
            "Invalid x-match field type double (value 1.0); expected longstr"
        );
        assert_eq!(
            bad(V::Void),
            "Invalid x-match field type void (value undefined); expected longstr"
        );
        assert_eq!(
            bad(V::FieldArray(FieldArray::from(vec![V::LongLongInt(1), s("a")]))),
            "Invalid x-match field type array (value [{long,1},{longstr,<<\"a\">>}]); expected longstr"
        );
        assert_eq!(
            bad(V::FieldTable(table(&[("k", V::DecimalValue(DecimalValue { scale: 2, value: 5 }))]))),
            "Invalid x-match field type table (value [{<<\"k\">>,decimal,{2,5}}]); expected longstr"
        );
        assert_eq!(
            validate_args(&table(&[xm("")])).unwrap_err(),
            "Invalid x-match field value <<>>; expected all, any, all-with-x, or any-with-x"
        );
        assert_eq!(erl_float(1e22), "1.0e22");
        assert_eq!(erl_float(0.25), "0.25");
    }
}
