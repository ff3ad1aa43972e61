//! Cgroups of one sandbox: layout detection, creation, joining, killing, removal.
//!
//! Every sandbox owns one parent cgroup `drover-sandbox-<id>` in every hierarchy it uses,
//! with one child per node plus `procs` (the private bus, the manager and the agents).
//! Invariants:
//! * the parent's name carries the sandbox id, so parallel sandboxes never share a cgroup;
//! * every process the sandbox starts joins its cgroup *before* it execs (in `pre_exec`),
//!   so no process can fork out of reach, and a node's `unshare -C` makes that cgroup the
//!   node's cgroup root;
//! * teardown needs nothing but the parent paths (they are recorded in `state.json`): kill
//!   every pid below them until none is left, then `rmdir` deepest first.
//!
//! Layouts: on a *hybrid* host (v1 controllers + `name=systemd` + cgroup2 at `unified`) the
//! sandbox uses `name=systemd`, `pids`, `memory`, `cpu` and `unified`, each at the root of
//! its hierarchy. On a *pure v2* host it uses the single cgroup2 tree, under the cgroup this
//! process runs in (run it inside a delegated scope, e.g. `systemd-run --scope -p Delegate=yes`),
//! or under `$DROVER_SANDBOX_CGROUP` (a path relative to the cgroup2 mount) when set.

use anyhow::{Context, Result, bail};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The v1 hierarchies a node manager uses (besides the named `systemd` one).
const V1_CONTROLLERS: &[&str] = &["pids", "memory", "cpu"];

/// One cgroup hierarchy the sandbox uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Where the hierarchy is mounted on the host, e.g. `/sys/fs/cgroup/pids`.
    pub host_mount: PathBuf,
    /// Directory under which sandbox parents are created.
    pub base: PathBuf,
    /// `-t` of the remount inside a node: `cgroup` or `cgroup2`.
    pub fstype: &'static str,
    /// `-o` of the remount inside a node (empty for cgroup2).
    pub options: String,
    /// Mount point inside a node, e.g. `/sys/fs/cgroup/pids`.
    pub node_mount: String,
}

/// The cgroup layout of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// `true` for a pure cgroup2 host (one hierarchy mounted at `/sys/fs/cgroup`).
    pub unified_only: bool,
    pub hierarchies: Vec<Hierarchy>,
}

impl Layout {
    /// Reads the host's layout from `/proc/self/mountinfo` and `/proc/self/cgroup`.
    pub fn detect() -> Result<Self> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .context("reading /proc/self/mountinfo")?;
        let own =
            std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
        let base_override = std::env::var("DROVER_SANDBOX_CGROUP").ok();
        Self::from_mountinfo(&mountinfo, &own, base_override.as_deref())
    }

    /// The pure part of [`Layout::detect`], separated for tests.
    pub fn from_mountinfo(
        mountinfo: &str,
        own_cgroup: &str,
        base_override: Option<&str>,
    ) -> Result<Self> {
        let mut v1 = Vec::new();
        let mut v2_mounts = Vec::new();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mount_point) = left.split(' ').nth(4) else {
                continue;
            };
            let mut right = right.split(' ');
            let (Some(fstype), Some(_source), Some(super_opts)) =
                (right.next(), right.next(), right.next())
            else {
                continue;
            };
            if !mount_point.starts_with("/sys/fs/cgroup") {
                continue;
            }
            match fstype {
                "cgroup" => v1.push((PathBuf::from(mount_point), super_opts.to_string())),
                "cgroup2" => v2_mounts.push(PathBuf::from(mount_point)),
                _ => {}
            }
        }

        let named_systemd = v1
            .iter()
            .find(|(_, opts)| opts.split(',').any(|o| o == "name=systemd"));
        if let Some((systemd_mount, _)) = named_systemd {
            let mut hierarchies = vec![Hierarchy {
                host_mount: systemd_mount.clone(),
                base: systemd_mount.clone(),
                fstype: "cgroup",
                options: "none,name=systemd".to_string(),
                node_mount: "/sys/fs/cgroup/systemd".to_string(),
            }];
            for controller in V1_CONTROLLERS {
                let found = v1
                    .iter()
                    .find(|(_, opts)| opts.split(',').any(|o| o == *controller));
                let Some((mount, opts)) = found else { continue };
                if hierarchies.iter().any(|h| &h.host_mount == mount) {
                    continue; // co-mounted with one we already have (cpu,cpuacct)
                }
                let controllers: Vec<&str> = opts
                    .split(',')
                    .filter(|o| is_controller_option(o))
                    .collect();
                let dir_name = mount
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| controller.to_string());
                hierarchies.push(Hierarchy {
                    host_mount: mount.clone(),
                    base: mount.clone(),
                    fstype: "cgroup",
                    options: controllers.join(","),
                    node_mount: format!("/sys/fs/cgroup/{dir_name}"),
                });
            }
            if let Some(unified) = v2_mounts
                .iter()
                .find(|m| m.as_path() == Path::new("/sys/fs/cgroup/unified"))
            {
                hierarchies.push(Hierarchy {
                    host_mount: unified.clone(),
                    base: unified.clone(),
                    fstype: "cgroup2",
                    options: String::new(),
                    node_mount: "/sys/fs/cgroup/unified".to_string(),
                });
            }
            return Ok(Layout {
                unified_only: false,
                hierarchies,
            });
        }

        if let Some(root) = v2_mounts
            .iter()
            .find(|m| m.as_path() == Path::new("/sys/fs/cgroup"))
        {
            let relative = match base_override {
                Some(path) => path.trim_start_matches('/').to_string(),
                None => own_cgroup
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .map(|p| p.trim_start_matches('/').to_string())
                    .context("no cgroup2 entry in /proc/self/cgroup")?,
            };
            if relative.split('/').any(|c| c == "..") {
                bail!("DROVER_SANDBOX_CGROUP must not contain '..'");
            }
            return Ok(Layout {
                unified_only: true,
                hierarchies: vec![Hierarchy {
                    host_mount: root.clone(),
                    base: root.join(relative),
                    fstype: "cgroup2",
                    options: String::new(),
                    node_mount: "/sys/fs/cgroup".to_string(),
                }],
            });
        }

        bail!(
            "unsupported cgroup layout: need either a hybrid host (cgroup v1 'name=systemd' under \
             /sys/fs/cgroup) or a pure cgroup2 host (cgroup2 at /sys/fs/cgroup)"
        )
    }

    /// The shell commands, run inside a fresh mount + cgroup namespace, that mount the
    /// node's own view of the cgroup trees (its cgroup becomes their root).
    pub fn node_mount_script(&self) -> String {
        let mut script = String::new();
        if self.unified_only {
            script.push_str("mount -t cgroup2 cgroup2 /sys/fs/cgroup\n");
            return script;
        }
        script.push_str("mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup\n");
        for h in &self.hierarchies {
            // Options and names come from the kernel's mount table ([a-z,=_]), never from users.
            script.push_str(&format!("mkdir -p '{}'\n", h.node_mount));
            if h.fstype == "cgroup2" {
                script.push_str(&format!("mount -t cgroup2 cgroup2 '{}'\n", h.node_mount));
            } else {
                script.push_str(&format!(
                    "mount -t cgroup -o '{}' cgroup '{}'\n",
                    h.options, h.node_mount
                ));
            }
            // Co-mounted controllers (cpu,cpuacct) are reached through per-controller links.
            if let Some(dir) = h.node_mount.strip_prefix("/sys/fs/cgroup/")
                && dir.contains(',')
            {
                for c in dir.split(',') {
                    script.push_str(&format!("ln -s '{dir}' '/sys/fs/cgroup/{c}'\n"));
                }
            }
        }
        script
    }
}

fn is_controller_option(option: &str) -> bool {
    option.starts_with("name=")
        || matches!(
            option,
            "cpu"
                | "cpuacct"
                | "cpuset"
                | "memory"
                | "pids"
                | "blkio"
                | "devices"
                | "freezer"
                | "net_cls"
                | "net_prio"
                | "perf_event"
                | "hugetlb"
                | "rdma"
                | "misc"
        )
}

/// The cgroups of one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxCgroups {
    /// `drover-sandbox-<id>` in every hierarchy.
    pub parents: Vec<PathBuf>,
}

/// The name of the group (below each parent) for the sandbox's own daemons.
pub const PROCS_GROUP: &str = "procs";

impl SandboxCgroups {
    /// The parent paths a sandbox with `id` uses in `layout` (nothing is created).
    pub fn for_id(layout: &Layout, id: &str) -> Self {
        let parents = layout
            .hierarchies
            .iter()
            .map(|h| h.base.join(format!("drover-sandbox-{id}")))
            .collect();
        SandboxCgroups { parents }
    }

    /// Creates `<parent>/<group>` in every hierarchy.
    pub fn create_group(&self, group: &str) -> Result<()> {
        for parent in &self.parents {
            let dir = parent.join(group);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("creating cgroup {}", dir.display()))?;
        }
        Ok(())
    }

    /// What a child must do to join `group` before it execs.
    pub fn join_spec(&self, group: &str) -> Result<CgroupJoin> {
        let procs = self
            .parents
            .iter()
            .map(|p| {
                let path = p.join(group).join("cgroup.procs");
                CString::new(path.as_os_str().as_bytes())
                    .with_context(|| format!("cgroup path {} contains a NUL byte", path.display()))
            })
            .collect::<Result<_>>()?;
        Ok(CgroupJoin { procs })
    }

    /// Every pid in any cgroup of this sandbox.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for parent in &self.parents {
            for dir in walk_dirs(parent) {
                if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
                }
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// SIGKILLs every process in the sandbox's cgroups until none is left (bounded).
    pub fn kill_all(&self, timeout: Duration) -> Result<()> {
        let me = std::process::id() as i32;
        let deadline = Instant::now() + timeout;
        loop {
            // cgroup.kill (cgroup2, Linux 5.14+) kills a whole subtree atomically, forks included.
            for parent in &self.parents {
                let kill_file = parent.join("cgroup.kill");
                if kill_file.exists() {
                    let _ = std::fs::write(&kill_file, "1");
                }
            }
            let pids: Vec<i32> = self.pids().into_iter().filter(|p| *p != me).collect();
            if pids.is_empty() {
                return Ok(());
            }
            for pid in &pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "processes {pids:?} are still alive in the sandbox cgroups after {timeout:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Removes every cgroup of the sandbox, deepest first (bounded retries: a cgroup stays
    /// busy for a moment after its last process died).
    pub fn remove(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut failures = Vec::new();
        for parent in &self.parents {
            let mut dirs = walk_dirs(parent);
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for dir in dirs {
                loop {
                    match std::fs::remove_dir(&dir) {
                        Ok(()) => break,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                        Err(e) if Instant::now() < deadline => {
                            let _ = e;
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => {
                            failures.push(format!("{}: {e}", dir.display()));
                            break;
                        }
                    }
                }
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            bail!("could not remove cgroups: {}", failures.join("; "))
        }
    }

    /// Whether any cgroup directory of the sandbox still exists.
    pub fn any_exists(&self) -> bool {
        self.parents.iter().any(|p| p.exists())
    }
}

/// All directories at and below `root` (cgroupfs holds no symlinks); empty if `root` is gone.
fn walk_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
        out.push(dir);
    }
    out
}

/// Pre-built `cgroup.procs` paths a freshly forked child writes `0` ("myself") into.
#[derive(Debug, Clone)]
pub struct CgroupJoin {
    procs: Vec<CString>,
}

impl CgroupJoin {
    /// Moves the calling process into the cgroups. Runs between fork and exec, so it only
    /// makes raw syscalls on data prepared before the fork (no allocation): that is why
    /// these are libc calls, not `std::fs` (which allocates a path and may lock).
    ///
    /// # Safety
    /// Call only in a `pre_exec` hook (a single-threaded child right after fork).
    pub unsafe fn join_self(&self) -> std::io::Result<()> {
        for path in &self.procs {
            // SAFETY: `path` is a valid NUL-terminated string; the fd is closed below.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: writing one byte from a static buffer to the fd we just opened.
            let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
            let err = std::io::Error::last_os_error();
            // SAFETY: closing our own fd.
            unsafe { libc::close(fd) };
            if n != 1 {
                return Err(err);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 24 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
35 30 0:31 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
36 30 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_layout_uses_the_five_hierarchies() {
        let l = Layout::from_mountinfo(HYBRID, "0::/\n", None).unwrap();
        assert!(!l.unified_only);
        let mounts: Vec<_> = l
            .hierarchies
            .iter()
            .map(|h| h.node_mount.as_str())
            .collect();
        assert_eq!(
            mounts,
            [
                "/sys/fs/cgroup/systemd",
                "/sys/fs/cgroup/pids",
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/cpu",
                "/sys/fs/cgroup/unified"
            ]
        );
        assert_eq!(l.hierarchies[0].options, "none,name=systemd");
        assert_eq!(l.hierarchies[3].options, "cpu");
        let script = l.node_mount_script();
        assert!(
            script.contains("mount -t cgroup -o 'pids' cgroup '/sys/fs/cgroup/pids'"),
            "{script}"
        );
        assert!(
            script.contains("mount -t cgroup2 cgroup2 '/sys/fs/cgroup/unified'"),
            "{script}"
        );
    }

    #[test]
    fn comounted_cpu_cpuacct_is_mounted_once_with_links() {
        let info = "\
31 30 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 30 0:31 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
";
        let l = Layout::from_mountinfo(info, "", None).unwrap();
        assert_eq!(l.hierarchies.len(), 2);
        assert_eq!(l.hierarchies[1].options, "cpu,cpuacct");
        let script = l.node_mount_script();
        assert!(
            script.contains("ln -s 'cpu,cpuacct' '/sys/fs/cgroup/cpuacct'"),
            "{script}"
        );
    }

    #[test]
    fn pure_v2_layout_nests_under_own_or_given_cgroup() {
        let info = "30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let l = Layout::from_mountinfo(info, "0::/user.slice/run-u5.scope\n", None).unwrap();
        assert!(l.unified_only);
        assert_eq!(
            l.hierarchies[0].base,
            Path::new("/sys/fs/cgroup/user.slice/run-u5.scope")
        );
        assert_eq!(
            l.node_mount_script(),
            "mount -t cgroup2 cgroup2 /sys/fs/cgroup\n"
        );
        let l = Layout::from_mountinfo(info, "0::/x\n", Some("/delegated/here")).unwrap();
        assert_eq!(
            l.hierarchies[0].base,
            Path::new("/sys/fs/cgroup/delegated/here")
        );
        assert!(Layout::from_mountinfo(info, "0::/x\n", Some("../escape")).is_err());
    }

    #[test]
    fn no_cgroups_is_a_clear_error() {
        let err = Layout::from_mountinfo("", "", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unsupported cgroup layout"), "{err}");
    }
}
