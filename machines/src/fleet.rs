//! A fleet: machines on a bridge of their own, torn down together.
//!
//! Everything a fleet makes is named after its id: the bridge `drvm<id>`
//! (no host address: the machines reach only each other), the machines'
//! cgroups `drover-machines-<id>-<name>`, nspawn's machine names `<id>-<name>`,
//! and its run directory (`/var/tmp/drover-machines/<id>/`, with each
//! machine's overlay and console logs). `state.json` there is written before
//! anything else is made, so a fleet can always be found and removed:
//! by its own `Drop` (also when a test fails), by `drover-machines down`,
//! or, when its owner process died, by the next fleet that boots.

use crate::base;
use crate::host::{self, CgroupPlan};
use crate::machine::Machine;
use crate::run::run;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where fleets keep their run directories.
pub const RUN_ROOT: &str = "/var/tmp/drover-machines";

/// What to boot.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Machine names and their addresses in 192.0.2.0/24 (TEST-NET-1, the
    /// documentation range: the addresses `docs/` uses).
    pub machines: Vec<(String, Ipv4Addr)>,
    /// The base tree cache ([`base::cache_dir`]).
    pub cache: PathBuf,
}

impl Default for FleetOptions {
    /// The fleet of the README's example: the manager host at 192.0.2.10,
    /// nodes `web1` and `db1`.
    fn default() -> Self {
        Self {
            machines: vec![
                ("manager".into(), Ipv4Addr::new(192, 0, 2, 10)),
                ("web1".into(), Ipv4Addr::new(192, 0, 2, 11)),
                ("db1".into(), Ipv4Addr::new(192, 0, 2, 12)),
            ],
            cache: base::cache_dir(),
        }
    }
}

/// `state.json`: enough to tear a fleet down without its `Fleet` value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub id: String,
    /// The process that owns the fleet; 0 for one left running on purpose.
    pub owner: u32,
    pub bridge: String,
    pub dir: PathBuf,
    pub machines: Vec<String>,
    pub cgroup_bases: Vec<PathBuf>,
}

#[derive(Debug)]
pub struct Fleet {
    state: State,
    plan: CgroupPlan,
    machines: Vec<Machine>,
    keep: bool,
}

impl Fleet {
    /// Checks the host, removes fleets whose owner died, makes sure the base
    /// exists, then boots every machine (in parallel) on a new bridge.
    pub fn boot(options: &FleetOptions) -> Result<Fleet> {
        host::check()?;
        for problem in clean_stale() {
            eprintln!("machines: {problem}");
        }
        let base = base::ensure(&options.cache)?;
        let plan = CgroupPlan::detect()?;
        let id = new_id();
        let dir = Path::new(RUN_ROOT).join(&id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let state = State {
            id: id.clone(),
            owner: std::process::id(),
            bridge: format!("drvm{id}"),
            dir: dir.clone(),
            machines: options.machines.iter().map(|(n, _)| n.clone()).collect(),
            cgroup_bases: plan.bases.clone(),
        };
        write_state(&state)?;
        // From here on, Drop removes whatever was made.
        let mut fleet = Fleet {
            state,
            plan,
            machines: Vec::new(),
            keep: false,
        };
        let bridge = fleet.state.bridge.clone();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["link", "set", &bridge, "up"])?;
        let hosts: String = options
            .machines
            .iter()
            .map(|(name, address)| format!("{address}\t{name}\n"))
            .collect();
        for (name, address) in &options.machines {
            let machine = Machine::prepare(
                &base,
                &dir.join(name),
                name,
                *address,
                &hosts,
                &fleet.plan,
                &id,
            )?;
            fleet.machines.push(machine);
        }
        let booted: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = fleet
                .machines
                .iter_mut()
                .map(|m| {
                    let bridge = bridge.clone();
                    s.spawn(move || m.boot(&bridge))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a boot thread panicked")))
                })
                .collect()
        });
        for result in booted {
            result?;
        }
        Ok(fleet)
    }

    pub fn id(&self) -> &str {
        &self.state.id
    }

    /// What `state.json` says (for [`leftovers`] after [`Fleet::down`]).
    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn bridge(&self) -> &str {
        &self.state.bridge
    }

    pub fn dir(&self) -> &Path {
        &self.state.dir
    }

    /// The machine called `name`.
    pub fn machine(&self, name: &str) -> Result<&Machine> {
        self.machines
            .iter()
            .find(|m| m.name == name)
            .with_context(|| format!("no machine '{name}' in this fleet"))
    }

    pub fn machines(&self) -> &[Machine] {
        &self.machines
    }

    /// Powers `name` off and boots it again (the same root).
    pub fn reboot(&mut self, name: &str) -> Result<()> {
        let bridge = self.state.bridge.clone();
        let machine = self
            .machines
            .iter_mut()
            .find(|m| m.name == name)
            .with_context(|| format!("no machine '{name}' in this fleet"))?;
        machine.reboot(&bridge)
    }

    /// Leaves the fleet running when this value goes (`drover-machines up`);
    /// `drover-machines down --dir DIR` removes it later.
    pub fn keep(mut self) -> Result<PathBuf> {
        self.keep = true;
        self.state.owner = 0;
        write_state(&self.state)?;
        Ok(self.state.dir.clone())
    }

    /// Tears everything down now; the errors, if any, together.
    pub fn down(mut self) -> Result<()> {
        let errors = self.teardown();
        self.keep = true; // nothing left for Drop
        if errors.is_empty() {
            Ok(())
        } else {
            bail!("teardown of fleet {}: {}", self.state.id, errors.join("; "))
        }
    }

    fn teardown(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        let teardowns: Vec<Vec<String>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .machines
                .iter_mut()
                .map(|m| s.spawn(move || m.teardown()))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| vec!["a teardown thread panicked".into()])
                })
                .collect()
        });
        errors.extend(teardowns.into_iter().flatten());
        errors.extend(remove_rest(&self.state));
        errors
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for problem in self.teardown() {
            eprintln!("machines: teardown: {problem}");
        }
    }
}

/// A short id, unique among the fleets of this host.
fn new_id() -> String {
    let mut bytes = [0u8; 3];
    if let Ok(uuid) = std::fs::read_to_string("/proc/sys/kernel/random/uuid") {
        let hex: String = uuid
            .chars()
            .filter(char::is_ascii_hexdigit)
            .take(6)
            .collect();
        if hex.len() == 6 {
            return hex;
        }
    }
    bytes.copy_from_slice(&std::process::id().to_le_bytes()[..3]);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_state(state: &State) -> Result<()> {
    let text = serde_json::to_string_pretty(state)?;
    std::fs::write(state.dir.join("state.json"), text)?;
    Ok(())
}

pub fn read_state(dir: &Path) -> Result<State> {
    let text = std::fs::read_to_string(dir.join("state.json"))
        .with_context(|| format!("no fleet in {} (no state.json)", dir.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args), Duration::from_secs(30))?
        .into_result(&format!("ip {}", args.join(" ")))
        .map(drop)
}

/// What a teardown removes after the machines: processes and cgroups left
/// below the fleet's names, mounts below its directory, the bridge, the
/// directory. Safe to run on a fleet that is partly gone.
fn remove_rest(state: &State) -> Vec<String> {
    let mut errors = Vec::new();
    let plan = CgroupPlan {
        bases: state.cgroup_bases.clone(),
        keep_unit: true,
    };
    for name in &state.machines {
        let cgroups = plan.for_machine(&state.id, name);
        if let Err(e) = cgroups.kill_all(Duration::from_secs(10)) {
            errors.push(format!("{e:#}"));
        }
        if let Err(e) = cgroups.remove(Duration::from_secs(10)) {
            errors.push(format!("{e:#}"));
        }
    }
    for mount in mounts_below(&state.dir).into_iter().rev() {
        if let Ok(out) = run(Command::new("umount").arg(&mount), Duration::from_secs(30))
            && !out.ok()
        {
            errors.push(format!("umount {}: {}", mount.display(), out.text().trim()));
        }
    }
    if link_exists(&state.bridge)
        && let Err(e) = ip(&["link", "del", &state.bridge])
    {
        errors.push(format!("{e:#}"));
    }
    if mounts_below(&state.dir).is_empty()
        && let Err(e) = base::remove_tree(&state.dir)
    {
        errors.push(format!("{e:#}"));
    }
    errors
}

/// Tears down the fleet of `dir` from its `state.json`: powers each machine
/// off if it runs (its PID 1 is nspawn's `systemd` child), kills what is
/// left in its cgroups, unmounts, removes the bridge and the directory.
pub fn down_dir(dir: &Path) -> Result<()> {
    let state = read_state(dir)?;
    for name in &state.machines {
        if let Some(init) = init_of(&state, name) {
            let _ = run(
                Command::new("nsenter").args([
                    "-t",
                    &init.to_string(),
                    "-a",
                    "--",
                    "systemctl",
                    "poweroff",
                ]),
                Duration::from_secs(30),
            );
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while drover_sandbox::process::alive(init) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let errors = remove_rest(&state);
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("teardown of fleet {}: {}", state.id, errors.join("; "))
    }
}

/// PID 1 of machine `name` of a running fleet: the `systemd` in its cgroups
/// whose parent is `systemd-nspawn`.
pub fn init_of(state: &State, name: &str) -> Option<u32> {
    let plan = CgroupPlan {
        bases: state.cgroup_bases.clone(),
        keep_unit: true,
    };
    plan.for_machine(&state.id, name)
        .pids()
        .into_iter()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "systemd")
                && parent_comm(*pid).is_some_and(|c| c == "systemd-nspawn")
        })
        .and_then(|pid| u32::try_from(pid).ok())
}

fn parent_comm(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
    let comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).ok()?;
    Some(comm.trim().to_string())
}

/// Removes every fleet whose owner process is gone (a fleet left running on
/// purpose has owner 0 and stays). Returns what could not be removed.
pub fn clean_stale() -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(entries) = std::fs::read_dir(RUN_ROOT) else {
        return problems;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let Ok(state) = read_state(&dir) else {
            continue;
        };
        if state.owner == 0 || drover_sandbox::process::alive(state.owner) {
            continue;
        }
        eprintln!(
            "machines: removing fleet {} (its owner, pid {}, is gone)",
            state.id, state.owner
        );
        if let Err(e) = down_dir(&dir) {
            problems.push(format!("{e:#}"));
        }
    }
    problems
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Mount points at or below `dir`, in mount order.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// What of fleet `state` is still on the host: its bridge, veths, cgroups,
/// mounts, processes (nspawn or anything rooted in its directory), its
/// directory. Empty when the teardown left nothing behind.
pub fn leftovers(state: &State) -> Vec<String> {
    let mut left = Vec::new();
    if link_exists(&state.bridge) {
        left.push(format!("link {}", state.bridge));
    }
    if let Ok(links) = std::fs::read_dir("/sys/class/net") {
        for link in links.flatten() {
            let name = link.file_name().to_string_lossy().into_owned();
            if name.starts_with("vb-") && name.contains(&state.id) {
                left.push(format!("link {name}"));
            }
        }
    }
    let plan = CgroupPlan {
        bases: state.cgroup_bases.clone(),
        keep_unit: true,
    };
    for cgroup in plan.of_fleet(&state.id) {
        left.push(format!("cgroup {}", cgroup.display()));
    }
    for mount in mounts_below(&state.dir) {
        left.push(format!("mount {}", mount.display()));
    }
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for p in procs.flatten() {
            let pid = p.file_name().to_string_lossy().into_owned();
            if !pid.chars().all(|c| c.is_ascii_digit()) {
                continue;
            }
            let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let rooted =
                std::fs::read_link(p.path().join("root")).is_ok_and(|r| r.starts_with(&state.dir));
            if rooted || cmdline.contains(&state.dir.display().to_string()) {
                left.push(format!("process {pid}: {}", cmdline.trim()));
            }
        }
    }
    if state.dir.exists() {
        left.push(format!("directory {}", state.dir.display()));
    }
    left
}
