//! `HealthCmd=`: one run of a check command, as a transient service that
//! systemd runs for the agent (as Podman's health checks run).
//!
//! Why systemd runs it, and not the agent: the check must run as the unit's
//! `User=`/`Group=` and in a plain service context, while the agent runs
//! sandboxed (its unit has no capabilities, a read-only file system, a
//! private `/tmp`, no `/home`, a system call filter without `setuid`): a
//! check the agent forked would inherit all of it and could not switch
//! users. systemd starts the check like any service, and its cgroup makes
//! "leave nothing behind" exact: on the timeout, and after the command
//! exits, everything the check started is killed, even a process that left
//! its process group.
//!
//! The service (`drover-health-check-PID-N.service`, `crate::own_units`):
//! * `Type=oneshot`, `ExecStart=` the command's words (no shell: a command
//!   that wants one says `/bin/sh -c '…'`; a bare program name is looked up
//!   in [`CHECK_PATH`]; a `$` is passed as written, not expanded by
//!   systemd); `User=`, `Group=` and `SupplementaryGroups=` of the
//!   unit (none: the manager's own user, root for the system manager);
//!   `Environment=DROVER_UNIT=` the unit's name;
//! * `TimeoutStartSec=` the check's timeout, `KillSignal=SIGKILL`: at the
//!   timeout systemd kills the whole cgroup at once;
//! * stdout and stderr: one pipe of the agent's (passed as file descriptors),
//!   so their lines keep their order; the first [`OUTPUT_MAX`] bytes are
//!   kept, the rest is read and dropped;
//! * `ExecStopPost=` prints the outcome (`$SERVICE_RESULT $EXIT_CODE
//!   $EXIT_STATUS`) as the pipe's last line; `CollectMode=inactive-or-failed`
//!   unloads the service as soon as it is done (a failing check never leaves
//!   a `failed` unit behind), which closes systemd's copy of the pipe: the
//!   end of the pipe is the end of the check.
//!
//! Exit status 0 passes; anything else fails, with the output as the reason.
//! A run that does not end within the timeout and a margin (systemd does not
//! answer) fails too, and the service is stopped.

use super::machine::Outcome;
use drover_bus::systemd::{BUS_NAME, MANAGER_IFACE, MANAGER_PATH};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use zbus::{Connection, Variant};

/// Bytes of output kept (the reason's cap).
pub const OUTPUT_MAX: usize = drover_protocol::health::REASON_MAX;

/// Where a bare program name is looked for.
pub const CHECK_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long past its timeout a check may take before the agent gives up on
/// systemd (the start of the service, `ExecStopPost=`, the unload).
pub const MARGIN: Duration = Duration::from_secs(5);

/// The first word of the outcome line `ExecStopPost=` prints.
const RESULT_MARK: &str = "DROVER-HEALTH-CHECK-RESULT";

/// Bytes of the output's end kept to find the outcome line in.
const TAIL: usize = 512;

/// Who and what a check runs for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunFor {
    /// The unit's name (`DROVER_UNIT`), or the node check's.
    pub unit: String,
    /// `User=`, `Group=`, `SupplementaryGroups=` of the unit (empty: none).
    pub user: String,
    pub group: String,
    pub groups: Vec<String>,
}

/// The absolute path of `program`: as given when it has a `/`, else the
/// first executable file of that name in [`CHECK_PATH`].
pub fn resolve(program: &str) -> Result<String, String> {
    if program.contains('/') {
        return Ok(program.to_owned());
    }
    CHECK_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .map(|p| p.display().to_string())
        .ok_or_else(|| format!("no program {program} in {CHECK_PATH}"))
}

/// `argv` as systemd must get it to run it as written: systemd expands
/// `$NAME` in `ExecStart=` (also over D-Bus), and `$$` is its `$`.
fn literal(argv: &[String]) -> Vec<String> {
    argv.iter().map(|w| w.replace('$', "$$")).collect()
}

/// A name for the next check unit of this agent process.
fn unit_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "{}{}-{}.service",
        crate::own_units::CHECK_UNIT_PREFIX,
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Stops the check unit if the run is dropped before it ended (its check
/// was stopped): systemd would otherwise let it run to its timeout.
struct StopOnDrop {
    conn: Option<Connection>,
    unit: String,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            let unit = std::mem::take(&mut self.unit);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = super::systemd::unit_job(&conn, "StopUnit", &unit).await;
                });
            }
        }
    }
}

/// Runs `argv` for `what` within `timeout`: see the module docs.
pub async fn run(conn: &Connection, argv: &[String], what: &RunFor, timeout: Duration) -> Outcome {
    let Some((program, _)) = argv.split_first() else {
        return Outcome::Fail("no command".into());
    };
    let path = match resolve(program) {
        Ok(path) => path,
        Err(why) => return Outcome::Fail(why),
    };
    let (tx, rx) = match tokio::net::unix::pipe::pipe() {
        Ok(pipe) => pipe,
        Err(e) => return Outcome::Fail(format!("cannot make a pipe for the check: {e}")),
    };
    let (out, err) = match tx
        .into_blocking_fd()
        .and_then(|fd| fd.try_clone().map(|dup| (fd, dup)))
    {
        Ok(fds) => fds,
        Err(e) => return Outcome::Fail(format!("cannot make a pipe for the check: {e}")),
    };
    let unit = unit_name();
    let mut props: Vec<(&str, Variant<'_>)> = vec![
        (
            "Description",
            Variant::from(format!("drover health check of {}", what.unit)),
        ),
        ("Type", Variant::from("oneshot")),
        (
            "ExecStart",
            Variant::from(vec![(path.clone(), literal(argv), false)]),
        ),
        (
            "ExecStopPost",
            Variant::from(vec![(
                "/bin/sh".to_owned(),
                vec![
                    "/bin/sh".to_owned(),
                    "-c".to_owned(),
                    format!(
                        "printf '\\n{RESULT_MARK} %s %s %s\\n' \"$SERVICE_RESULT\" \"$EXIT_CODE\" \"$EXIT_STATUS\""
                    ),
                ],
                false,
            )]),
        ),
        (
            "Environment",
            Variant::from(vec![format!("DROVER_UNIT={}", what.unit)]),
        ),
        (
            "TimeoutStartUSec",
            Variant::from(u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX)),
        ),
        ("KillSignal", Variant::from(9i32)),
        ("CollectMode", Variant::from("inactive-or-failed")),
        (
            "StandardOutputFileDescriptor",
            Variant::from(zbus::Fd::from(out)),
        ),
        (
            "StandardErrorFileDescriptor",
            Variant::from(zbus::Fd::from(err)),
        ),
    ];
    if !what.user.is_empty() {
        props.push(("User", Variant::from(what.user.clone())));
    }
    if !what.group.is_empty() {
        props.push(("Group", Variant::from(what.group.clone())));
    }
    if !what.groups.is_empty() {
        props.push(("SupplementaryGroups", Variant::from(what.groups.clone())));
    }
    let aux: Vec<(&str, Vec<(&str, Variant<'_>)>)> = Vec::new();
    let started = conn
        .call_method(
            Some(BUS_NAME),
            MANAGER_PATH,
            Some(MANAGER_IFACE),
            "StartTransientUnit",
            &(unit.as_str(), "fail", props, aux),
        )
        .await;
    if let Err(e) = started {
        return Outcome::Fail(format!("systemd cannot run {path}: {e}"));
    }
    let mut guard = StopOnDrop {
        conn: Some(conn.clone()),
        unit,
    };
    let mut output = Output::new(rx);
    let ended = tokio::time::timeout(timeout + MARGIN, output.read_to_end()).await;
    if ended.is_err() {
        // Dropping the guard stops the unit.
        return Outcome::Fail(format!(
            "no end of the check within {} (systemd did not finish it)",
            drover_config::timespan::format(timeout + MARGIN)
        ));
    }
    guard.conn = None;
    outcome(&output.head, &output.tail, timeout)
}

/// The read end of the check's pipe: the head kept, the tail for the
/// outcome line.
struct Output {
    pipe: tokio::net::unix::pipe::Receiver,
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl Output {
    fn new(pipe: tokio::net::unix::pipe::Receiver) -> Self {
        Self {
            pipe,
            head: Vec::new(),
            tail: Vec::new(),
        }
    }

    /// Reads until every writer closed the pipe (the check unit is gone).
    async fn read_to_end(&mut self) {
        let mut buf = [0u8; 4096];
        loop {
            match self.pipe.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let room = OUTPUT_MAX.saturating_sub(self.head.len());
                    self.head.extend_from_slice(&buf[..n.min(room)]);
                    self.tail.extend_from_slice(&buf[..n]);
                    if self.tail.len() > TAIL {
                        let cut = self.tail.len() - TAIL;
                        self.tail.drain(..cut);
                    }
                }
            }
        }
    }
}

/// The verdict from the outcome line at the end of the output (`tail`),
/// with the output before it (`head`) as the reason.
fn outcome(head: &[u8], tail: &[u8], timeout: Duration) -> Outcome {
    let tail = String::from_utf8_lossy(tail);
    let mark = tail
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(RESULT_MARK))
        .map(str::trim)
        .map(|rest| rest.split(' ').map(str::to_owned).collect::<Vec<_>>());
    let head = String::from_utf8_lossy(head);
    // The output without the outcome line (when it is within the head).
    let text = match head.rfind(RESULT_MARK) {
        Some(at) => head[..at].trim(),
        None => head.trim(),
    }
    .to_owned();
    let Some(fields) = mark else {
        return Outcome::Fail(join("the check ended without saying how", &text));
    };
    let field = |i: usize| fields.get(i).map(String::as_str).unwrap_or("");
    match (field(0), field(1), field(2)) {
        ("success", _, _) => Outcome::Pass(text),
        ("timeout", _, _) => Outcome::Fail(join(
            &format!(
                "timed out after {} (systemd killed its cgroup)",
                drover_config::timespan::format(timeout)
            ),
            &text,
        )),
        (_, "exited", status) => Outcome::Fail(join(&format!("exit status {status}"), &text)),
        (_, "killed" | "dumped", signal) => {
            Outcome::Fail(join(&format!("killed by SIG{signal}"), &text))
        }
        ("exit-code", _, _) => Outcome::Fail(join("exit status not 0", &text)),
        (result, _, _) => Outcome::Fail(join(&format!("the check's result: {result}"), &text)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_reach_the_command_as_written() {
        let argv = vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            "echo $HOME $$".to_owned(),
        ];
        assert_eq!(literal(&argv)[2], "echo $$HOME $$$$");
    }

    #[test]
    fn bare_names_are_found_on_the_fixed_path_and_paths_are_kept() {
        let sh = resolve("sh").unwrap();
        assert!(sh.starts_with('/') && sh.ends_with("/sh"), "{sh}");
        assert_eq!(resolve("/opt/x/check").unwrap(), "/opt/x/check");
        assert_eq!(resolve("./check").unwrap(), "./check");
        let err = resolve("no-such-program-drover").unwrap_err();
        assert!(
            err.starts_with("no program no-such-program-drover in /usr/local/sbin:"),
            "{err}"
        );
    }

    fn outcome(text: &str) -> Outcome {
        let bytes = text.as_bytes();
        let head = &bytes[..bytes.len().min(OUTPUT_MAX)];
        let tail = &bytes[bytes.len().saturating_sub(TAIL)..];
        super::outcome(head, tail, Duration::from_secs(2))
    }

    #[test]
    fn the_outcome_line_decides_and_is_not_part_of_the_reason() {
        assert_eq!(
            outcome("ready\n\nDROVER-HEALTH-CHECK-RESULT success exited 0\n"),
            Outcome::Pass("ready".into())
        );
        assert_eq!(
            outcome("no db\n\nDROVER-HEALTH-CHECK-RESULT exit-code exited 3\n"),
            Outcome::Fail("exit status 3: no db".into())
        );
        assert_eq!(
            outcome("waiting\n\nDROVER-HEALTH-CHECK-RESULT timeout killed KILL\n"),
            Outcome::Fail("timed out after 2s (systemd killed its cgroup): waiting".into())
        );
        assert_eq!(
            outcome("\nDROVER-HEALTH-CHECK-RESULT signal killed SEGV\n"),
            Outcome::Fail("killed by SIGSEGV".into())
        );
        assert_eq!(
            outcome("half a line"),
            Outcome::Fail("the check ended without saying how: half a line".into())
        );
        // A long output: the head is the reason, the tail still has the line.
        let long = format!(
            "{}\n\nDROVER-HEALTH-CHECK-RESULT exit-code exited 1\n",
            "x".repeat(10_000)
        );
        let Outcome::Fail(why) = outcome(&long) else {
            panic!("passed")
        };
        assert!(why.starts_with("exit status 1: xxx"), "{why}");
        assert!(why.len() <= OUTPUT_MAX + 20);
    }
}
