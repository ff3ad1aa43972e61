//! One `StartUnit` of the benchmarks' trivial unit, timed until its job is
//! removed (through systemd's manager or drover's node object, which take the
//! same call), and a process's resident memory: what several benchmarks
//! measure the same way.

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use std::time::{Duration, Instant};
use zbus::OwnedObjectPath;

/// The trivial oneshot the `StartUnit` benchmarks start.
pub(crate) const UNIT: &str = "bench-noop.service";

/// One `StartUnit` of the trivial unit until its job is removed, through
/// `starter` (systemd's manager or drover's node object, which take the same
/// call).
pub(crate) async fn time_start(
    starter: &zbus::Proxy<'_>,
    removed: &mut zbus::proxy::SignalStream<'_>,
) -> Result<Duration> {
    let t = Instant::now();
    let job: OwnedObjectPath = starter.call("StartUnit", &(UNIT, "replace")).await?;
    wait_removed(removed, job.as_str()).await?;
    Ok(t.elapsed())
}

/// Waits for the JobRemoved of `path`: systemd's is (u o s s), drover's
/// (u o s s s); the job path is the second field in both.
async fn wait_removed(stream: &mut zbus::proxy::SignalStream<'_>, path: &str) -> Result<()> {
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(msg) = stream.next().await {
            let body = msg.body();
            let p: Option<OwnedObjectPath> = body
                .deserialize::<(u32, OwnedObjectPath, String, String)>()
                .map(|t| t.1)
                .or_else(|_| {
                    body.deserialize::<(u32, OwnedObjectPath, String, String, String)>()
                        .map(|t| t.1)
                })
                .ok();
            if p.as_ref().map(|p| p.as_str()) == Some(path) {
                return Ok(());
            }
        }
        bail!("signal stream ended")
    })
    .await
    .context("job did not finish within 10 s")?
}

/// `VmRSS` of `pid`, KiB.
pub(crate) fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmRSS")
}
