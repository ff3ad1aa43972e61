//! What the TLS tests share: a temporary PKI made by `drover_tls::pki`, a
//! manager-side echo server over real TLS on loopback, and attempts through
//! the bare rustls client of `drover_testkit::tls` (for the peers drover's own
//! API would never build), and a rogue server.

#![allow(dead_code)] // each test file uses its own part of this

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use drover_protocol::NodeName;
use drover_tls::pki::{Issued, Options, Pki, Validity};
use drover_tls::{
    Acceptor, ClientSettings, ClientStream, Connector, NodeIdentity, ServerSettings, TlsFiles,
    peer_identity,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

pub const WAIT: Duration = Duration::from_secs(5);

/// A directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "drover-tls-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn node(name: &str) -> NodeName {
    NodeName::new(name).unwrap()
}

pub fn days(n: u32) -> Options {
    Options {
        validity: Validity::days(n).unwrap(),
        force: false,
    }
}

pub fn forced(n: u32) -> Options {
    Options {
        force: true,
        ..days(n)
    }
}

/// A CA with a manager certificate for `localhost` and `127.0.0.1`, and
/// certificates for `node1` and `node2`.
pub struct Fleet {
    pub pki: Pki,
    pub node1: Issued,
    pub manager: Issued,
    _dir: TempDir,
}

impl Fleet {
    pub fn new() -> Self {
        let dir = TempDir::new();
        let pki = Pki::new(dir.path().join("pki"));
        pki.create_ca(&days(30)).unwrap();
        let manager = pki
            .issue_manager(&["localhost", "127.0.0.1"], &days(10))
            .unwrap();
        let mut nodes = pki
            .issue_nodes(&[node("node1"), node("node2")], &days(10))
            .unwrap();
        Self {
            pki,
            node1: nodes.remove(0),
            manager,
            _dir: dir,
        }
    }

    pub fn server_settings(&self) -> ServerSettings {
        ServerSettings::load(&self.pki.manager_files()).unwrap()
    }

    pub fn client_settings(&self, name: &str) -> ClientSettings {
        ClientSettings::load(&self.pki.node_files(&node(name))).unwrap()
    }

    pub fn connector(&self, name: &str) -> Connector {
        Connector::new(self.client_settings(name), "localhost").unwrap()
    }

    /// The CA's certificate and key, for tests that sign odd certificates.
    pub fn ca_issuer(&self) -> rcgen::Issuer<'static, rcgen::KeyPair> {
        let cert = CertificateDer::from_pem_file(self.pki.ca_certificate()).unwrap();
        let key =
            rcgen::KeyPair::from_pem(&std::fs::read_to_string(self.pki.ca_key()).unwrap()).unwrap();
        rcgen::Issuer::from_ca_cert_der(&cert, key).unwrap()
    }

    pub fn files_with(&self, certificate: PathBuf, private_key: PathBuf) -> TlsFiles {
        TlsFiles {
            certificate,
            private_key,
            ..self.pki.node_files(&node("node1"))
        }
    }
}

/// The outcome of one handshake, as the manager saw it.
pub type Outcome = Result<NodeIdentity, String>;

/// A manager stand-in: accepts TLS (5 s handshake timeout), reports each
/// handshake's outcome, then echoes what the client sends.
pub struct Server {
    pub addr: SocketAddr,
    pub acceptor: Acceptor,
    outcomes: mpsc::UnboundedReceiver<Outcome>,
}

impl Server {
    pub async fn start(settings: ServerSettings) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = Acceptor::new(settings);
        let (tx, outcomes) = mpsc::unbounded_channel();
        let accepting = acceptor.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = accepting.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let tls = match tokio::time::timeout(WAIT, acceptor.accept(tcp)).await {
                        Err(_) => Err("handshake timed out".to_string()),
                        // The class the manager counts it under, then the error.
                        Ok(Err(e)) => Err(format!("[{}] {e}", drover_tls::refusal_class(&e))),
                        Ok(Ok(tls)) => Ok(tls),
                    };
                    let mut tls = match tls {
                        Ok(tls) => tls,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = tx.send(peer_identity(&tls).map_err(|e| e.to_string()));
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = tls.read(&mut buf).await {
                        if n == 0 || tls.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        let _ = tls.flush().await;
                    }
                });
            }
        });
        Self {
            addr,
            acceptor,
            outcomes,
        }
    }

    /// The outcome of the next handshake.
    pub async fn outcome(&mut self) -> Outcome {
        tokio::time::timeout(WAIT, self.outcomes.recv())
            .await
            .expect("the server reported no handshake outcome in time (hang or panic)")
            .expect("server gone")
    }

    /// The next handshake must have failed; returns the manager's error.
    pub async fn refused(&mut self) -> String {
        match self.outcome().await {
            Ok(id) => panic!("the manager accepted {id}"),
            Err(e) => e,
        }
    }

    pub async fn tcp(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    pub async fn connect(&self, connector: &Connector) -> std::io::Result<ClientStream<TcpStream>> {
        tokio::time::timeout(WAIT, connector.connect(self.tcp().await))
            .await
            .expect("client handshake hung")
    }
}

/// Sends `msg` and reads the echo: proves the link carries data both ways.
pub async fn echo<S>(stream: &mut S, msg: &[u8]) -> std::io::Result<Vec<u8>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    stream.write_all(msg).await?;
    stream.flush().await?;
    let mut buf = vec![0u8; msg.len()];
    tokio::time::timeout(WAIT, stream.read_exact(&mut buf))
        .await
        .map_err(|_| std::io::Error::other("echo timed out"))??;
    Ok(buf)
}

use drover_testkit::tls::provider;

/// Connects a raw client; the manager's verdict comes from [`Server::refused`].
/// Returns what the client saw: an error at connect or at the first read.
pub async fn raw_attempt(server: &Server, client: &tokio_rustls::TlsConnector) -> String {
    let name = ServerName::try_from("localhost").unwrap();
    match tokio::time::timeout(WAIT, client.connect(name, server.tcp().await))
        .await
        .expect("client handshake hung")
    {
        Err(e) => e.to_string(),
        Ok(mut tls) => match echo(&mut tls, b"hello").await {
            Ok(_) => "accepted".to_string(),
            Err(e) => e.to_string(),
        },
    }
}

/// Signs a client certificate with the fleet's CA with exactly these SANs
/// (and validity), writes it and its key next to the PKI, returns the paths.
pub fn odd_client_cert(
    fleet: &Fleet,
    tag: &str,
    sans: Vec<rcgen::SanType>,
    validity: Option<(SystemTime, SystemTime)>,
) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "node1");
    params.subject_alt_names = sans;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let (from, until) = validity.unwrap_or((
        SystemTime::now() - Duration::from_secs(3600),
        SystemTime::now() + Duration::from_secs(86_400),
    ));
    params.not_before = from.into();
    params.not_after = until.into();
    let cert = params.signed_by(&key, &fleet.ca_issuer()).unwrap();
    let cert_path = fleet.pki.dir().join(format!("{tag}.pem"));
    let key_path = fleet.pki.dir().join(format!("{tag}.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    write_private(&key_path, key.serialize_pem().as_bytes());
    (cert_path, key_path)
}

pub fn dns(name: &str) -> rcgen::SanType {
    rcgen::SanType::DnsName(name.try_into().unwrap())
}

pub fn write_private(path: &Path, contents: &[u8]) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(contents).unwrap();
}

/// A rogue TLS server presenting `cert`/`key` (whatever they are) to anyone:
/// for checking what an agent refuses. Returns its address.
pub async fn raw_server(cert: &Path, key: &Path) -> SocketAddr {
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            CertificateDer::pem_file_iter(cert)
                .unwrap()
                .map(Result::unwrap)
                .collect(),
            PrivateKeyDer::from_pem_file(key).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(WAIT, acceptor.accept(tcp)).await;
            });
        }
    });
    addr
}
