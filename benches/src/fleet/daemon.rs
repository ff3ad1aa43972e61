//! The manager under test: a real `drover-manager` process on a private bus,
//! its config, its kill and restart, and what `/proc` says of it.
//!
//! The binary is found as the sandbox finds it (`DROVER_BIN_DIR`, else next
//! to the running executable: `target/release` for the benchmark,
//! `target/debug` for the test). It listens on a fixed port on 127.0.0.1, so
//! a restarted manager is reached at the same address; it logs at WARN to
//! `manager.log` in the bus's directory. The descriptor limit it runs with
//! is the one this process has when it starts it ([`raise_nofile`]).
//! Dropping a [`Manager`] kills the process; its bus goes with the
//! [`PrivateBus`] that owns the directory.

use crate::procfs;
use anyhow::{Context, Result, bail};
use drover_bus::bluechi::BUS_NAME;
use drover_sandbox::PrivateBus;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How agents are admitted and how they talk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Plaintext TCP on loopback; every node name listed in `AllowedNodeNames`.
    Plain,
    /// Mutual TLS; `AllowCertifiedNodes=true`, no list.
    Tls,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Plain => "plain",
            Transport::Tls => "tls",
        }
    }
}

/// The manager's settings for one run.
pub struct ManagerSetup<'a> {
    pub port: u16,
    /// The manager's `HeartbeatInterval`; `None`: not set (its default).
    pub heartbeat_interval_ms: Option<u64>,
    pub heartbeat_threshold_ms: u64,
    /// The manager's `ProxyGracePeriod`; `None`: not set (its default).
    pub proxy_grace_ms: Option<u64>,
    /// Plaintext: the names to allow.
    pub nodes: &'a [String],
    /// TLS: the manager's `TLS*` keys (key, value).
    pub tls: Option<Vec<(&'static str, PathBuf)>>,
    /// The Prometheus endpoint (`MetricsListenAddress`, `MetricsPerNode`);
    /// `None`: off.
    pub metrics: Option<(SocketAddr, bool)>,
    /// More `[drover-manager]` lines (`failover`: the etcd keys and a
    /// `StateDirectory` of its own); empty: none.
    pub extra: String,
}

/// A running manager (see the module docs).
pub struct Manager {
    child: Option<Child>,
    bin: PathBuf,
    conf: PathBuf,
    log: PathBuf,
    address: String,
    pub port: u16,
}

impl Manager {
    /// Writes the config into `bus`'s directory and starts the manager on `bus`.
    pub fn start(bus: &PrivateBus, setup: &ManagerSetup<'_>) -> Result<Self> {
        let bin = drover_sandbox::binaries::locate("drover-manager")?;
        let dir = bus.dir();
        let conf = dir.join("manager.conf");
        std::fs::write(&conf, config_text(setup)).context("writing the manager's config")?;
        let mut manager = Self {
            child: None,
            bin,
            conf,
            log: dir.join("manager.log"),
            address: bus.address().to_owned(),
            port: setup.port,
        };
        manager.spawn()?;
        Ok(manager)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .context("opening the manager's log")?;
        let child = Command::new(&self.bin)
            .arg("--no-default-config")
            .arg("-c")
            .arg(&self.conf)
            .arg("--bus")
            .arg(&self.address)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    pub fn binary(&self) -> &Path {
        &self.bin
    }

    /// SIGKILL, then reaps the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the manager again with the same config.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    /// Sends `sig` (SIGTERM: a clean stop).
    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        let pid = i32::try_from(self.pid()).context("pid")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
            .with_context(|| format!("kill -{sig} {pid}"))
    }

    /// Waits up to `timeout` for the process to exit by itself and reaps it.
    pub async fn exited(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Ok(status);
            }
            if self.child.is_none() {
                bail!("drover-manager is not running");
            }
            if started.elapsed() > timeout {
                bail!("drover-manager did not exit within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until the manager owns its bus name (it then also listens).
    pub async fn wait_serving(&mut self, conn: &zbus::Connection, timeout: Duration) -> Result<()> {
        let dbus = zbus::fdo::DBusProxy::new(conn).await?;
        let started = Instant::now();
        loop {
            if dbus.name_has_owner(BUS_NAME.try_into()?).await? {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "drover-manager exited ({status}): {}",
                    std::fs::read_to_string(&self.log)
                        .unwrap_or_default()
                        .trim()
                );
            }
            if started.elapsed() > timeout {
                bail!("drover-manager did not serve within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// (VmRSS, RssAnon, VmHWM) in KiB.
    pub fn memory_kib(&self) -> Result<(u64, u64, u64)> {
        let pid = self.pid();
        Ok((
            procfs::status_kib(pid, "VmRSS:")?,
            procfs::status_kib(pid, "RssAnon:")?,
            procfs::status_kib(pid, "VmHWM:")?,
        ))
    }

    /// The manager's log so far (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.kill();
    }
}

fn config_text(setup: &ManagerSetup<'_>) -> String {
    let mut conf = format!(
        "[drover-manager]\nControllerPort={}\nListenAddress=127.0.0.1\n\
         NodeHeartbeatThreshold={}\nLogLevel=WARN\nLogTarget=stderr\n",
        setup.port, setup.heartbeat_threshold_ms
    );
    if let Some(interval) = setup.heartbeat_interval_ms {
        conf.push_str(&format!("HeartbeatInterval={interval}\n"));
    }
    if let Some(grace) = setup.proxy_grace_ms {
        conf.push_str(&format!("ProxyGracePeriod={grace}\n"));
    }
    if let Some((addr, per_node)) = setup.metrics {
        conf.push_str(&format!(
            "MetricsListenAddress={addr}\nMetricsPerNode={per_node}\n"
        ));
    }
    conf.push_str(&setup.extra);
    match &setup.tls {
        None => {
            // Lines are at most 500 characters: the list goes on over
            // indented continuation lines (joined without a separator).
            conf.push_str("AllowedNodeNames=");
            let mut line = 0;
            for (i, name) in setup.nodes.iter().enumerate() {
                if line + name.len() > 400 {
                    conf.push_str("\n  ");
                    line = 0;
                }
                conf.push_str(name);
                if i + 1 < setup.nodes.len() {
                    conf.push(',');
                }
                line += name.len() + 1;
            }
            conf.push('\n');
        }
        Some(keys) => {
            for (key, path) in keys {
                conf.push_str(&format!("{key}={}\n", path.display()));
            }
            conf.push_str("AllowCertifiedNodes=true\n");
        }
    }
    conf
}

/// Raises this process's `RLIMIT_NOFILE` (soft and hard) to at least
/// `want`, within the kernel's `nr_open`; what it starts inherits it.
/// Returns the (soft, hard) limit now in force.
pub fn raise_nofile(want: u64) -> Result<(u64, u64)> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= want {
        return Ok((soft, hard));
    }
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(hard);
    let target = want.min(nr_open);
    // Raising the hard limit needs CAP_SYS_RESOURCE; without it, the soft
    // limit goes up to the hard one.
    let new_hard = hard.max(target);
    if setrlimit(Resource::RLIMIT_NOFILE, target, new_hard).is_err() {
        setrlimit(Resource::RLIMIT_NOFILE, target.min(hard), hard)?;
    }
    let now = getrlimit(Resource::RLIMIT_NOFILE)?;
    Ok(now)
}

/// A port free on 127.0.0.1 now.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_lists_the_names_and_tls_admits_by_certificate() {
        let nodes = vec!["a".to_owned(), "b".to_owned()];
        let plain = config_text(&ManagerSetup {
            port: 9,
            heartbeat_interval_ms: Some(2000),
            heartbeat_threshold_ms: 6000,
            proxy_grace_ms: None,
            nodes: &nodes,
            tls: None,
            metrics: None,
            extra: String::new(),
        });
        assert!(plain.contains("AllowedNodeNames=a,b\n"), "{plain}");
        let many: Vec<String> = (0..1000).map(|i| format!("node{i}")).collect();
        let long = config_text(&ManagerSetup {
            port: 9,
            heartbeat_interval_ms: Some(2000),
            heartbeat_threshold_ms: 6000,
            proxy_grace_ms: None,
            nodes: &many,
            tls: None,
            metrics: None,
            extra: String::new(),
        });
        assert!(long.lines().all(|l| l.len() <= 500));
        let parsed = drover_config::ManagerConfig::parse_str(&long).unwrap();
        assert_eq!(parsed.allowed_nodes.len(), 1000);
        assert_eq!(parsed.allowed_nodes[999].as_str(), "node999");
        assert!(plain.contains("ControllerPort=9\n"));
        let tls = config_text(&ManagerSetup {
            port: 9,
            heartbeat_interval_ms: Some(2000),
            heartbeat_threshold_ms: 6000,
            proxy_grace_ms: None,
            nodes: &nodes,
            tls: Some(vec![("TLSCertificate", PathBuf::from("/m.pem"))]),
            metrics: Some((SocketAddr::from(([127, 0, 0, 1], 9842)), false)),
            extra: String::new(),
        });
        assert!(
            tls.contains("MetricsListenAddress=127.0.0.1:9842\nMetricsPerNode=false\n"),
            "{tls}"
        );
        assert!(!plain.contains("Metrics"), "{plain}");
        assert!(tls.contains("TLSCertificate=/m.pem\nAllowCertifiedNodes=true\n"));
        assert!(plain.contains("HeartbeatInterval=2000\n"), "{plain}");
        let default = config_text(&ManagerSetup {
            port: 9,
            heartbeat_interval_ms: None,
            heartbeat_threshold_ms: 6000,
            proxy_grace_ms: None,
            nodes: &nodes,
            tls: None,
            metrics: None,
            extra: String::new(),
        });
        assert!(!default.contains("HeartbeatInterval"), "{default}");
        assert!(!tls.contains("AllowedNodeNames"));
    }
}
