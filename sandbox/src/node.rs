//! One node: a `systemd --user` manager in its own mount + cgroup namespace.
//!
//! Layout of a node directory `<dir>/<node>/`: it is the node's `HOME`; `rt/` is its
//! `XDG_RUNTIME_DIR` (systemd's socket-activated dbus-daemon listens on `rt/bus`);
//! `config/` is its `XDG_CONFIG_HOME`, so unit files go to `<dir>/<node>/config/systemd/user/`;
//! `unit-logs/` holds what the proxy units print (a node has no journal).
//! The node's process tree is `unshare` → `sh` (mounts) → `exec systemd --user`: one pid,
//! which is the pid `nsenter` uses to run commands inside the node.
//!
//! Invariant: the node process joins its cgroup before `unshare -C`, so the node's cgroup
//! namespace root is its own sandbox cgroup and two nodes never share a unit cgroup.

use crate::cgroups::{CgroupJoin, Layout};
use crate::process::{self, Spawn};
use anyhow::{Context, Result, bail};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

pub const SYSTEMD: &str = "/lib/systemd/systemd";
/// Host PATH for node processes: systemd and its helpers need the usual directories.
const NODE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The node's `systemd --user` configuration. A node has no journal: a service
/// whose output goes to the journal (systemd's default) fails to connect to it,
/// and its child process reports that on `/dev/console` before exec. On a VM that
/// is a serial line, milliseconds per line on every service start, and the
/// host's console fills with it. Services inherit the node's log file instead.
const MANAGER_CONF: &str = "\
# Written by drover-sandbox: the node has no journal; service output goes to
# the node's log (systemd@NODE.log in the sandbox directory).
[Manager]
DefaultStandardOutput=inherit
DefaultStandardError=inherit
";

/// The node's home directory.
pub fn home(dir: &Path, node: &str) -> PathBuf {
    dir.join(node)
}

/// The node's `XDG_RUNTIME_DIR`.
pub fn runtime_dir(dir: &Path, node: &str) -> PathBuf {
    home(dir, node).join("rt")
}

/// Where the node's user unit files live.
pub fn unit_dir(dir: &Path, node: &str) -> PathBuf {
    home(dir, node).join("config").join("systemd").join("user")
}

/// Where the node's proxy units write their output (the node has no journal).
pub fn unit_log_dir(dir: &Path, node: &str) -> PathBuf {
    home(dir, node).join("unit-logs")
}

/// `unix:path=<node>/rt/bus`: the node's bus, where its systemd is `org.freedesktop.systemd1`.
pub fn bus_address(dir: &Path, node: &str) -> String {
    format!("unix:path={}", runtime_dir(dir, node).join("bus").display())
}

/// The environment of processes running "in" the node (its systemd, `exec`, agents).
pub fn env(dir: &Path, node: &str) -> Vec<(String, String)> {
    vec![
        (
            "XDG_RUNTIME_DIR".into(),
            runtime_dir(dir, node).display().to_string(),
        ),
        (
            "XDG_CONFIG_HOME".into(),
            home(dir, node).join("config").display().to_string(),
        ),
        ("HOME".into(), home(dir, node).display().to_string()),
        ("DBUS_SESSION_BUS_ADDRESS".into(), bus_address(dir, node)),
    ]
}

/// Creates a fresh node directory (a stale one from an earlier run is removed first).
pub fn prepare_dirs(dir: &Path, node: &str) -> Result<()> {
    let home = home(dir, node);
    if home.exists() {
        std::fs::remove_dir_all(&home)
            .with_context(|| format!("removing stale node directory {}", home.display()))?;
    }
    std::fs::create_dir_all(unit_dir(dir, node))
        .with_context(|| format!("creating {}", unit_dir(dir, node).display()))?;
    let manager_conf = home.join("config").join("systemd").join("user.conf");
    std::fs::write(&manager_conf, MANAGER_CONF)
        .with_context(|| format!("writing {}", manager_conf.display()))?;
    let rt = runtime_dir(dir, node);
    std::fs::create_dir_all(&rt).with_context(|| format!("creating {}", rt.display()))?;
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod 700 {}", rt.display()))?;
    Ok(())
}

/// The script run inside the new namespaces: private /run that says "booted with
/// systemd", with the inaccessible nodes PID 1 makes at boot (units with
/// `ProtectHome=`, `ProtectKernelTunables=`, `ProtectKernelLogs=` or
/// `InaccessiblePaths=` mount them over what they hide; without them such a
/// unit fails with status 226/NAMESPACE), the node's own view of the cgroup
/// trees, then systemd itself.
pub fn script(layout: &Layout) -> String {
    let mut s = String::from(
        "set -e\nmount -t tmpfs -o mode=755 tmpfs /run\nmkdir -p /run/systemd/system\n\
         mkdir -p /run/systemd/inaccessible\ncd /run/systemd/inaccessible\n\
         touch reg\nmkdir dir\nmkfifo fifo\nmknod chr c 0 0\nmknod blk b 0 0\n\
         chmod 0000 reg dir fifo chr blk\ncd /\n",
    );
    s.push_str(&layout.node_mount_script());
    s.push_str(&format!("exec {SYSTEMD} --user\n"));
    s
}

/// Starts the node; returns the child whose pid is the node's systemd.
pub fn spawn(
    layout: &Layout,
    join: &CgroupJoin,
    dir: &Path,
    node: &str,
    log: PathBuf,
) -> Result<Child> {
    let mut node_env = env(dir, node);
    node_env.push(("PATH".into(), NODE_PATH.into()));
    node_env.push(("LANG".into(), "C.UTF-8".into()));
    let unshare = Path::new("/usr/bin/unshare");
    process::spawn(Spawn {
        program: unshare,
        args: vec![
            "-m".into(),
            "-C".into(),
            "--propagation".into(),
            "private".into(),
            "/bin/sh".into(),
            "-c".into(),
            script(layout),
        ],
        env: node_env,
        clear_env: true,
        log,
        cgroup: join,
        listen_fd: None,
        stdout_pipe: false,
    })
    .with_context(|| format!("starting node {node}"))
}

/// Waits until the node's systemd answers on its bus and finished starting up.
pub async fn wait_ready(
    dir: &Path,
    node: &str,
    pid: u32,
    log: &Path,
    timeout: Duration,
) -> Result<()> {
    let address = bus_address(dir, node);
    let deadline = Instant::now() + timeout;
    let mut last;
    loop {
        if !process::alive(pid) {
            bail!(
                "node {node}: systemd --user (pid {pid}) exited during startup\n{}",
                process::log_tail(log, 30)
            );
        }
        match crate::bus::systemd_state(&address).await {
            Ok(state) if state == "running" || state == "degraded" => return Ok(()),
            Ok(state) => last = format!("SystemState={state}"),
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            bail!(
                "node {node}: systemd on {address} did not become ready within {timeout:?} ({last})\n{}",
                process::log_tail(log, 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `nsenter` into the node whose systemd is `pid` and run `argv` there with the node env.
pub fn exec_command(dir: &Path, node: &str, pid: u32, argv: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new("/usr/bin/nsenter");
    cmd.arg("-t")
        .arg(pid.to_string())
        .args(["-m", "-C", "--"])
        .args(argv)
        .envs(env(dir, node));
    cmd
}
