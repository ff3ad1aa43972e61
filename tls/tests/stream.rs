//! The manager's established TLS link (`drover_tls::ServerStream`, rustls's
//! unbuffered API) over real TLS 1.3 on loopback: drover's acceptor and
//! certificates from `drover_tls::pki` on the manager's side, a rustls client
//! driven by hand on the agent's side (a blocking socket), so every byte the
//! agent sends can be cut, delayed or forged.
//!
//! What a user of the link relies on: every byte arrives whole and in order
//! whatever the cuts; an idle link holds no buffer; the end reads as the end
//! (with `close_notify`) or as an error (without); garbage and oversized
//! records end the link with an error and bounded memory; key updates work.

#![cfg(feature = "pki")]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream as StdStream;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use drover_tls::ServerStream;
use drover_tls::server_stream::MAX_INCOMING;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The agent's side: a rustls client over a blocking socket.
struct Agent {
    tls: rustls::ClientConnection,
    socket: StdStream,
}

impl Agent {
    /// What the connection has to send, as bytes.
    fn pending(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        while self.tls.wants_write() {
            self.tls.write_tls(&mut out).unwrap();
        }
        out
    }

    /// `plaintext` sealed (one record up to 16 KiB), not sent.
    fn seal(&mut self, plaintext: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = plaintext;
        while !rest.is_empty() {
            let n = self.tls.writer().write(rest).unwrap();
            rest = &rest[n..];
            out.extend(self.pending());
        }
        out
    }

    /// Reads and opens records until `want` bytes of plaintext came.
    fn receive(&mut self, want: usize) -> Vec<u8> {
        let mut got = Vec::new();
        while got.len() < want {
            let mut buf = [0u8; 4096];
            match self.tls.reader().read(&mut buf) {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                Ok(_) => panic!("the manager ended the link after {} bytes", got.len()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.tls.read_tls(&mut self.socket).unwrap();
                    self.tls.process_new_packets().unwrap();
                }
                Err(e) => panic!("agent read: {e}"),
            }
        }
        got
    }

    /// Reads until the link ends; what rustls said about it.
    fn until_end(&mut self) -> Result<(), String> {
        self.socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        loop {
            let mut buf = [0u8; 4096];
            match self.tls.reader().read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    match self.tls.read_tls(&mut self.socket) {
                        Ok(0) => return Err("end of stream".into()),
                        Ok(_) => {}
                        Err(e) => return Err(e.to_string()),
                    }
                    if let Err(e) = self.tls.process_new_packets() {
                        return Err(e.to_string());
                    }
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

fn client_config(fleet: &Fleet) -> Arc<rustls::ClientConfig> {
    let files = fleet.pki.node_files(&node("node1"));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&files.ca_bundle).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain = CertificateDer::pem_file_iter(&files.certificate)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(&files.private_key).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(drover_testkit::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    Arc::new(config)
}

/// An established link: the agent's side and the manager's stream.
async fn link(fleet: &Fleet) -> (Agent, ServerStream<TcpStream>) {
    let acceptor = drover_tls::Acceptor::new(fleet.server_settings());
    let config = client_config(fleet);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let agent = tokio::task::spawn_blocking(move || {
        let mut socket = StdStream::connect(addr).unwrap();
        socket.set_nodelay(true).unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut tls = rustls::ClientConnection::new(config, name).unwrap();
        while tls.is_handshaking() {
            tls.complete_io(&mut socket).unwrap();
        }
        while tls.wants_write() {
            tls.write_tls(&mut socket).unwrap();
        }
        Agent { tls, socket }
    });
    let (tcp, _) = listener.accept().await.unwrap();
    let stream = tokio::time::timeout(WAIT, acceptor.accept(tcp))
        .await
        .unwrap()
        .unwrap();
    (agent.await.unwrap(), stream)
}

/// Reads exactly `n` bytes from the manager's stream.
async fn read_n(stream: &mut ServerStream<TcpStream>, n: usize) -> Vec<u8> {
    let mut got = vec![0u8; n];
    tokio::time::timeout(WAIT, stream.read_exact(&mut got))
        .await
        .expect("the manager's read hung")
        .unwrap();
    got
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_arrive_whole_both_ways_and_an_idle_link_holds_no_buffer() {
    let fleet = Fleet::new();
    let (mut agent, mut stream) = link(&fleet).await;
    assert_eq!(
        drover_tls::peer_identity(&stream).unwrap().node().as_str(),
        "node1"
    );
    assert!(drover_tls::records::sizes_known(&stream));
    assert_eq!(stream.buffered(), 0, "after the handshake");
    for len in [1, 5, 27, 4095, 4096, 16_384, 16_385, 100_000] {
        let data = pattern(len);
        let sealed = agent.seal(&data);
        agent.socket.write_all(&sealed).unwrap();
        assert_eq!(read_n(&mut stream, len).await, data, "{len} bytes in");
        assert_eq!(stream.buffered(), 0, "idle after reading {len} bytes");

        stream.write_all(&data).await.unwrap();
        stream.flush().await.unwrap();
        assert_eq!(stream.buffered(), 0, "idle after writing {len} bytes");
        let back = tokio::task::block_in_place(|| agent.receive(len));
        assert_eq!(back, data, "{len} bytes out");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_cut_at_every_byte_are_read_whole() {
    let fleet = Fleet::new();
    let (mut agent, mut stream) = link(&fleet).await;
    // Two records back to back, sent one byte at a time: the stream holds
    // at most the head of a record, then hands over each whole.
    let first = pattern(40);
    let second = pattern(300);
    let bytes = [agent.seal(&first), agent.seal(&second)].concat();
    let writer = tokio::task::spawn_blocking(move || {
        for b in &bytes {
            agent.socket.write_all(std::slice::from_ref(b)).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
        agent
    });
    assert_eq!(read_n(&mut stream, first.len()).await, first);
    assert_eq!(read_n(&mut stream, second.len()).await, second);
    let _agent = writer.await.unwrap();
    assert_eq!(stream.buffered(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_notify_then_the_end_reads_as_the_end() {
    let fleet = Fleet::new();
    let (mut agent, mut stream) = link(&fleet).await;
    let mut bytes = agent.seal(b"last words");
    agent.tls.send_close_notify();
    bytes.extend(agent.pending());
    agent.socket.write_all(&bytes).unwrap();
    agent.socket.shutdown(std::net::Shutdown::Write).unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut all))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(all, b"last words");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_without_close_notify_is_an_error() {
    let fleet = Fleet::new();
    let (mut agent, mut stream) = link(&fleet).await;
    let bytes = agent.seal(b"cut off");
    agent.socket.write_all(&bytes).unwrap();
    drop(agent);
    assert_eq!(read_n(&mut stream, 7).await, b"cut off");
    let mut buf = [0u8; 16];
    let e = tokio::time::timeout(WAIT, stream.read(&mut buf))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_sends_close_notify() {
    let fleet = Fleet::new();
    let (agent, mut stream) = link(&fleet).await;
    stream.write_all(b"bye").await.unwrap();
    stream.shutdown().await.unwrap();
    let mut agent = agent;
    let seen = tokio::task::block_in_place(|| {
        let got = agent.receive(3);
        (got, agent.until_end())
    });
    assert_eq!(seen, (b"bye".to_vec(), Ok(())));
    // Nothing can be written after.
    assert!(stream.write_all(b"more").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_update_from_the_agent_keeps_the_link() {
    let fleet = Fleet::new();
    let (mut agent, mut stream) = link(&fleet).await;
    agent.tls.refresh_traffic_keys().unwrap();
    let bytes = agent.seal(b"under new keys");
    agent.socket.write_all(&bytes).unwrap();
    assert_eq!(read_n(&mut stream, 14).await, b"under new keys");
    stream.write_all(b"and back").await.unwrap();
    stream.flush().await.unwrap();
    let back = tokio::task::block_in_place(|| agent.receive(8));
    assert_eq!(back, b"and back");
}

/// Forged records after the handshake end the link with an error, and
/// nothing of them is read as data; a record that does not open gets the
/// agent an alert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_records_end_the_link() {
    let fleet = Fleet::new();
    let cases: [(&str, Vec<u8>); 4] = [
        ("a record that does not open", {
            let mut r = vec![23, 3, 3, 0, 40];
            r.extend(pattern(40));
            r
        }),
        ("an unknown content type", vec![99, 3, 3, 0, 1, 0]),
        (
            "a plaintext alert after the handshake",
            vec![21, 3, 3, 0, 2, 2, 40],
        ),
        (
            "random bytes",
            pattern(64).iter().map(|b| b ^ 0x5a).collect(),
        ),
    ];
    for (i, (what, bytes)) in cases.into_iter().enumerate() {
        let (mut agent, mut stream) = link(&fleet).await;
        agent.socket.write_all(&bytes).unwrap();
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .unwrap();
        let e = read.expect_err(what);
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{what}: {e}");
        assert!(
            e.get_ref().is_some_and(|i| i.is::<rustls::Error>()),
            "{what}: {e}"
        );
        drop(stream);
        let heard = tokio::task::block_in_place(|| agent.until_end());
        assert!(heard.is_err(), "{what}: the agent saw a clean end");
        if i == 0 {
            assert!(
                heard.as_ref().is_err_and(|h| h.contains("alert")),
                "{what}: the agent heard {heard:?}"
            );
        }
    }
}

/// A record header that claims more than a record may hold, then the bytes
/// to fill it: refused once the stream holds its cap, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_record_is_refused_within_the_cap() {
    let fleet = Fleet::new();
    let (mut agent, mut stream) = link(&fleet).await;
    let mut bytes = vec![23, 3, 3, 0xff, 0xff];
    bytes.extend(pattern(0xffff));
    let writer = tokio::task::spawn_blocking(move || {
        let _ = agent.socket.write_all(&bytes);
        agent
    });
    let mut buf = [0u8; 64];
    let e = tokio::time::timeout(WAIT, stream.read(&mut buf))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    assert!(stream.buffered() <= MAX_INCOMING, "{}", stream.buffered());
    drop(stream);
    let _ = writer.await;
}
