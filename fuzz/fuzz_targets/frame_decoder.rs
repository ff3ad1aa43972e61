//! Fuzz target: the frame decoder of both ends, on arbitrary bytes fed in
//! arbitrary chunks. The first byte picks the chunk size, the rest is the
//! stream. Asserts what the property tests assert: no panic, no frame over
//! the cap, nothing decoded that was not in the input.
#![no_main]

use bytes::BytesMut;
use drover_protocol::codec::{Frames, HEADER_LEN};
use drover_protocol::{FrameCodec, ToAgent, ToManager};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

/// A small cap, so that the fuzzer reaches "too large" with short inputs too.
const MAX: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut frames = Frames::with_max(MAX);
    let mut manager = FrameCodec::<ToManager, ToAgent>::with_max(MAX);
    let mut agent = FrameCodec::<ToAgent, ToManager>::with_max(MAX);
    let (mut raw_buf, mut m_buf, mut a_buf) = (BytesMut::new(), BytesMut::new(), BytesMut::new());
    let (mut raw_done, mut m_done, mut a_done) = (false, false, false);
    let mut decoded = 0;
    for piece in stream.chunks(chunk) {
        raw_buf.extend_from_slice(piece);
        m_buf.extend_from_slice(piece);
        a_buf.extend_from_slice(piece);
        while !raw_done {
            match frames.decode_frame(&mut raw_buf) {
                Ok(Some(body)) => {
                    assert!(body.len() <= MAX);
                    decoded += HEADER_LEN + body.len();
                }
                Ok(None) => break,
                Err(_) => raw_done = true,
            }
        }
        while !m_done {
            match manager.decode(&mut m_buf) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => m_done = true,
            }
        }
        while !a_done {
            match agent.decode(&mut a_buf) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => a_done = true,
            }
        }
    }
    if !raw_done {
        while let Ok(Some(body)) = frames.decode_frame_eof(&mut raw_buf) {
            decoded += HEADER_LEN + body.len();
        }
    }
    assert!(decoded <= stream.len());
});
