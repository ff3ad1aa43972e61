//! The reader's mark on a real TLS 1.3 link over loopback: drover's own
//! server settings and certificates from `drover_tls::pki`, the manager's
//! side read through `Records` as the listener does, and an agent side
//! driven by hand (a rustls `ClientConnection` over a blocking socket), so
//! every record's bytes can be cut and sent at will.

use super::tests::{frame, queued, readable, until_queued};
use super::*;
use drover_protocol::NodeName;
use drover_testkit::process::TempDir;
use drover_tls::pki::{Options, Pki, Validity};
use drover_tls::records::Records;
use drover_tls::{Acceptor, ServerSettings};
use futures::StreamExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

type TlsReader = Frames<tokio::io::ReadHalf<drover_tls::ServerStream<Records<TcpStream>>>>;

const WAIT: Duration = Duration::from_secs(10);

/// One link: the agent's connection and socket, the manager's reader, its
/// write half (kept so the stream stays whole), a second descriptor of the
/// manager's socket to look at it, and the PKI directory.
struct Link {
    agent: rustls::ClientConnection,
    socket: std::net::TcpStream,
    frames: TlsReader,
    _write: tokio::io::WriteHalf<drover_tls::ServerStream<Records<TcpStream>>>,
    view: std::net::TcpStream,
    _dir: TempDir,
}

impl Link {
    async fn new() -> Self {
        let dir = TempDir::new("drover-frames-tls");
        let pki = Pki::new(dir.path());
        let options = Options {
            validity: Validity::days(2).unwrap(),
            force: false,
        };
        let node = NodeName::new("node1").unwrap();
        pki.create_ca(&options).unwrap();
        pki.issue_manager(&["127.0.0.1"], &options).unwrap();
        pki.issue_nodes(std::slice::from_ref(&node), &options)
            .unwrap();
        let acceptor = Acceptor::new(ServerSettings::load(&pki.manager_files()).unwrap());
        let config = client_config(&pki, &node);

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handshake = tokio::task::spawn_blocking(move || {
            let mut socket = std::net::TcpStream::connect(addr).unwrap();
            socket.set_nodelay(true).unwrap();
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let mut agent = rustls::ClientConnection::new(config, name).unwrap();
            while agent.is_handshaking() {
                agent.complete_io(&mut socket).unwrap();
            }
            while agent.wants_write() {
                agent.write_tls(&mut socket).unwrap();
            }
            (agent, socket)
        });
        let (manager, _) = listener.accept().await.unwrap();
        let view = std::net::TcpStream::from(socket2::SockRef::from(&manager).try_clone().unwrap());
        let fd = manager.as_raw_fd();
        let (records, boundary) = drover_tls::records::follow(manager);
        let tls = acceptor.accept(records).await.unwrap();
        assert!(drover_tls::records::sizes_known(&tls));
        let (agent, socket) = handshake.await.unwrap();
        let (read, write) = tokio::io::split(tls);
        let frames = Frames::new(read, &[], 512, Some(MarkSocket::tls(fd, boundary)));
        Link {
            agent,
            socket,
            frames,
            _write: write,
            view,
            _dir: dir,
        }
    }

    /// The ciphertext of `plaintext` written in one go: one record.
    fn seal(&mut self, plaintext: &[u8]) -> Vec<u8> {
        self.agent.writer().write_all(plaintext).unwrap();
        self.pending()
    }

    /// What the agent's connection has to send.
    fn pending(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        while self.agent.wants_write() {
            self.agent.write_tls(&mut out).unwrap();
        }
        out
    }

    /// Sends `bytes` and waits until the manager's socket holds `queued`.
    async fn send(&mut self, bytes: &[u8], queued: usize) {
        self.socket.write_all(bytes).unwrap();
        until_queued(&self.view, queued).await;
    }

    /// Polls the reader until it took everything queued, each poll pending.
    async fn drain_pending(&mut self, what: &str) {
        while queued(&self.view) > 0 {
            assert!(futures::poll!(self.frames.next()).is_pending(), "{what}");
            tokio::task::yield_now().await;
        }
    }

    async fn next(&mut self, what: &str) -> Option<Result<ToManager, FrameError>> {
        tokio::time::timeout(WAIT, self.frames.next())
            .await
            .unwrap_or_else(|_| panic!("{what}: the reader was left waiting"))
    }
}

/// A client config as the agent's, from the node's files of `pki`.
fn client_config(pki: &Pki, node: &NodeName) -> Arc<rustls::ClientConfig> {
    let files = pki.node_files(node);
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

fn reply(text: &str) -> ToManager {
    ToManager::Reply {
        id: 7,
        result: Ok(drover_protocol::Response::Text(text.to_owned())),
    }
}

/// Between frames the manager's socket does not report
/// `HEARTBEATS_PER_READ - 1` heartbeat records as readable, and does report
/// one more, or any other frame's record alone.
#[tokio::test]
async fn lone_heartbeat_records_do_not_wake_the_reader() {
    let mut link = Link::new().await;
    assert!(futures::poll!(link.frames.next()).is_pending());
    assert_eq!(link.frames.mark(), TLS_BETWEEN_FRAMES);
    assert_eq!(TLS_BETWEEN_FRAMES, (HEARTBEATS_PER_READ - 1) * 27 + 1);

    for n in 1..HEARTBEATS_PER_READ {
        let beat = link.seal(&frame(&ToManager::Heartbeat));
        assert_eq!(beat.len(), 27, "a heartbeat's record");
        link.send(&beat, n * beat.len()).await;
        assert!(
            !readable(&link.view),
            "{n} heartbeat records are below the mark"
        );
    }
    let beat = link.seal(&frame(&ToManager::Heartbeat));
    link.send(&beat, HEARTBEATS_PER_READ * beat.len()).await;
    assert!(readable(&link.view), "one more reaches it");
    for _ in 0..HEARTBEATS_PER_READ {
        assert_eq!(
            link.next("a batch of heartbeats").await.unwrap().unwrap(),
            ToManager::Heartbeat
        );
    }
    assert!(futures::poll!(link.frames.next()).is_pending());
    assert_eq!(link.frames.mark(), TLS_BETWEEN_FRAMES);

    // A frame whose record is as long as the mark (here one that does not
    // decode): it reaches the mark alone.
    let len = TLS_BETWEEN_FRAMES - 22;
    let mut bad = u32::try_from(len - 4).unwrap().to_be_bytes().to_vec();
    bad.resize(len, 0xff);
    let one_more = link.seal(&bad);
    assert_eq!(one_more.len(), TLS_BETWEEN_FRAMES);
    link.send(&one_more, one_more.len()).await;
    assert!(
        readable(&link.view),
        "a record as long as the mark reaches it alone"
    );
    assert!(matches!(
        link.next("a frame of garbage").await,
        Some(Err(FrameError::Malformed(_)))
    ));
}

/// Any other frame's record wakes the reader alone.
#[tokio::test]
async fn any_other_frame_wakes_the_reader() {
    let mut link = Link::new().await;
    assert!(futures::poll!(link.frames.next()).is_pending());
    let msg = reply("");
    let record = link.seal(&frame(&msg));
    link.send(&record, record.len()).await;
    assert!(readable(&link.view));
    assert_eq!(link.next("a reply").await.unwrap().unwrap(), msg);
}

/// A record whose tail comes later is read as soon as it comes: the record
/// of a frame cut at every byte. Where the head wakes the reader, the reader
/// takes it (rustls keeps it) and returns Pending; the mark then drops to
/// one byte, so even a one-byte tail is reported readable by the kernel.
#[tokio::test]
async fn the_tail_of_a_record_is_never_left_waiting() {
    let mut link = Link::new().await;
    let msg = reply(&"x".repeat(40));
    let whole = link.seal(&frame(&msg));
    let len = whole.len();
    link.send(&whole, len).await;
    assert_eq!(link.next("whole").await.unwrap().unwrap(), msg);
    for cut in 1..len {
        assert!(futures::poll!(link.frames.next()).is_pending());
        assert_eq!(link.frames.mark(), TLS_BETWEEN_FRAMES, "cut {cut}");
        let record = link.seal(&frame(&msg));
        assert_eq!(record.len(), len);
        link.send(&record[..cut], cut).await;
        if cut >= TLS_BETWEEN_FRAMES {
            link.drain_pending(&format!("cut {cut}")).await;
            assert_eq!(link.frames.mark(), 1, "inside a record (cut {cut})");
        } else {
            assert!(!readable(&link.view), "cut {cut}: below the mark");
        }
        let waiting = queued(&link.view);
        link.send(&record[cut..], waiting + len - cut).await;
        assert!(readable(&link.view), "cut {cut}: the tail wakes the reader");
        assert_eq!(
            link.next(&format!("cut {cut}")).await.unwrap().unwrap(),
            msg
        );
    }
}

/// Two records in one send, the second cut: the first is read, the reader
/// stands between frames inside the second record, and its mark is one byte.
#[tokio::test]
async fn between_frames_inside_a_record_the_mark_is_one_byte() {
    let mut link = Link::new().await;
    assert!(futures::poll!(link.frames.next()).is_pending());
    let msg = reply("y");
    let first = link.seal(&frame(&msg));
    let second = link.seal(&frame(&ToManager::Heartbeat));
    let bytes = [first.as_slice(), &second[..3]].concat();
    link.send(&bytes, bytes.len()).await;
    assert_eq!(link.next("first").await.unwrap().unwrap(), msg);
    link.drain_pending("head of the second").await;
    assert!(futures::poll!(link.frames.next()).is_pending());
    assert_eq!(link.frames.mark(), 1);
    link.send(&second[3..], second.len() - 3).await;
    assert!(readable(&link.view), "a heartbeat's tail is read at once");
    assert_eq!(
        link.next("second").await.unwrap().unwrap(),
        ToManager::Heartbeat
    );
}

/// A TLS shutdown (close_notify, then the end of the stream) ends the
/// reader at once, and so does the end of the stream alone.
#[tokio::test]
async fn close_notify_and_the_end_end_the_reader() {
    let mut link = Link::new().await;
    assert!(futures::poll!(link.frames.next()).is_pending());
    link.agent.send_close_notify();
    let alert = link.pending();
    assert_eq!(
        alert.len(),
        drover_tls::records::sealed_len(2),
        "close_notify"
    );
    link.send(&alert, alert.len()).await;
    link.socket.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(link.next("close_notify").await.is_none());

    let mut link = Link::new().await;
    assert!(futures::poll!(link.frames.next()).is_pending());
    let beat = link.seal(&frame(&ToManager::Heartbeat));
    link.send(&beat, beat.len()).await;
    drop(link.socket);
    let Link { mut frames, .. } = link;
    // The heartbeat before the end is still read, then the stream ends:
    // rustls reports a missing close_notify as an error.
    assert_eq!(
        tokio::time::timeout(WAIT, frames.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap(),
        ToManager::Heartbeat
    );
    assert!(
        tokio::time::timeout(WAIT, async { while frames.next().await.is_some() {} })
            .await
            .is_ok()
    );
}

/// Garbage from the peer after the handshake: rustls refuses it, the reader
/// ends with an error, at once when it reaches the mark and with the end of
/// the stream when it does not.
#[tokio::test]
async fn garbage_records_end_the_reader_with_an_error() {
    for garbage in [
        vec![0x17, 3, 3, 0, 40]
            .into_iter()
            .chain([0xa5; 40])
            .collect::<Vec<u8>>(),
        vec![0xff; 7],
    ] {
        let mut link = Link::new().await;
        assert!(futures::poll!(link.frames.next()).is_pending());
        link.send(&garbage, garbage.len()).await;
        if garbage.len() < TLS_BETWEEN_FRAMES {
            assert!(!readable(&link.view));
            link.socket.shutdown(std::net::Shutdown::Write).unwrap();
        }
        assert!(matches!(
            link.next("garbage").await,
            Some(Err(FrameError::Io(_)))
        ));
        assert!(link.frames.next().await.is_none());
    }
}
