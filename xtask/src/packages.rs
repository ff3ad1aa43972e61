//! What is installed where, and in which package: the one list behind
//! `make install`, `make deb` and the package test.
//!
//! Shipped files live in `dist/`, at the path they are installed to
//! (`dist/usr/lib/systemd/system/drover-manager.service` is installed as
//! `/usr/lib/systemd/system/drover-manager.service`); binaries come from a
//! cargo target directory, man pages and completions are rendered here.
//!
//! Packages (Debian names; the rpm spec in `dist/rpm/` splits the same way):
//! * `drover-manager`: the manager, its unit, preset, D-Bus policy, configs,
//!   and the XML of the interfaces it serves (`/usr/share/dbus-1/interfaces/`);
//! * `drover-agent`: the agent and `drover-proxy`, their units and the
//!   proxy/dep templates (system and user), preset, D-Bus policy, configs,
//!   and the XML of the interface it serves;
//! * `droverctl`: `droverctl` and `drover-pki`, with completions;
//! * `drover-common`: `drover.conf(5)`, which both daemons' packages need and
//!   only one package may own;
//! * `drover-bluechi-compat` (optional, [`OPTIONAL`]: not part of `make
//!   install`, installed by `make install-bluechi-compat`): Eclipse BlueChi's
//!   `bluechi-proxy@.service` and `bluechi-dep@.service` templates (system and
//!   user), so unit files written for BlueChi work with drover's agent;
//! * `drover-dns` (optional too: `make install-dns`): the DNS server fed by
//!   the manager, its unit (shipped, not enabled), configs and man page.
//!
//! Units are enabled on first install, never started by a maintainer script
//! ([`crate::deb`] for Debian's scripts, the presets elsewhere);
//! `/etc/drover/*.conf` are conffiles.

use crate::man;
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where one file comes from.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// `dist/PATH`.
    Dist(&'static str),
    /// A binary of the cargo target directory.
    Bin(&'static str),
    /// A rendered man page, `NAME.SECTION`.
    Man(&'static str),
    /// A droverctl completion file (by its file name).
    Completion(&'static str),
}

/// One installed file. `dest` may start with `{prefix}`, `{dbus}` (the D-Bus
/// system policy directory) or `{zsh}` (zsh's completion directory).
#[derive(Debug, Clone, Copy)]
pub struct Item {
    pub source: Source,
    pub dest: &'static str,
    pub mode: u32,
}

#[derive(Debug)]
pub struct Package {
    pub name: &'static str,
    pub summary: &'static str,
    pub description: &'static str,
    pub depends: &'static [&'static str],
    /// Packages that make it better (Debian's `Recommends:`).
    pub recommends: &'static [&'static str],
    /// Other drover packages it needs, at exactly the same version.
    pub siblings: &'static [&'static str],
    /// Eclipse BlueChi packages that own the same paths or bus names: the deb
    /// says `Conflicts:` and `Replaces:` (so one `apt-get install` swaps them),
    /// the rpm spec `Conflicts:`.
    pub replaces: &'static [&'static str],
    /// No binaries: `Architecture: all`.
    pub arch_all: bool,
    /// The unit its preset enables on first install.
    pub unit: Option<&'static str>,
    pub items: &'static [Item],
    /// Empty directories the package owns.
    pub dirs: &'static [&'static str],
}

const fn dist(path: &'static str, dest: &'static str) -> Item {
    Item {
        source: Source::Dist(path),
        dest,
        mode: 0o644,
    }
}

const fn bin(name: &'static str, dest: &'static str) -> Item {
    Item {
        source: Source::Bin(name),
        dest,
        mode: 0o755,
    }
}

const fn man(page: &'static str, dest: &'static str) -> Item {
    Item {
        source: Source::Man(page),
        dest,
        mode: 0o644,
    }
}

/// Every package. Adding one is one entry: its files (each also under
/// `dist/`, which a unit test checks), what it depends on, the drover
/// packages it needs at the same version (`siblings`), and the unit its
/// preset enables, if any; plus its `%files` section in `dist/rpm/drover.spec`
/// (the rpm test compares the two lists). `drover-bluechi-compat` below is
/// such an entry.
pub const PACKAGES: &[Package] = &[
    Package {
        name: "drover-manager",
        summary: "drover manager: cross-node systemd dependencies and fleet control",
        description: "Tracks the nodes of a drover fleet over drover's agent protocol and serves\n\
                      Eclipse BlueChi's public D-Bus API (org.eclipse.bluechi), so bluechictl-style\n\
                      tools, BlueChi's Python bindings and droverctl drive the whole fleet.",
        depends: &["systemd", "dbus"],
        recommends: &[],
        siblings: &["drover-common"],
        replaces: &["bluechi-controller"],
        arch_all: false,
        unit: Some("drover-manager.service"),
        items: &[
            bin("drover-manager", "{prefix}/libexec/drover-manager"),
            dist(
                "usr/lib/systemd/system/drover-manager.service",
                "{prefix}/lib/systemd/system/drover-manager.service",
            ),
            dist(
                "usr/lib/systemd/system/drover-manager.socket",
                "{prefix}/lib/systemd/system/drover-manager.socket",
            ),
            dist(
                "usr/lib/systemd/system-preset/50-drover-manager.preset",
                "{prefix}/lib/systemd/system-preset/50-drover-manager.preset",
            ),
            dist(
                "usr/share/dbus-1/system.d/org.eclipse.bluechi.conf",
                "{dbus}/org.eclipse.bluechi.conf",
            ),
            dist(
                "usr/share/dbus-1/interfaces/org.eclipse.bluechi.Controller.xml",
                "{prefix}/share/dbus-1/interfaces/org.eclipse.bluechi.Controller.xml",
            ),
            dist(
                "usr/share/dbus-1/interfaces/org.eclipse.bluechi.Node.xml",
                "{prefix}/share/dbus-1/interfaces/org.eclipse.bluechi.Node.xml",
            ),
            dist(
                "usr/share/dbus-1/interfaces/org.eclipse.bluechi.Job.xml",
                "{prefix}/share/dbus-1/interfaces/org.eclipse.bluechi.Job.xml",
            ),
            dist(
                "usr/share/dbus-1/interfaces/org.eclipse.bluechi.Monitor.xml",
                "{prefix}/share/dbus-1/interfaces/org.eclipse.bluechi.Monitor.xml",
            ),
            dist(
                "usr/share/dbus-1/interfaces/org.eclipse.bluechi.Metrics.xml",
                "{prefix}/share/dbus-1/interfaces/org.eclipse.bluechi.Metrics.xml",
            ),
            dist(
                "usr/share/dbus-1/interfaces/io.drover.Controller.xml",
                "{prefix}/share/dbus-1/interfaces/io.drover.Controller.xml",
            ),
            dist(
                "usr/share/dbus-1/interfaces/io.drover.Monitor.xml",
                "{prefix}/share/dbus-1/interfaces/io.drover.Monitor.xml",
            ),
            dist(
                "usr/share/dbus-1/interfaces/io.drover.Node.xml",
                "{prefix}/share/dbus-1/interfaces/io.drover.Node.xml",
            ),
            dist(
                "usr/share/drover/manager.conf",
                "{prefix}/share/drover/manager.conf",
            ),
            dist("etc/drover/manager.conf", "/etc/drover/manager.conf"),
            dist(
                "usr/share/drover/grafana/drover-fleet.json",
                "{prefix}/share/drover/grafana/drover-fleet.json",
            ),
            dist(
                "usr/share/drover/prometheus/drover-alerts.yml",
                "{prefix}/share/drover/prometheus/drover-alerts.yml",
            ),
            man(
                "drover-manager.8",
                "{prefix}/share/man/man8/drover-manager.8.gz",
            ),
        ],
        dirs: &["/etc/drover/manager.conf.d"],
    },
    Package {
        name: "drover-agent",
        summary: "drover agent: lets the drover manager drive this node's systemd",
        description: "Connects to the drover manager and drives this node's systemd over D-Bus.\n\
                      Ships drover-proxy and the drover-proxy@.service and drover-dep@.service\n\
                      templates, with which a unit depends on a unit of another node.",
        // procps: `/bin/kill`, the units' `ExecReload=`.
        depends: &["systemd", "dbus", "procps"],
        recommends: &[],
        siblings: &["drover-common"],
        replaces: &["bluechi-agent"],
        arch_all: false,
        unit: Some("drover-agent.service"),
        items: &[
            bin("drover-agent", "{prefix}/libexec/drover-agent"),
            bin("drover-proxy", "{prefix}/libexec/drover-proxy"),
            dist(
                "usr/lib/systemd/system/drover-agent.service",
                "{prefix}/lib/systemd/system/drover-agent.service",
            ),
            dist(
                "usr/lib/systemd/system/drover-proxy@.service",
                "{prefix}/lib/systemd/system/drover-proxy@.service",
            ),
            dist(
                "usr/lib/systemd/system/drover-dep@.service",
                "{prefix}/lib/systemd/system/drover-dep@.service",
            ),
            dist(
                "usr/lib/systemd/user/drover-agent.service",
                "{prefix}/lib/systemd/user/drover-agent.service",
            ),
            dist(
                "usr/lib/systemd/user/drover-proxy@.service",
                "{prefix}/lib/systemd/user/drover-proxy@.service",
            ),
            dist(
                "usr/lib/systemd/user/drover-dep@.service",
                "{prefix}/lib/systemd/user/drover-dep@.service",
            ),
            dist(
                "usr/lib/systemd/system-preset/50-drover-agent.preset",
                "{prefix}/lib/systemd/system-preset/50-drover-agent.preset",
            ),
            dist(
                "usr/share/dbus-1/system.d/org.eclipse.bluechi.Agent.conf",
                "{dbus}/org.eclipse.bluechi.Agent.conf",
            ),
            dist(
                "usr/share/dbus-1/interfaces/org.eclipse.bluechi.Agent.xml",
                "{prefix}/share/dbus-1/interfaces/org.eclipse.bluechi.Agent.xml",
            ),
            dist(
                "usr/share/dbus-1/interfaces/io.drover.Agent.xml",
                "{prefix}/share/dbus-1/interfaces/io.drover.Agent.xml",
            ),
            dist(
                "usr/share/drover/agent.conf",
                "{prefix}/share/drover/agent.conf",
            ),
            dist("etc/drover/agent.conf", "/etc/drover/agent.conf"),
            man(
                "drover-agent.8",
                "{prefix}/share/man/man8/drover-agent.8.gz",
            ),
            man(
                "drover-proxy.8",
                "{prefix}/share/man/man8/drover-proxy.8.gz",
            ),
        ],
        dirs: &["/etc/drover/agent.conf.d"],
    },
    Package {
        name: "droverctl",
        summary: "drover command line: nodes and units of a drover fleet, certificates",
        description: "droverctl drives the units of every node through the manager's\n\
                      BlueChi-compatible D-Bus API; drover-pki makes the certificates of\n\
                      drover's mutual TLS.",
        depends: &[],
        // Loads the bash completion it ships.
        recommends: &["bash-completion"],
        siblings: &[],
        replaces: &[],
        arch_all: false,
        unit: None,
        items: &[
            bin("droverctl", "{prefix}/bin/droverctl"),
            bin("drover-pki", "{prefix}/bin/drover-pki"),
            man("droverctl.1", "{prefix}/share/man/man1/droverctl.1.gz"),
            man("drover-pki.1", "{prefix}/share/man/man1/drover-pki.1.gz"),
            Item {
                source: Source::Completion("droverctl"),
                dest: "{prefix}/share/bash-completion/completions/droverctl",
                mode: 0o644,
            },
            Item {
                source: Source::Completion("_droverctl"),
                dest: "{zsh}/_droverctl",
                mode: 0o644,
            },
            Item {
                source: Source::Completion("droverctl.fish"),
                dest: "{prefix}/share/fish/vendor_completions.d/droverctl.fish",
                mode: 0o644,
            },
        ],
        dirs: &[],
    },
    Package {
        name: "drover-common",
        summary: "drover: files shared by the manager and the agent",
        description: "The drover.conf(5) manual page: every key of the manager's and the\n\
                      agent's configuration files.",
        depends: &[],
        recommends: &[],
        siblings: &[],
        replaces: &[],
        arch_all: true,
        unit: None,
        items: &[man(
            "drover.conf.5",
            "{prefix}/share/man/man5/drover.conf.5.gz",
        )],
        dirs: &[],
    },
    Package {
        name: "drover-bluechi-compat",
        summary: "drover: Eclipse BlueChi's proxy unit names for existing unit files",
        description: "The bluechi-proxy@.service and bluechi-dep@.service templates (system and\n\
                      user), so unit files written for Eclipse BlueChi\n\
                      (Wants=bluechi-proxy@node2_db.service) work unchanged with drover's agent\n\
                      and its drover-proxy helper.",
        depends: &[],
        recommends: &[],
        // The templates run drover-agent's drover-proxy, whose command line
        // they use: the same version.
        siblings: &["drover-agent"],
        replaces: &["bluechi-agent"],
        arch_all: true,
        unit: None,
        items: &[
            dist(
                "usr/lib/systemd/system/bluechi-proxy@.service",
                "{prefix}/lib/systemd/system/bluechi-proxy@.service",
            ),
            dist(
                "usr/lib/systemd/system/bluechi-dep@.service",
                "{prefix}/lib/systemd/system/bluechi-dep@.service",
            ),
            dist(
                "usr/lib/systemd/user/bluechi-proxy@.service",
                "{prefix}/lib/systemd/user/bluechi-proxy@.service",
            ),
            dist(
                "usr/lib/systemd/user/bluechi-dep@.service",
                "{prefix}/lib/systemd/user/bluechi-dep@.service",
            ),
        ],
        dirs: &[],
    },
    Package {
        name: "drover-dns",
        summary: "drover DNS: where each unit of a drover fleet runs and is healthy",
        description: "drover-dns answers DNS queries for the units of a drover fleet (A/AAAA for\n\
                      the nodes where a unit is active and healthy, SRV for its ports), fed by\n\
                      the drover manager over D-Bus. Its unit is not enabled by the package.",
        depends: &[],
        // It asks the manager on this host's system bus.
        recommends: &["drover-manager"],
        siblings: &[],
        replaces: &[],
        arch_all: false,
        // Off unless enabled: no preset, no maintainer scripts.
        unit: None,
        items: &[
            bin("drover-dns", "{prefix}/libexec/drover-dns"),
            dist(
                "usr/lib/systemd/system/drover-dns.service",
                "{prefix}/lib/systemd/system/drover-dns.service",
            ),
            dist(
                "usr/share/drover/dns.conf",
                "{prefix}/share/drover/dns.conf",
            ),
            dist("etc/drover/dns.conf", "/etc/drover/dns.conf"),
            man("drover-dns.8", "{prefix}/share/man/man8/drover-dns.8.gz"),
        ],
        dirs: &["/etc/drover/dns.conf.d"],
    },
];

/// Packages `make install` leaves out; each has its own install goal
/// (`make install-bluechi-compat`, `make install-dns`).
pub const OPTIONAL: &[&str] = &["drover-bluechi-compat", "drover-dns"];

/// Where things go.
#[derive(Debug, Clone)]
pub struct Layout {
    pub prefix: String,
    pub dbus_policy_dir: String,
    pub zsh_dir: String,
}

impl Layout {
    /// A distribution package's layout (Debian's zsh directory).
    pub fn debian() -> Self {
        Self {
            prefix: "/usr".into(),
            dbus_policy_dir: "/usr/share/dbus-1/system.d".into(),
            zsh_dir: "/usr/share/zsh/vendor-completions".into(),
        }
    }

    pub fn dest(&self, item: &Item) -> String {
        item.dest
            .replace("{prefix}", &self.prefix)
            .replace("{dbus}", &self.dbus_policy_dir)
            .replace("{zsh}", &self.zsh_dir)
    }
}

/// What staging needs: the source tree, the binaries, the rendered pages.
pub struct Inputs {
    pub repo: PathBuf,
    pub bin_dir: PathBuf,
    pub version: String,
    pub man_pages: BTreeMap<String, String>,
    pub completions: BTreeMap<String, Vec<u8>>,
}

impl Inputs {
    pub fn new(repo: &Path, bin_dir: &Path, version: &str) -> Result<Self> {
        Ok(Self {
            repo: repo.to_path_buf(),
            bin_dir: bin_dir.to_path_buf(),
            version: version.to_string(),
            man_pages: render_man_pages(repo, version)?,
            completions: crate::completions::droverctl()
                .into_iter()
                .map(|(_, file, text)| (file.to_string(), text))
                .collect(),
        })
    }
}

/// Renders every `docs/man/*.md` page: `NAME.SECTION` → roff.
pub fn render_man_pages(repo: &Path, version: &str) -> Result<BTreeMap<String, String>> {
    let dir = repo.join("docs/man");
    let mut pages = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let (name, section) = man::title(&text)
            .with_context(|| format!("{}: first line must be '% NAME SECTION'", path.display()))?;
        let expected = format!("{name}.{section}.md");
        if path.file_name().is_none_or(|f| f != expected.as_str()) {
            bail!("{} must be called {expected}", path.display());
        }
        let roff =
            man::render(&text, version).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        pages.insert(format!("{name}.{section}"), roff);
    }
    Ok(pages)
}

/// Installs `pkg` into `root` (a DESTDIR); returns the installed paths
/// (relative to `root`, absolute form) with their modes. A file under `/etc`
/// that exists already is left alone (and not returned).
pub fn stage(
    pkg: &Package,
    root: &Path,
    layout: &Layout,
    inputs: &Inputs,
) -> Result<Vec<(String, u32)>> {
    let mut installed = Vec::new();
    for item in pkg.items {
        let dest = layout.dest(item);
        let target = root.join(dest.trim_start_matches('/'));
        // A configuration file the administrator already has is theirs.
        if dest.starts_with("/etc/") && target.exists() {
            continue;
        }
        let bytes: Vec<u8> = match item.source {
            Source::Dist(path) => {
                let file = inputs.repo.join("dist").join(path);
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?;
                rewrite_paths(&text, layout).into_bytes()
            }
            Source::Bin(name) => {
                let file = inputs.bin_dir.join(name);
                std::fs::read(&file).with_context(|| {
                    format!("reading {} (build the binaries first)", file.display())
                })?
            }
            Source::Man(page) => {
                let roff = inputs
                    .man_pages
                    .get(page)
                    .with_context(|| format!("no man page docs/man/{page}.md"))?;
                gzip(roff.as_bytes())?
            }
            Source::Completion(file) => inputs
                .completions
                .get(file)
                .with_context(|| format!("no completion file {file}"))?
                .clone(),
        };
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        // Replace, never write through: a test root may hold a link.
        let _ = std::fs::remove_file(&target);
        std::fs::write(&target, &bytes).with_context(|| format!("writing {}", target.display()))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(item.mode))?;
        installed.push((dest, item.mode));
    }
    for dir in pkg.dirs {
        let target = root.join(dir.trim_start_matches('/'));
        std::fs::create_dir_all(&target)
            .with_context(|| format!("creating {}", target.display()))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(installed)
}

/// Points the shipped files at the binaries' real place under another prefix.
pub fn rewrite_paths(text: &str, layout: &Layout) -> String {
    if layout.prefix == "/usr" {
        text.to_string()
    } else {
        text.replace(
            "/usr/libexec/drover-",
            &format!("{}/libexec/drover-", layout.prefix),
        )
    }
}

/// `gzip -9n`: reproducible (no name, no time stamp), as man pages ship.
pub(crate) fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write;
    let mut child = Command::new("gzip")
        .args(["-9n", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running gzip")?;
    let mut stdin = child.stdin.take().context("gzip stdin")?;
    let input = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().context("running gzip")?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("gzip writer panicked"))?
        .context("feeding gzip")?;
    if !out.status.success() {
        bail!("gzip failed ({})", out.status);
    }
    Ok(out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dist_file_is_in_a_package_and_every_source_exists() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut listed: Vec<&str> = PACKAGES
            .iter()
            .flat_map(|p| p.items)
            .filter_map(|i| match i.source {
                Source::Dist(p) => Some(p),
                _ => None,
            })
            .collect();
        listed.sort();
        let mut present = Vec::new();
        let mut stack = vec![repo.join("dist")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                let rel = path
                    .strip_prefix(repo.join("dist"))
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                if rel.starts_with("rpm") {
                    continue; // the rpm spec is build input, not an installed file
                }
                if path.is_dir() {
                    stack.push(path);
                } else {
                    present.push(rel);
                }
            }
        }
        present.sort();
        assert_eq!(listed, present, "dist/ and the package lists disagree");
    }

    #[test]
    fn another_prefix_moves_binaries_and_the_units_follow() {
        let layout = Layout {
            prefix: "/opt/drover".into(),
            ..Layout::debian()
        };
        let unit = "ExecStart=/usr/libexec/drover-proxy create %i\nExecStop=/bin/true\n";
        assert_eq!(
            rewrite_paths(unit, &layout),
            "ExecStart=/opt/drover/libexec/drover-proxy create %i\nExecStop=/bin/true\n"
        );
        assert_eq!(rewrite_paths(unit, &Layout::debian()), unit);
        let item = PACKAGES[0].items[0];
        assert_eq!(layout.dest(&item), "/opt/drover/libexec/drover-manager");
    }
}
