//! `drover-sandbox up --managers N` ([`ClusterOptions::managers`]): a high-availability
//! group of N managers (docs/ha.md) electing their leader on a real local etcd.
//!
//! * etcd: Debian's `etcd` binary (package `etcd-server`), one member, client and peer
//!   ports on 127.0.0.1 chosen free, its data in `DIR/etcd`, its log `DIR/etcd.log`; it
//!   runs in the sandbox's process cgroup, so every teardown (`down`, `Drop`, a failed
//!   start) ends it, and removes its data with the directory.
//! * Manager K (1..N) listens on the sandbox's manager port on its own loopback address
//!   127.0.0.K ([`manager_host`]) and has its own bus, like a manager on a host of its
//!   own; the agents' `ControllerHost=` lists every address. Manager 1 is the sandbox's
//!   usual manager (`DIR/bus`, `manager.conf`); K ≥ 2 has `DIR/bus-K`, `DIR/manager-K.conf`,
//!   `DIR/manager-K.log`, its `StateDirectory` `DIR/manager-state-K` and its metrics (if
//!   any) on 127.0.0.K at the first manager's metrics port. With TLS, the one manager
//!   certificate names every address.
//! * Every manager's config ends with the same etcd keys (prefix `/drover-sandbox`, a
//!   [`LEASE_TTL_S`] lease). Manager 1 is started first and leads before the others
//!   start, so `DROVER_BUS` is the leader's at first.

use super::{
    Cluster, ClusterOptions, KEY_PREFIX, LEASE_TTL_S, MANAGER_READY_TIMEOUT, Standby,
    free_loopback_port, manager_host, wait_bus_ready, wait_manager_ready, write_file,
};
use crate::binaries;
use crate::bus;
use crate::files;
use crate::process::{self, Spawn};
use crate::state::{ETCD_DIR, EtcdState, ManagerState, manager_bus, manager_state_dir};
use anyhow::{Context, Result, bail};
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(15);

impl Cluster {
    /// Starts etcd and waits until it answers `/health`; sets the etcd keys every
    /// manager's config gets.
    pub(super) async fn start_etcd(&mut self) -> Result<()> {
        let bin = find_in_path("etcd").context(
            "`--managers` runs a local etcd, and no `etcd` is in PATH: install Debian's \
             etcd-server (scripts/host-deps test)",
        )?;
        let client_port = free_loopback_port()?;
        let mut peer_port = free_loopback_port()?;
        while peer_port == client_port {
            peer_port = free_loopback_port()?;
        }
        let data = self.state.dir.join(ETCD_DIR);
        if data.exists() {
            std::fs::remove_dir_all(&data)
                .with_context(|| format!("removing stale {}", data.display()))?;
        }
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = self.log_path("etcd");
        let mut child = process::spawn(Spawn {
            program: &bin,
            args: vec![
                "--name=drover-sandbox".into(),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls={client}"),
                format!("--advertise-client-urls={client}"),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster=drover-sandbox={peer}"),
            ],
            env: Vec::new(),
            clear_env: false,
            log: log.clone(),
            cgroup: &self.procs_join,
            listen_fd: None,
            stdout_pipe: false,
        })?;
        let etcd = EtcdState {
            pid: Some(child.id()),
            client_port,
            peer_port,
        };
        self.ha_keys = format!(
            "\n[drover-manager]\nEtcdEndpoints={}\nEtcdKeyPrefix={KEY_PREFIX}\nEtcdLeaseTTL={LEASE_TTL_S}\n",
            etcd.url()
        );
        self.state.etcd = Some(etcd);
        self.state.save()?;
        let deadline = Instant::now() + ETCD_READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().context("checking etcd")? {
                bail!(
                    "etcd exited during startup ({status})\n{}",
                    process::log_tail(&log, 30)
                );
            }
            if etcd_healthy(client_port).await {
                break;
            }
            if Instant::now() >= deadline {
                self.etcd = Some(child);
                bail!(
                    "etcd did not answer /health within {ETCD_READY_TIMEOUT:?}\n{}",
                    process::log_tail(&log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.etcd = Some(child);
        Ok(())
    }

    /// Waits until manager `number` says it leads (`io.drover.Controller.Leading`).
    pub(super) async fn wait_leading(&self, number: usize) -> Result<()> {
        let (address, log) = if number == 1 {
            (self.state.bus_address.clone(), self.log_path("manager"))
        } else {
            let m = self
                .standbys
                .iter()
                .find(|m| m.number == number)
                .with_context(|| format!("no manager {number}"))?;
            (self.manager_bus_address(number), m.log(&self.state.dir))
        };
        let deadline = Instant::now() + MANAGER_READY_TIMEOUT;
        let mut last;
        loop {
            match bus::connect(&address).await {
                Ok(conn) => match bus::leading(&conn).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => last = "it stands by".into(),
                    Err(e) => last = format!("{e:#}"),
                },
                Err(e) => last = format!("{e:#}"),
            }
            if Instant::now() >= deadline {
                bail!(
                    "manager {number} did not lead within {MANAGER_READY_TIMEOUT:?} ({last})\n{}",
                    process::log_tail(&log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `unix:path=DIR/bus-K`: manager `number`'s bus (K ≥ 2).
    fn manager_bus_address(&self, number: usize) -> String {
        format!(
            "unix:path={}",
            self.state.dir.join(manager_bus(number)).display()
        )
    }

    /// Starts manager `number` (≥ 2): its bus, its listener on [`manager_host`] at the
    /// sandbox's port, its config; returns once it owns its name on its bus.
    pub(super) async fn start_standby(
        &mut self,
        number: usize,
        opts: &ClusterOptions,
    ) -> Result<()> {
        let dir = self.state.dir.clone();
        let host = manager_host(number);
        let listener =
            TcpListener::bind((host.as_str(), self.state.manager_port)).with_context(|| {
                format!(
                    "binding manager {number}'s port {host}:{}",
                    self.state.manager_port
                )
            })?;
        socket2::SockRef::from(&listener)
            .listen(4096)
            .context("setting the manager's listen backlog")?;
        let bus_name = manager_bus(number);
        let mut bus_child = self.spawn_bus(
            &dir.join(&bus_name),
            &dir.join(format!("{bus_name}.conf")),
            dir.join(format!("{bus_name}.log")),
        )?;
        let stdout = bus_child.stdout.take().context("dbus-daemon stdout")?;
        let bus_address = self.manager_bus_address(number);
        self.state.standby_managers.push(ManagerState {
            number,
            host: host.clone(),
            bus_address: bus_address.clone(),
            bus_pid: Some(bus_child.id()),
            pid: None,
        });
        self.standbys.push(Standby {
            number,
            listener,
            bus: Some(bus_child),
            manager: None,
        });
        self.state.save()?;
        wait_bus_ready(stdout, &dir.join(format!("{bus_name}.log"))).await?;

        let mut settings = self.settings.clone();
        settings.metrics_port = None;
        settings.state_dir = Some(dir.join(manager_state_dir(number)));
        if let Some(state_dir) = &settings.state_dir
            && state_dir.exists()
        {
            std::fs::remove_dir_all(state_dir)
                .with_context(|| format!("removing stale {}", state_dir.display()))?;
        }
        let mut extra = opts.manager_extra_config.clone();
        extra.push_str(&self.ha_keys);
        if let Some(port) = self.state.metrics_port {
            extra.push_str(&format!("MetricsListenAddress={host}:{port}\n"));
        }
        let conf = dir.join(format!("manager-{number}.conf"));
        write_file(
            &conf,
            &files::manager_config(
                &settings,
                &self.node_names(),
                &self.allowed,
                opts.allow_all_proxies,
                &extra,
            ),
        )?;
        let bin = binaries::locate_in("drover-manager", &self.bin_dirs)?;
        let Some(slot) = self.standbys.iter().position(|m| m.number == number) else {
            bail!("manager {number} vanished");
        };
        let log = self.standbys[slot].log(&dir);
        let child = process::spawn(Spawn {
            program: &bin,
            args: vec![
                "--no-default-config".into(),
                "-c".into(),
                conf.display().to_string(),
                "--bus".into(),
                bus_address.clone(),
            ],
            env: vec![("DBUS_SESSION_BUS_ADDRESS".into(), bus_address.clone())],
            clear_env: false,
            log: log.clone(),
            cgroup: &self.procs_join,
            listen_fd: Some(process::raw_fd(&self.standbys[slot].listener)),
            stdout_pipe: false,
        })?;
        if let Some(m) = self
            .state
            .standby_managers
            .iter_mut()
            .find(|m| m.number == number)
        {
            m.pid = Some(child.id());
        }
        self.state.save()?;
        let standby = &mut self.standbys[slot];
        let child = standby.manager.insert(child);
        wait_manager_ready(child, &bus_address, &log).await
    }

    /// Each manager's bus and pid, in order (manager 1 first), for `sandbox.env`.
    pub fn managers(&self) -> Vec<(String, Option<u32>)> {
        let mut all = vec![(self.state.bus_address.clone(), self.state.manager_pid)];
        all.extend(
            self.state
                .standby_managers
                .iter()
                .map(|m| (m.bus_address.clone(), m.pid)),
        );
        all
    }

    /// The etcd client URL of `up --managers N`.
    pub fn etcd_url(&self) -> Option<String> {
        self.state.etcd.as_ref().map(EtcdState::url)
    }
}

/// Whether etcd on 127.0.0.1:`port` answers `GET /health` with `"health":"true"`
/// (one bounded HTTP/1.0 exchange).
async fn etcd_healthy(port: u16) -> bool {
    let limit = Duration::from_secs(1);
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        s.take(16 * 1024).read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(limit, exchange).await {
        Ok(Ok(answer)) => {
            let text = String::from_utf8_lossy(&answer);
            text.starts_with("HTTP/1.") && text.contains("\"health\":\"true\"")
        }
        _ => false,
    }
}

/// `name` in one of `$PATH`'s directories.
fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}
