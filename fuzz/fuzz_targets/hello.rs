//! Fuzz target: the manager's hello path, the first thing an unauthenticated
//! peer reaches. The bounded read (header checked against the hello cap, then
//! exactly the body) and the hello decoder, on arbitrary bytes. Asserts: no
//! panic, never more read than the header and the cap, and no hello from a
//! body that does not start with drover's magic.
#![no_main]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use drover_protocol::codec::HEADER_LEN;
use drover_protocol::handshake::MAGIC;
use drover_protocol::link::{decode_hello, read_bounded_frame};
use drover_protocol::HELLO_MAX_LEN;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut reader = data;
    let read = match pin!(read_bounded_frame(&mut reader, HELLO_MAX_LEN))
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(read) => read,
        Poll::Pending => panic!("an in-memory read waited"),
    };
    assert!(data.len() - reader.len() <= HEADER_LEN + HELLO_MAX_LEN);
    if let Ok(body) = read {
        let hello = decode_hello(&body);
        assert!(hello.is_err() || body.starts_with(&MAGIC));
    }
    let hello = decode_hello(data);
    assert!(hello.is_err() || data.starts_with(&MAGIC));
});
