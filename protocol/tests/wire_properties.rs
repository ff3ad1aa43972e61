//! Property tests of what an outsider can feed the manager: the frame
//! decoder and the hello path. They run in every `cargo test` with a fixed
//! case count (the cargo-fuzz targets in `fuzz/` explore the same code for
//! as long as one lets them; see `fuzz/README.md`).
//!
//! What they pin: no input panics; garbage is an error; the hello read never
//! consumes more than its header and [`HELLO_MAX_LEN`]; valid frames and
//! hellos round-trip however the stream is cut into reads.
#![cfg(feature = "io")]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use drover_protocol::codec::{FrameError, Frames, HEADER_LEN, decode_body, encode_body};
use drover_protocol::handshake::{AGENT_VERSION_MAX, MAGIC};
use drover_protocol::link::{HandshakeError, decode_hello, read_bounded_frame};
use drover_protocol::{FrameCodec, HELLO_MAX_LEN, Hello, MAX_FRAME_LEN, ToAgent, ToManager};
use proptest::prelude::*;
use tokio_util::codec::Decoder;

/// Cases per property: enough to matter, few enough for CI (about a second each).
const CASES: u32 = 2000;

/// Runs a future that never waits (its I/O is an in-memory slice).
fn now<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-memory read waited"),
    }
}

/// Feeds `input` to a raw frame decoder in chunks of the given sizes, then
/// ends the stream. Returns the frames decoded and the error that stopped
/// it, if any.
fn decode_chunked(
    frames: &mut Frames,
    input: &[u8],
    chunks: &[usize],
) -> (Vec<Vec<u8>>, Option<FrameError>) {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = input;
    let mut sizes = chunks.iter().copied().cycle();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            match frames.decode_frame(&mut buf) {
                Ok(Some(body)) => out.push(body.to_vec()),
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
    }
    loop {
        match frames.decode_frame_eof(&mut buf) {
            Ok(Some(body)) => out.push(body.to_vec()),
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e)),
        }
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

fn hello() -> impl Strategy<Value = Hello> {
    (
        "[a-z0-9][a-z0-9.-]{0,63}",
        proptest::collection::vec(any::<char>(), 0..40),
    )
        .prop_map(|(node, version)| {
            let mut version: String = version.into_iter().collect();
            while version.len() > AGENT_VERSION_MAX {
                version.pop();
            }
            Hello::new(node, version)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Arbitrary bytes, cut anywhere: frames or an error, never a panic, and
    /// never a frame longer than the cap.
    #[test]
    fn raw_frames_never_panic(
        input in proptest::collection::vec(any::<u8>(), 0..600),
        chunks in proptest::collection::vec(1usize..64, 1..8),
        max in 0usize..300,
    ) {
        let mut frames = Frames::with_max(max);
        let (bodies, _) = decode_chunked(&mut frames, &input, &chunks);
        let total: usize = bodies.iter().map(|b| b.len() + HEADER_LEN).sum();
        prop_assert!(total <= input.len());
        prop_assert!(bodies.iter().all(|b| b.len() <= max));
    }

    /// Valid frames back to back come out whole and in order however the
    /// stream is cut; the stream then ends cleanly.
    #[test]
    fn valid_frames_round_trip(
        bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..6),
        chunks in proptest::collection::vec(1usize..97, 1..8),
    ) {
        let mut input = Vec::new();
        let mut tx = Frames::default();
        for body in &bodies {
            let mut out = BytesMut::new();
            tx.encode_frame(body, &mut out).unwrap();
            prop_assert_eq!(&out[..], &frame(body)[..]);
            input.extend_from_slice(&out);
        }
        let (got, err) = decode_chunked(&mut Frames::default(), &input, &chunks);
        prop_assert!(err.is_none(), "{:?}", err);
        prop_assert_eq!(got, bodies);
    }

    /// A header announcing more than the cap is refused from the header, with
    /// the length it announced; a stream cut inside a frame is truncated.
    #[test]
    fn oversized_and_cut_frames_are_errors(
        len in (MAX_FRAME_LEN as u32 + 1)..=u32::MAX,
        body in proptest::collection::vec(any::<u8>(), 1..200),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut buf = BytesMut::from(&len.to_be_bytes()[..]);
        let err = Frames::default().decode_frame(&mut buf).unwrap_err();
        let too_large = matches!(err, FrameError::TooLarge { len: l, .. } if l == len as usize);
        prop_assert!(too_large, "{}", err);

        let whole = frame(&body);
        let cut = 1 + cut.index(whole.len() - 1);
        let (got, err) = decode_chunked(&mut Frames::default(), &whole[..cut], &[7]);
        prop_assert!(got.is_empty());
        prop_assert!(matches!(err, Some(FrameError::Truncated)), "{:?}", err);
    }

    /// Arbitrary frame bodies through the typed codecs of both ends: a
    /// message or `Malformed`, never a panic.
    #[test]
    fn typed_codecs_never_panic(body in proptest::collection::vec(any::<u8>(), 0..400)) {
        let input = frame(&body);
        let mut manager = FrameCodec::<ToManager, ToAgent>::default();
        match manager.decode(&mut BytesMut::from(&input[..])) {
            Ok(Some(_)) | Err(FrameError::Malformed(_)) => {}
            other => prop_assert!(false, "manager side: {:?}", other),
        }
        let mut agent = FrameCodec::<ToAgent, ToManager>::default();
        match agent.decode(&mut BytesMut::from(&input[..])) {
            Ok(Some(_)) | Err(FrameError::Malformed(_)) => {}
            other => prop_assert!(false, "agent side: {:?}", other),
        }
    }

    /// The hello path on arbitrary input: it reads at most the header and
    /// the hello cap, never panics, and anything that does not start with
    /// drover's magic is an error.
    #[test]
    fn hello_path_on_garbage(input in proptest::collection::vec(any::<u8>(), 0..700)) {
        let mut reader = &input[..];
        let read = now(read_bounded_frame(&mut reader, HELLO_MAX_LEN));
        let consumed = input.len() - reader.len();
        prop_assert!(consumed <= HEADER_LEN + HELLO_MAX_LEN, "consumed {}", consumed);
        if let Ok(body) = read {
            let decoded = decode_hello(&body);
            if !body.starts_with(&MAGIC) {
                prop_assert!(decoded.is_err());
            }
        }
        // The body alone, as if it had been framed.
        let decoded = decode_hello(&input);
        if !input.starts_with(&MAGIC) {
            prop_assert!(matches!(decoded, Err(HandshakeError::NotDrover(_))), "{:?}", decoded);
        }
    }

    /// Bytes after drover's magic and version: still never a panic, and a
    /// hello only when the body is exactly one.
    #[test]
    fn hello_with_valid_prefix_and_garbage_after(
        tail in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut body = encode_body(&(MAGIC, drover_protocol::PROTOCOL_VERSION)).unwrap();
        body.extend_from_slice(&tail);
        if let Ok(hello) = decode_hello(&body) {
            let again = encode_body(&hello).unwrap();
            prop_assert_eq!(decode_hello(&again).unwrap(), hello);
        }
    }

    /// Valid hellos round-trip through the bounded read and the decoder,
    /// leaving what follows them unread.
    #[test]
    fn valid_hellos_round_trip(hello in hello(), after in proptest::collection::vec(any::<u8>(), 0..16)) {
        let body = encode_body(&hello).unwrap();
        prop_assert!(body.len() <= HELLO_MAX_LEN);
        let mut input = frame(&body);
        input.extend_from_slice(&after);
        let mut reader = &input[..];
        let read = now(read_bounded_frame(&mut reader, HELLO_MAX_LEN)).unwrap();
        prop_assert_eq!(reader, &after[..]);
        prop_assert_eq!(decode_hello(&read).unwrap(), hello.clone());
        prop_assert_eq!(decode_body::<Hello>(&body).unwrap(), hello);
    }
}
