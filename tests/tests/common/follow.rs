//! Helpers for following long-running output: a droverctl process that prints
//! until interrupted (`monitor`, `status -w`, `metrics listen`), and the signals
//! of one monitor object on the manager's bus.
//!
//! Both keep everything they received, so a test can look for an event that
//! already arrived and then check that some other event never came.

use anyhow::{Context, Result, bail};
use drover_sandbox::Cluster;
use futures::StreamExt;
use std::collections::HashMap;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use zbus::{MatchRule, MessageStream, OwnedObjectPath, OwnedVariant};

use super::{BUS_NAME, bin};

/// A droverctl child whose stdout lines are collected as they come.
pub struct CtlFollower {
    child: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    stderr: mpsc::UnboundedReceiver<String>,
    /// Stderr lines taken from `stderr` and not yet returned.
    stderr_seen: Vec<String>,
    /// Every stdout line read so far.
    pub seen: Vec<String>,
    /// How many of `seen` `expect_line` has already looked at.
    cursor: usize,
}

impl CtlFollower {
    pub fn spawn(cluster: &Cluster, args: &[&str]) -> CtlFollower {
        let mut child = tokio::process::Command::new(bin("droverctl"))
            .args(args)
            .env("DROVER_BUS", cluster.bus_address())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("droverctl starts");
        let (tx, lines) = mpsc::unbounded_channel();
        let out = child.stdout.take().expect("stdout");
        tokio::spawn(async move {
            let mut r = BufReader::new(out).lines();
            while let Ok(Some(l)) = r.next_line().await {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let (etx, stderr) = mpsc::unbounded_channel();
        let err = child.stderr.take().expect("stderr");
        tokio::spawn(async move {
            let mut r = BufReader::new(err).lines();
            while let Ok(Some(l)) = r.next_line().await {
                if etx.send(l).is_err() {
                    break;
                }
            }
        });
        CtlFollower {
            child,
            lines,
            stderr,
            stderr_seen: Vec::new(),
            seen: Vec::new(),
            cursor: 0,
        }
    }

    /// Waits for a stdout line (after those already matched) for which `pred`
    /// holds; returns its index in `seen`.
    pub async fn expect_line(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<usize> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            while self.cursor < self.seen.len() {
                let i = self.cursor;
                self.cursor += 1;
                if pred(&self.seen[i]) {
                    return Ok(i);
                }
            }
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(l)) => self.seen.push(l),
                Ok(None) => bail!(
                    "droverctl closed stdout before: {what}\nstdout:\n{}\nstderr:\n{}",
                    self.seen.join("\n"),
                    self.drain_stderr()
                ),
                Err(_) => bail!(
                    "no line within {timeout:?}: {what}\nstdout:\n{}\nstderr:\n{}",
                    self.seen.join("\n"),
                    self.drain_stderr()
                ),
            }
        }
    }

    /// Reads whatever arrives during `d` (to check afterwards that something did
    /// not happen).
    pub async fn settle(&mut self, d: Duration) {
        let deadline = tokio::time::Instant::now() + d;
        while let Ok(Some(l)) = tokio::time::timeout_at(deadline, self.lines.recv()).await {
            self.seen.push(l);
        }
    }

    /// Marks everything seen so far as looked at.
    pub fn skip_seen(&mut self) {
        self.cursor = self.seen.len();
    }

    /// Stderr lines read so far (after [`Self::wait_exit`]: all of them).
    pub fn drain_stderr(&mut self) -> String {
        while let Ok(l) = self.stderr.try_recv() {
            self.stderr_seen.push(l);
        }
        std::mem::take(&mut self.stderr_seen).join("\n")
    }

    /// Sends SIGINT (Ctrl-C) and waits for the exit.
    pub async fn interrupt(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let pid = self.child.id().context("droverctl already exited")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGINT,
        )?;
        self.wait_exit(timeout).await
    }

    /// Waits for droverctl to exit by itself, then for the reader of its
    /// stderr to reach the end, so [`Self::drain_stderr`] has every line (the
    /// exit can be seen before the reader task has read what was written).
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

/// One signal of a monitor object (BlueChi's and drover's).
#[derive(Debug, Clone, PartialEq)]
pub enum Ev {
    New {
        node: String,
        unit: String,
        reason: String,
    },
    Removed {
        node: String,
        unit: String,
        reason: String,
    },
    State {
        node: String,
        unit: String,
        active: String,
        sub: String,
        reason: String,
    },
    Props {
        node: String,
        unit: String,
        interface: String,
        keys: Vec<String>,
    },
    PeerRemoved {
        reason: String,
    },
    /// One entry of io.drover.Monitor.UnitsChanged (the batched tagged stream).
    Changed {
        node: String,
        unit: String,
        kind: String,
        active: String,
        sub: String,
        reason: String,
        guid: u64,
        index: u64,
    },
}

impl Ev {
    pub fn unit(&self) -> Option<(&str, &str)> {
        match self {
            Ev::New { node, unit, .. }
            | Ev::Removed { node, unit, .. }
            | Ev::State { node, unit, .. }
            | Ev::Props { node, unit, .. }
            | Ev::Changed { node, unit, .. } => Some((node, unit)),
            Ev::PeerRemoved { .. } => None,
        }
    }

    /// The events one signal carries: one for BlueChi's signals, every entry
    /// of a `UnitsChanged` batch, none for anything else.
    fn parse(msg: &zbus::Message) -> Vec<Ev> {
        if msg
            .header()
            .member()
            .is_some_and(|m| m.as_str() == "UnitsChanged")
        {
            type Row = (String, String, String, String, String, String, u64, u64);
            let Ok((rows,)) = msg.body().deserialize::<(Vec<Row>,)>() else {
                return Vec::new();
            };
            return rows
                .into_iter()
                .map(
                    |(node, unit, kind, active, sub, reason, guid, index)| Ev::Changed {
                        node,
                        unit,
                        kind,
                        active,
                        sub,
                        reason,
                        guid,
                        index,
                    },
                )
                .collect();
        }
        Self::parse_one(msg).into_iter().collect()
    }

    fn parse_one(msg: &zbus::Message) -> Option<Ev> {
        let h = msg.header();
        let member = h.member()?.as_str().to_owned();
        let b = msg.body();
        Some(match member.as_str() {
            "UnitNew" => {
                let (node, unit, reason) = b.deserialize().ok()?;
                Ev::New { node, unit, reason }
            }
            "UnitRemoved" => {
                let (node, unit, reason) = b.deserialize().ok()?;
                Ev::Removed { node, unit, reason }
            }
            "UnitStateChanged" => {
                let (node, unit, active, sub, reason) = b.deserialize().ok()?;
                Ev::State {
                    node,
                    unit,
                    active,
                    sub,
                    reason,
                }
            }
            "UnitPropertiesChanged" => {
                let (node, unit, interface, props): (
                    String,
                    String,
                    String,
                    HashMap<String, OwnedVariant>,
                ) = b.deserialize().ok()?;
                let mut keys: Vec<String> = props.into_keys().collect();
                keys.sort();
                Ev::Props {
                    node,
                    unit,
                    interface,
                    keys,
                }
            }
            "PeerRemoved" => {
                let (reason,) = b.deserialize().ok()?;
                Ev::PeerRemoved { reason }
            }
            _ => return None,
        })
    }
}

/// A monitor on its own connection, with every signal it received.
pub struct MonitorWatch {
    pub conn: zbus::Connection,
    pub path: String,
    pub proxy: zbus::Proxy<'static>,
    stream: MessageStream,
    pub seen: Vec<Ev>,
    cursor: usize,
}

impl MonitorWatch {
    /// A new connection to the manager's bus and a monitor owned by it.
    pub async fn create(cluster: &Cluster) -> MonitorWatch {
        let conn = super::bus(cluster).await;
        let path: OwnedObjectPath = super::controller(&conn)
            .await
            .call("CreateMonitor", &())
            .await
            .expect("CreateMonitor");
        Self::listen(conn, path.as_str()).await
    }

    /// Collects the signals `conn` receives from the monitor at `path` (for a
    /// peer: a connection that does not own the monitor).
    pub async fn listen(conn: zbus::Connection, path: &str) -> MonitorWatch {
        let rule = MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(BUS_NAME)
            .path(path.to_owned())
            .build()
            .expect("match rule");
        let stream =
            MessageStream::for_match_rule(rule, &conn, std::num::NonZeroUsize::new(100_000))
                .await
                .expect("match monitor signals");
        let proxy = zbus::Proxy::new(
            &conn,
            BUS_NAME,
            path.to_owned(),
            "org.eclipse.bluechi.Monitor",
        )
        .await
        .expect("monitor proxy");
        MonitorWatch {
            conn,
            path: path.to_owned(),
            proxy,
            stream,
            seen: Vec::new(),
            cursor: 0,
        }
    }

    pub async fn subscribe(&self, node: &str, unit: &str) -> zbus::Result<u32> {
        self.proxy.call("Subscribe", &(node, unit)).await
    }

    pub async fn subscribe_list(&self, node: &str, units: &[&str]) -> zbus::Result<u32> {
        self.proxy.call("SubscribeList", &(node, units)).await
    }

    /// `io.drover.Monitor.Follow()`.
    pub async fn follow(&self) -> zbus::Result<Vec<(String, String, String, String, u64, u64)>> {
        let p =
            zbus::Proxy::new(&self.conn, BUS_NAME, self.path.clone(), "io.drover.Monitor").await?;
        p.call("Follow", &()).await
    }

    /// Waits for an event (after those already matched) for which `pred` holds.
    pub async fn expect(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Ev) -> bool,
    ) -> Result<Ev> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            while self.cursor < self.seen.len() {
                let i = self.cursor;
                self.cursor += 1;
                if pred(&self.seen[i]) {
                    return Ok(self.seen[i].clone());
                }
            }
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Ok(Some(Ok(msg))) => {
                    self.seen.extend(Ev::parse(&msg));
                }
                Ok(_) => bail!("signal stream ended before: {what}"),
                Err(_) => bail!(
                    "no event within {timeout:?}: {what}\nseen:\n{}",
                    self.seen
                        .iter()
                        .map(|e| format!("  {e:?}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            }
        }
    }

    /// Collects whatever arrives during `d`.
    pub async fn settle(&mut self, d: Duration) {
        let deadline = tokio::time::Instant::now() + d;
        while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(deadline, self.stream.next()).await {
            self.seen.extend(Ev::parse(&msg));
        }
    }

    /// Marks everything seen so far as looked at; returns the mark.
    pub fn mark(&mut self) -> usize {
        self.cursor = self.seen.len();
        self.cursor
    }

    /// Events received since `mark`.
    pub fn since(&self, mark: usize) -> &[Ev] {
        &self.seen[mark.min(self.seen.len())..]
    }
}
