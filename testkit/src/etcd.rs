//! [`Etcd`]: a real single-member etcd (Debian's `etcd-server`) for the
//! high-availability tests, on free loopback ports with its data in a temp
//! dir; killed and removed on drop. It can be killed and started again on
//! the same ports and data, as an etcd outage looks to its clients.
//! [`Etcd::start_tls`] serves its clients with mutual TLS
//! (`--client-cert-auth`).

use crate::process::{ChildGuard, TempDir, free_port};
use crate::wait::eventually;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long etcd may take to serve after it starts.
pub const UP: Duration = Duration::from_secs(15);

/// See the module docs.
pub struct Etcd {
    // Before `dir`: the process goes before its data.
    child: Option<ChildGuard>,
    client_port: u16,
    peer_port: u16,
    /// Mutual TLS for clients: certificate, key, trusted CA bundle.
    tls: Option<[PathBuf; 3]>,
    dir: TempDir,
}

impl Etcd {
    /// Starts etcd and waits until it answers `/health`.
    pub async fn start() -> Etcd {
        Self::start_with(None).await
    }

    /// Starts etcd serving its clients with mutual TLS: its certificate
    /// `cert` and `key` (for 127.0.0.1, with server and client
    /// authentication: its JSON gateway dials etcd with it), clients'
    /// certificates checked against `ca` (`--client-cert-auth`). Waits until
    /// it says it serves.
    pub async fn start_tls(cert: PathBuf, key: PathBuf, ca: PathBuf) -> Etcd {
        Self::start_with(Some([cert, key, ca])).await
    }

    async fn start_with(tls: Option<[PathBuf; 3]>) -> Etcd {
        let mut etcd = Etcd {
            child: None,
            client_port: free_port(),
            peer_port: free_port(),
            tls,
            dir: TempDir::new("drover-etcd"),
        };
        etcd.resume().await;
        etcd
    }

    /// The client URL (`http://127.0.0.1:PORT`, `https://` with TLS), as
    /// `EtcdEndpoints=` takes it.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// SIGKILL: every client sees etcd gone at once.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Starts etcd again on the same ports and data; waits until healthy.
    pub async fn resume(&mut self) {
        assert!(self.child.is_none(), "etcd is running already");
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("etcd log file");
        let mut command = Command::new("etcd");
        if let Some([cert, key, ca]) = &self.tls {
            command
                .arg(format!("--cert-file={}", cert.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg("--client-cert-auth")
                .arg(format!("--trusted-ca-file={}", ca.display()));
        }
        let child = command
            .arg("--name=drover-test")
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=drover-test={peer}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run etcd (Debian package etcd-server, scripts/host-deps)");
        self.child = Some(ChildGuard::new(child));
        if self.tls.is_some() {
            // Our plain HTTP client cannot ask /health over mutual TLS: etcd
            // says when it serves.
            let served = self.log().matches("serving client requests on").count();
            eventually(UP, "etcd serves its clients over TLS", || async {
                self.log().matches("serving client requests on").count() > served
            })
            .await
            .unwrap_or_else(|e| panic!("{e}\netcd log:\n{}", self.log()));
            return;
        }
        let health = format!("{}/health", self.url());
        eventually(UP, "etcd answers /health", || async {
            crate::http::get(&health)
                .await
                .is_ok_and(|a| a.status == 200 && a.body.contains("true"))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\netcd log:\n{}", self.log()));
    }

    /// What etcd logged so far.
    pub fn log(&self) -> String {
        self.dir.read("etcd.log")
    }
}
