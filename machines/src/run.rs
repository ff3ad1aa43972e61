//! Running one command with a deadline. The command runs in a process group
//! of its own, so a deadline kills it with everything it started (an
//! `nsenter` and the command inside a machine), and nothing it started in
//! that group outlives it. Output is kept whole.

use anyhow::{Context, Result, bail};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a finished command said.
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// stdout, then stderr.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// `Ok(stdout)` for a success, else an error carrying everything it said.
    pub fn into_result(self, what: &str) -> Result<String> {
        if self.ok() {
            Ok(self.stdout)
        } else {
            bail!(
                "{what} failed (exit {:?}):\n{}",
                self.code,
                self.text().trim_end()
            )
        }
    }
}

/// Runs `cmd` (stdin closed) until it exits or `timeout` passes; then the
/// whole process group is killed and that is an error.
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {shown}"))?;
    let pgid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let mut out = child.stdout.take().context("stdout")?;
    let mut err = child.stderr.take().context("stderr")?;
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // Whatever the command left in its group would hold the pipes open (and
    // outlive the call): it goes with the command.
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let stdout = reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    let output = Output {
        code: status.and_then(|s| s.code()),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    };
    if status.is_none() {
        bail!(
            "{shown} did not finish within {timeout:?}; killed. It said:\n{}",
            output.text().trim_end()
        );
    }
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_exit_codes_are_kept() {
        let out = run(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(
            (out.code, out.stdout.as_str(), out.stderr.as_str()),
            (Some(3), "out\n", "err\n")
        );
        assert!(
            out.into_result("sh")
                .unwrap_err()
                .to_string()
                .contains("err")
        );
    }

    #[test]
    fn a_command_past_its_deadline_is_killed_with_its_children() {
        let started = Instant::now();
        let err = run(
            Command::new("sh").args(["-c", "sleep 30 & sleep 30"]),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(err.to_string().contains("did not finish"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
