//! [`Etcd`]: a real single-member etcd (Debian's `etcd-server`) for the
//! high-availability tests, on free loopback ports with its data in a temp
//! dir; killed and removed on drop. It can be killed and started again on
//! the same ports and data, as an etcd outage looks to its clients.

use crate::process::{ChildGuard, TempDir, free_port};
use crate::wait::eventually;
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
    dir: TempDir,
}

impl Etcd {
    /// Starts etcd and waits until it answers `/health`.
    pub async fn start() -> Etcd {
        let mut etcd = Etcd {
            child: None,
            client_port: free_port(),
            peer_port: free_port(),
            dir: TempDir::new("drover-etcd"),
        };
        etcd.resume().await;
        etcd
    }

    /// The client URL (`http://127.0.0.1:PORT`), as `EtcdEndpoints=` takes it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
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
        let child = Command::new("etcd")
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
