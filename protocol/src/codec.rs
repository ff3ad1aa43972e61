//! Framing: `u32` big-endian length prefix + postcard body.
//!
//! The framing itself is tokio-util's [`LengthDelimitedCodec`] (4-byte
//! big-endian length, `max_frame_length` = the frame cap); this module adds the
//! body encoding and the typed errors on top. The body rules ([`encode_body`],
//! [`decode_body`], [`FrameError`]) need no I/O and build without the `io`
//! feature; `FrameCodec` (the tokio-util `Decoder`/`Encoder`) needs it.
//!
//! Invariants:
//! * A frame longer than [`MAX_FRAME_LEN`] is rejected from its 4-byte header,
//!   before any buffer for the body is reserved (a peer cannot make us allocate
//!   by announcing a huge frame): [`FrameError::TooLarge`].
//! * A body that does not decode as the expected message type is a typed
//!   [`FrameError::Malformed`], never a panic; trailing bytes after a valid
//!   message are malformed too (a frame is exactly one message), except
//!   zero bytes: the padding a sender adds to reach its message's
//!   [`MinFrameLen`] (protocol 10; why the agent pads: [`crate::liveness`]).
//! * A connection that ends inside a frame (header or body cut off) is
//!   [`FrameError::Truncated`]; one that ends between frames is a clean end.
//!
//! [`LengthDelimitedCodec`]: https://docs.rs/tokio-util/latest/tokio_util/codec/struct.LengthDelimitedCodec.html

use serde::{Serialize, de::DeserializeOwned};

/// Hard maximum of one frame body (1 MiB).
pub const MAX_FRAME_LEN: usize = 1 << 20;

/// Bytes of the length prefix in front of every body.
pub const HEADER_LEN: usize = 4;

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

/// Decodes one whole message from a frame body; trailing bytes are an
/// error unless all are zero (padding).
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let (msg, rest) =
        postcard::take_from_bytes::<T>(body).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if rest.iter().any(|&b| b != 0) {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes after the message",
            rest.len()
        )));
    }
    Ok(msg)
}

/// The least length of a message's frame, header included: the encoder
/// pads a shorter body with zero bytes, which [`decode_body`] skips.
pub trait MinFrameLen {
    /// 0: never padded.
    fn min_frame_len(&self) -> usize;
}

/// `body` padded with zero bytes so that its frame is at least `min` bytes.
pub fn pad_body(body: &mut Vec<u8>, min: usize) {
    let want = min.saturating_sub(HEADER_LEN);
    if body.len() < want {
        body.resize(want, 0);
    }
}

/// Encodes one message as a frame body.
pub fn encode_body<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    postcard::to_stdvec(msg).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// The body length of `msg` when it does not fit one frame, else `None`.
/// Senders check what they build from outside input before queueing it:
/// a message over the cap fails the writer, and a failed writer ends the
/// whole connection, not just that message.
pub fn oversized<T: Serialize + ?Sized>(msg: &T) -> Option<usize> {
    let len = encoded_len(msg);
    (len > MAX_FRAME_LEN).then_some(len)
}

/// The length of `msg`'s body, measured without building it (no
/// allocation, one walk); `usize::MAX` when it cannot be encoded.
pub fn encoded_len<T: Serialize + ?Sized>(msg: &T) -> usize {
    postcard::serialize_with_flavor::<T, _, usize>(msg, postcard::ser_flavors::Size::default())
        .unwrap_or(usize::MAX)
}

#[cfg(feature = "io")]
pub use framed::{FrameCodec, Frames};

#[cfg(feature = "io")]
mod framed {
    use crate::codec::{
        FrameError, HEADER_LEN, MAX_FRAME_LEN, MinFrameLen, decode_body, encode_body, pad_body,
    };
    use bytes::BytesMut;
    use serde::{Serialize, de::DeserializeOwned};
    use std::marker::PhantomData;
    use tokio_util::codec::length_delimited::LengthDelimitedCodecError;
    use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

    /// Raw frames: tokio-util's length-delimited codec with the cap, plus
    /// what it does not track for us — whether a frame was begun (its header
    /// consumed) so that an end of stream there is [`FrameError::Truncated`].
    pub struct Frames {
        inner: LengthDelimitedCodec,
        max: usize,
        /// The header of a frame was consumed, its body is not complete yet.
        in_frame: bool,
    }

    impl Frames {
        pub fn with_max(max: usize) -> Self {
            let inner = LengthDelimitedCodec::builder()
                .big_endian()
                .length_field_type::<u32>()
                .max_frame_length(max)
                .new_codec();
            Self {
                inner,
                max,
                in_frame: false,
            }
        }

        /// Splits one raw frame body off `src` once it is complete. The
        /// header is checked against the cap before anything is reserved.
        pub fn decode_frame(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
            let before = src.len();
            match self.inner.decode(src) {
                Ok(Some(body)) => {
                    self.in_frame = false;
                    Ok(Some(body))
                }
                Ok(None) => {
                    // The codec consumes a header only once it is whole.
                    if src.len() < before {
                        self.in_frame = true;
                    }
                    Ok(None)
                }
                Err(e) if is_too_large(&e) => Err(FrameError::TooLarge {
                    len: announced_len(src),
                    max: self.max,
                }),
                Err(e) => Err(FrameError::Io(e)),
            }
        }

        /// [`Frames::decode_frame`] at the end of the stream: what is left
        /// must be nothing, or whole frames.
        pub fn decode_frame_eof(
            &mut self,
            src: &mut BytesMut,
        ) -> Result<Option<BytesMut>, FrameError> {
            match self.decode_frame(src)? {
                Some(body) => Ok(Some(body)),
                None if src.is_empty() && !self.in_frame => Ok(None),
                None => Err(FrameError::Truncated),
            }
        }

        /// Appends `body` with its length prefix; a body over the cap is
        /// refused before anything is written.
        pub fn encode_frame(&mut self, body: &[u8], dst: &mut BytesMut) -> Result<(), FrameError> {
            if body.len() > self.max {
                return Err(FrameError::TooLarge {
                    len: body.len(),
                    max: self.max,
                });
            }
            Encoder::<&[u8]>::encode(&mut self.inner, body, dst)?;
            Ok(())
        }
    }

    impl Default for Frames {
        fn default() -> Self {
            Self::with_max(MAX_FRAME_LEN)
        }
    }

    fn is_too_large(e: &std::io::Error) -> bool {
        e.get_ref()
            .is_some_and(|inner| inner.is::<LengthDelimitedCodecError>())
    }

    /// The length a rejected header announced: the codec refuses a header
    /// without consuming it, so it is still at the front of `src`.
    fn announced_len(src: &BytesMut) -> usize {
        src.get(..HEADER_LEN)
            .and_then(|h| <[u8; HEADER_LEN]>::try_from(h).ok())
            .map_or(0, |h| u32::from_be_bytes(h) as usize)
    }

    /// Encodes `Out` and decodes `In`; one codec per direction pair.
    pub struct FrameCodec<In, Out> {
        frames: Frames,
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
                frames: Frames::with_max(max),
                _marker: PhantomData,
            }
        }

        /// False once a frame's header was taken and its body is still
        /// awaited (the header is no longer in the buffer then): a reader
        /// with an empty buffer stands between frames only when this holds.
        pub fn between_frames(&self) -> bool {
            !self.frames.in_frame
        }
    }

    impl<In: DeserializeOwned, Out> Decoder for FrameCodec<In, Out> {
        type Item = In;
        type Error = FrameError;

        fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, FrameError> {
            match self.frames.decode_frame(src)? {
                Some(body) => decode_body(&body).map(Some),
                None => Ok(None),
            }
        }

        fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<In>, FrameError> {
            match self.frames.decode_frame_eof(buf)? {
                Some(body) => decode_body(&body).map(Some),
                None => Ok(None),
            }
        }
    }

    impl<In, Out: Serialize + MinFrameLen> Encoder<Out> for FrameCodec<In, Out> {
        type Error = FrameError;

        fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), FrameError> {
            let mut body = encode_body(&item)?;
            pad_body(&mut body, item.min_frame_len());
            self.frames.encode_frame(&body, dst)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::codec::oversized;
        use crate::message::{ToAgent, ToManager};
        use bytes::BufMut;

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

        /// A header taken with its body still missing leaves the buffer
        /// empty but the codec inside a frame.
        #[test]
        fn between_frames_only_before_a_header_is_taken() {
            let mut codec = FrameCodec::<ToManager, ToAgent>::default();
            assert!(codec.between_frames());
            let body = encode_body(&ToManager::Heartbeat).unwrap();
            let mut buf = BytesMut::new();
            buf.put_u32(u32::try_from(body.len()).unwrap());
            assert!(codec.decode(&mut buf).unwrap().is_none());
            assert!(buf.is_empty() && !codec.between_frames());
            buf.extend_from_slice(&body);
            assert_eq!(codec.decode(&mut buf).unwrap(), Some(ToManager::Heartbeat));
            assert!(buf.is_empty() && codec.between_frames());
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

        /// A subscription whose unit name was made invalid on the wire
        /// (the same length, so the frame is otherwise well formed) is
        /// malformed as a whole: the agent never sees the name.
        #[test]
        fn a_subscription_with_an_invalid_unit_name_is_malformed() {
            use crate::message::Request;
            use crate::names::UnitName;
            let unit = || UnitName::new("abc.service").unwrap();
            for body in [
                Request::SubscribeState { unit: unit() },
                Request::Subscribe { unit: Some(unit()) },
                Request::Unsubscribe { unit: Some(unit()) },
            ] {
                let frame = ToAgent::Request { id: 7, body };
                let good = encode_body(&frame).unwrap();
                assert_eq!(decode_body::<ToAgent>(&good).unwrap(), frame);
                for bad in ["a/c.service", "a c.service", "abc.nopenop"] {
                    let at = good.windows(11).position(|w| w == b"abc.service").unwrap();
                    let mut tampered = good.clone();
                    tampered[at..at + 11].copy_from_slice(bad.as_bytes());
                    let err = decode_body::<ToAgent>(&tampered).unwrap_err();
                    assert!(matches!(err, FrameError::Malformed(_)), "{bad}: {err}");
                }
            }
        }

        #[test]
        fn trailing_bytes_are_malformed_unless_all_zero() {
            let mut body = encode_body(&ToManager::Heartbeat).unwrap();
            body.extend_from_slice(&[0, 0, 1]);
            assert!(matches!(
                decode_body::<ToManager>(&body),
                Err(FrameError::Malformed(_))
            ));
            body.pop();
            assert_eq!(
                decode_body::<ToManager>(&body).unwrap(),
                ToManager::Heartbeat
            );
        }

        /// The agent's frames other than heartbeats are padded to the
        /// minimum and decode as they were; heartbeats and the manager's
        /// frames are not padded.
        #[test]
        fn the_agents_small_frames_are_padded_and_decode_unchanged() {
            use crate::liveness::{AGENT_HEARTBEAT_FRAME_LEN, AGENT_MIN_FRAME_LEN};
            let mut tx = FrameCodec::<ToAgent, ToManager>::default();
            let mut rx = FrameCodec::<ToManager, ToAgent>::default();
            let reply = ToManager::Reply {
                id: 7,
                result: Ok(crate::message::Response::Empty),
            };
            let mut buf = BytesMut::new();
            tx.encode(reply.clone(), &mut buf).unwrap();
            assert_eq!(buf.len(), AGENT_MIN_FRAME_LEN);
            tx.encode(ToManager::Heartbeat, &mut buf).unwrap();
            assert_eq!(buf.len(), AGENT_MIN_FRAME_LEN + AGENT_HEARTBEAT_FRAME_LEN);
            assert_eq!(rx.decode(&mut buf).unwrap(), Some(reply));
            assert_eq!(rx.decode(&mut buf).unwrap(), Some(ToManager::Heartbeat));
            assert!(buf.is_empty());

            let mut out = BytesMut::new();
            rx.encode(ToAgent::Heartbeat, &mut out).unwrap();
            assert_eq!(
                out.len(),
                HEADER_LEN + 1,
                "the manager's frames are not padded"
            );
        }

        #[test]
        fn too_large_names_the_announced_length() {
            let mut codec = FrameCodec::<ToManager, ToAgent>::with_max(8);
            let mut buf = BytesMut::new();
            buf.put_u32(9);
            match codec.decode(&mut buf) {
                Err(FrameError::TooLarge { len: 9, max: 8 }) => {}
                other => panic!("unexpected {other:?}"),
            }
            let mut out = BytesMut::new();
            let err = codec.frames.encode_frame(&[0; 9], &mut out).unwrap_err();
            assert!(matches!(err, FrameError::TooLarge { len: 9, max: 8 }));
            assert!(out.is_empty(), "nothing written for a refused frame");
        }

        #[test]
        fn a_stream_cut_right_after_a_header_is_truncated() {
            let mut codec = FrameCodec::<ToManager, ToAgent>::default();
            let mut buf = BytesMut::from(&10u32.to_be_bytes()[..]);
            assert!(codec.decode(&mut buf).unwrap().is_none());
            assert!(buf.is_empty(), "the length codec took the header");
            let end = codec.decode_eof(&mut buf);
            assert!(matches!(end, Err(FrameError::Truncated)), "{end:?}");
        }

        #[test]
        fn frames_round_trip_back_to_back_and_end_cleanly() {
            let mut tx = FrameCodec::<ToAgent, ToManager>::default();
            let mut rx = FrameCodec::<ToManager, ToAgent>::default();
            let mut buf = BytesMut::new();
            tx.encode(ToManager::Heartbeat, &mut buf).unwrap();
            tx.encode(ToManager::Heartbeat, &mut buf).unwrap();
            assert_eq!(&buf[..HEADER_LEN], &1u32.to_be_bytes());
            assert_eq!(rx.decode(&mut buf).unwrap(), Some(ToManager::Heartbeat));
            assert_eq!(rx.decode_eof(&mut buf).unwrap(), Some(ToManager::Heartbeat));
            assert_eq!(rx.decode_eof(&mut buf).unwrap(), None);
        }
        #[test]
        fn oversized_measures_the_body_as_encoded() {
            let small = vec![7u8; 1000];
            assert_eq!(oversized(&small), None);
            let big = vec![7u8; MAX_FRAME_LEN];
            let len = encode_body(&big).unwrap().len();
            assert_eq!(oversized(&big), Some(len));
        }
    }
}
