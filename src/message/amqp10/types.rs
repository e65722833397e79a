//! Reading AMQP 1.0's encoded values (its type system, part 1 of the
//! specification) straight out of a message's bytes: `Cursor` reads one
//! value at a time, compound values (lists, maps, arrays) stay encoded
//! until walked (`Seq`), so nothing is allocated to read a message.
//!
//! Nothing here trusts the bytes: every length is checked against what is
//! left, a compound claims no more items than it has octets (so a count
//! cannot make a walk run long), described values nest at most
//! `MAX_DEPTH` deep, and strings are checked to be UTF-8.

/// How deep values may nest.
pub const MAX_DEPTH: usize = 16;
/// Items an array of items without width (nulls, booleans, zeros) may
/// hold.
const MAX_WIDTHLESS: u32 = 256;

/// The bytes were not an AMQP 1.0 message.
#[derive(Debug)]
pub struct Bad;

pub type R<T> = Result<T, Bad>;

/// An AMQP 1.0 value, borrowed from the message's bytes; compound values
/// stay encoded until walked.
#[derive(Debug, Clone, Copy)]
pub enum V<'a> {
    Null,
    Bool(bool),
    UByte(u8),
    Byte(i8),
    UShort(u16),
    Short(i16),
    UInt(u32),
    Int(i32),
    ULong(u64),
    Long(i64),
    Float(f32),
    Double(f64),
    Char(u32),
    Timestamp(i64),
    Uuid([u8; 16]),
    /// decimal32/64/128: 0-9-1 has no such type, left out.
    Decimal,
    Bin(&'a [u8]),
    Str(&'a [u8]),
    Sym(&'a [u8]),
    List(Seq<'a>),
    Map(Seq<'a>),
    Array(Seq<'a>),
    /// A described value: its descriptor is dropped, the value kept.
    Described(&'a [u8]),
}

/// The items of a list, map (keys and values alternate) or array (one
/// constructor for all, `code`).
#[derive(Debug, Clone, Copy)]
pub struct Seq<'a> {
    pub items: &'a [u8],
    pub count: u32,
    /// For an array: the items' type code.
    pub code: Option<u8>,
}

pub struct Cursor<'a> {
    pub b: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub fn take(&mut self, n: usize) -> R<&'a [u8]> {
        if n > self.b.len() {
            return Err(Bad);
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn fixed<const N: usize>(&mut self) -> R<[u8; N]> {
        self.take(N)?.try_into().map_err(|_| Bad)
    }

    pub fn u8(&mut self) -> R<u8> {
        Ok(self.fixed::<1>()?[0])
    }

    fn u32(&mut self) -> R<u32> {
        Ok(u32::from_be_bytes(self.fixed()?))
    }

    /// A size (one octet or four, as `wide` says), then that many octets.
    fn sized(&mut self, wide: bool) -> R<&'a [u8]> {
        let n = if wide {
            self.u32()? as usize
        } else {
            self.u8()? as usize
        };
        self.take(n)
    }

    /// A compound's size and count, then its items (`depth`: how deep
    /// it sits, for an array's described constructor).
    fn seq(&mut self, wide: bool, array: bool, depth: usize) -> R<Seq<'a>> {
        let mut body = Cursor {
            b: self.sized(wide)?,
        };
        let count = if wide { body.u32()? } else { body.u8()? as u32 };
        let code = if array {
            let mut code = body.u8()?;
            if code == 0x00 {
                // A described constructor: its descriptor (which may be
                // an array with a described constructor, and so on:
                // counted as nesting), then the code.
                if depth >= MAX_DEPTH {
                    return Err(Bad);
                }
                body.value(depth + 1)?;
                code = body.u8()?;
            }
            Some(code)
        } else {
            None
        };
        // A count is bounded by the bytes: every item of a list or map
        // takes an octet at least, and so does an array's unless its
        // items have no width (null, true, false, zero, an empty list),
        // of which an array may hold only a few.
        let width_less = matches!(code, Some(0x40..=0x45));
        if count as usize > body.b.len() || (width_less && count > MAX_WIDTHLESS) {
            return Err(Bad);
        }
        Ok(Seq {
            items: body.b,
            count,
            code,
        })
    }

    /// The next value.
    pub fn value(&mut self, depth: usize) -> R<V<'a>> {
        let code = self.u8()?;
        self.value_of(code, depth)
    }

    /// The next value of type `code` (its constructor already read).
    pub fn value_of(&mut self, code: u8, depth: usize) -> R<V<'a>> {
        Ok(match code {
            0x00 => {
                if depth > MAX_DEPTH {
                    return Err(Bad);
                }
                self.value(depth + 1)?; // the descriptor
                let start = self.b;
                self.value(depth + 1)?;
                let used = start.len() - self.b.len();
                V::Described(&start[..used])
            }
            0x40 => V::Null,
            0x41 => V::Bool(true),
            0x42 => V::Bool(false),
            0x56 => V::Bool(self.u8()? != 0),
            0x50 => V::UByte(self.u8()?),
            0x51 => V::Byte(self.u8()? as i8),
            0x60 => V::UShort(u16::from_be_bytes(self.fixed()?)),
            0x61 => V::Short(i16::from_be_bytes(self.fixed()?)),
            0x43 => V::UInt(0),
            0x52 => V::UInt(self.u8()? as u32),
            0x70 => V::UInt(self.u32()?),
            0x54 => V::Int(self.u8()? as i8 as i32),
            0x71 => V::Int(i32::from_be_bytes(self.fixed()?)),
            0x44 => V::ULong(0),
            0x53 => V::ULong(self.u8()? as u64),
            0x80 => V::ULong(u64::from_be_bytes(self.fixed()?)),
            0x55 => V::Long(self.u8()? as i8 as i64),
            0x81 => V::Long(i64::from_be_bytes(self.fixed()?)),
            0x72 => V::Float(f32::from_be_bytes(self.fixed()?)),
            0x82 => V::Double(f64::from_be_bytes(self.fixed()?)),
            0x73 => V::Char(self.u32()?),
            0x83 => V::Timestamp(i64::from_be_bytes(self.fixed()?)),
            0x98 => V::Uuid(self.fixed()?),
            0x74 => {
                self.take(4)?;
                V::Decimal
            }
            0x84 => {
                self.take(8)?;
                V::Decimal
            }
            0x94 => {
                self.take(16)?;
                V::Decimal
            }
            0xa0 | 0xb0 => V::Bin(self.sized(code == 0xb0)?),
            0xa1 | 0xb1 => {
                let s = self.sized(code == 0xb1)?;
                std::str::from_utf8(s).map_err(|_| Bad)?;
                V::Str(s)
            }
            0xa3 | 0xb3 => V::Sym(self.sized(code == 0xb3)?),
            0x45 => V::List(Seq {
                items: &[],
                count: 0,
                code: None,
            }),
            0xc0 | 0xd0 => V::List(self.seq(code == 0xd0, false, depth)?),
            0xc1 | 0xd1 => V::Map(self.seq(code == 0xd1, false, depth)?),
            0xe0 | 0xf0 => V::Array(self.seq(code == 0xf0, true, depth)?),
            _ => return Err(Bad),
        })
    }
}

impl<'a> Seq<'a> {
    /// Its items, read one by one (an item that does not read ends the
    /// walk with an error).
    pub fn items(self, depth: usize) -> impl Iterator<Item = R<V<'a>>> {
        let mut c = Cursor { b: self.items };
        (0..self.count).map(move |_| match self.code {
            Some(code) => c.value_of(code, depth),
            None => c.value(depth),
        })
    }

    /// A map's entries.
    pub fn pairs(self, depth: usize) -> impl Iterator<Item = R<(V<'a>, V<'a>)>> {
        let mut items = self.items(depth);
        std::iter::from_fn(move || {
            let k = items.next()?;
            let v = items.next().unwrap_or(Err(Bad));
            Some(k.and_then(|k| v.map(|v| (k, v))))
        })
    }
}
