//! The host prerequisites of a sandbox, checked in one pass before anything starts.
//!
//! A sandbox needs root, `unshare`/`nsenter`, `dbus-daemon`, systemd, the user-bus socket
//! unit that gives every node its session bus (`dbus.socket`, from Debian's
//! `dbus-user-session`: without it a node's systemd starts but its bus never appears),
//! a cgroup layout the sandbox knows, and room under the inotify limit. Every missing piece
//! is reported at once, each with the package that provides it, so one install fixes all;
//! `scripts/host-deps demo` installs exactly those packages.

use crate::cgroups::Layout;
use crate::inotify;
use crate::node;
use anyhow::{Result, bail};
use std::path::Path;

/// A file the sandbox needs, and the packages that provide it.
struct Needed {
    /// Any one of these paths will do.
    paths: &'static [&'static str],
    what: &'static str,
    debian: &'static str,
    fedora: &'static str,
}

const FILES: &[Needed] = &[
    Needed {
        paths: &["/usr/bin/unshare"],
        what: "unshare (the nodes' namespaces)",
        debian: "util-linux",
        fedora: "util-linux",
    },
    Needed {
        paths: &["/usr/bin/nsenter"],
        what: "nsenter (`drover-sandbox exec`)",
        debian: "util-linux",
        fedora: "util-linux",
    },
    Needed {
        paths: &["/usr/bin/dbus-daemon"],
        what: "dbus-daemon (the manager's bus)",
        debian: "dbus",
        fedora: "dbus-daemon",
    },
    Needed {
        paths: &[node::SYSTEMD],
        what: "systemd (one `systemd --user` per node)",
        debian: "systemd",
        fedora: "systemd",
    },
    Needed {
        paths: &[
            "/usr/lib/systemd/user/dbus.socket",
            "/lib/systemd/user/dbus.socket",
            "/etc/systemd/user/dbus.socket",
        ],
        what: "the user-bus socket unit dbus.socket (each node's session bus)",
        debian: "dbus-user-session",
        fedora: "dbus-common",
    },
];

/// What the checks found out about the host; separated from the checks so that tests can
/// describe any host.
pub struct Host<'a> {
    pub is_root: bool,
    pub exists: &'a dyn Fn(&Path) -> bool,
    pub layout: Result<Layout>,
    /// The result of making room for the nodes under the inotify limit.
    pub inotify: Result<()>,
}

/// Checks this host for a sandbox of `nodes` nodes (raising the inotify limit if needed and
/// possible); returns the cgroup layout, or one error that lists every problem.
pub fn check(nodes: usize) -> Result<Layout> {
    let is_root = nix::unistd::geteuid().is_root();
    let host = Host {
        is_root,
        exists: &|p: &Path| p.exists(),
        layout: Layout::detect(),
        // Raising the limit needs root; without root that is reported once, above.
        inotify: if is_root {
            inotify::ensure_capacity(nodes)
        } else {
            Ok(())
        },
    };
    judge(host)
}

/// The verdict on `host`: its layout, or every problem with its fix.
pub fn judge(host: Host<'_>) -> Result<Layout> {
    let mut problems = Vec::new();
    if !host.is_root {
        problems.push(
            "not running as root: the sandbox makes cgroups, mounts and namespaces".to_string(),
        );
    }
    let mut packages: Vec<(&str, &str)> = Vec::new();
    for need in FILES {
        if need.paths.iter().any(|p| (host.exists)(Path::new(p))) {
            continue;
        }
        problems.push(format!(
            "{} is missing ({}): install the package {} (Fedora: {})",
            need.paths[0], need.what, need.debian, need.fedora
        ));
        if !packages.contains(&(need.debian, need.fedora)) {
            packages.push((need.debian, need.fedora));
        }
    }
    if let Err(e) = &host.layout {
        problems.push(format!("cgroups: {e:#}"));
    }
    if let Err(e) = &host.inotify {
        problems.push(format!("inotify: {e:#}"));
    }
    match host.layout {
        Ok(layout) if problems.is_empty() => Ok(layout),
        _ => {
            let mut msg = format!(
                "this host cannot run a sandbox yet ({} problem{}):\n",
                problems.len(),
                if problems.len() == 1 { "" } else { "s" }
            );
            for p in &problems {
                msg.push_str(&format!("  - {p}\n"));
            }
            if !packages.is_empty() {
                let debian: Vec<&str> = packages.iter().map(|p| p.0).collect();
                let fedora: Vec<&str> = packages.iter().map(|p| p.1).collect();
                msg.push_str(&format!(
                    "Install them with `scripts/host-deps demo` (in the source tree), or \
                     `apt-get install {}` (Fedora: `dnf install {}`).",
                    debian.join(" "),
                    fedora.join(" ")
                ));
            }
            bail!(msg.trim_end().to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::anyhow;

    fn hybrid() -> Result<Layout> {
        // A hybrid host as in the cgroup tests: name=systemd + unified.
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
31 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";
        Layout::from_mountinfo(mountinfo, "1:name=systemd:/\n0::/\n", None)
    }

    #[test]
    fn a_complete_host_passes() {
        let layout = judge(Host {
            is_root: true,
            exists: &|_| true,
            layout: hybrid(),
            inotify: Ok(()),
        });
        assert!(layout.is_ok(), "{:#}", layout.err().unwrap());
    }

    #[test]
    fn every_problem_is_reported_at_once_with_its_package() {
        let err = judge(Host {
            is_root: false,
            exists: &|_| false,
            layout: Err(anyhow!("no cgroup hierarchy found")),
            inotify: Err(anyhow!("limit too low")),
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("(8 problems)"), "{err}");
        assert!(err.contains("not running as root"), "{err}");
        for (path, package) in [
            ("/usr/bin/unshare", "util-linux"),
            ("/usr/bin/nsenter", "util-linux"),
            ("/usr/bin/dbus-daemon", "dbus"),
            (node::SYSTEMD, "systemd"),
            ("/usr/lib/systemd/user/dbus.socket", "dbus-user-session"),
        ] {
            let line = err
                .lines()
                .find(|l| l.contains(path))
                .unwrap_or_else(|| panic!("{path} not named in:\n{err}"));
            assert!(
                line.contains(&format!("install the package {package} ")),
                "{line}"
            );
        }
        assert!(err.contains("cgroups: no cgroup hierarchy found"), "{err}");
        assert!(err.contains("inotify: limit too low"), "{err}");
        // One install command with each package once.
        assert!(
            err.contains("apt-get install util-linux dbus systemd dbus-user-session`"),
            "{err}"
        );
        assert!(err.contains("scripts/host-deps demo"), "{err}");
    }

    #[test]
    fn the_user_bus_socket_is_found_in_any_unit_directory() {
        let only_lib = |p: &Path| p != Path::new("/usr/lib/systemd/user/dbus.socket");
        assert!(
            judge(Host {
                is_root: true,
                exists: &only_lib,
                layout: hybrid(),
                inotify: Ok(()),
            })
            .is_ok()
        );
        let no_socket = |p: &Path| !p.ends_with("dbus.socket");
        let err = judge(Host {
            is_root: true,
            exists: &no_socket,
            layout: hybrid(),
            inotify: Ok(()),
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("(1 problem)"), "{err}");
        assert!(
            err.contains("dbus-user-session (Fedora: dbus-common)"),
            "{err}"
        );
    }
}
