//! `FieldReader`: big-endian integers and short strings off a byte slice,
//! each read returning None rather than panicking when the bytes run out.

/// A reader over encoded AMQP fields.
pub struct FieldReader<'a> {
    buf: &'a [u8],
}

impl<'a> FieldReader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        FieldReader { buf }
    }
    /// One octet.
    pub fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.buf.split_first()?;
        self.buf = rest;
        Some(b)
    }
    /// A short (16-bit) integer.
    pub fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }
    /// A long (32-bit) integer.
    pub fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A long-long (64-bit) integer.
    pub fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_be_bytes(a))
    }
    /// A short string, as its byte range in the original buffer.
    pub fn short_str(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()? as usize;
        self.take(n)
    }
    /// A long string (or any 32-bit length-prefixed run), without its length.
    pub fn long_str(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Some(a)
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }
    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }
}
