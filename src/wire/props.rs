//! The basic class's property list as on the wire (16 flag bits, then the
//! fields that are present, in flag order): where each field lies, and
//! edits that replace one field and copy the rest verbatim. The broker
//! edits only what it must (x-death, BCC, x-delay, x-delivery-count,
//! expiration when dead-lettering); a property it cannot decode, such as a
//! short string that is not UTF-8, passes through untouched.

use std::ops::Range;

use super::{table, FieldReader};

/// The basic class's properties, in flag order (bit 15 first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    ContentType,
    ContentEncoding,
    Headers,
    DeliveryMode,
    Priority,
    CorrelationId,
    ReplyTo,
    Expiration,
    MessageId,
    Timestamp,
    Type,
    UserId,
    AppId,
    ClusterId,
}

/// Every field, in flag order.
const FIELDS: [Field; 14] = [
    Field::ContentType,
    Field::ContentEncoding,
    Field::Headers,
    Field::DeliveryMode,
    Field::Priority,
    Field::CorrelationId,
    Field::ReplyTo,
    Field::Expiration,
    Field::MessageId,
    Field::Timestamp,
    Field::Type,
    Field::UserId,
    Field::AppId,
    Field::ClusterId,
];

impl Field {
    /// Its flag bit.
    pub fn flag(self) -> u16 {
        1 << (15 - self as u16)
    }
}

/// Where each present field lies in an encoded property list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub flags: u16,
    spans: [Option<Range<usize>>; 14],
}

impl Layout {
    /// The bytes of `field` in the list it was read from: a short string
    /// with its length octet, the headers table with its length.
    pub fn span(&self, field: Field) -> Option<Range<usize>> {
        self.spans[field as usize].clone()
    }
}

/// Lays out an encoded property list. None if it is malformed: unknown
/// flag bits, a field cut short, bytes left over, or a headers table that
/// `table::check_table` refuses (its error is returned as Err).
pub fn layout(props: &[u8]) -> Result<Layout, table::TableError> {
    layout_with(props, true)
}

/// `layout` with the headers table skipped by its length, not checked: for
/// a list that was checked before (no second walk of its headers), and for
/// records an older version stored with headers nested deeper than
/// `table::MAX_DEPTH` allows now.
pub fn layout_unchecked(props: &[u8]) -> Result<Layout, table::TableError> {
    layout_with(props, false)
}

fn layout_with(props: &[u8], check_headers: bool) -> Result<Layout, table::TableError> {
    let mut spans: [Option<Range<usize>>; 14] = Default::default();
    let flags = walk(props, check_headers, |field, span| {
        spans[field as usize] = Some(span);
    })?;
    Ok(Layout { flags, spans })
}

/// Walks the fields present in an encoded property list, in order, calling
/// `f` with each and its span (as `Layout::span` gives it); returns the
/// flags. Refuses what `layout` refuses. The publish path reads `Meta`
/// with this (no layout to build).
pub fn walk(
    props: &[u8],
    check_headers: bool,
    mut f: impl FnMut(Field, Range<usize>),
) -> Result<u16, table::TableError> {
    use table::TableError::Malformed;
    let mut r = FieldReader::new(props);
    let flags = r.u16().ok_or(Malformed)?;
    // Continuation and unused bits: basic has only 14 properties.
    if flags & 0b11 != 0 {
        return Err(Malformed);
    }
    // Only the bits that are set, most significant first.
    let mut bits = flags;
    while bits != 0 {
        let i = bits.leading_zeros() as usize;
        bits &= !(1 << (15 - i));
        let field = FIELDS[i];
        let start = props.len() - r.remaining();
        match field {
            Field::Headers if check_headers => {
                let n = table::check_table(r.rest())?;
                r.take(n).ok_or(Malformed)?;
            }
            Field::Headers => {
                r.long_str().ok_or(Malformed)?;
            }
            Field::DeliveryMode | Field::Priority => {
                r.u8().ok_or(Malformed)?;
            }
            Field::Timestamp => {
                r.u64().ok_or(Malformed)?;
            }
            _ => {
                r.short_str().ok_or(Malformed)?;
            }
        }
        f(field, start..props.len() - r.remaining());
    }
    if r.remaining() != 0 {
        return Err(Malformed);
    }
    Ok(flags)
}

/// The headers table (with its length), if present, in a list that was
/// checked before (the table is not walked here: `table::decode_table`
/// checks what it decodes).
pub fn headers(props: &[u8]) -> Option<&[u8]> {
    let span = layout_unchecked(props).ok()?.span(Field::Headers)?;
    props.get(span)
}

/// A short-string field's bytes, if present, in a list that was checked
/// before (its headers are not walked again).
pub fn short_str(props: &[u8], field: Field) -> Option<&[u8]> {
    let span = layout_unchecked(props).ok()?.span(field)?;
    props.get(span.start + 1..span.end)
}

/// A copy of `props` with `field` replaced by `value` (its encoding: a
/// short string with its length octet, a table with its length), or left
/// out when `value` is None. Every other byte is copied as it was. None if
/// `props` is malformed.
pub fn with_field(props: &[u8], field: Field, value: Option<&[u8]>) -> Option<Vec<u8>> {
    let layout = layout(props).ok()?;
    let mut flags = layout.flags & !field.flag();
    if value.is_some() {
        flags |= field.flag();
    }
    // Where the field is, or where it would go: after every field before it.
    let at = match layout.span(field) {
        Some(span) => span,
        None => {
            let end = FIELDS[..field as usize]
                .iter()
                .rev()
                .find_map(|f| layout.span(*f))
                .map_or(2, |s| s.end);
            end..end
        }
    };
    let mut out = Vec::with_capacity(props.len() + value.map_or(0, <[u8]>::len));
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&props[2..at.start]);
    if let Some(v) = value {
        out.extend_from_slice(v);
    }
    out.extend_from_slice(&props[at.end..]);
    Some(out)
}

/// A copy of `props` whose headers have `set` entries set and `remove`
/// entries left out (see `table::edit`); the headers table is added if
/// there was none. None if `props` is malformed.
pub fn edit_headers(props: &[u8], set: &[(&[u8], &[u8])], remove: &[&[u8]]) -> Option<Vec<u8>> {
    let old = layout(props)
        .ok()?
        .span(Field::Headers)
        .and_then(|s| props.get(s))
        .unwrap_or(&[0, 0, 0, 0]);
    let new = table::edit(old, set, remove);
    with_field(props, Field::Headers, Some(&new))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// content-type "a\xff" (not UTF-8), delivery-mode 2, app-id "x".
    fn sample() -> Vec<u8> {
        let flags = Field::ContentType.flag() | Field::DeliveryMode.flag() | Field::AppId.flag();
        let mut p = flags.to_be_bytes().to_vec();
        p.extend_from_slice(&[2, b'a', 0xff, 2, 1, b'x']);
        p
    }

    #[test]
    fn lays_out_fields() {
        let p = sample();
        let l = layout(&p).unwrap();
        assert_eq!(l.span(Field::ContentType), Some(2..5));
        assert_eq!(l.span(Field::DeliveryMode), Some(5..6));
        assert_eq!(l.span(Field::AppId), Some(6..8));
        assert_eq!(l.span(Field::Headers), None);
        assert_eq!(short_str(&p, Field::ContentType), Some(&[b'a', 0xff][..]));
        assert!(layout(&p[..7]).is_err());
        let mut long = p.clone();
        long.push(0);
        assert!(layout(&long).is_err());
    }

    #[test]
    fn adding_headers_keeps_every_other_byte() {
        let p = sample();
        let mut v = Vec::new();
        table::encode_value(&mut v, &amq_protocol::types::AMQPValue::LongLongInt(1));
        let q = edit_headers(&p, &[(b"x-delivery-count", &v)], &[]).unwrap();
        let l = layout(&q).unwrap();
        assert_eq!(l.flags, layout(&p).unwrap().flags | Field::Headers.flag());
        // The content type (not UTF-8) and delivery mode are where they were.
        assert_eq!(&q[2..5], &p[2..5]);
        assert_eq!(&q[l.span(Field::DeliveryMode).unwrap()], &[2]);
        let h = headers(&q).unwrap();
        assert_eq!(
            table::get(h, b"x-delivery-count").and_then(|v| v.as_int()),
            Some(1)
        );
        // Removing a field takes its bytes and its flag.
        let r = with_field(&q, Field::ContentType, None).unwrap();
        assert_eq!(layout(&r).unwrap().span(Field::ContentType), None);
        assert_eq!(r.len(), q.len() - 3);
    }
}
