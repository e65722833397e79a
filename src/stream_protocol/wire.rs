//! The stream protocol's encoding (PROTOCOL.adoc, "Types" and "Frame
//! Structure"): big-endian integers, strings with an int16 length (-1:
//! null), bytes with an int32 length, arrays with an int32 count. A frame
//! is its size (uint32, not counting itself), then key, version and the
//! command's fields.

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// A frame's fields did not parse (a response code of its own: the
/// caller answers or closes as the command's kind allows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// Reads the fields of one frame, borrowing it.
pub struct Fields<'a> {
    buf: &'a [u8],
}

impl<'a> Fields<'a> {
    pub fn new(buf: &'a [u8]) -> Fields<'a> {
        Fields { buf }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.buf.len() < n {
            return Err(Malformed);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, Malformed> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self) -> Result<u32, Malformed> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, Malformed> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A string; null reads as None.
    pub fn string_or_null(&mut self) -> Result<Option<&'a str>, Malformed> {
        match self.raw_string_or_null()? {
            None => Ok(None),
            Some(b) => std::str::from_utf8(b).map(Some).map_err(|_| Malformed),
        }
    }

    /// A string's bytes as they came (UTF-8 or not), or None for null.
    pub fn raw_string_or_null(&mut self) -> Result<Option<&'a [u8]>, Malformed> {
        let len = self.u16()? as i16;
        if len < 0 {
            return Ok(None);
        }
        self.take(len as usize).map(Some)
    }

    /// A string; null reads as "".
    pub fn string(&mut self) -> Result<&'a str, Malformed> {
        Ok(self.string_or_null()?.unwrap_or(""))
    }

    /// Bytes; null reads as empty.
    pub fn bytes(&mut self) -> Result<&'a [u8], Malformed> {
        let len = self.u32()? as i32;
        if len < 0 {
            return Ok(&[]);
        }
        self.take(len as usize)
    }

    /// An array's count, checked against what is left (each item takes
    /// at least `min_item` bytes), so no count makes a large allocation.
    pub fn count(&mut self, min_item: usize) -> Result<usize, Malformed> {
        let n = self.u32()? as i32;
        if n < 0 {
            return Ok(0);
        }
        let n = n as usize;
        if n.saturating_mul(min_item.max(1)) > self.buf.len() {
            return Err(Malformed);
        }
        Ok(n)
    }

    /// Key-value string pairs (properties, arguments).
    pub fn pairs(&mut self) -> Result<Vec<(&'a str, &'a str)>, Malformed> {
        let n = self.count(4)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push((self.string()?, self.string()?));
        }
        Ok(out)
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// What is left unread.
    #[cfg(test)]
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }
}

/// Writes one frame into `out`: `body` puts the fields after key and
/// version; the size is filled in after.
pub fn frame(out: &mut BytesMut, key: u16, version: u16, body: impl FnOnce(&mut BytesMut)) {
    let at = out.len();
    out.put_u32(0);
    out.put_u16(key);
    out.put_u16(version);
    body(out);
    let size = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&size.to_be_bytes());
}

/// A response: key with the response bit, version 1, correlation id and
/// code, then `rest`.
pub fn response(
    out: &mut BytesMut,
    key: u16,
    correlation: u32,
    code: u16,
    rest: impl FnOnce(&mut BytesMut),
) {
    frame(out, key | super::codes::RESPONSE, 1, |o| {
        o.put_u32(correlation);
        o.put_u16(code);
        rest(o);
    });
}

/// A string field (cut to what an int16 length says).
pub fn put_str(out: &mut BytesMut, s: &str) {
    let b = &s.as_bytes()[..s.len().min(i16::MAX as usize)];
    out.put_u16(b.len() as u16);
    out.put_slice(b);
}

/// Key-value string pairs.
pub fn put_pairs<'a>(out: &mut BytesMut, pairs: impl ExactSizeIterator<Item = (&'a str, &'a str)>) {
    out.put_u32(pairs.len() as u32);
    for (k, v) in pairs {
        put_str(out, k);
        put_str(out, v);
    }
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum ReadError {
    Io(std::io::Error),
    /// Larger than `max`: its size.
    TooLarge(u32),
}

/// Reads one frame's content (after its size) into `buf`, refusing one
/// larger than `max` before reading it.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: u32,
) -> Result<(), ReadError> {
    let mut size = [0u8; 4];
    r.read_exact(&mut size).await.map_err(ReadError::Io)?;
    let size = u32::from_be_bytes(size);
    if size > max {
        return Err(ReadError::TooLarge(size));
    }
    buf.clear();
    buf.resize(size as usize, 0);
    r.read_exact(buf).await.map_err(ReadError::Io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_what_frames_write() {
        let mut out = BytesMut::new();
        frame(&mut out, 7, 1, |o| {
            o.put_u8(3);
            put_str(o, "stream");
            o.put_u64(42);
            put_pairs(o, [("a", "1"), ("b", "")].into_iter());
        });
        let size = u32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(size, out.len() - 4);
        let mut f = Fields::new(&out[4..]);
        assert_eq!((f.u16(), f.u16()), (Ok(7), Ok(1)));
        assert_eq!(f.u8(), Ok(3));
        assert_eq!(f.string(), Ok("stream"));
        assert_eq!(f.u64(), Ok(42));
        assert_eq!(f.pairs(), Ok(vec![("a", "1"), ("b", "")]));
        assert!(f.rest().is_empty());
    }

    #[test]
    fn short_or_lying_fields_are_malformed() {
        assert_eq!(Fields::new(&[0, 5, b'a']).string(), Err(Malformed));
        assert_eq!(Fields::new(&[0xff, 0xff]).string_or_null(), Ok(None));
        assert_eq!(Fields::new(&[0, 0, 0]).u32(), Err(Malformed));
        // A count that the bytes left cannot hold.
        assert_eq!(
            Fields::new(&[0x7f, 0xff, 0xff, 0xff, 0]).count(1),
            Err(Malformed)
        );
        assert_eq!(Fields::new(&[0, 1, 0xc3]).string(), Err(Malformed));
    }
}
