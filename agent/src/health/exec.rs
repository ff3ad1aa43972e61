//! `HealthCmd=`: one run of a check command.
//!
//! * **As whom.** The command runs as the unit's `User=` and `Group=`
//!   ([`RunAs::resolve`]): the user's uid, the group (or the user's primary
//!   group) and the user's supplementary groups, set in the child before
//!   `exec` (`setgroups`, `setgid`, `setuid`, in that order, so the process
//!   can never regain root). A unit without `User=` runs its check as the
//!   agent's own user: root for the system manager, the user for a user
//!   manager. A user that does not exist is an error (the check fails with
//!   the reason), never a fallback to root.
//! * **How.** `argv` is executed directly, without a shell (a command that
//!   wants one says `/bin/sh -c '…'`), with stdin from `/dev/null`, `/` as
//!   the working directory and a small fixed environment (`PATH`, `HOME`,
//!   `USER`, `LOGNAME`, `SHELL` of the user, `LANG=C.UTF-8`, and
//!   `DROVER_UNIT` naming the unit).
//! * **Bounded.** The command gets its own process group. When it does not
//!   exit within the timeout the whole group is killed (`SIGKILL`) and the
//!   check fails ("timed out"); when it exits, what it left running in its
//!   group is killed too, so a check leaves nothing behind. (A process that
//!   leaves the group on purpose, with `setsid`, is out of reach; the unit's
//!   own cgroup is not the agent's to use.) stdout and stderr share one
//!   pipe (as `2>&1` does, so their lines keep their order); the first
//!   [`OUTPUT_MAX`] bytes are kept, the rest is read and dropped, so a
//!   chatty check never blocks on a full pipe.
//! * **Verdict.** Exit status 0 passes, anything else fails; the output (or
//!   the error) is the reason.

use super::machine::Outcome;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Gid, Pid, Uid};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// Bytes of output kept (the reason's cap).
pub const OUTPUT_MAX: usize = drover_protocol::health::REASON_MAX;

/// The `PATH` a check command sees.
pub const CHECK_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Who a check command runs as.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunAs {
    /// `None`: the agent's own user (no switch).
    pub ids: Option<Ids>,
    pub user: String,
    pub home: String,
    pub shell: String,
}

/// The ids set in the child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl RunAs {
    /// The ids for a unit's `User=` and `Group=` (names or numbers; empty:
    /// not set), from the user and group databases. `Err` says why not.
    pub fn resolve(user: &str, group: &str) -> Result<RunAs, String> {
        if user.is_empty() && group.is_empty() {
            return Ok(RunAs::own());
        }
        let own = RunAs::own();
        let entry = if user.is_empty() {
            None
        } else {
            let found = match user.parse::<u32>() {
                Ok(uid) => nix::unistd::User::from_uid(Uid::from_raw(uid)),
                Err(_) => nix::unistd::User::from_name(user),
            };
            Some(
                found
                    .map_err(|e| format!("cannot look up user {user}: {e}"))?
                    .ok_or_else(|| format!("user {user} does not exist"))?,
            )
        };
        let gid = if group.is_empty() {
            None
        } else {
            let found = match group.parse::<u32>() {
                Ok(gid) => nix::unistd::Group::from_gid(Gid::from_raw(gid)),
                Err(_) => nix::unistd::Group::from_name(group),
            };
            Some(
                found
                    .map_err(|e| format!("cannot look up group {group}: {e}"))?
                    .ok_or_else(|| format!("group {group} does not exist"))?
                    .gid,
            )
        };
        let (uid, primary, name, home, shell) = match &entry {
            Some(u) => (
                u.uid.as_raw(),
                u.gid,
                u.name.clone(),
                u.dir.to_string_lossy().into_owned(),
                u.shell.to_string_lossy().into_owned(),
            ),
            None => (
                Uid::effective().as_raw(),
                Gid::effective(),
                own.user.clone(),
                own.home.clone(),
                own.shell.clone(),
            ),
        };
        let gid = gid.unwrap_or(primary);
        let mut groups = match &entry {
            Some(u) => {
                let cname = std::ffi::CString::new(u.name.as_bytes())
                    .map_err(|_| format!("user name {} holds a NUL", u.name))?;
                nix::unistd::getgrouplist(&cname, u.gid)
                    .map_err(|e| format!("cannot list the groups of {}: {e}", u.name))?
                    .into_iter()
                    .map(Gid::as_raw)
                    .collect()
            }
            None => Vec::new(),
        };
        if !groups.contains(&gid.as_raw()) {
            groups.push(gid.as_raw());
        }
        Ok(RunAs {
            ids: Some(Ids {
                uid,
                gid: gid.as_raw(),
                groups,
            }),
            user: name,
            home,
            shell,
        })
    }

    /// The agent's own user, no switch.
    pub fn own() -> RunAs {
        let me = nix::unistd::User::from_uid(Uid::effective()).ok().flatten();
        RunAs {
            ids: None,
            user: me.as_ref().map(|u| u.name.clone()).unwrap_or_default(),
            home: me
                .as_ref()
                .map(|u| u.dir.to_string_lossy().into_owned())
                .unwrap_or_else(|| "/".into()),
            shell: me
                .as_ref()
                .map(|u| u.shell.to_string_lossy().into_owned())
                .unwrap_or_else(|| "/bin/sh".into()),
        }
    }
}

/// Runs `argv` for `unit` as `run_as`, within `timeout`: see the module docs.
pub async fn run(argv: &[String], run_as: &RunAs, unit: &str, timeout: Duration) -> Outcome {
    let Some((program, args)) = argv.split_first() else {
        return Outcome::Fail("no command".into());
    };
    let (mut output, stdout, stderr) = match Output::pipe() {
        Ok(pipe) => pipe,
        Err(e) => return Outcome::Fail(format!("cannot make a pipe for {program}: {e}")),
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", CHECK_PATH)
        .env("HOME", &run_as.home)
        .env("USER", &run_as.user)
        .env("LOGNAME", &run_as.user)
        .env("SHELL", &run_as.shell)
        .env("LANG", "C.UTF-8")
        .env("DROVER_UNIT", unit)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(true);
    if let Some(ids) = run_as.ids.clone() {
        let groups: Vec<Gid> = ids.groups.iter().copied().map(Gid::from_raw).collect();
        let (uid, gid) = (Uid::from_raw(ids.uid), Gid::from_raw(ids.gid));
        // SAFETY: the closure runs in the child between fork and exec, where
        // only async-signal-safe calls are allowed. It makes three system
        // calls (setgroups, setgid, setuid: nix passes the slice allocated
        // before the fork straight to libc), allocates nothing, takes no
        // lock, and returns an io::Error built from an errno (no allocation
        // either: `from_raw_os_error`).
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                let errno = |e: nix::errno::Errno| std::io::Error::from_raw_os_error(e as i32);
                nix::unistd::setgroups(&groups).map_err(errno)?;
                nix::unistd::setgid(gid).map_err(errno)?;
                nix::unistd::setuid(uid).map_err(errno)?;
                Ok(())
            });
        }
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let spawned = cmd.spawn();
    // The parent's copies of the pipe's write end go with `cmd`: EOF comes
    // once the child's side is closed.
    drop(cmd);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let who = if run_as.ids.is_some() {
                format!(" as {}", run_as.user)
            } else {
                String::new()
            };
            return Outcome::Fail(format!("cannot run {program}{who}: {e}"));
        }
    };
    let group = child.id().map(|pid| Pid::from_raw(pid as i32));
    // If this future is dropped (the check is stopped), the group goes too.
    let guard = GroupKill(group);
    let status = tokio::time::timeout_at(deadline, async {
        loop {
            tokio::select! {
                status = child.wait() => break status,
                () = output.read_some() => {}
            }
        }
    })
    .await;
    // Whatever is left in the group goes now: on a timeout the command
    // itself, after an exit what it started. Safe after the reap above: a
    // freed pid comes back only after the whole pid space was used.
    drop(guard);
    let grace = Duration::from_millis(50);
    let status = match status {
        Err(_) => {
            let _ = child.wait().await;
            output.drain_until(deadline + grace).await;
            return Outcome::Fail(join(
                &format!(
                    "timed out after {} (its process group was killed)",
                    drover_config::timespan::format(timeout)
                ),
                &output.text(),
            ));
        }
        Ok(Err(e)) => return Outcome::Fail(format!("waiting for {program}: {e}")),
        Ok(Ok(status)) => status,
    };
    output
        .drain_until(deadline.max(tokio::time::Instant::now()) + grace)
        .await;
    let text = output.text();
    if status.success() {
        Outcome::Pass(text)
    } else if let Some(code) = status.code() {
        Outcome::Fail(join(&format!("exit status {code}"), &text))
    } else {
        let signal = status
            .signal()
            .and_then(|s| Signal::try_from(s).ok())
            .map_or_else(|| "a signal".to_owned(), |s| s.as_str().to_owned());
        Outcome::Fail(join(&format!("killed by {signal}"), &text))
    }
}

/// Kills the process group when dropped.
struct GroupKill(Option<Pid>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

/// `head: text`, or `head` alone when there is no text.
fn join(head: &str, text: &str) -> String {
    if text.is_empty() {
        head.to_owned()
    } else {
        format!("{head}: {text}")
    }
}

/// The read end of the pipe stdout and stderr share, into a capped buffer.
struct Output {
    pipe: Option<tokio::net::unix::pipe::Receiver>,
    kept: Vec<u8>,
}

impl Output {
    /// The reader and the child's stdout and stderr (one pipe).
    fn pipe() -> std::io::Result<(Output, Stdio, Stdio)> {
        let (tx, rx) = tokio::net::unix::pipe::pipe()?;
        let out = tx.into_blocking_fd()?;
        let err = out.try_clone()?;
        Ok((
            Output {
                pipe: Some(rx),
                kept: Vec::new(),
            },
            Stdio::from(out),
            Stdio::from(err),
        ))
    }

    /// Reads what the pipe has; pends forever once it is at EOF.
    async fn read_some(&mut self) {
        let Some(pipe) = &mut self.pipe else {
            return std::future::pending().await;
        };
        let mut buf = [0u8; 4096];
        match pipe.read(&mut buf).await {
            Ok(n) if n > 0 => {
                let room = OUTPUT_MAX.saturating_sub(self.kept.len());
                self.kept.extend_from_slice(&buf[..n.min(room)]);
            }
            _ => self.pipe = None,
        }
    }

    /// Reads until EOF or `deadline`.
    async fn drain_until(&mut self, deadline: tokio::time::Instant) {
        let _ = tokio::time::timeout_at(deadline, async {
            while self.pipe.is_some() {
                self.read_some().await;
            }
        })
        .await;
    }

    /// The kept output, trimmed, as text.
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.kept).trim().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    async fn run_own(words: &[&str], timeout_ms: u64) -> Outcome {
        run(
            &argv(words),
            &RunAs::own(),
            "t.service",
            Duration::from_millis(timeout_ms),
        )
        .await
    }

    #[tokio::test]
    async fn exit_status_and_output_decide() {
        assert_eq!(
            run_own(&["/bin/sh", "-c", "echo fine; echo warn >&2"], 5000).await,
            Outcome::Pass("fine\nwarn".into())
        );
        assert_eq!(
            run_own(&["/bin/sh", "-c", "echo no db; exit 3"], 5000).await,
            Outcome::Fail("exit status 3: no db".into())
        );
        assert_eq!(
            run_own(&["/bin/false"], 5000).await,
            Outcome::Fail("exit status 1".into())
        );
        let Outcome::Fail(why) = run_own(&["/nonexistent/x"], 5000).await else {
            panic!("ran a missing program")
        };
        assert!(why.starts_with("cannot run /nonexistent/x: "), "{why}");
        // Found on the fixed PATH, in a fixed environment, from /.
        assert_eq!(
            run_own(&["sh", "-c", "echo $PATH $DROVER_UNIT $PWD"], 5000).await,
            Outcome::Pass(format!("{CHECK_PATH} t.service /"))
        );
    }

    #[tokio::test]
    async fn output_is_capped_and_a_chatty_check_does_not_block() {
        let Outcome::Pass(out) = run_own(
            &["/bin/sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x"],
            10_000,
        )
        .await
        else {
            panic!("a chatty check failed")
        };
        assert_eq!(out.len(), OUTPUT_MAX);
    }

    #[tokio::test]
    async fn a_hanging_check_is_killed_with_its_group() {
        let dir = std::env::temp_dir().join(format!("drover-exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("pids");
        let script = format!(
            "sleep 300 & echo $! > {p}; echo started; sleep 300",
            p = pidfile.display()
        );
        let t0 = std::time::Instant::now();
        let Outcome::Fail(why) = run_own(&["/bin/sh", "-c", &script], 300).await else {
            panic!("a hanging check passed")
        };
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(
            why,
            "timed out after 300ms (its process group was killed): started"
        );
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(gone(pid).await, "the background sleep {pid} survived");
        // A check that exits but leaves a child behind: the child goes too.
        let script = format!("sleep 300 & echo $! > {p}; exit 0", p = pidfile.display());
        assert!(run_own(&["/bin/sh", "-c", &script], 5000).await.passed());
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(gone(pid).await, "the leftover sleep {pid} survived");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Whether `pid` is gone (or a zombie of someone else's) within 5 s.
    async fn gone(pid: i32) -> bool {
        for _ in 0..500 {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return true,
                Ok(stat)
                    if stat
                        .rsplit(')')
                        .next()
                        .is_some_and(|r| r.trim_start().starts_with('Z')) =>
                {
                    return true;
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        false
    }

    #[test]
    fn unknown_users_and_groups_are_errors_not_root() {
        let err = RunAs::resolve("no-such-user-drover", "").unwrap_err();
        assert_eq!(err, "user no-such-user-drover does not exist");
        let err = RunAs::resolve("", "no-such-group-drover").unwrap_err();
        assert_eq!(err, "group no-such-group-drover does not exist");
        assert_eq!(RunAs::resolve("", "").unwrap().ids, None);
        let nobody = RunAs::resolve("nobody", "").unwrap();
        let ids = nobody.ids.unwrap();
        assert_ne!(ids.uid, 0);
        assert!(ids.groups.contains(&ids.gid));
    }

    #[tokio::test]
    async fn a_check_runs_as_the_units_user() {
        assert!(
            Uid::effective().is_root(),
            "switching users needs root; the tests run as root"
        );
        let nobody = RunAs::resolve("nobody", "").unwrap();
        let uid = nobody.ids.as_ref().unwrap().uid;
        let out = run(
            &argv(&["/bin/sh", "-c", "id -u; id -G"]),
            &nobody,
            "t.service",
            Duration::from_secs(5),
        )
        .await;
        let Outcome::Pass(out) = out else {
            panic!("{out:?}")
        };
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some(uid.to_string().as_str()));
        assert!(
            !lines.next().unwrap_or("").split(' ').any(|g| g == "0"),
            "{out}"
        );
        // Root's files are out of reach.
        assert!(
            !run(
                &argv(&["/bin/sh", "-c", "cat /proc/1/environ"]),
                &nobody,
                "t.service",
                Duration::from_secs(5)
            )
            .await
            .passed()
        );
    }
}
