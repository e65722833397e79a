//! Field tables and arrays as they are on the wire: a 32-bit length, then
//! entries (a short-string key, a type octet, the value) or values.
//!
//! `check_table` walks an encoded table without recursion and without
//! building anything, refusing nesting deeper than `MAX_DEPTH`: decoders
//! that build values (amq-protocol's recurse on parse, clone, drop and
//! encode) only ever see tables that passed it. `entries` and `Value` read
//! a checked table without copying; `edit` rewrites one, copying every
//! entry it does not touch verbatim; `to_amqp` converts to amq-protocol's
//! values for the code that matches on them (non-UTF-8 keys, which
//! RabbitMQ accepts and amq-protocol does not, are read lossily there).
//!
//! Type octets are RabbitMQ's (rabbit_binary_parser), as amq-protocol
//! reads them: `s` and `U` are signed shorts, `l` and `L` signed longs.

use amq_protocol::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};

use super::FieldReader;

/// How deeply tables and arrays may nest (the outermost table is level 1).
/// RabbitMQ sets no limit; 64 is far beyond any real use and keeps every
/// recursive decoder's stack small.
pub const MAX_DEPTH: usize = 64;

/// Why an encoded table was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableError {
    /// The bytes do not form a table (a length past the end, an unknown
    /// type octet).
    Malformed,
    /// Tables or arrays nest deeper than `MAX_DEPTH`.
    TooDeep,
}

impl std::fmt::Display for TableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableError::Malformed => f.write_str("malformed field table"),
            TableError::TooDeep => write!(f, "field table nested deeper than {MAX_DEPTH} levels"),
        }
    }
}

/// The size of a fixed-size value of type `tag`, None for the others.
fn fixed_size(tag: u8) -> Option<usize> {
    Some(match tag {
        b'V' => 0,
        b't' | b'b' | b'B' => 1,
        b's' | b'u' | b'U' => 2,
        b'I' | b'i' | b'f' => 4,
        b'D' => 5,
        b'l' | b'L' | b'd' | b'T' => 8,
        _ => return None,
    })
}

/// The encoded size of a value of type `tag` at the start of `bytes`.
fn value_len(tag: u8, bytes: &[u8]) -> Option<usize> {
    if let Some(n) = fixed_size(tag) {
        return (bytes.len() >= n).then_some(n);
    }
    match tag {
        b'S' | b'x' | b'F' | b'A' => {
            let n = FieldReader::new(bytes).u32()? as usize;
            let len = n.checked_add(4)?;
            (bytes.len() >= len).then_some(len)
        }
        _ => None,
    }
}

/// Checks the table at the start of `buf` (its 32-bit length first):
/// well formed and at most `MAX_DEPTH` deep. Returns its encoded length.
pub fn check_table(buf: &[u8]) -> Result<usize, TableError> {
    check(buf, true)
}

/// `check_table` for an array.
pub fn check_array(buf: &[u8]) -> Result<usize, TableError> {
    check(buf, false)
}

fn check(buf: &[u8], table: bool) -> Result<usize, TableError> {
    use TableError::{Malformed, TooDeep};
    let len = |at: usize| -> Result<usize, TableError> {
        let n = buf
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or(Malformed)?;
        let end = at + 4 + n;
        if end > buf.len() {
            return Err(Malformed);
        }
        Ok(end)
    };
    // The open tables and arrays: where each ends, and whether it is a
    // table (entries have keys) or an array.
    let mut open = [(0usize, false); MAX_DEPTH];
    let mut depth = 1;
    let outer_end = len(0)?;
    open[0] = (outer_end, table);
    let mut at = 4;
    loop {
        let (end, is_table) = open[depth - 1];
        if at == end {
            depth -= 1;
            if depth == 0 {
                return Ok(outer_end);
            }
            continue;
        }
        if is_table {
            let key = *buf.get(at).ok_or(Malformed)? as usize;
            at += 1 + key;
        }
        let tag = *buf.get(at).filter(|_| at < end).ok_or(Malformed)?;
        at += 1;
        match tag {
            b'F' | b'A' => {
                let inner_end = len(at)?;
                if inner_end > end {
                    return Err(Malformed);
                }
                if depth == MAX_DEPTH {
                    return Err(TooDeep);
                }
                open[depth] = (inner_end, tag == b'F');
                depth += 1;
                at += 4;
            }
            _ => {
                let n = value_len(tag, buf.get(at..end).ok_or(Malformed)?).ok_or(Malformed)?;
                at += n;
            }
        }
        if at > end {
            return Err(Malformed);
        }
    }
}

/// One encoded value: its type octet and its bytes (for strings, tables
/// and arrays, the 32-bit length included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Value<'a> {
    pub tag: u8,
    pub bytes: &'a [u8],
}

impl<'a> Value<'a> {
    /// The bytes of a long string.
    pub fn as_long_str(&self) -> Option<&'a [u8]> {
        (self.tag == b'S').then(|| self.bytes.get(4..)).flatten()
    }

    /// An integer of any width, as RabbitMQ compares them.
    pub fn as_int(&self) -> Option<i64> {
        let mut r = FieldReader::new(self.bytes);
        Some(match self.tag {
            b'b' => r.u8()? as i8 as i64,
            b'B' => r.u8()? as i64,
            b's' | b'U' => r.u16()? as i16 as i64,
            b'u' => r.u16()? as i64,
            b'I' => r.u32()? as i32 as i64,
            b'i' => r.u32()? as i64,
            b'l' | b'L' => r.u64()? as i64,
            _ => return None,
        })
    }

    /// The entries of a table value.
    pub fn as_table(&self) -> Option<Entries<'a>> {
        (self.tag == b'F').then(|| entries(self.bytes))
    }

    /// The items of an array value.
    pub fn as_array(&self) -> Option<Items<'a>> {
        (self.tag == b'A').then(|| Items {
            r: FieldReader::new(self.bytes.get(4..).unwrap_or_default()),
        })
    }

    /// The type octet followed by the value, as a table entry holds it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.tag);
        out.extend_from_slice(self.bytes);
    }
}

fn next_value<'a>(r: &mut FieldReader<'a>) -> Option<Value<'a>> {
    let tag = r.u8()?;
    let n = value_len(tag, r.rest())?;
    Some(Value {
        tag,
        bytes: r.take(n)?,
    })
}

/// The entries of an encoded table, in wire order. Stops at the first
/// malformed entry (tables from the wire were checked already).
pub struct Entries<'a> {
    r: FieldReader<'a>,
}

impl<'a> Iterator for Entries<'a> {
    type Item = (&'a [u8], Value<'a>);
    fn next(&mut self) -> Option<Self::Item> {
        let key = self.r.short_str()?;
        Some((key, next_value(&mut self.r)?))
    }
}

/// The items of an encoded array.
pub struct Items<'a> {
    r: FieldReader<'a>,
}

impl<'a> Iterator for Items<'a> {
    type Item = Value<'a>;
    fn next(&mut self) -> Option<Self::Item> {
        next_value(&mut self.r)
    }
}

/// The entries of the table at the start of `table` (its length first).
pub fn entries(table: &[u8]) -> Entries<'_> {
    let mut r = FieldReader::new(table);
    let body = r.long_str().unwrap_or_default();
    Entries {
        r: FieldReader::new(body),
    }
}

/// The first value under `key`.
pub fn get<'a>(table: &'a [u8], key: &[u8]) -> Option<Value<'a>> {
    entries(table).find(|(k, _)| *k == key).map(|(_, v)| v)
}

/// A copy of `table` with the entries named in `set` given those values
/// (tag and value bytes; in place where the key was, else appended in
/// order) and those named in `remove` left out. Every other entry is
/// copied verbatim, duplicates and order included.
pub fn edit(table: &[u8], set: &[(&[u8], &[u8])], remove: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(table.len() + 64);
    out.extend_from_slice(&[0; 4]);
    let mut placed = vec![false; set.len()];
    for (key, value) in entries(table) {
        if remove.contains(&key) {
            continue;
        }
        match set.iter().position(|(k, _)| *k == key) {
            Some(i) if placed[i] => continue,
            Some(i) => {
                placed[i] = true;
                put_entry(&mut out, key, set[i].1);
            }
            None => {
                put_entry(&mut out, key, &[]);
                value.encode(&mut out);
            }
        }
    }
    for (i, (key, value)) in set.iter().enumerate() {
        if !placed[i] {
            put_entry(&mut out, key, value);
        }
    }
    finish(out)
}

/// Appends a key and an encoded value (tag first) to a table body.
fn put_entry(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let key = &key[..key.len().min(255)];
    out.push(key.len() as u8);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Fills in the length of a table or array begun with four zero octets.
fn finish(mut out: Vec<u8>) -> Vec<u8> {
    let n = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&n.to_be_bytes());
    out
}

/// Encodes `v` with its type octet. Short strings are written as long
/// strings (a table holds no short-string values on the wire).
pub fn encode_value(out: &mut Vec<u8>, v: &AMQPValue) {
    let long = |out: &mut Vec<u8>, tag: u8, b: &[u8]| {
        out.push(tag);
        out.extend_from_slice(&(b.len() as u32).to_be_bytes());
        out.extend_from_slice(b);
    };
    match v {
        AMQPValue::Boolean(b) => out.extend_from_slice(&[b't', *b as u8]),
        AMQPValue::ShortShortInt(n) => out.extend_from_slice(&[b'b', *n as u8]),
        AMQPValue::ShortShortUInt(n) => out.extend_from_slice(&[b'B', *n]),
        AMQPValue::ShortInt(n) => {
            out.push(b's');
            out.extend_from_slice(&n.to_be_bytes());
        }
        AMQPValue::ShortUInt(n) => {
            out.push(b'u');
            out.extend_from_slice(&n.to_be_bytes());
        }
        AMQPValue::LongInt(n) => {
            out.push(b'I');
            out.extend_from_slice(&n.to_be_bytes());
        }
        AMQPValue::LongUInt(n) => {
            out.push(b'i');
            out.extend_from_slice(&n.to_be_bytes());
        }
        AMQPValue::LongLongInt(n) => {
            out.push(b'l');
            out.extend_from_slice(&n.to_be_bytes());
        }
        AMQPValue::Float(f) => {
            out.push(b'f');
            out.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        AMQPValue::Double(d) => {
            out.push(b'd');
            out.extend_from_slice(&d.to_bits().to_be_bytes());
        }
        AMQPValue::DecimalValue(d) => {
            out.extend_from_slice(&[b'D', d.scale]);
            out.extend_from_slice(&d.value.to_be_bytes());
        }
        AMQPValue::ShortString(s) => long(out, b'S', s.as_str().as_bytes()),
        AMQPValue::LongString(s) => long(out, b'S', s.as_bytes()),
        AMQPValue::ByteArray(a) => long(out, b'x', a.as_slice()),
        AMQPValue::Timestamp(t) => {
            out.push(b'T');
            out.extend_from_slice(&t.to_be_bytes());
        }
        AMQPValue::Void => out.push(b'V'),
        AMQPValue::FieldTable(t) => {
            out.push(b'F');
            encode_table_into(out, t);
        }
        AMQPValue::FieldArray(a) => {
            out.push(b'A');
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            for item in a.as_slice() {
                encode_value(out, item);
            }
            let n = (out.len() - at - 4) as u32;
            out[at..at + 4].copy_from_slice(&n.to_be_bytes());
        }
    }
}

/// Encodes a table (its length first).
pub fn encode_table(t: &FieldTable) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode_table_into(&mut out, t);
    out
}

fn encode_table_into(out: &mut Vec<u8>, t: &FieldTable) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    for (k, v) in t {
        put_entry(out, k.as_str().as_bytes(), &[]);
        encode_value(out, v);
    }
    let n = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&n.to_be_bytes());
}

/// Decodes a table checked with `check_table` into amq-protocol's values
/// (keys that are not UTF-8 are read lossily). None if it is malformed or
/// too deep.
pub fn decode_table(table: &[u8]) -> Option<FieldTable> {
    check_table(table).ok()?;
    Some(to_field_table(entries(table)))
}

fn to_field_table(entries: Entries<'_>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(lossy_key(k), to_amqp(v));
    }
    t
}

/// A key as amq-protocol's short string: UTF-8 (invalid bytes replaced),
/// at most 255 bytes. A replacement character takes three bytes, so a
/// 255-byte key that is not UTF-8 is cut at a character boundary (found by
/// fuzz/field_table: ShortString::from panics past 255 bytes).
fn lossy_key(k: &[u8]) -> ShortString {
    let mut s = String::from_utf8_lossy(k).into_owned();
    if s.len() > 255 {
        let mut end = 255;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    ShortString::from(s)
}

/// One value as amq-protocol's (the recursion is bounded: tables reaching
/// here passed `check_table`).
pub fn to_amqp(v: Value<'_>) -> AMQPValue {
    let mut r = FieldReader::new(v.bytes);
    let int = v.as_int();
    match v.tag {
        b't' => AMQPValue::Boolean(r.u8().unwrap_or(0) != 0),
        b'b' => AMQPValue::ShortShortInt(int.unwrap_or(0) as i8),
        b'B' => AMQPValue::ShortShortUInt(int.unwrap_or(0) as u8),
        b's' | b'U' => AMQPValue::ShortInt(int.unwrap_or(0) as i16),
        b'u' => AMQPValue::ShortUInt(int.unwrap_or(0) as u16),
        b'I' => AMQPValue::LongInt(int.unwrap_or(0) as i32),
        b'i' => AMQPValue::LongUInt(int.unwrap_or(0) as u32),
        b'l' | b'L' => AMQPValue::LongLongInt(int.unwrap_or(0)),
        b'f' => AMQPValue::Float(f32::from_bits(r.u32().unwrap_or(0))),
        b'd' => AMQPValue::Double(f64::from_bits(r.u64().unwrap_or(0))),
        b'D' => AMQPValue::DecimalValue(DecimalValue {
            scale: r.u8().unwrap_or(0),
            value: r.u32().unwrap_or(0),
        }),
        b'S' => AMQPValue::LongString(LongString::from(r.long_str().unwrap_or_default())),
        b'x' => AMQPValue::ByteArray(ByteArray::from(r.long_str().unwrap_or_default())),
        b'T' => AMQPValue::Timestamp(r.u64().unwrap_or(0)),
        b'F' => AMQPValue::FieldTable(to_field_table(entries(v.bytes))),
        b'A' => {
            let items: Vec<AMQPValue> = v.as_array().into_iter().flatten().map(to_amqp).collect();
            AMQPValue::FieldArray(FieldArray::from(items))
        }
        _ => AMQPValue::Void,
    }
}

/// RabbitMQ's name for the type of a field value.
pub fn type_name(v: &AMQPValue) -> &'static str {
    use AMQPValue as V;
    match v {
        V::Boolean(_) => "bool",
        V::ShortShortInt(_) => "byte",
        V::ShortShortUInt(_) => "unsignedbyte",
        V::ShortInt(_) => "short",
        V::ShortUInt(_) => "unsignedshort",
        V::LongInt(_) => "signedint",
        V::LongUInt(_) => "unsignedint",
        V::LongLongInt(_) => "long",
        V::Float(_) => "float",
        V::Double(_) => "double",
        V::DecimalValue(_) => "decimal",
        V::ShortString(_) | V::LongString(_) => "longstr",
        V::FieldArray(_) => "array",
        V::Timestamp(_) => "timestamp",
        V::FieldTable(_) => "table",
        V::ByteArray(_) => "binary",
        V::Void => "void",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table holding `depth - 1` tables nested one in another.
    fn nested(depth: usize) -> Vec<u8> {
        let mut t = Vec::new();
        t.extend_from_slice(&0u32.to_be_bytes());
        for _ in 1..depth {
            let mut outer = Vec::new();
            let body_len = 1 + 1 + 1 + t.len();
            outer.extend_from_slice(&(body_len as u32).to_be_bytes());
            outer.extend_from_slice(&[1, b'k', b'F']);
            outer.extend_from_slice(&t);
            t = outer;
        }
        t
    }

    #[test]
    fn depth_is_bounded_without_recursion() {
        assert_eq!(check_table(&nested(1)), Ok(4));
        assert!(check_table(&nested(MAX_DEPTH)).is_ok());
        assert_eq!(
            check_table(&nested(MAX_DEPTH + 1)),
            Err(TableError::TooDeep)
        );
        // Deeper than any stack would take recursively: still just refused.
        assert_eq!(check_table(&nested(20_000)), Err(TableError::TooDeep));
        // Arrays count as levels too.
        let mut a = vec![0, 0, 0, 0];
        for _ in 0..MAX_DEPTH {
            let mut outer = ((a.len() + 1) as u32).to_be_bytes().to_vec();
            outer.push(b'A');
            outer.extend_from_slice(&a);
            a = outer;
        }
        assert_eq!(check_array(&a), Err(TableError::TooDeep));
    }

    #[test]
    fn malformed_tables_are_refused() {
        for bad in [
            &[0u8, 0, 0][..],
            &[0, 0, 0, 5, 1, b'k', b'I', 0],
            &[0, 0, 0, 3, 1, b'k', b'?'],
            &[0, 0, 0, 4, 1, b'k', b'S', 0],
            &[0, 0, 0, 2, 5, b'k'],
            // An inner table longer than the outer one.
            &[0, 0, 0, 7, 1, b'k', b'F', 0, 0, 0, 9],
        ] {
            assert_eq!(check_table(bad), Err(TableError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn values_round_trip_exactly() {
        let mut inner = FieldTable::default();
        inner.insert("n".into(), AMQPValue::Double(f64::NAN));
        let mut t = FieldTable::default();
        t.insert("f".into(), AMQPValue::Float(f32::INFINITY));
        t.insert("d".into(), AMQPValue::Double(f64::NEG_INFINITY));
        t.insert("t".into(), AMQPValue::FieldTable(inner));
        t.insert(
            "a".into(),
            AMQPValue::FieldArray(vec![AMQPValue::Void, AMQPValue::LongInt(-3)].into()),
        );
        t.insert(
            "x".into(),
            AMQPValue::ByteArray(ByteArray::from(&[0u8, 255][..])),
        );
        t.insert(
            "D".into(),
            AMQPValue::DecimalValue(DecimalValue { scale: 2, value: 7 }),
        );
        let bytes = encode_table(&t);
        assert_eq!(check_table(&bytes), Ok(bytes.len()));
        let back = decode_table(&bytes).unwrap();
        // NaN != NaN: compare encodings.
        assert_eq!(encode_table(&back), bytes);
    }

    #[test]
    fn a_long_key_that_is_not_utf8_decodes() {
        let mut body = vec![255u8];
        body.extend(std::iter::repeat_n(0xffu8, 255));
        body.extend_from_slice(&[b't', 1]);
        let mut t = (body.len() as u32).to_be_bytes().to_vec();
        t.extend_from_slice(&body);
        let decoded = decode_table(&t).expect("decodes");
        assert!(decoded.inner().keys().all(|k| k.as_str().len() <= 255));
    }

    #[test]
    fn edits_keep_other_entries_verbatim() {
        // A key that is not UTF-8, and a duplicate: both survive an edit.
        let mut body = vec![1, 0xff, b'I', 0, 0, 0, 1];
        body.extend_from_slice(&[1, b'a', b'I', 0, 0, 0, 2]);
        body.extend_from_slice(&[1, b'a', b'I', 0, 0, 0, 3]);
        body.extend_from_slice(&[1, b'z', b't', 1]);
        let mut table = (body.len() as u32).to_be_bytes().to_vec();
        table.extend_from_slice(&body);
        assert!(check_table(&table).is_ok());
        let mut v = Vec::new();
        encode_value(&mut v, &AMQPValue::LongLongInt(9));
        let edited = edit(&table, &[(b"n", &v)], &[b"z"]);
        let got: Vec<_> = entries(&edited).map(|(k, v)| (k.to_vec(), v.tag)).collect();
        assert_eq!(
            got,
            vec![
                (vec![0xff], b'I'),
                (b"a".to_vec(), b'I'),
                (b"a".to_vec(), b'I'),
                (b"n".to_vec(), b'l')
            ]
        );
        assert_eq!(&edited[4..25], &table[4..25]);
        // Setting a present key replaces it in place, once.
        let edited = edit(&table, &[(b"a", &v)], &[]);
        let keys: Vec<_> = entries(&edited).map(|(k, _)| k.to_vec()).collect();
        assert_eq!(keys, vec![vec![0xff], b"a".to_vec(), b"z".to_vec()]);
        assert_eq!(get(&edited, b"a").and_then(|v| v.as_int()), Some(9));
    }
}
