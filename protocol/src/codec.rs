//! Framing: `u32` big-endian length prefix + postcard body.
//!
//! Invariants:
//! * A frame longer than [`MAX_FRAME_LEN`] is rejected from its 4-byte header,
//!   before any buffer for the body is reserved (a peer cannot make us allocate
//!   by announcing a huge frame).
//! * A body that does not decode as the expected message type is a typed
//!   [`FrameError::Malformed`], never a panic; trailing bytes after a valid
//!   message are malformed too (a frame is exactly one message).

use bytes::{Buf, BufMut, BytesMut};
use serde::{Serialize, de::DeserializeOwned};
use std::marker::PhantomData;
use tokio_util::codec::{Decoder, Encoder};

/// Hard maximum of one frame body (1 MiB).
pub const MAX_FRAME_LEN: usize = 1 << 20;

const HEADER_LEN: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `Out` and decodes `In`; one codec per direction pair.
pub struct FrameCodec<In, Out> {
    max: usize,
    _marker: PhantomData<fn(Out) -> In>,
}

impl<In, Out> Default for FrameCodec<In, Out> {
    fn default() -> Self {
        Self::with_max(MAX_FRAME_LEN)
    }
}

impl<In, Out> FrameCodec<In, Out> {
    pub fn with_max(max: usize) -> Self {
        Self {
            max,
            _marker: PhantomData,
        }
    }
}

/// Decodes one whole message from a frame body; trailing bytes are an error.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let (msg, rest) =
        postcard::take_from_bytes::<T>(body).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes after the message",
            rest.len()
        )));
    }
    Ok(msg)
}

/// Encodes one message as a frame body.
pub fn encode_body<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    postcard::to_stdvec(msg).map_err(|e| FrameError::Malformed(e.to_string()))
}

impl<In, Out> FrameCodec<In, Out> {
    /// Splits one raw frame body off `src`, checking the length header first.
    pub fn decode_raw(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        if src.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
        if len > self.max {
            return Err(FrameError::TooLarge { len, max: self.max });
        }
        if src.len() < HEADER_LEN + len {
            // Reserve only what the (bounded) header announced.
            src.reserve(HEADER_LEN + len - src.len());
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        Ok(Some(src.split_to(len)))
    }
}

impl<In: DeserializeOwned, Out> Decoder for FrameCodec<In, Out> {
    type Item = In;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, FrameError> {
        match self.decode_raw(src)? {
            Some(body) => decode_body(&body).map(Some),
            None => Ok(None),
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<In>, FrameError> {
        match self.decode(buf)? {
            Some(frame) => Ok(Some(frame)),
            None if buf.is_empty() => Ok(None),
            None => Err(FrameError::Truncated),
        }
    }
}

impl<In, Out: Serialize> Encoder<Out> for FrameCodec<In, Out> {
    type Error = FrameError;

    fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), FrameError> {
        let body = encode_body(&item)?;
        if body.len() > self.max {
            return Err(FrameError::TooLarge {
                len: body.len(),
                max: self.max,
            });
        }
        dst.reserve(HEADER_LEN + body.len());
        dst.put_u32(body.len() as u32);
        dst.extend_from_slice(&body);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ToAgent, ToManager};

    #[test]
    fn oversized_header_is_rejected_before_allocating() {
        let mut codec = FrameCodec::<ToManager, ToAgent>::default();
        let mut buf = BytesMut::new();
        buf.put_u32(u32::MAX);
        let cap_before = buf.capacity();
        let err = codec.decode(&mut buf).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
        assert_eq!(buf.capacity(), cap_before, "no body buffer was reserved");
    }

    #[test]
    fn truncated_frame_at_eof_is_an_error() {
        let mut codec = FrameCodec::<ToManager, ToAgent>::default();
        let mut buf = BytesMut::new();
        buf.put_u32(10);
        buf.extend_from_slice(&[1, 2, 3]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        assert!(matches!(
            codec.decode_eof(&mut buf),
            Err(FrameError::Truncated)
        ));
    }

    #[test]
    fn garbage_body_is_malformed_not_a_panic() {
        let mut codec = FrameCodec::<ToManager, ToAgent>::default();
        let mut buf = BytesMut::new();
        buf.put_u32(4);
        buf.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            codec.decode(&mut buf),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn trailing_bytes_are_malformed() {
        let mut body = encode_body(&ToManager::Heartbeat).unwrap();
        body.push(0);
        assert!(matches!(
            decode_body::<ToManager>(&body),
            Err(FrameError::Malformed(_))
        ));
    }
}
