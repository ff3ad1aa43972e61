//! `state.json`: everything needed to find and remove a sandbox without its creator.
//!
//! The creator writes the file as soon as the sandbox's cgroup paths are known and again
//! whenever a pid changes, so a later `drover-sandbox down --dir DIR` can clean up even
//! after the creator crashed mid-start. Teardown needs only the cgroup parents (every
//! process lives below them) and the directory; the pids are informational and used by
//! `exec` to find a node's systemd. [`TeardownOnDrop`] holds a sandbox described only by
//! its state (detached from its creator) and tears it down unless released.

use crate::cgroups::SandboxCgroups;
use crate::node;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const STATE_FILE: &str = "state.json";
/// The manager's `StateDirectory` inside the sandbox directory (drained nodes and units):
/// made by `up`, emptied by the next `up` and removed by `down`, also in a directory the
/// caller gave.
pub const MANAGER_STATE_DIR: &str = "manager-state";
pub const ENV_FILE: &str = "sandbox.env";
/// etcd's data directory inside the sandbox directory (`up --managers N`).
pub const ETCD_DIR: &str = "etcd";
const FORMAT_VERSION: u32 = 1;

/// The persisted description of one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct State {
    pub version: u32,
    pub id: String,
    pub dir: PathBuf,
    /// Whether the sandbox created `dir` (then teardown removes it entirely).
    pub created_dir: bool,
    pub creator_pid: u32,
    pub cgroup_parents: Vec<PathBuf>,
    pub bus_address: String,
    pub manager_port: u16,
    /// The manager's Prometheus port on 127.0.0.1, when it serves one.
    #[serde(default)]
    pub metrics_port: Option<u16>,
    pub nodes: Vec<NodeState>,
    /// `drover-dns` (`up --dns`): its pid and loopback port.
    #[serde(default)]
    pub dns_pid: Option<u32>,
    #[serde(default)]
    pub dns_port: Option<u16>,
    pub bus_pid: Option<u32>,
    pub manager_pid: Option<u32>,
    pub agent_pids: BTreeMap<String, u32>,
    pub extra_agent_pids: Vec<u32>,
    /// `up --managers N`: the local etcd the managers elect their leader on.
    #[serde(default)]
    pub etcd: Option<EtcdState>,
    /// `up --managers N`: managers 2..N, each on its own bus and loopback
    /// address (the first is `bus_address`/`manager_pid`).
    #[serde(default)]
    pub standby_managers: Vec<ManagerState>,
}

/// The sandbox's etcd: data in `DIR/`[`ETCD_DIR`], clients on 127.0.0.1.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EtcdState {
    pub pid: Option<u32>,
    pub client_port: u16,
    pub peer_port: u16,
}

impl EtcdState {
    /// The client URL, as `EtcdEndpoints=` takes it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

/// One more manager of the sandbox (2..N): its loopback address (where it
/// listens on the sandbox's manager port, like another host), its bus.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ManagerState {
    /// 2..N.
    pub number: usize,
    pub host: String,
    pub bus_address: String,
    pub bus_pid: Option<u32>,
    pub pid: Option<u32>,
}

/// What manager `number` (2..N) keeps in the sandbox directory: its bus
/// socket and its `StateDirectory` (removed by `down`), its config and
/// logs (kept in a directory the caller gave).
pub fn manager_bus(number: usize) -> String {
    format!("bus-{number}")
}

pub fn manager_state_dir(number: usize) -> String {
    format!("{MANAGER_STATE_DIR}-{number}")
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeState {
    pub name: String,
    pub systemd_pid: Option<u32>,
}

impl State {
    pub fn new(
        id: String,
        dir: PathBuf,
        created_dir: bool,
        cgroups: &SandboxCgroups,
        port: u16,
    ) -> Self {
        State {
            version: FORMAT_VERSION,
            bus_address: format!("unix:path={}", dir.join("bus").display()),
            id,
            dir,
            created_dir,
            creator_pid: std::process::id(),
            cgroup_parents: cgroups.parents.clone(),
            manager_port: port,
            metrics_port: None,
            nodes: Vec::new(),
            dns_pid: None,
            dns_port: None,
            bus_pid: None,
            manager_pid: None,
            agent_pids: BTreeMap::new(),
            extra_agent_pids: Vec::new(),
            etcd: None,
            standby_managers: Vec::new(),
        }
    }

    /// Writes `DIR/state.json` (via a temporary file, so a reader never sees half of it).
    pub fn save(&self) -> Result<()> {
        let path = self.dir.join(STATE_FILE);
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self).context("encoding state")?;
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }

    /// Reads `DIR/state.json`; `None` when there is none.
    pub fn load(dir: &Path) -> Result<Option<State>> {
        let path = dir.join(STATE_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let state: State = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a drover-sandbox state file", path.display()))?;
        if state.version != FORMAT_VERSION {
            bail!(
                "{} has format version {}, expected {FORMAT_VERSION}",
                path.display(),
                state.version
            );
        }
        // The cgroup paths decide what teardown kills and removes: never trust them blindly.
        for parent in &state.cgroup_parents {
            let ok = parent.starts_with("/sys/fs/cgroup")
                && parent
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy() == format!("drover-sandbox-{}", state.id))
                && !parent
                    .components()
                    .any(|c| c == std::path::Component::ParentDir);
            if !ok {
                bail!(
                    "{}: refusing suspicious cgroup path {}",
                    path.display(),
                    parent.display()
                );
            }
        }
        Ok(Some(state))
    }

    pub fn cgroups(&self) -> SandboxCgroups {
        SandboxCgroups {
            parents: self.cgroup_parents.clone(),
        }
    }

    /// Whether any process of this sandbox is still running.
    pub fn is_live(&self) -> bool {
        !self.cgroups().pids().is_empty()
    }

    pub fn node(&self, name: &str) -> Result<&NodeState> {
        self.nodes.iter().find(|n| n.name == name).with_context(|| {
            let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
            format!(
                "no node '{name}' in this sandbox (nodes: {})",
                names.join(", ")
            )
        })
    }

    /// SIGKILLs every process of the sandbox (bounded).
    pub fn kill_all(&self) -> Result<()> {
        self.cgroups().kill_all(Duration::from_secs(10))
    }

    /// After [`State::kill_all`]: unmounts anything left under the directory, removes the
    /// cgroups and the files (or the whole directory if the sandbox created it). Keeps going
    /// after a failure and returns every failure.
    pub fn cleanup(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if let Err(e) = unmount_below(&self.dir) {
            errors.push(format!("{e:#}"));
        }
        if let Err(e) = self.cgroups().remove(Duration::from_secs(5)) {
            // Keep state.json: it is the only record of where the cgroups are.
            errors.push(format!(
                "{e:#}; keeping {} for a retry",
                self.dir.join(STATE_FILE).display()
            ));
            return errors;
        }
        let result = if self.created_dir {
            remove_if_exists(&self.dir)
        } else {
            // A directory the caller gave us: remove what we made, keep configs and logs.
            let mut paths: Vec<PathBuf> = self
                .nodes
                .iter()
                .map(|n| node::home(&self.dir, &n.name))
                .collect();
            paths.extend(
                ["bus", MANAGER_STATE_DIR, STATE_FILE, ENV_FILE, ETCD_DIR]
                    .iter()
                    .map(|f| self.dir.join(f)),
            );
            for m in &self.standby_managers {
                paths.push(self.dir.join(manager_bus(m.number)));
                paths.push(self.dir.join(manager_state_dir(m.number)));
            }
            paths.iter().try_for_each(|p| remove_if_exists(p))
        };
        if let Err(e) = result {
            errors.push(format!("{e:#}"));
        }
        errors
    }

    /// Kill + cleanup, collecting every failure.
    pub fn teardown(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if let Err(e) = self.kill_all() {
            errors.push(format!("{e:#}"));
        }
        errors.extend(self.cleanup());
        errors
    }
}

/// Holds a sandbox that no [`crate::Cluster`] owns (a detached one, or one found by its
/// directory) and tears it down when dropped, unless [`TeardownOnDrop::release`]d: a
/// holder that fails half-way (an error, a panicking test) leaves nothing running.
pub struct TeardownOnDrop {
    state: State,
    armed: bool,
}

impl TeardownOnDrop {
    pub fn new(state: State) -> Self {
        Self { state, armed: true }
    }

    /// The sandbox held.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Stops holding: the sandbox stays as it is.
    pub fn release(mut self) -> State {
        self.armed = false;
        self.state.clone()
    }

    /// Tears the sandbox down now; every failure.
    pub fn teardown(mut self) -> Vec<String> {
        self.armed = false;
        self.state.teardown()
    }
}

impl Drop for TeardownOnDrop {
    fn drop(&mut self) {
        if self.armed {
            for error in self.state.teardown() {
                eprintln!("drover-sandbox: teardown: {error}");
            }
        }
    }
}

fn remove_if_exists(path: &Path) -> Result<()> {
    let result = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    };
    result.with_context(|| format!("removing {}", path.display()))
}

/// Mount points at or below `dir` in this mount namespace, deepest first.
pub fn mounts_below(dir: &Path) -> Result<Vec<PathBuf>> {
    let info =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    Ok(found)
}

/// Lazily unmounts every mount at or below `dir` (nodes mount only inside their own
/// namespaces, so normally there is nothing; this catches anything that leaked out).
fn unmount_below(dir: &Path) -> Result<()> {
    let mut failures = Vec::new();
    for mount in mounts_below(dir)? {
        if let Err(e) = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH) {
            failures.push(format!("{}: {e}", mount.display()));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("could not unmount: {}", failures.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_refuses_cgroup_paths_outside_the_sandbox() {
        let dir = std::env::temp_dir().join(format!("drover-sandbox-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cg = SandboxCgroups {
            parents: vec![PathBuf::from("/sys/fs/cgroup/pids/drover-sandbox-x1")],
        };
        let mut state = State::new("x1".into(), dir.clone(), false, &cg, 1);
        state.save().unwrap();
        assert_eq!(State::load(&dir).unwrap(), Some(state.clone()));

        state.cgroup_parents = vec![PathBuf::from("/sys/fs/cgroup/pids")];
        state.save().unwrap();
        let err = State::load(&dir).unwrap_err().to_string();
        assert!(err.contains("refusing suspicious cgroup path"), "{err}");

        std::fs::write(dir.join(STATE_FILE), "{not json").unwrap();
        let err = State::load(&dir).unwrap_err().to_string();
        assert!(err.contains("is not a drover-sandbox state file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(State::load(&dir).unwrap(), None);
    }
}
