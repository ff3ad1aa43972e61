//! One machine: a root (an overlay on the base, or a copy of it), its own
//! host name, machine id and address, booted with `systemd-nspawn --boot`
//! from cgroups of its own, and driven with `nsenter` into its namespaces.
//!
//! Invariants: a machine's processes are all below its cgroups (nspawn joins
//! them before it execs), so power-off and teardown can always find and kill
//! what is left; a reboot is a new boot of the same root (what the machine
//! wrote stays); teardown unmounts the root and removes its directory.

use crate::host::CgroupPlan;
use crate::run::{Output, run};
use anyhow::{Context, Result, bail};
use drover_sandbox::cgroups::SandboxCgroups;
use drover_sandbox::process::{Spawn, spawn, wait_timeout};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// How long a command inside a machine may take unless told otherwise.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a boot may take until `systemctl is-system-running` says running.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a power-off may take before nspawn and what is left are killed.
const POWEROFF_TIMEOUT: Duration = Duration::from_secs(60);

/// The environment of every command run inside a machine.
const ENV: &[&str] = &[
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "DEBIAN_FRONTEND=noninteractive",
    "SYSTEMD_PAGER=",
    "SYSTEMD_COLORS=0",
];

#[derive(Debug)]
pub struct Machine {
    pub name: String,
    /// nspawn's machine name: the fleet id and `name`.
    machine_name: String,
    pub address: Ipv4Addr,
    dir: PathBuf,
    root: PathBuf,
    overlay: bool,
    cgroups: SandboxCgroups,
    keep_unit: bool,
    nspawn: Option<Child>,
    init: Option<u32>,
    boots: u32,
}

impl Machine {
    /// Lays out `dir` (`upper/`, `work/`, `root/`), mounts the overlay (or
    /// copies `base`), and writes the machine's identity: host name, machine
    /// id, `/etc/hosts` (`hosts`: every machine of the fleet), its address.
    pub fn prepare(
        base: &Path,
        dir: &Path,
        name: &str,
        address: Ipv4Addr,
        hosts: &str,
        cgroups: &CgroupPlan,
        fleet: &str,
    ) -> Result<Self> {
        let root = dir.join("root");
        for sub in ["upper", "work", "root"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            base.display(),
            dir.join("upper").display(),
            dir.join("work").display()
        );
        let mounted = run(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o", &options])
                .arg(&root),
            Duration::from_secs(30),
        )?;
        let overlay = mounted.ok();
        if !overlay {
            eprintln!(
                "machines: overlay mount failed ({}); copying the base for {name}",
                mounted.text().trim()
            );
            run(
                Command::new("cp")
                    .arg("-a")
                    .arg(format!("{}/.", base.display()))
                    .arg(&root),
                Duration::from_secs(600),
            )?
            .into_result("copying the base")?;
        }
        let machine = Self {
            name: name.to_string(),
            machine_name: format!("{fleet}-{name}"),
            address,
            dir: dir.to_path_buf(),
            root,
            overlay,
            cgroups: cgroups.for_machine(fleet, name),
            keep_unit: cgroups.keep_unit,
            nspawn: None,
            init: None,
            boots: 0,
        };
        machine.write("/etc/hostname", &format!("{name}\n"))?;
        let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")?;
        machine.write(
            "/etc/machine-id",
            &format!("{}\n", uuid.trim().replace('-', "")),
        )?;
        let own = std::fs::read_to_string(machine.path("/etc/hosts")).unwrap_or_default();
        machine.write("/etc/hosts", &format!("{own}{hosts}"))?;
        machine.write(
            "/etc/systemd/network/10-host0.network.d/50-address.conf",
            &format!("[Network]\nAddress={address}/24\n"),
        )?;
        Ok(machine)
    }

    /// `path` inside the machine, as the host sees it.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Writes `text` to `path` inside the machine (directories made).
    pub fn write(&self, path: &str, text: &str) -> Result<()> {
        let dest = self.path(path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&dest, text).with_context(|| format!("{}: writing {path}", self.name))
    }

    /// Reads `path` inside the machine.
    pub fn read(&self, path: &str) -> Result<String> {
        std::fs::read_to_string(self.path(path))
            .with_context(|| format!("{}: reading {path}", self.name))
    }

    /// The pid (on the host) of the machine's PID 1, while it runs.
    pub fn init_pid(&self) -> Option<u32> {
        self.init
    }

    /// The pid of its `systemd-nspawn`, while it runs.
    pub fn nspawn_pid(&self) -> Option<u32> {
        self.nspawn.as_ref().map(Child::id)
    }

    pub fn cgroups(&self) -> &SandboxCgroups {
        &self.cgroups
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Boots the machine on `bridge` and waits until systemd says `running`.
    pub fn boot(&mut self, bridge: &str) -> Result<()> {
        if self.nspawn.is_some() {
            bail!("{} is running already", self.name);
        }
        self.boots += 1;
        for parent in &self.cgroups.parents {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating cgroup {}", parent.display()))?;
        }
        let join = self.cgroups.join_spec("")?;
        let mut args: Vec<String> = vec!["--boot".into(), "--register=no".into()];
        if self.keep_unit {
            args.push("--keep-unit".into());
        }
        args.extend([
            "-D".into(),
            self.root.display().to_string(),
            // Unique on the host (nspawn names the host's veth after it, and
            // two fleets may run at once); the host name inside is `name`.
            "-M".into(),
            self.machine_name.clone(),
            format!("--network-bridge={bridge}"),
            "--console=passive".into(),
            "-q".into(),
        ]);
        let log = self.console_log();
        let nspawn =
            crate::host::which("systemd-nspawn").context("systemd-nspawn is not installed")?;
        let child = spawn(Spawn {
            program: &nspawn,
            args,
            env: Vec::new(),
            clear_env: false,
            log: log.clone(),
            cgroup: &join,
            listen_fd: None,
            stdout_pipe: false,
        })?;
        let nspawn_pid = child.id();
        self.nspawn = Some(child);
        let started = Instant::now();
        self.init = Some(self.find_init(nspawn_pid, &log)?);
        self.wait_running(&log)?;
        eprintln!(
            "machines: {} up in {:.1} s ({})",
            self.name,
            started.elapsed().as_secs_f64(),
            self.address
        );
        Ok(())
    }

    fn console_log(&self) -> PathBuf {
        self.dir.join(format!("console-{}.log", self.boots))
    }

    /// nspawn's child that runs systemd: the machine's PID 1.
    fn find_init(&mut self, nspawn: u32, log: &Path) -> Result<u32> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for child in children(nspawn) {
                let comm =
                    std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
                if comm.trim() == "systemd" {
                    return Ok(child);
                }
            }
            if let Some(child) = self.nspawn.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.nspawn = None;
                bail!(
                    "systemd-nspawn for {} exited ({status}) before the machine booted:\n{}",
                    self.name,
                    drover_sandbox::process::log_tail(log, 20)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "{}: no systemd under nspawn (pid {nspawn}) after 30 s:\n{}",
                    self.name,
                    drover_sandbox::process::log_tail(log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_running(&self, log: &Path) -> Result<()> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let out = self.exec_for(&["systemctl", "is-system-running", "--wait"], left)?;
            match out.stdout.trim() {
                "running" => return Ok(()),
                "degraded" => {
                    let failed = self.exec(&["systemctl", "--failed", "--no-legend"])?;
                    bail!(
                        "{} booted degraded; failed units:\n{}",
                        self.name,
                        failed.text()
                    );
                }
                // systemd's bus not up yet, or still starting.
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                other => bail!(
                    "{} did not finish booting within {BOOT_TIMEOUT:?} (state '{other}', {}):\n{}",
                    self.name,
                    out.stderr.trim(),
                    drover_sandbox::process::log_tail(log, 30)
                ),
            }
        }
    }

    /// Runs `args` inside the machine (all its namespaces, a clean
    /// environment, as root), within [`COMMAND_TIMEOUT`].
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        self.exec_for(args, COMMAND_TIMEOUT)
    }

    pub fn exec_for(&self, args: &[&str], timeout: Duration) -> Result<Output> {
        let Some(init) = self.init else {
            bail!("{} is not running", self.name);
        };
        run(
            Command::new("nsenter")
                .args(["-t", &init.to_string(), "-a", "--", "/usr/bin/env", "-i"])
                .args(ENV)
                .args(args),
            timeout,
        )
        .with_context(|| format!("on {}", self.name))
    }

    /// `sh -c script` inside the machine.
    pub fn sh(&self, script: &str) -> Result<Output> {
        self.exec(&["sh", "-c", script])
    }

    /// `sh -c script` inside the machine, which must succeed: its stdout.
    pub fn must(&self, script: &str) -> Result<String> {
        self.sh(script)?
            .into_result(&format!("{}: {script}", self.name))
    }

    /// `systemctl poweroff` inside, then waits for nspawn to exit; kills
    /// whatever is left after `POWEROFF_TIMEOUT` (60 s). The root stays.
    pub fn poweroff(&mut self) -> Result<()> {
        let Some(mut nspawn) = self.nspawn.take() else {
            return self.kill_leftovers();
        };
        let asked = self.exec_for(&["systemctl", "poweroff"], Duration::from_secs(30));
        self.init = None;
        let ended = match asked {
            Ok(_) => wait_timeout(&mut nspawn, POWEROFF_TIMEOUT)?,
            Err(_) => None,
        };
        if ended.is_none() {
            eprintln!("machines: {} did not power off; killing it", self.name);
            let _ = nspawn.kill();
            let _ = nspawn.wait();
        }
        self.kill_leftovers()
    }

    /// A new boot of the same root.
    pub fn reboot(&mut self, bridge: &str) -> Result<()> {
        self.poweroff()?;
        self.boot(bridge)
    }

    fn kill_leftovers(&self) -> Result<()> {
        self.cgroups.kill_all(Duration::from_secs(10))?;
        self.cgroups.remove(Duration::from_secs(10))
    }

    /// Powers off (or kills) the machine, unmounts its root and removes its
    /// directory. Every step runs whatever an earlier one did; the errors
    /// are returned together.
    pub fn teardown(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        if let Err(e) = self.poweroff() {
            errors.push(format!("{}: {e:#}", self.name));
        }
        if self.overlay {
            match run(
                Command::new("umount").arg(&self.root),
                Duration::from_secs(30),
            ) {
                Ok(out) if out.ok() => self.overlay = false,
                Ok(out) => errors.push(format!("{}: umount: {}", self.name, out.text().trim())),
                Err(e) => errors.push(format!("{}: umount: {e:#}", self.name)),
            }
        }
        if !self.overlay
            && let Err(e) = crate::base::remove_tree(&self.dir)
        {
            errors.push(format!("{}: {e:#}", self.name));
        }
        errors
    }
}

/// The children of `pid` (every thread's list).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
                out.extend(
                    list.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    out
}
