//! Property tests of what an outsider can feed the manager: the frame
//! decoder and the hello path; and of what a peer posing as the manager can
//! feed an agent: the welcome path. They run in every `cargo test` with a fixed
//! case count (the cargo-fuzz targets in `fuzz/` explore the same code for
//! as long as one lets them; see `fuzz/README.md`).
//!
//! What they pin: no input panics; garbage is an error; the hello read never
//! consumes more than its header and [`HELLO_MAX_LEN`], the welcome read no
//! more than its header and [`WELCOME_MAX_LEN`]; every welcome the
//! constructors build fits that cap; valid frames and hellos round-trip
//! however the stream is cut into reads.
#![cfg(feature = "io")]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use drover_protocol::codec::{FrameError, Frames, HEADER_LEN, decode_body, encode_body};
use drover_protocol::handshake::{AGENT_VERSION_MAX, Accepted, MAGIC};
use drover_protocol::link::{HandshakeError, agent_handshake, decode_hello, read_bounded_frame};
use drover_protocol::{
    FrameCodec, HELLO_MAX_LEN, Hello, MAX_FRAME_LEN, RefuseReason, ToAgent, ToManager,
    WELCOME_MAX_LEN, Welcome,
};
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

/// A peer posing as the manager: what it answers is `answer`, what the agent
/// sends it is dropped; counts what the agent read.
struct Posing<'a> {
    answer: &'a [u8],
    read: usize,
}

impl tokio::io::AsyncRead for Posing<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = buf.remaining().min(self.answer.len() - self.read);
        let start = self.read;
        buf.put_slice(&self.answer[start..start + n]);
        self.read += n;
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for Posing<'_> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The agent's handshake against `answer`: the welcome it got (or the error)
/// and how many bytes of `answer` it read.
fn agent_against(answer: &[u8]) -> (Result<Accepted, HandshakeError>, usize) {
    thread_local! {
        // The handshake's timeouts need a clock; nothing here waits on it.
        static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
    }
    let mut peer = Posing { answer, read: 0 };
    let out = RT.with(|rt| {
        rt.block_on(agent_handshake(
            &mut peer,
            &Hello::new("n1", "x"),
            std::time::Duration::from_secs(5),
        ))
    });
    (out.map(|(_, accepted)| accepted), peer.read)
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

    /// The welcome path on arbitrary input, also behind a header announcing
    /// up to twice the cap: never a panic, never more read than the header
    /// and the welcome cap, and an error unless drover's magic opens the body.
    #[test]
    fn welcome_path_on_garbage(
        announced in 0u32..(2 * WELCOME_MAX_LEN as u32),
        framed in any::<bool>(),
        input in proptest::collection::vec(any::<u8>(), 0..1200),
    ) {
        let answer = if framed {
            let mut a = announced.to_be_bytes().to_vec();
            a.extend_from_slice(&input);
            a
        } else {
            input
        };
        let (got, read) = agent_against(&answer);
        prop_assert!(read <= HEADER_LEN + WELCOME_MAX_LEN, "read {}", read);
        if answer.len() < HEADER_LEN + MAGIC.len() || answer[HEADER_LEN..HEADER_LEN + MAGIC.len()] != MAGIC {
            prop_assert!(got.is_err(), "{:?}", got);
        }
    }

    /// Every welcome the constructors build, whatever text it is given, fits
    /// the cap the agent reads with and reaches the agent whole. (Arbitrary
    /// characters average about 3.5 bytes: the lengths go past both text caps.)
    #[test]
    fn every_welcome_fits_the_cap(
        message in proptest::collection::vec(any::<char>(), 0..600),
        version in proptest::collection::vec(any::<char>(), 0..150),
        numbers in any::<(u64, u64, u64)>(),
    ) {
        let message: String = message.into_iter().collect();
        let refused = Welcome::refused(RefuseReason::BadHandshake, message.clone());
        let body = encode_body(&refused).unwrap();
        prop_assert!(body.len() <= WELCOME_MAX_LEN, "{}", body.len());
        match agent_against(&frame(&body)).0 {
            Err(HandshakeError::Refused { message: got, .. }) => {
                prop_assert!(message.starts_with(&got));
            }
            other => prop_assert!(false, "{:?}", other),
        }
        let accepted = Accepted {
            session_id: numbers.0,
            heartbeat_interval_ms: numbers.1,
            heartbeat_threshold_ms: numbers.2,
            manager_version: version.into_iter().collect(),
            resync_interval_ms: 0,
            epoch: 0,
        };
        let body = encode_body(&Welcome::accepted(accepted.clone())).unwrap();
        prop_assert!(body.len() <= WELCOME_MAX_LEN, "{}", body.len());
        let got = agent_against(&frame(&body)).0.unwrap();
        prop_assert_eq!(got.session_id, accepted.session_id);
        prop_assert!(accepted.manager_version.starts_with(&got.manager_version));
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
