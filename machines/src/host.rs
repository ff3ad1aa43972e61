//! The host's side of a fleet: what it must have, the package mirror it
//! uses, and the cgroups a machine is booted from.
//!
//! Cgroups (the recipe, and why, in `docs/dev/machines.md`): on a host whose PID 1 is not systemd, each
//! machine starts from a cgroup of its own in the `name=systemd` hierarchy
//! and in the cgroup2 tree (hybrid: `/sys/fs/cgroup/unified`; pure v2: the
//! one tree), and nspawn runs with `--keep-unit`; without its own cgroups
//! two machines would share one and see each other's processes. On a host
//! whose PID 1 is systemd, nspawn asks it for a scope instead: no cgroup of
//! ours, no `--keep-unit`.

use anyhow::{Context, Result, bail};
use drover_sandbox::cgroups::{Layout, SandboxCgroups};
use std::path::{Path, PathBuf};

/// Programs a fleet runs, and the Debian package of each.
pub const TOOLS: &[(&str, &str)] = &[
    ("systemd-nspawn", "systemd-container"),
    ("debootstrap", "debootstrap"),
    ("nsenter", "util-linux"),
    ("mount", "mount"),
    ("ip", "iproute2"),
    ("chroot", "coreutils"),
];

/// Every missing prerequisite at once, or `Ok`.
pub fn check() -> Result<()> {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root (machines need mounts, cgroups, a bridge)".to_string());
    }
    for (tool, package) in TOOLS {
        if which(tool).is_none() {
            missing.push(format!("{tool} (package {package})"));
        }
    }
    if !Path::new("/proc/filesystems").exists()
        || !std::fs::read_to_string("/proc/filesystems")
            .unwrap_or_default()
            .contains("overlay")
    {
        // Not fatal: a machine's root is then a copy of the base.
        eprintln!("machines: overlayfs is not available; machine roots will be copies");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        bail!(
            "this host lacks: {}; `scripts/host-deps machines` installs the packages",
            missing.join(", ")
        )
    }
}

/// `program` on `PATH`, or in the sbin directories root's `PATH` has.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// The apt configuration of this host that a machine's apt gets too
/// (`/etc/apt/sources.list`, `sources.list.d/*`, `apt.conf.d/*`), as paths
/// relative to `/` with their contents, sorted.
pub fn apt_files() -> Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut files = Vec::new();
    let list = Path::new("/etc/apt/sources.list");
    if list.is_file() {
        files.push((
            PathBuf::from("etc/apt/sources.list"),
            std::fs::read(list).context("reading /etc/apt/sources.list")?,
        ));
    }
    for dir in ["/etc/apt/sources.list.d", "/etc/apt/apt.conf.d"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() {
                let rel = path.strip_prefix("/").unwrap_or(&path).to_path_buf();
                files.push((rel, std::fs::read(&path)?));
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The Debian mirror this host's apt uses for `suite`: the first `deb`
/// source's URI, in one-line (`.list`) or deb822 (`.sources`) form.
pub fn mirror(files: &[(PathBuf, Vec<u8>)], suite: &str) -> Result<String> {
    for (path, bytes) in files {
        let text = String::from_utf8_lossy(bytes);
        let name = path.to_string_lossy();
        if name.ends_with(".list") {
            for line in text.lines().map(str::trim) {
                let mut words = line.split_whitespace();
                if words.next() != Some("deb") {
                    continue;
                }
                // Options in brackets may come first: deb [signed-by=...] URI ...
                if let Some(uri) = words.find(|w| !w.starts_with('[') && !w.ends_with(']'))
                    && uri.contains("/debian")
                {
                    return Ok(uri.to_string());
                }
            }
        } else if name.ends_with(".sources") {
            for stanza in text.split("\n\n") {
                let field = |key: &str| {
                    stanza
                        .lines()
                        .find_map(|l| l.strip_prefix(key).map(str::trim))
                        .map(str::to_string)
                };
                let types = field("Types:").unwrap_or_default();
                let suites = field("Suites:").unwrap_or_default();
                if types.split_whitespace().any(|t| t == "deb")
                    && suites.split_whitespace().any(|s| s == suite)
                    && let Some(uris) = field("URIs:")
                    && let Some(uri) = uris.split_whitespace().next()
                {
                    return Ok(uri.to_string());
                }
            }
        }
    }
    bail!("no Debian mirror for {suite} in this host's apt sources (/etc/apt/sources.list*)")
}

/// How machines get their cgroups on this host.
#[derive(Debug, Clone)]
pub struct CgroupPlan {
    /// Where each machine's cgroups go (`<base>/drover-machines-<fleet>-<name>`).
    pub bases: Vec<PathBuf>,
    /// nspawn's `--keep-unit`: we made the cgroups (PID 1 is not systemd).
    pub keep_unit: bool,
}

impl CgroupPlan {
    pub fn detect() -> Result<Self> {
        let pid1 = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
        if pid1.trim() == "systemd" {
            return Ok(Self {
                bases: Vec::new(),
                keep_unit: false,
            });
        }
        let layout = Layout::detect().context("detecting the cgroup layout")?;
        let bases: Vec<PathBuf> = layout
            .hierarchies
            .iter()
            .filter(|h| {
                layout.unified_only
                    || h.fstype == "cgroup2"
                    || h.options.split(',').any(|o| o == "name=systemd")
            })
            .map(|h| h.base.clone())
            .collect();
        if bases.is_empty() {
            bail!(
                "no name=systemd or cgroup2 hierarchy on this host: systemd cannot boot a machine"
            );
        }
        Ok(Self {
            bases,
            keep_unit: true,
        })
    }

    /// The cgroups of one machine (nothing is created).
    pub fn for_machine(&self, fleet: &str, name: &str) -> SandboxCgroups {
        SandboxCgroups {
            parents: self
                .bases
                .iter()
                .map(|b| b.join(format!("drover-machines-{fleet}-{name}")))
                .collect(),
        }
    }

    /// Every cgroup directory named after `fleet`, in any hierarchy.
    pub fn of_fleet(&self, fleet: &str) -> Vec<PathBuf> {
        let prefix = format!("drover-machines-{fleet}-");
        let mut found = Vec::new();
        for base in &self.bases {
            if let Ok(entries) = std::fs::read_dir(base) {
                for e in entries.flatten() {
                    if e.file_name().to_string_lossy().starts_with(&prefix) {
                        found.push(e.path());
                    }
                }
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mirror_comes_from_either_source_format() {
        let deb822 = b"Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n\
                       Components: main\n\nTypes: deb\nURIs: http://security.debian.org/debian-security\n\
                       Suites: bookworm-security\n"
            .to_vec();
        let files = vec![(
            PathBuf::from("etc/apt/sources.list.d/debian.sources"),
            deb822,
        )];
        assert_eq!(
            mirror(&files, "bookworm").unwrap(),
            "http://deb.debian.org/debian"
        );
        let list =
            b"# comment\ndeb [signed-by=/k.gpg] http://mirror.example/debian bookworm main\n"
                .to_vec();
        let files = vec![(PathBuf::from("etc/apt/sources.list"), list)];
        assert_eq!(
            mirror(&files, "bookworm").unwrap(),
            "http://mirror.example/debian"
        );
        assert!(mirror(&[], "bookworm").is_err());
    }
}
