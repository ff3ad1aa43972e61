//! [`Flood`]: an attacker holding the manager's door. Thousands of TCP connections
//! from many loopback source addresses (`127.A.B.C` all reach the host) that open a TLS
//! handshake and never finish it, each reopened as soon as the manager closes it. What
//! each sends is a [`Kind`]: a whole ClientHello (the manager answers it, then waits
//! forever), half of one, or nothing.
//!
//! The flood runs until dropped (its tasks are aborted and every connection closes).
//! [`Flood::open`] and [`Flood::closed_by_peer`] say how hard it holds: connections open
//! now, and how many the manager has closed so far (each was reopened).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

/// What a flood connection sends after connecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A complete TLS 1.3 ClientHello, then nothing: the manager answers with its
    /// flight (key exchange and signature) and waits for the client's.
    ClientHello,
    /// The first half of a ClientHello, then nothing.
    HalfClientHello,
    /// Nothing at all.
    Silent,
}

/// Where and how hard to flood.
#[derive(Debug, Clone)]
pub struct FloodOptions {
    /// Source addresses `first`, `first + 1`, … (IPv4, loopback).
    pub first: Ipv4Addr,
    pub addresses: usize,
    /// Connections kept open from each address.
    pub per_address: usize,
    pub kind: Kind,
}

impl FloodOptions {
    /// `addresses` × `per_address` ClientHellos from `127.2.0.1` on.
    pub fn client_hellos(addresses: usize, per_address: usize) -> Self {
        FloodOptions {
            first: Ipv4Addr::new(127, 2, 0, 1),
            addresses,
            per_address,
            kind: Kind::ClientHello,
        }
    }
}

#[derive(Debug, Default)]
struct Stats {
    open: AtomicUsize,
    opened: AtomicU64,
    closed_by_peer: AtomicU64,
}

/// See the module docs.
pub struct Flood {
    tasks: Vec<JoinHandle<()>>,
    stats: Arc<Stats>,
}

impl Flood {
    /// Starts the flood against `target`; raises this process's descriptor limit to
    /// its hard limit first (each connection is one descriptor).
    pub fn start(target: SocketAddr, opts: &FloodOptions) -> Flood {
        raise_nofile();
        let payload: Arc<[u8]> = match opts.kind {
            Kind::ClientHello => client_hello().into(),
            Kind::HalfClientHello => {
                let hello = client_hello();
                hello[..hello.len() / 2].into()
            }
            Kind::Silent => Vec::new().into(),
        };
        let stats = Arc::new(Stats::default());
        let mut tasks = Vec::new();
        for a in 0..opts.addresses {
            let source = IpAddr::V4(Ipv4Addr::from(
                u32::from(opts.first) + u32::try_from(a).expect("address index"),
            ));
            for _ in 0..opts.per_address {
                let (stats, payload) = (stats.clone(), payload.clone());
                tasks.push(tokio::spawn(hold(target, source, payload, stats)));
            }
        }
        Flood { tasks, stats }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.stats.open.load(Ordering::Relaxed)
    }

    /// Connections opened so far.
    pub fn opened(&self) -> u64 {
        self.stats.opened.load(Ordering::Relaxed)
    }

    /// Connections the manager closed so far (each reopened at once).
    pub fn closed_by_peer(&self) -> u64 {
        self.stats.closed_by_peer.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` connections were opened (at most `timeout`).
    pub async fn opened_at_least(&self, n: u64, timeout: Duration) -> anyhow::Result<()> {
        let what = format!("{n} flood connections opened");
        crate::wait::eventually(timeout, &what, || async { self.opened() >= n }).await
    }

    /// Waits until at least `n` connections are open (at most `timeout`).
    pub async fn holding(&self, n: usize, timeout: Duration) -> anyhow::Result<()> {
        let what = format!("{n} flood connections open");
        crate::wait::eventually(timeout, &what, || async { self.open() >= n }).await
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// One flood connection, reopened whenever the manager closes it.
async fn hold(target: SocketAddr, source: IpAddr, payload: Arc<[u8]>, stats: Arc<Stats>) {
    loop {
        let socket = match tokio::net::TcpSocket::new_v4() {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let connected = match socket.bind(SocketAddr::new(source, 0)) {
            Ok(()) => socket.connect(target).await,
            Err(e) => Err(e),
        };
        let mut stream = match connected {
            Ok(s) => s,
            // The manager's port is not there (a restart without socket activation).
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        stats.open.fetch_add(1, Ordering::Relaxed);
        stats.opened.fetch_add(1, Ordering::Relaxed);
        if stream.write_all(&payload).await.is_ok() {
            // Whatever the manager answers is read and ignored until it closes.
            let mut sink = [0u8; 4096];
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
        }
        stats.open.fetch_sub(1, Ordering::Relaxed);
        stats.closed_by_peer.fetch_add(1, Ordering::Relaxed);
    }
}

/// The bytes of a real TLS 1.3 ClientHello (rustls, as an agent's), for a server
/// named `localhost`.
pub fn client_hello() -> Vec<u8> {
    let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("server name");
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).expect("TLS client");
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).expect("ClientHello bytes");
    }
    out
}

/// Raises the soft limit on open descriptors to the hard limit.
fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_hello_is_one_tls_handshake_record() {
        let hello = client_hello();
        assert_eq!(hello[0], 22, "a handshake record");
        assert_eq!(hello[5], 1, "a ClientHello");
        let len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
        assert_eq!(hello.len(), 5 + len);
    }
}
