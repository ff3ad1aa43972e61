//! [`SystemdNode`]: one `systemd --user` node on its own (no manager, no agent), for tests
//! that drive a node's systemd directly or run an agent against it. It is built from the
//! sandbox's node pieces (`docs/sandbox.md`), so both cgroup layouts work, and torn down in
//! `Drop`: every process in its cgroups killed, the cgroups removed, the directory deleted.

use drover_sandbox::cgroups::{Layout, SandboxCgroups};
use drover_sandbox::node;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

const READY: Duration = Duration::from_secs(30);

/// See the module docs.
pub struct SystemdNode {
    name: String,
    dir: PathBuf,
    cgroups: SandboxCgroups,
    child: Option<Child>,
}

impl SystemdNode {
    /// Starts node `name` in a fresh directory tagged `tag`; returns once its systemd runs.
    pub async fn start(tag: &str, name: &str) -> SystemdNode {
        Self::start_in(&std::env::temp_dir(), tag, name).await
    }

    /// [`Self::start`] with the node's directory under `base` instead of the
    /// temporary directory (a unit with `PrivateTmp=yes` cannot see `/tmp`).
    pub async fn start_in(base: &Path, tag: &str, name: &str) -> SystemdNode {
        let layout = Layout::detect().expect("cgroup layout");
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let id = format!("{tag}-{}-{stamp}", std::process::id());
        let dir = base.join(format!("drover-{id}"));
        // Owned from here: a failure below still tears down what exists.
        let mut n = SystemdNode {
            name: name.to_owned(),
            dir: dir.clone(),
            cgroups: SandboxCgroups::for_id(&layout, &id),
            child: None,
        };
        n.cgroups.create_group(name).expect("node cgroup");
        node::prepare_dirs(&dir, name).expect("node dirs");
        let join = n.cgroups.join_spec(name).expect("cgroup join");
        let log = dir.join("systemd.log");
        let child = node::spawn(&layout, &join, &dir, name, log.clone()).expect("spawn node");
        let pid = child.id();
        n.child = Some(child);
        node::wait_ready(&dir, name, pid, &log, READY)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        n
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directory the node's home lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `unix:path=…/rt/bus`: where the node's systemd is `org.freedesktop.systemd1`.
    pub fn bus_address(&self) -> String {
        node::bus_address(&self.dir, &self.name)
    }

    /// Where the node's user unit files live.
    pub fn unit_dir(&self) -> PathBuf {
        node::unit_dir(&self.dir, &self.name)
    }

    /// Writes a unit file (no reload: see [`Self::reload`]).
    pub fn write_unit(&self, name: &str, text: &str) {
        let path = self.unit_dir().join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// `systemctl --user ARGS` inside the node (its mount and cgroup namespace).
    pub fn systemctl(&self, args: &[&str]) -> std::process::Output {
        let pid = self.child.as_ref().map_or(0, Child::id);
        let mut argv = vec!["systemctl", "--user"];
        argv.extend_from_slice(args);
        node::exec_command(&self.dir, &self.name, pid, &argv)
            .output()
            .unwrap_or_else(|e| panic!("systemctl {args:?} on node {}: {e}", self.name))
    }

    /// systemd's `Reload` (daemon-reload), after writing unit files.
    pub async fn reload(&self) {
        drover_sandbox::bus::reload_systemd(&self.bus_address())
            .await
            .unwrap_or_else(|e| panic!("daemon-reload of node {}: {e:#}", self.name));
    }
}

impl Drop for SystemdNode {
    fn drop(&mut self) {
        // systemd --user ignores SIGTERM and its services outlive it: kill the cgroups.
        if let Err(e) = self.cgroups.kill_all(Duration::from_secs(10)) {
            eprintln!("teardown: {e:#}");
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Err(e) = self.cgroups.remove(Duration::from_secs(5)) {
            eprintln!("teardown: {e:#}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
