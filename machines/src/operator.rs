//! The operator's path, as the README ("Install", "A fleet of several
//! hosts") and `docs/security.md` tell it, on booted machines: the packages
//! installed with apt, the certificates made with `drover-pki` by the
//! README's own commands, the files put where the docs say, the settings
//! from `docs/examples/`, each configuration checked, the daemons started.
//!
//! The commands and files come from the documentation itself (compiled in),
//! so the machines suite follows what a reader would type, and a change of
//! the docs that breaks the path breaks the suite.

use crate::fleet::Fleet;
use crate::machine::Machine;
use crate::run::Output;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const README: &str = include_str!("../../README.md");
pub const FLEET_MANAGER_CONF: &str = include_str!("../../docs/examples/fleet-manager.conf");
pub const FLEET_AGENT_CONF: &str = include_str!("../../docs/examples/fleet-agent.conf");

/// The CA directory of the docs, on the manager machine.
pub const CA_DIR: &str = "/root/drover-ca";
/// Where each host's TLS files go.
pub const TLS_DIR: &str = "/etc/drover/tls";

/// The packages of the manager host and of a node (README, "Install").
pub const MANAGER_PACKAGES: &[&str] = &["drover-common", "drover-manager", "droverctl"];
pub const NODE_PACKAGES: &[&str] = &["drover-common", "drover-agent"];

/// The `.deb` of each package in `dir` (`NAME_VERSION_ARCH.deb`).
pub fn debs(dir: &Path, packages: &[&str]) -> Result<Vec<PathBuf>> {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {} (run make deb first)", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .collect();
    packages
        .iter()
        .map(|p| {
            entries
                .iter()
                .find(|e| {
                    e.file_name()
                        .and_then(|f| f.to_str())
                        .is_some_and(|f| f.starts_with(&format!("{p}_")) && f.ends_with(".deb"))
                })
                .cloned()
                .with_context(|| format!("no {p}_*.deb in {}", dir.display()))
        })
        .collect()
}

/// Copies `debs` into the machine and installs them as the README does
/// (`apt install ./PKG.deb ...`, which also installs what they depend on).
pub fn install(machine: &Machine, debs: &[PathBuf]) -> Result<Output> {
    let mut names = Vec::new();
    for deb in debs {
        let name = deb
            .file_name()
            .and_then(|f| f.to_str())
            .context("a package file name")?
            .to_string();
        std::fs::create_dir_all(machine.path("/root/debs"))?;
        std::fs::copy(deb, machine.path(&format!("/root/debs/{name}")))
            .with_context(|| format!("copying {} into {}", deb.display(), machine.name))?;
        names.push(format!("./{name}"));
    }
    machine.exec_for(
        &[
            "sh",
            "-c",
            &format!("cd /root/debs && apt install -y {}", names.join(" ")),
        ],
        Duration::from_secs(600),
    )
}

/// The README's `drover-pki` commands of "A fleet of several hosts", in
/// order, as written.
pub fn readme_pki_commands() -> Result<Vec<String>> {
    let section = README
        .split("### A fleet of several hosts")
        .nth(1)
        .context("README: no section 'A fleet of several hosts'")?;
    let commands: Vec<String> = section
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("drover-pki "))
        .map(str::to_string)
        .collect();
    if commands.len() < 3 {
        bail!("README: expected the drover-pki ca, manager and node commands, found {commands:?}");
    }
    Ok(commands)
}

/// Runs the README's `drover-pki` commands on `machine` (the manager host
/// stands in for the "safe host" that keeps the CA).
pub fn make_certificates(machine: &Machine) -> Result<()> {
    for command in readme_pki_commands()? {
        machine.must(&command)?;
    }
    Ok(())
}

/// Puts each host's TLS files into `/etc/drover/tls/`, as the README's
/// step 2 and `docs/security.md`'s table say: the manager gets `ca.pem`,
/// `crl.pem`, `manager.pem`, `manager.key`; each node `ca.pem` and its
/// `nodes/NODE.pem`, `nodes/NODE.key` as `NODE.pem`, `NODE.key`.
pub fn distribute_certificates(fleet: &Fleet, manager: &str, nodes: &[&str]) -> Result<()> {
    let ca = fleet.machine(manager)?;
    let copy = |to: &Machine, from: &str, name: &str, mode: u32| -> Result<()> {
        let src = ca.path(&format!("{CA_DIR}/{from}"));
        let dest = to.path(&format!("{TLS_DIR}/{name}"));
        std::fs::create_dir_all(to.path(TLS_DIR))?;
        std::fs::copy(&src, &dest).with_context(|| {
            format!("copying {} to {}:{TLS_DIR}/{name}", src.display(), to.name)
        })?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    for file in ["ca.pem", "crl.pem", "manager.pem"] {
        copy(ca, file, file, 0o644)?;
    }
    copy(ca, "manager.key", "manager.key", 0o600)?;
    for node in nodes {
        let to = fleet.machine(node)?;
        copy(to, "ca.pem", "ca.pem", 0o644)?;
        copy(
            to,
            &format!("nodes/{node}.pem"),
            &format!("{node}.pem"),
            0o644,
        )?;
        copy(
            to,
            &format!("nodes/{node}.key"),
            &format!("{node}.key"),
            0o600,
        )?;
    }
    Ok(())
}

/// The first line of a `docs/examples` file names where it goes.
fn destination(example: &str) -> Result<&str> {
    example
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# "))
        .filter(|p| p.starts_with("/etc/"))
        .context("an example's first line names its path")
}

/// The manager's drop-in (`docs/examples/fleet-manager.conf`, as written).
pub fn configure_manager(machine: &Machine) -> Result<()> {
    machine.write(destination(FLEET_MANAGER_CONF)?, FLEET_MANAGER_CONF)
}

/// A node's drop-in: `docs/examples/fleet-agent.conf`, which is `web1`'s,
/// with the node's own name.
pub fn configure_agent(machine: &Machine) -> Result<()> {
    let text = FLEET_AGENT_CONF.replace("web1", &machine.name);
    machine.write(destination(FLEET_AGENT_CONF)?, &text)
}

/// The README's line of step 4 that contains `needle` (its comment cut).
pub fn readme_line(needle: &str) -> Result<String> {
    README
        .lines()
        .find(|l| l.contains(needle) && !l.trim_start().starts_with('#'))
        .map(|l| l.split("   #").next().unwrap_or(l).trim().to_string())
        .with_context(|| format!("README: no command line with '{needle}'"))
}

/// The README's check-and-start line for the manager host.
pub fn start_manager(machine: &Machine) -> Result<String> {
    machine.must(&readme_line("drover-manager --check")?)
}

/// The README's check-and-start line for a node.
pub fn start_agent(machine: &Machine) -> Result<String> {
    machine.must(&readme_line("drover-agent --check")?)
}

/// The whole path for a fleet whose first machine is the manager host:
/// packages, certificates, settings, checks, daemons started.
pub fn set_up(fleet: &Fleet, debs_dir: &Path) -> Result<()> {
    let manager = fleet.machines().first().context("an empty fleet")?;
    let nodes: Vec<&str> = fleet.machines()[1..]
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    install(manager, &debs(debs_dir, MANAGER_PACKAGES)?)?.into_result("apt install (manager)")?;
    for node in &nodes {
        install(fleet.machine(node)?, &debs(debs_dir, NODE_PACKAGES)?)?
            .into_result(&format!("apt install ({node})"))?;
    }
    make_certificates(manager)?;
    distribute_certificates(fleet, &manager.name, &nodes)?;
    configure_manager(manager)?;
    start_manager(manager)?;
    for node in &nodes {
        let machine = fleet.machine(node)?;
        configure_agent(machine)?;
        start_agent(machine)?;
    }
    Ok(())
}
