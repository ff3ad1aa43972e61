//! The TLS records of a link as bytes on its socket: where one ends, and how
//! long one is, so the manager's reader can mark its socket on TLS links as
//! it does on plaintext ones (`manager/src/nodes/frames.rs`).
//!
//! * [`Records`] goes between the TCP stream and rustls. It passes every
//!   byte through unchanged both ways and follows the record headers (type,
//!   version, two-byte big-endian length) of the bytes read, so its
//!   [`Boundary`] tells whether what rustls was handed so far ends exactly
//!   where a record ends. Any byte sequence, cut anywhere, is followed the
//!   same way (a length is only a count of bytes to skip); it never fails
//!   and never changes a byte: whether a record is valid is rustls's call.
//! * [`sealed_len`] is the exact length on the wire of one application data
//!   record on a link for which [`sizes_known`] holds (TLS 1.3, a suite with
//!   a 16-byte tag, as drover's settings always negotiate): rustls seals what
//!   one write hands it into one record of that length (up to 16 KiB), and
//!   it never pads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustls::{CipherSuite, ProtocolVersion};
use tokio::io::AsyncRead;
use tokio_util::io::InspectReader;

/// A record header: content type (1), legacy version (2), length (2).
pub const HEADER_LEN: usize = 5;

/// The inner content type a TLS 1.3 record seals after its content.
pub const INNER_TYPE_LEN: usize = 1;

/// The AEAD tag of every TLS 1.3 suite [`sizes_known`] accepts.
pub const TAG_LEN: usize = 16;

/// The suites whose tag is [`TAG_LEN`] bytes: all that drover's provider
/// offers for TLS 1.3.
const SIXTEEN_BYTE_TAG: [CipherSuite; 3] = [
    CipherSuite::TLS13_AES_128_GCM_SHA256,
    CipherSuite::TLS13_AES_256_GCM_SHA384,
    CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
];

/// The length on the wire of one unpadded TLS 1.3 application data record
/// carrying `plaintext` bytes: header, the bytes, the inner content type,
/// the tag. Exact on a link where [`sizes_known`] holds.
pub const fn sealed_len(plaintext: usize) -> usize {
    HEADER_LEN + plaintext + INNER_TYPE_LEN + TAG_LEN
}

/// Whether [`sealed_len`] is exact on this established link: TLS 1.3 and a
/// suite with a [`TAG_LEN`]-byte tag. False for anything else (a caller
/// then must not reason about record sizes).
pub fn sizes_known<S>(conn: &crate::ServerStream<S>) -> bool {
    let session = conn.state();
    session.protocol_version() == Some(ProtocolVersion::TLSv1_3)
        && session
            .negotiated_cipher_suite()
            .is_some_and(|s| SIXTEEN_BYTE_TAG.contains(&s.suite()))
}

/// Whether the bytes read through a [`Records`] so far end at a record
/// boundary. Cheap to clone. Loads and stores are `Relaxed`: the one that
/// asks is the task that reads through the stream, right after its read
/// (a lock around a split stream orders it after any other reader's).
#[derive(Debug, Clone)]
pub struct Boundary(Arc<AtomicBool>);

impl Boundary {
    /// True when every record begun has been read whole (also before the
    /// first byte).
    pub fn at_boundary(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a [`Records`] calls with the bytes of every read.
pub type Follow = Box<dyn FnMut(&[u8]) + Send + Sync>;

/// A pass-through stream that follows the record headers of what is read
/// (see the module docs): tokio-util's [`InspectReader`], which hands each
/// read's bytes to the walk and passes writes through untouched. Made by
/// [`follow`].
pub type Records<IO> = InspectReader<IO, Follow>;

/// `io`, read from its first byte, as a [`Records`], and the handle that
/// tells where the bytes read so far end.
pub fn follow<IO: AsyncRead>(io: IO) -> (Records<IO>, Boundary) {
    let boundary = Arc::new(AtomicBool::new(true));
    let shared = Arc::clone(&boundary);
    let mut walk = Walk::default();
    let follow: Follow = Box::new(move |read: &[u8]| {
        if !read.is_empty() {
            walk.feed(read);
            shared.store(walk.at_boundary(), Ordering::Relaxed);
        }
    });
    (InspectReader::new(io, follow), Boundary(boundary))
}

/// Where a byte stream stands among its records.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Walk {
    /// The header bytes of the next record seen so far (fewer than
    /// [`HEADER_LEN`]), only its length bytes kept.
    header: usize,
    length: [u8; 2],
    /// Body bytes of the current record still to come.
    body: usize,
}

impl Walk {
    fn at_boundary(&self) -> bool {
        self.header == 0 && self.body == 0
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.body > 0 {
                let skip = self.body.min(bytes.len());
                self.body -= skip;
                bytes = bytes.get(skip..).unwrap_or_default();
                continue;
            }
            // Inside a header: bytes 3 and 4 are the length.
            let want = (HEADER_LEN - self.header).min(bytes.len());
            for (i, b) in bytes.iter().take(want).enumerate() {
                match self.header + i {
                    3 => self.length[0] = *b,
                    4 => self.length[1] = *b,
                    _ => {}
                }
            }
            self.header += want;
            bytes = bytes.get(want..).unwrap_or_default();
            if self.header == HEADER_LEN {
                self.header = 0;
                self.body = usize::from(u16::from_be_bytes(self.length));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The offsets at which records end, walking `stream` in one piece by
    /// the definition (0 included).
    fn boundaries(stream: &[u8]) -> Vec<usize> {
        let mut at = vec![0];
        let mut pos = 0;
        while pos + HEADER_LEN <= stream.len() {
            let len = usize::from(u16::from_be_bytes([stream[pos + 3], stream[pos + 4]]));
            pos += HEADER_LEN + len;
            if pos <= stream.len() {
                at.push(pos);
            }
        }
        at
    }

    fn record(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind, 3, 3];
        out.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn every_cut_of_a_header_and_a_body() {
        let stream = [record(23, b"hello"), record(21, b""), record(23, &[0; 300])].concat();
        let ends = boundaries(&stream);
        assert_eq!(ends, vec![0, 10, 15, 320]);
        // Fed in two pieces cut anywhere, and byte by byte.
        for cut in 0..=stream.len() {
            let mut walk = Walk::default();
            walk.feed(&stream[..cut]);
            assert_eq!(walk.at_boundary(), ends.contains(&cut), "cut {cut}");
            walk.feed(&stream[cut..]);
            assert!(walk.at_boundary(), "cut {cut}");
        }
        let mut walk = Walk::default();
        for (i, b) in stream.iter().enumerate() {
            walk.feed(std::slice::from_ref(b));
            assert_eq!(walk.at_boundary(), ends.contains(&(i + 1)), "byte {i}");
        }
    }

    #[test]
    fn the_largest_length_a_header_can_say() {
        let mut walk = Walk::default();
        walk.feed(&[0xff; HEADER_LEN]);
        assert_eq!(walk.body, 0xffff);
        walk.feed(&vec![0xff; 0xffff - 1]);
        assert!(!walk.at_boundary());
        walk.feed(&[0]);
        assert!(walk.at_boundary());
    }

    proptest! {
        /// Garbage cut anywhere: the walk agrees with the definition after
        /// every piece, whatever the bytes.
        #[test]
        fn garbage_in_any_pieces(
            stream in proptest::collection::vec(any::<u8>(), 0..600),
            cuts in proptest::collection::vec(0usize..600, 0..12),
        ) {
            // Short lengths now and then, so bodies end inside the stream.
            let stream: Vec<u8> = stream
                .iter()
                .enumerate()
                .map(|(i, b)| if i % 7 == 3 { b % 4 } else { *b })
                .collect();
            let ends = boundaries(&stream);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(stream.len())).collect();
            cuts.push(stream.len());
            cuts.sort_unstable();
            let mut walk = Walk::default();
            let mut from = 0;
            for cut in cuts {
                walk.feed(&stream[from..cut]);
                from = cut;
                prop_assert_eq!(walk.at_boundary(), ends.contains(&cut), "at {}", cut);
            }
        }
    }

    /// Through a real stream pair: bytes pass unchanged both ways and the
    /// handle follows what was read.
    #[tokio::test]
    async fn passes_bytes_through_and_tells_the_boundary() {
        let (near, mut far) = tokio::io::duplex(64);
        let (mut records, boundary) = follow(near);
        assert!(boundary.at_boundary());
        let stream = [record(23, b"abc"), record(23, b"defg")].concat();
        far.write_all(&stream[..6]).await.unwrap();
        let mut got = vec![0; 6];
        records.read_exact(&mut got).await.unwrap();
        assert_eq!(got, stream[..6]);
        assert!(!boundary.at_boundary());
        far.write_all(&stream[6..8]).await.unwrap();
        let mut got = vec![0; 2];
        records.read_exact(&mut got).await.unwrap();
        assert!(boundary.at_boundary());
        far.write_all(&stream[8..]).await.unwrap();
        let mut got = vec![0; stream.len() - 8];
        records.read_exact(&mut got).await.unwrap();
        assert!(boundary.at_boundary());

        records.write_all(b"out").await.unwrap();
        records.flush().await.unwrap();
        let mut got = vec![0; 3];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"out");
        records.shutdown().await.unwrap();
        assert_eq!(far.read(&mut got).await.unwrap(), 0);
    }
}
