//! Things a test starts or makes outside a cluster, each undone in `Drop`: a child
//! process ([`ChildGuard`]), a child with all it started ([`GroupGuard`]), a temp
//! directory ([`TempDir`]); what a finished process
//! printed ([`Run`]); where the workspace's binaries are ([`bin`]); a free loopback port
//! ([`free_port`]).

pub use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Where cargo put the workspace binary `name`: `$DROVER_BIN_DIR` when set, else
/// `target/<profile>`, found from the running test binary (`target/<profile>/deps/<test>`).
/// A crate's tests of its own binary use `env!("CARGO_BIN_EXE_…")` instead, which cargo
/// builds for them; the others need `cargo build --workspace` first (`make test` does it).
pub fn bin(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("DROVER_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    profile_dir.join(name)
}

/// A port on 127.0.0.1 that was free a moment ago (for a daemon given `-p PORT`).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local address").port()
}

/// A process that ran to its end: exit code, stdout and stderr as text.
#[derive(Clone, Debug)]
pub struct Run {
    /// The exit code; -1 when a signal ended it.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Run {
    fn from(out: std::process::Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Run {
    /// (exit code, stdout, stderr).
    pub fn parts(self) -> (i32, String, String) {
        (self.code, self.stdout, self.stderr)
    }

    pub fn success(&self) -> bool {
        self.code == 0
    }

    /// Asserts the process succeeded; returns its stdout.
    pub fn ok(self) -> String {
        assert!(
            self.success(),
            "exit code {}\nstdout: {}\nstderr: {}",
            self.code,
            self.stdout,
            self.stderr
        );
        self.stdout
    }
}

/// A child process killed and reaped on drop (also when the test fails).
pub struct ChildGuard(Option<Child>);

impl ChildGuard {
    pub fn new(child: Child) -> ChildGuard {
        ChildGuard(Some(child))
    }

    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("the child is still guarded")
    }

    pub fn pid(&self) -> u32 {
        self.0.as_ref().expect("the child is still guarded").id()
    }

    /// Sends `sig` to the child.
    pub fn signal(&self, sig: Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).expect("pid fits"));
        nix::sys::signal::kill(pid, sig).unwrap_or_else(|e| panic!("kill -{sig} {pid}: {e}"));
    }

    /// SIGKILL, then reap (a crash, as a test causes one).
    pub fn kill(&mut self) {
        let child = self.child();
        child.kill().expect("kill our child");
        child.wait().expect("reap our child");
    }

    /// The exit status, if the child has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child().try_wait().expect("try_wait on our child")
    }

    /// Waits up to `limit` for the child to exit; panics if it does not.
    pub async fn exited(&mut self, limit: Duration) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.try_wait() {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pid {} did not exit within {limit:?}",
                self.pid()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (blocking) for the exit and collects what the child printed to its piped
    /// stdout and stderr; run it with `spawn_blocking` from async code.
    pub fn wait_with_output(mut self) -> std::process::Output {
        let child = self.0.take().expect("the child is still guarded");
        child.wait_with_output().expect("wait for our child")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory under the temp dir (`<tag>-<pid>-<n>`), removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` inside the directory (not created).
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes `text` to `name` inside the directory; returns its path.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// The text of `name` inside the directory ("" while it does not exist).
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.join(name)).unwrap_or_default()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A process group a test started a child in (its command's `process_group(0)`, so the
/// group's id is the child's pid), killed whole on drop, also when the test fails: the
/// child and every process it started that stayed in its group. A kill of the child
/// alone (`ChildGuard`, tokio's `kill_on_drop`) would leave those running, orphaned.
pub struct GroupGuard(nix::unistd::Pid);

impl GroupGuard {
    /// Guards the group that `pid` leads; panics when `pid` leads no group (its command
    /// lacked `process_group(0)`), since killing the group would then reach nothing of it.
    pub fn new(pid: u32) -> GroupGuard {
        let raw = i32::try_from(pid).expect("pid fits");
        assert_eq!(
            group_of(raw),
            Some(raw),
            "pid {pid} leads no process group: start it with process_group(0)"
        );
        GroupGuard(nix::unistd::Pid::from_raw(raw))
    }

    /// The group's id (its leader's pid).
    pub fn id(&self) -> u32 {
        self.0.as_raw().unsigned_abs()
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        // ESRCH (the group is gone already) is the outcome wanted.
        let _ = nix::sys::signal::killpg(self.0, Signal::SIGKILL);
    }
}

/// The processes of the group `pgid` that are still alive (a zombie is dead: it only
/// waits to be reaped).
pub fn live_in_group(pgid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat_fields(&stat).is_some_and(|(state, pgrp)| {
                i64::from(pgrp) == i64::from(pgid) && state != 'Z' && state != 'X'
            })
        })
        .map(i32::unsigned_abs)
        .collect()
}

/// The process group of `pid`, from `/proc/PID/stat`.
fn group_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields(&stat).map(|(_, pgrp)| pgrp)
}

/// State and process group from `/proc/PID/stat` text (the fields after the `)` that
/// closes the command name: state, ppid, pgrp, ...).
fn stat_fields(stat: &str) -> Option<(char, i32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some((state, pgrp))
}
