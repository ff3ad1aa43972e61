//! `ctl`: droverctl as a user runs it, a whole process from spawn to exit, against sd-bus
//! clients making the same D-Bus calls.
//!
//! The baseline is `sdbus-ctl` (`benches/c/sdbus-ctl.c`, compiled by the bench with `cc`
//! against libsystemd): bluechictl's calls and output for the two commands, in a small C
//! program on sd-bus linked to `libsystemd.so.0` as bluechictl is (bluechictl itself has
//! no Debian package). `busctl` is measured beside it as a second sd-bus reference; it
//! links systemd's big private library, so its start-up is heavier than bluechictl's.
//!
//! Two commands, against the same running sandbox:
//!
//! * `status`: `droverctl --bus ADDR status`; `sdbus-ctl ADDR status` (one
//!   `Controller.ListNodes`, the table); `busctl --address=ADDR call ... ListNodes`.
//! * `start`: `droverctl --bus ADDR start node2 UNIT` (a trivial oneshot; the process exits
//!   after the job's `JobRemoved`); `sdbus-ctl ADDR start node2 UNIT` (match `JobRemoved`,
//!   `Node.StartUnit`, wait, as bluechictl does); `busctl call ... Node StartUnit ss UNIT
//!   replace` with the bench waiting for that job's `JobRemoved` on its own connection
//!   (subscribed beforehand): its sample ends when the process has exited and the job has
//!   ended.
//!
//! Each round runs every side once per command, the order rotated from round to round, so
//! that load drift on a shared machine hits all sides alike; the report gives medians and
//! p90 of wall time, the median of the paired difference to sdbus-ctl with a bootstrap 95%
//! confidence interval (an interval that holds 0: the run cannot tell the two apart), and
//! per process
//! (from `wait4`): minor and major page faults and user+system CPU time. Peak RSS comes
//! from a separate pass (5 runs per side and command, median) through `benches/c/maxrss.c`:
//! a child of the bench itself would report the bench's own high-water mark.
//!
//! ```text
//! drover-bench ctl --samples 300 --ctl target/release/droverctl --ctl /tmp/old/droverctl \
//!     --ctl-csv /tmp/ctl.csv
//! ```
//!
//! Without `--ctl`, the `droverctl` the sandbox would find (`DROVER_BIN_DIR`, next to the
//! bench, `$PATH`) is measured.

use crate::stats::{Spread, median_ci95, median_f64};
use anyhow::{Context, Result, bail};
use drover_bus::bluechi;
use drover_sandbox::{Cluster, binaries};
use futures::{FutureExt, StreamExt};
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use zbus::OwnedObjectPath;

const UNIT: &str = "bench-ctl.service";
const NODE: &str = "node2";
const WARMUP: usize = 10;
const JOB_TIMEOUT: Duration = Duration::from_secs(10);

/// What `wait4` says about one finished process, and how long it took.
#[derive(Debug, Clone, Copy)]
struct Sample {
    wall: Duration,
    minflt: i64,
    majflt: i64,
    cpu: Duration,
}

/// Which program a side runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `benches/c/sdbus-ctl.c`: bluechictl's calls on sd-bus (the baseline).
    SdBus,
    /// `busctl call`: sd-bus too, but a much bigger binary (libsystemd-shared).
    Busctl,
    Droverctl,
}

/// One client under test.
struct Side {
    label: String,
    bin: PathBuf,
    kind: Kind,
    status: Vec<Sample>,
    start: Vec<Sample>,
}

/// Runs the benchmark on `cluster` with `samples` rounds; `ctls` are the droverctl
/// binaries (empty: the one the sandbox finds); the samples go to `csv` when given.
pub async fn ctl(
    cluster: &Cluster,
    samples: usize,
    ctls: &[PathBuf],
    csv: Option<&Path>,
) -> Result<()> {
    cluster
        .install_unit(NODE, UNIT, "[Service]\nType=oneshot\nExecStart=/bin/true\n")
        .await?;
    let mut sides = vec![
        Side::new(
            "sdbus-ctl (bluechictl stand-in)".into(),
            build_c(
                cluster.dir(),
                "sdbus-ctl",
                include_str!("../c/sdbus-ctl.c"),
                &["-lsystemd"],
            )?,
            Kind::SdBus,
        ),
        Side::new("busctl".into(), locate_busctl()?, Kind::Busctl),
    ];
    let ctls = if ctls.is_empty() {
        vec![binaries::locate("droverctl")?]
    } else {
        ctls.to_vec()
    };
    for (i, bin) in ctls.into_iter().enumerate() {
        let label = format!("droverctl #{} {}", i + 1, bin.display());
        sides.push(Side::new(label, bin, Kind::Droverctl));
    }

    // The bench's own view of jobs, for the busctl side of `start`.
    let conn = zbus::connection::Builder::address(cluster.bus_address())
        .build()
        .await?;
    let controller = zbus::Proxy::new(
        &conn,
        bluechi::BUS_NAME,
        bluechi::CONTROLLER_PATH,
        bluechi::CONTROLLER_IFACE,
    )
    .await?;
    let mut removed = controller.receive_signal("JobRemoved").await?;

    let addr = cluster.bus_address().to_owned();
    let n = sides.len();
    for round in 0..(samples + WARMUP) {
        for k in 0..n {
            let side = &mut sides[(round + k) % n];
            let st = side.status_once(&addr).await?;
            let sa = side.start_once(&addr, &mut removed).await?;
            if round >= WARMUP {
                side.status.push(st);
                side.start.push(sa);
            }
        }
    }

    // Peak RSS, through the small `maxrss` runner (see `benches/c/maxrss.c`).
    let runner = build_c(cluster.dir(), "maxrss", include_str!("../c/maxrss.c"), &[])?;
    let mut peak = std::collections::HashMap::new();
    for side in &sides {
        for cmd in ["status", "start node2 UNIT"] {
            let mut kib = Vec::new();
            for _ in 0..5 {
                let mut args = vec![side.bin.display().to_string()];
                args.extend(side.args(&addr, cmd == "status"));
                let bin = runner.clone();
                let (_, _, err) =
                    tokio::task::spawn_blocking(move || run_blocking(&bin, &args)).await??;
                let last = err.lines().last().unwrap_or_default();
                let v: u64 = last
                    .strip_prefix("maxrss ")
                    .and_then(|v| v.trim().parse().ok())
                    .with_context(|| format!("maxrss printed {err:?}"))?;
                kib.push(v);
            }
            kib.sort_unstable();
            peak.insert((side.label.clone(), cmd), kib[kib.len() / 2]);
        }
    }
    // The busctl start samples left jobs to end; let them.
    tokio::time::sleep(Duration::from_millis(200)).await;

    println!(
        "ctl: whole process, spawn to exit, {samples} rounds (+{WARMUP} warm-up), sides interleaved; load {}",
        loadavg()
    );
    for (cmd, pick) in [
        (
            "status",
            (|s: &Side| &s.status) as fn(&Side) -> &Vec<Sample>,
        ),
        ("start node2 UNIT", |s: &Side| &s.start),
    ] {
        println!("  {cmd}:");
        let base: Vec<f64> = pick(&sides[0]).iter().map(|s| wall_ms(s.wall)).collect();
        for side in &sides {
            let v = pick(side);
            let wall: Vec<f64> = v.iter().map(|s| wall_ms(s.wall)).collect();
            let sp = Spread::of(&wall);
            let diff: Vec<f64> = wall.iter().zip(&base).map(|(a, b)| a - b).collect();
            let col = |f: fn(&Sample) -> f64| median_f64(&v.iter().map(f).collect::<Vec<_>>());
            let (lo, hi) = median_ci95(&diff, 2000);
            println!(
                "    {:<40} median {:.3} ms  p90 {:.3} ms  vs sdbus-ctl {:+.3} ms [{:+.3}, {:+.3}]  | minflt {:.0}  majflt {:.0}  cpu {:.3} ms  peak RSS {} KiB",
                side.label,
                sp.median,
                sp.p90,
                median_f64(&diff),
                lo,
                hi,
                col(|s| s.minflt as f64),
                col(|s| s.majflt as f64),
                col(|s| wall_ms(s.cpu)),
                peak[&(side.label.clone(), cmd)],
            );
        }
    }
    if let Some(path) = csv {
        write_csv(path, &sides).with_context(|| format!("writing {}", path.display()))?;
        println!("  samples written to {}", path.display());
    }
    Ok(())
}

impl Side {
    fn new(label: String, bin: PathBuf, kind: Kind) -> Side {
        Side {
            label,
            bin,
            kind,
            status: Vec::new(),
            start: Vec::new(),
        }
    }

    /// The command line of this side for `status` (else `start node2 UNIT`).
    fn args(&self, addr: &str, status: bool) -> Vec<String> {
        let mut args: Vec<String> = match self.kind {
            Kind::SdBus => vec![addr.into()],
            Kind::Busctl => vec![
                format!("--address={addr}"),
                "call".into(),
                bluechi::BUS_NAME.into(),
            ],
            Kind::Droverctl => vec!["--bus".into(), addr.into()],
        };
        match (self.kind, status) {
            (Kind::Busctl, true) => args.extend([
                bluechi::CONTROLLER_PATH.into(),
                bluechi::CONTROLLER_IFACE.into(),
                "ListNodes".into(),
            ]),
            (Kind::Busctl, false) => args.extend([
                bluechi::node_path(NODE),
                bluechi::NODE_IFACE.into(),
                "StartUnit".into(),
                "ss".into(),
                UNIT.into(),
                "replace".into(),
            ]),
            (_, true) => args.push("status".into()),
            (_, false) => args.extend(["start".into(), NODE.into(), UNIT.into()]),
        }
        args
    }

    async fn status_once(&self, addr: &str) -> Result<Sample> {
        let (sample, _) = run(&self.bin, self.args(addr, true)).await?;
        Ok(sample)
    }

    async fn start_once(
        &self,
        addr: &str,
        removed: &mut zbus::proxy::SignalStream<'_>,
    ) -> Result<Sample> {
        let args = self.args(addr, false);
        if self.kind != Kind::Busctl {
            let (sample, out) = run(&self.bin, args).await?;
            if !out.contains("operation result: done") {
                bail!("{}: unexpected output {out:?}", self.label);
            }
            return Ok(sample);
        }
        let t = Instant::now();
        let (mut sample, out) = run(&self.bin, args).await?;
        // busctl prints `o "/org/eclipse/bluechi/job/N"`.
        let job = out
            .trim()
            .strip_prefix("o ")
            .map(|p| p.trim_matches('"').to_owned())
            .with_context(|| format!("busctl printed {out:?}"))?;
        let exited = t + sample.wall;
        if let Some(seen) = wait_removed(removed, &job).await? {
            sample.wall = seen.max(exited) - t;
        }
        Ok(sample)
    }
}

/// Waits for the `JobRemoved` of `job`: `None` when it was already queued (it came
/// while the process ran; the caller counts the process exit as the end), else when it
/// arrived.
async fn wait_removed(
    stream: &mut zbus::proxy::SignalStream<'_>,
    job: &str,
) -> Result<Option<Instant>> {
    let is_ours = |msg: &zbus::Message| {
        msg.body()
            .deserialize::<(u32, OwnedObjectPath, String, String, String)>()
            .is_ok_and(|(_, path, ..)| path.as_str() == job)
    };
    while let Some(queued) = stream.next().now_or_never() {
        let Some(msg) = queued else {
            bail!("JobRemoved stream ended");
        };
        if is_ours(&msg) {
            return Ok(None);
        }
    }
    tokio::time::timeout(JOB_TIMEOUT, async {
        while let Some(msg) = stream.next().await {
            if is_ours(&msg) {
                return Ok(Some(Instant::now()));
            }
        }
        bail!("JobRemoved stream ended")
    })
    .await
    .context("job did not finish within 10 s")?
}

/// Spawns `bin args` with stdout and stderr captured, waits for it with `wait4` (its own rusage),
/// and fails unless it exited 0.
async fn run(bin: &Path, args: Vec<String>) -> Result<(Sample, String)> {
    let bin = bin.to_owned();
    let (sample, out, _) = tokio::task::spawn_blocking(move || run_blocking(&bin, &args)).await??;
    Ok((sample, out))
}

/// Reaps `pid` with `wait4`: its exit status and its own resource usage (page faults,
/// CPU, max RSS), which std's `Child::wait` does not give.
#[allow(unsafe_code)]
pub(crate) fn wait4(pid: i32) -> Result<(i32, libc::rusage)> {
    let mut status = 0;
    // SAFETY: rusage is plain integers; all zero is a valid value for the kernel to
    // overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child, not yet reaped (nothing else waits for it); status and
    // ru are valid for writes for the whole call.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    if r != pid {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    Ok((status, ru))
}

fn run_blocking(bin: &Path, args: &[String]) -> Result<(Sample, String, String)> {
    let t = Instant::now();
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {}", bin.display()))?;
    let pid = i32::try_from(child.id())?;
    let (status, ru) = wait4(pid)?;
    let wall = t.elapsed();
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        o.read_to_string(&mut out)?;
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err)?;
    }
    let exit = std::process::ExitStatus::from_raw(status);
    if !exit.success() {
        bail!("{} {args:?}: {exit}: {out}{err}", bin.display());
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    Ok((
        Sample {
            wall,
            minflt: ru.ru_minflt,
            majflt: ru.ru_majflt,
            cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
        },
        out,
        err,
    ))
}

/// Compiles the C program `src` (a file of `benches/c/`) as `dir/name` (the sandbox's
/// directory, removed with it), linked with `libs`.
fn build_c(dir: &Path, name: &str, src: &str, libs: &[&str]) -> Result<PathBuf> {
    let src_path = dir.join(format!("{name}.c"));
    let bin = dir.join(name);
    std::fs::write(&src_path, src)?;
    let out = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src_path)
        .args(libs)
        .output()
        .with_context(|| format!("running cc for {name}"))?;
    if !out.status.success() {
        bail!(
            "cannot build {name} (needs a C compiler, and libsystemd-dev for sdbus-ctl): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(bin)
}

fn locate_busctl() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    binaries::locate_in("busctl", &dirs).context("the sd-bus baseline needs busctl (systemd)")
}

fn wall_ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// One row per sample: side, command, round, wall ms, faults, CPU ms, max RSS.
fn write_csv(path: &Path, sides: &[Side]) -> Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(f, "side,command,round,wall_ms,minflt,majflt,cpu_ms")?;
    for side in sides {
        for (cmd, v) in [("status", &side.status), ("start", &side.start)] {
            for (i, s) in v.iter().enumerate() {
                writeln!(
                    f,
                    "{},{cmd},{i},{:.4},{},{},{:.4}",
                    side.label,
                    wall_ms(s.wall),
                    s.minflt,
                    s.majflt,
                    wall_ms(s.cpu),
                )?;
            }
        }
    }
    f.flush()?;
    Ok(())
}
