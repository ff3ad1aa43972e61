//! Whatever an outsider sends as the first bytes of a connection, the
//! acceptor answers with an error — never a panic, never a hang once the
//! sender stops. Fixed case count, so CI runs the same amount every time.

#![cfg(feature = "pki")]

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// One runtime and server for all cases (each case is one connection). A static
/// is never dropped, so it holds no files: the fleet's certificates are loaded into
/// the server's settings and their directory is removed at once.
struct Harness {
    runtime: tokio::runtime::Runtime,
    server: Mutex<Server>,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let fleet = Fleet::new();
        let server = runtime.block_on(Server::start(fleet.server_settings()));
        drop(fleet);
        Harness {
            runtime,
            server: Mutex::new(server),
        }
    })
}

/// Sends `bytes`, closes the sending half, and returns the manager's verdict.
fn first_bytes(bytes: &[u8]) -> Outcome {
    let h = harness();
    h.runtime.block_on(async {
        let mut server = h.server.lock().await;
        let mut tcp = server.tcp().await;
        // The server may refuse before reading everything: a reset is fine.
        let _ = tcp.write_all(bytes).await;
        let _ = tcp.shutdown().await;
        let outcome = tokio::time::timeout(Duration::from_secs(3), server.outcome())
            .await
            .expect("no verdict within 3 s of the peer closing");
        drop(tcp);
        outcome
    })
}

/// Arbitrary bytes; or one complete TLS handshake record (type 22, a TLS
/// version, the right length) around arbitrary bytes, to get past the record
/// layer into the handshake parser.
fn openings() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..2048),
        (
            prop_oneof![Just(0x01u8), Just(0x03u8)],
            proptest::collection::vec(any::<u8>(), 0..1024)
        )
            .prop_map(|(minor, body)| {
                let len = body.len() as u16;
                let mut record = vec![0x16, 0x03, minor, (len >> 8) as u8, len as u8];
                record.extend(body);
                record
            }),
        // A ClientHello header (type 1, a 24-bit length) with a random body.
        proptest::collection::vec(any::<u8>(), 0..512).prop_map(|body| {
            let len = body.len() + 4;
            let mut record = vec![0x16, 0x03, 0x01, (len >> 8) as u8, len as u8, 0x01, 0x00];
            record.push(((body.len() >> 8) & 0xff) as u8);
            record.push((body.len() & 0xff) as u8);
            record.extend(body);
            record
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_first_bytes_are_an_error(bytes in openings()) {
        let outcome = first_bytes(&bytes);
        prop_assert!(outcome.is_err(), "accepted {:?}", outcome);
    }
}

#[test]
fn edge_openings_are_errors() {
    let cases: [&[u8]; 6] = [
        b"",
        b"\x16",
        b"\x16\x03\x01\xff\xff",
        b"\x16\x03\x01\x00\x00",
        &[0u8; 4096],
        &[0xffu8; 4096],
    ];
    for bytes in cases {
        assert!(
            first_bytes(bytes).is_err(),
            "{:?}",
            &bytes[..bytes.len().min(8)]
        );
    }
}
