//! Keeping small messages from pinning large read buffers. A message cut
//! from the read buffer keeps a slice of it (no copy), and a slice keeps
//! its whole allocation alive. Where every frame is small that costs
//! nothing (the allocation is full of messages); but where a large frame
//! shared the allocation (a large message arriving in every read), one
//! small queued message kept a buffer the size of the large one, and a
//! backlog of small messages held memory out of all proportion to its size.
//!
//! So the reader notes, per buffer allocation, whether a large frame was
//! in it (`after_read` looks at the frame headers of what was read), and a
//! small frame cut from such an allocation is copied out (`detach`). Only
//! that case copies: streams of small frames, or of large ones, keep their
//! slices.

use bytes::{Bytes, BytesMut};

use super::codec::{Frame, FRAME_OVERHEAD};

/// A frame at least this large makes its allocation "mixed".
const LARGE: usize = 16 * 1024;
/// A frame at most this large is copied out of a mixed allocation.
const SMALL: usize = 4 * 1024;
/// An allocation this large was grown for a large frame.
const LARGE_ALLOCATION: usize = 192 * 1024;

/// What the reader knows of the allocation its buffer is in.
#[derive(Debug, Default)]
pub struct Pinning {
    /// The allocation's range as first seen (data start, end of capacity).
    start: usize,
    end: usize,
    /// Where the buffer's data started at the last look.
    last: usize,
    /// Whether a large frame was (or is) in it.
    mixed: bool,
}

impl Pinning {
    /// After a read into `buf`: notes which allocation it is in and
    /// whether a large frame has been in it.
    pub fn after_read(&mut self, buf: &BytesMut) {
        let at = buf.as_ptr() as usize;
        // A new allocation, or the old one reclaimed in place (then every
        // slice of it is gone and nothing is pinned).
        if at < self.start || at >= self.end || at < self.last {
            self.start = at;
            self.end = at + buf.capacity();
            self.mixed = buf.capacity() >= LARGE_ALLOCATION;
        }
        self.last = at;
        if !self.mixed {
            self.mixed = has_large_frame(buf);
        }
    }

    /// `frame`, copied into its own buffer if it is small and its
    /// allocation held a large frame.
    pub fn detach(&self, frame: Frame) -> Frame {
        if !self.mixed {
            return frame;
        }
        let copy = |b: Bytes| {
            if b.len() <= SMALL {
                Bytes::copy_from_slice(&b)
            } else {
                b
            }
        };
        match frame {
            Frame::Publish {
                channel,
                raw,
                header_at,
                body_at,
            } => Frame::Publish {
                channel,
                raw: copy(raw),
                header_at,
                body_at,
            },
            Frame::Header { channel, payload } => Frame::Header {
                channel,
                payload: copy(payload),
            },
            Frame::Body { channel, payload } => Frame::Body {
                channel,
                payload: copy(payload),
            },
            other => other,
        }
    }
}

/// Whether a frame of `LARGE` octets or more starts in `buf` (only the
/// 7-octet frame headers are read).
fn has_large_frame(buf: &[u8]) -> bool {
    let mut at = 0;
    while let Some(h) = buf.get(at..at + 7) {
        let size = u32::from_be_bytes([h[3], h[4], h[5], h[6]]) as usize;
        if size >= LARGE {
            return true;
        }
        at += size + FRAME_OVERHEAD;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(size: usize) -> Vec<u8> {
        let mut f = vec![3, 0, 1];
        f.extend_from_slice(&(size as u32).to_be_bytes());
        f.resize(7 + size, 0);
        f.push(0xCE);
        f
    }

    #[test]
    fn small_frames_next_to_a_large_one_are_copied() {
        let mut bytes = frame(100);
        bytes.extend(frame(LARGE));
        let mut buf = BytesMut::from(&bytes[..]);
        let mut p = Pinning::default();
        p.after_read(&buf);
        let small = buf.split_to(108).freeze();
        let Frame::Body { payload, .. } = p.detach(Frame::Body {
            channel: 1,
            payload: small.clone(),
        }) else {
            panic!()
        };
        assert_ne!(payload.as_ptr(), small.as_ptr(), "copied");
        assert_eq!(payload, small);
    }

    #[test]
    fn streams_of_small_frames_keep_their_slices() {
        let bytes: Vec<u8> = (0..100).flat_map(|_| frame(50)).collect();
        let mut buf = BytesMut::from(&bytes[..]);
        let mut p = Pinning::default();
        p.after_read(&buf);
        let small = buf.split_to(58).freeze();
        let Frame::Body { payload, .. } = p.detach(Frame::Body {
            channel: 1,
            payload: small.clone(),
        }) else {
            panic!()
        };
        assert_eq!(payload.as_ptr(), small.as_ptr(), "not copied");
    }
}
