//! Running `droverctl` against a manager's bus: [`Ctl`] says which binary and which bus,
//! [`Run`] is one finished run (exit code, stdout, stderr), [`CtlFollower`] a run that
//! prints until interrupted (`monitor`, `status -w`, `metrics listen`), read line by line.
//!
//! A run that hangs is a failure after [`HANG`], not a stuck test run.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use crate::process::{Run, bin};
use crate::wait::{NotSeen, Seen};

/// The longest a `droverctl` run may take before the test fails.
pub const HANG: Duration = Duration::from_secs(60);

/// `droverctl` pointed at one bus.
#[derive(Clone, Debug)]
pub struct Ctl {
    bin: PathBuf,
    bus: String,
    /// `--bus ADDRESS` (and no `DROVER_BUS`) instead of `DROVER_BUS=ADDRESS`.
    flag: bool,
}

impl Ctl {
    /// The workspace's `droverctl`, told the bus in `DROVER_BUS` as a user's shell would.
    pub fn env(bus: &str) -> Ctl {
        Ctl {
            bin: bin("droverctl"),
            bus: bus.to_owned(),
            flag: false,
        }
    }

    /// `bin`, told the bus with `--bus` (and `DROVER_BUS` removed from its environment).
    pub fn flag(bin: impl AsRef<Path>, bus: &str) -> Ctl {
        Ctl {
            bin: bin.as_ref().to_owned(),
            bus: bus.to_owned(),
            flag: true,
        }
    }

    /// The command, for a test that needs more than [`Self::run`] (its own stdout, say).
    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.bin);
        if self.flag {
            cmd.arg("--bus").arg(&self.bus).env_remove("DROVER_BUS");
        } else {
            cmd.env("DROVER_BUS", &self.bus);
        }
        cmd.args(args).kill_on_drop(true);
        cmd
    }

    /// Runs `droverctl ARGS` to its end.
    pub async fn run(&self, args: &[&str]) -> Run {
        let out = tokio::time::timeout(HANG, self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("droverctl {args:?} hung"))
            .expect("droverctl runs");
        Run::from(out)
    }

    /// Runs `droverctl ARGS`, asserts it succeeded and returns its stdout.
    pub async fn ok(&self, args: &[&str]) -> String {
        self.run(args).await.ok()
    }

    /// Starts `droverctl ARGS` and collects its output as it comes.
    pub fn follow(&self, args: &[&str]) -> CtlFollower {
        CtlFollower::spawn(self.command(args))
    }
}

/// A `droverctl` child whose stdout and stderr lines are collected as they come. It is
/// killed on drop.
pub struct CtlFollower {
    child: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    stderr: mpsc::UnboundedReceiver<String>,
    /// Stderr text taken from `stderr` and not yet returned.
    stderr_seen: Vec<String>,
    /// Every stdout line read so far.
    pub seen: Seen<String>,
}

/// Sends each line `from` gives to `to` (without its newline) until either side ends.
fn forward_lines(
    from: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    to: mpsc::UnboundedSender<String>,
) {
    tokio::spawn(async move {
        let mut r = BufReader::new(from).lines();
        while let Ok(Some(l)) = r.next_line().await {
            if to.send(l).is_err() {
                break;
            }
        }
    });
}

/// Sends what `from` gives to `to` as it comes, byte for byte (as text), until either
/// side ends.
fn forward_text(
    from: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    to: mpsc::UnboundedSender<String>,
) {
    tokio::spawn(async move {
        let mut r = BufReader::new(from);
        loop {
            let mut chunk = String::new();
            match r.read_line(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if to.send(chunk).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

impl CtlFollower {
    fn spawn(mut cmd: tokio::process::Command) -> CtlFollower {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("droverctl starts");
        let (tx, lines) = mpsc::unbounded_channel();
        forward_lines(child.stdout.take().expect("stdout"), tx);
        let (etx, stderr) = mpsc::unbounded_channel();
        forward_text(child.stderr.take().expect("stderr"), etx);
        CtlFollower {
            child,
            lines,
            stderr,
            stderr_seen: Vec::new(),
            seen: Seen::default(),
        }
    }

    /// Waits for a stdout line (after those already looked at) for which `pred` holds;
    /// returns its index in `seen`.
    pub async fn expect_line<P>(&mut self, what: &str, timeout: Duration, pred: P) -> Result<usize>
    where
        P: Fn(&str) -> bool,
    {
        let lines = &mut self.lines;
        let more = async || lines.recv().await.map(|l| vec![l]);
        let why = match self.seen.expect(timeout, more, |l| pred(l)).await {
            Ok(i) => return Ok(i),
            Err(NotSeen::Ended) => "droverctl closed stdout before".to_string(),
            Err(NotSeen::Timeout) => format!("no line within {timeout:?}"),
        };
        let stderr = self.drain_stderr();
        bail!(
            "{why}: {what}\nstdout:\n{}\nstderr:\n{stderr}",
            self.seen.join("\n")
        )
    }

    /// The next `n` stdout lines, in order, each within `each` (a missing line is a
    /// failure, not a hang).
    pub async fn next_lines(&mut self, n: usize, each: Duration) -> Vec<String> {
        let start = self.seen.looked_at();
        for _ in 0..n {
            if let Err(e) = self.expect_line("the next line", each, |_| true).await {
                panic!("after {:?}: {e:#}", self.seen.since(start));
            }
        }
        self.seen[start..self.seen.looked_at()].to_vec()
    }

    /// Reads whatever arrives during `d` (to check afterwards that something did not
    /// happen).
    pub async fn settle(&mut self, d: Duration) {
        let lines = &mut self.lines;
        let more = async || lines.recv().await.map(|l| vec![l]);
        self.seen.settle(d, more).await;
    }

    /// Marks everything seen so far as looked at.
    pub fn skip_seen(&mut self) {
        self.seen.mark();
    }

    /// Stderr text read so far and not returned before, as written (after
    /// [`Self::wait_exit`]: all of it).
    pub fn drain_stderr(&mut self) -> String {
        while let Ok(l) = self.stderr.try_recv() {
            self.stderr_seen.push(l);
        }
        std::mem::take(&mut self.stderr_seen).concat()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends SIGINT (Ctrl-C) and returns at once.
    pub fn sigint(&self) -> Result<()> {
        let pid = self.child.id().context("droverctl already exited")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid)?),
            nix::sys::signal::Signal::SIGINT,
        )?;
        Ok(())
    }

    /// Sends SIGINT (Ctrl-C) and waits for the exit.
    pub async fn interrupt(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.sigint()?;
        self.wait_exit(timeout).await
    }

    /// Waits for droverctl to exit by itself, then for the reader of its stderr to reach
    /// the end, so [`Self::drain_stderr`] has every line (the exit can be seen before the
    /// reader task has read what was written).
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .with_context(|| format!("droverctl did not exit within {timeout:?}"))?
            .context("waiting for droverctl")?;
        let deadline = tokio::time::Instant::now() + timeout;
        while let Ok(Some(l)) = tokio::time::timeout_at(deadline, self.stderr.recv()).await {
            self.stderr_seen.push(l);
        }
        Ok(status)
    }
}
