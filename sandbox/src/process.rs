//! Starting and stopping the long-lived processes of a sandbox.
//!
//! Every process is started in its own session (so a Ctrl-C aimed at the caller's terminal
//! does not reach it and it can outlive `drover-sandbox up`), with its stdout and stderr in
//! a log file, and inside a sandbox cgroup joined before `exec` (so teardown finds it even
//! if the creator died). A socket-activated child gets the listener as fd 3.
//!
//! A process counts as stopped only once it is reaped ([`settle`]): one that has begun to
//! exit (its sockets already closed, so the manager may already report its node offline)
//! but is not yet a zombie is waited for, never taken for a running one.

use crate::cgroups::CgroupJoin;
use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Environment variables that must not leak from the caller into a sandbox daemon.
const SCRUBBED_ENV: &[&str] = &[
    "DROVER_BUS",
    "DROVER_SANDBOX_DIR",
    "DBUS_SESSION_BUS_ADDRESS",
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "INVOCATION_ID",
];

/// What to start.
pub struct Spawn<'a> {
    pub program: &'a Path,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Start from an empty environment instead of the caller's (minus `SCRUBBED_ENV`).
    pub clear_env: bool,
    pub log: PathBuf,
    pub cgroup: &'a CgroupJoin,
    /// Pass this listening socket as fd 3 with `LISTEN_FDS=1` and `LISTEN_PID` = the child.
    pub listen_fd: Option<RawFd>,
    /// Pipe stdout back to the caller (for `dbus-daemon --print-address`).
    pub stdout_pipe: bool,
}

/// Starts `spec`; the child is in a new session and in the given cgroups before it execs.
pub fn spawn(spec: Spawn<'_>) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)
        .with_context(|| format!("opening log file {}", spec.log.display()))?;
    let log_out = log.try_clone().context("duplicating the log file handle")?;

    let mut cmd = if spec.listen_fd.is_some() {
        // LISTEN_PID must be the pid of the process that finally runs the daemon. A shell
        // knows its own pid ($$) and keeps it across `exec`, so it sets the variable;
        // setting it by hand between fork and exec would not reach std's prepared envp.
        let mut c = Command::new("/bin/sh");
        c.arg("-c")
            .arg("LISTEN_PID=$$ LISTEN_FDS=1; export LISTEN_PID LISTEN_FDS; exec \"$0\" \"$@\"")
            .arg(spec.program)
            .args(&spec.args);
        c
    } else {
        let mut c = Command::new(spec.program);
        c.args(&spec.args);
        c
    };
    if spec.clear_env {
        cmd.env_clear();
    } else {
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    cmd.stdin(Stdio::null()).stderr(log);
    if spec.stdout_pipe {
        cmd.stdout(Stdio::piped());
    } else {
        cmd.stdout(log_out);
    }

    let join = spec.cgroup.clone();
    let listen_fd = spec.listen_fd;
    // SAFETY: the hook only makes async-signal-safe syscalls (open/write/close, setsid,
    // dup2, fcntl) on data prepared before the fork. They stay raw libc calls on
    // purpose: between fork and exec nothing may allocate or take a lock, which std's
    // wrappers (and nix's path handling) do not promise.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            // Join first: the open() calls inside may take fd 3 before we dup2 onto it.
            join.join_self()?;
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = listen_fd {
                if fd == 3 {
                    let flags = libc::fcntl(3, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, 3) < 0 {
                    // dup2 clears FD_CLOEXEC on the new descriptor.
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn()
        .with_context(|| format!("starting {}", spec.program.display()))
}

/// The listener's fd, for [`Spawn::listen_fd`].
pub fn raw_fd(listener: &std::net::TcpListener) -> RawFd {
    listener.as_raw_fd()
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: Signal) -> Result<()> {
    let raw = i32::try_from(pid).context("pid out of range")?;
    kill(Pid::from_raw(raw), sig).with_context(|| format!("sending {sig} to pid {pid}"))
}

/// One look at `child`: `Some(Some(status))` once it exited, `Some(None)` when
/// `deadline` passed first, `None` to look again later.
fn exited_by(child: &mut Child, deadline: Instant) -> Result<Option<Option<ExitStatus>>> {
    if let Some(status) = child.try_wait().context("waiting for a child")? {
        return Ok(Some(Some(status)));
    }
    Ok((Instant::now() >= deadline).then_some(None))
}

/// Waits for `child` to exit (polling, so it works from async code and from `Drop`).
/// Returns `None` on timeout.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(ended) = exited_by(child, deadline)? {
            return Ok(ended);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Async flavour of [`wait_timeout`].
pub async fn wait_timeout_async(
    child: &mut Child,
    timeout: Duration,
) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(ended) = exited_by(child, deadline)? {
            return Ok(ended);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `PF_EXITING` in the flags of `/proc/PID/stat`: the task has entered `do_exit`.
const PF_EXITING: u64 = 0x4;

/// SIGKILL's bit in the pending-signal masks of `/proc/PID/status`.
const SIGKILL_BIT: u64 = 1 << (Signal::SIGKILL as u64 - 1);

/// Whether `pid` has begun to exit: a SIGKILL is pending for it, it is past the start of
/// `do_exit` (which closes its files, sockets included, before it becomes a zombie), or
/// it is a zombie. A pid that is gone is not "exiting": it has exited. (The pending mask
/// is read before the flags: a SIGKILL leaves the mask only to set `PF_EXITING`.)
pub fn exiting(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    if kill_pending(&status) {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| exiting_by_stat(&stat))
}

/// Whether `/proc/PID/status` text shows a SIGKILL pending (for the thread or the process).
fn kill_pending(status: &str) -> bool {
    status.lines().any(|line| {
        line.strip_prefix("ShdPnd:")
            .or_else(|| line.strip_prefix("SigPnd:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & SIGKILL_BIT != 0)
    })
}

/// Whether `/proc/PID/stat` text shows a zombie or a task with `PF_EXITING`.
fn exiting_by_stat(stat: &str) -> bool {
    // Fields after the ')' closing the command name: state, ppid, pgrp, session,
    // tty_nr, tpgid, flags, ...
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or_default();
    let flags = fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or_default();
    state == "Z" || state == "X" || flags & PF_EXITING != 0
}

/// How long [`settle`] waits for an exiting child to be reapable. Exiting is not
/// optional for such a process: this bounds only a kernel that is very slow about it.
const EXIT_GRACE: Duration = Duration::from_secs(10);

/// `Some(status)` once `child` has exited, waiting for it (bounded) when it has begun
/// to exit but is not reapable yet; `None` while it runs on. This is the one test of
/// "is it still running" before starting a replacement: `try_wait` alone misses the
/// window between an exit's closing of the sockets and the zombie.
pub async fn settle(child: &mut Child) -> Result<Option<ExitStatus>> {
    if let Some(status) = child.try_wait().context("waiting for a child")? {
        return Ok(Some(status));
    }
    if !exiting(child.id()) {
        return Ok(None);
    }
    match wait_timeout_async(child, EXIT_GRACE).await? {
        Some(status) => Ok(Some(status)),
        None => bail!(
            "pid {} began to exit but was not reapable within {EXIT_GRACE:?}",
            child.id()
        ),
    }
}

/// SIGTERM (and SIGCONT, in case it is stopped), wait up to `grace`, then SIGKILL; reaps.
pub async fn terminate(child: &mut Child, grace: Duration) -> Result<ExitStatus> {
    if let Some(status) = child.try_wait().context("waiting for a child")? {
        return Ok(status);
    }
    let pid = child.id();
    // The process may exit between the check and the signal; ESRCH is fine then.
    let _ = signal(pid, Signal::SIGTERM);
    let _ = signal(pid, Signal::SIGCONT);
    if let Some(status) = wait_timeout_async(child, grace).await? {
        return Ok(status);
    }
    let _ = signal(pid, Signal::SIGKILL);
    match wait_timeout_async(child, Duration::from_secs(5)).await? {
        Some(status) => Ok(status),
        None => bail!("pid {pid} survived SIGKILL for 5 s"),
    }
}

/// SIGKILL and reap, synchronously (for `Drop`).
pub fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
        let _ = wait_timeout(child, Duration::from_secs(5));
    }
}

/// Whether `pid` names a live (not zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the ')' closing the command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// The last `lines` lines of a log file (or a note that it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            let start = all.len().saturating_sub(lines);
            let tail = all[start..].join("\n");
            if tail.is_empty() {
                format!("({} is empty)", path.display())
            } else {
                format!("--- last lines of {} ---\n{tail}", path.display())
            }
        }
        Err(e) => format!("({}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNNING: &str =
        "4242 (drover-agent) S 1 4242 4242 0 -1 4194560 120 0 0 0 3 1 0 0 20 0 3 0";

    #[test]
    fn an_exit_under_way_counts_as_exiting() {
        assert!(!exiting_by_stat(RUNNING));
        // PF_EXITING (0x4) set: past the start of do_exit, sockets may be closed already.
        let exiting = RUNNING.replace(" 4194560 ", &format!(" {} ", 4194560 | 4));
        assert!(exiting_by_stat(&exiting));
        assert!(exiting_by_stat(&RUNNING.replace(") S ", ") Z ")));
        // A command name with ") S " in it does not confuse the parse.
        let tricky = RUNNING.replace("(drover-agent)", "(a) S 1 2 3 4 5 4 (b)");
        assert!(!exiting_by_stat(&tricky));
        assert!(!exiting_by_stat("garbage"));
        assert!(!exiting_by_stat(""));
    }

    #[test]
    fn a_pending_sigkill_counts_as_exiting() {
        let status = |sig: &str, shd: &str| {
            format!(
                "Name:\tdrover-agent\nState:\tR (running)\nSigPnd:\t{sig}\nShdPnd:\t{shd}\nSigBlk:\t0000000000000000\n"
            )
        };
        assert!(!kill_pending(&status(
            "0000000000000000",
            "0000000000000000"
        )));
        // SIGTERM (15) pending is no exit yet.
        assert!(!kill_pending(&status(
            "0000000000004000",
            "0000000000004000"
        )));
        assert!(kill_pending(&status(
            "0000000000000000",
            "0000000000000100"
        )));
        assert!(kill_pending(&status(
            "0000000000000100",
            "0000000000000000"
        )));
        assert!(!kill_pending("SigPnd:\tnot-hex\n"));
    }

    #[tokio::test]
    async fn settle_tells_running_from_exited_children() {
        let mut sleeper = Command::new("/bin/sleep").arg("600").spawn().unwrap();
        assert!(!exiting(sleeper.id()));
        assert_eq!(settle(&mut sleeper).await.unwrap(), None, "runs on");
        signal(sleeper.id(), Signal::SIGKILL).unwrap();
        // Killed, reaped or not yet: settle waits for the exit instead of calling it running.
        let status = settle(&mut sleeper).await.unwrap().expect("exited");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );

        let mut quick = Command::new("/bin/true").spawn().unwrap();
        // A zombie is exiting until it is reaped.
        while alive(quick.id()) {
            tokio::task::yield_now().await;
        }
        assert!(exiting(quick.id()));
        assert!(
            settle(&mut quick)
                .await
                .unwrap()
                .is_some_and(|s| s.success())
        );
        assert!(!exiting(quick.id()), "reaped: gone");
    }
}
