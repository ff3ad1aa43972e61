//! The `drover-sandbox` command: `up`, `exec`, `install`, `down`, `demo`.
//!
//! `up` starts a sandbox whose processes outlive the command (it detaches from the
//! [`Cluster`] after everything is online); the other commands find it again through
//! `DIR/state.json`. `--dir` defaults to `$DROVER_SANDBOX_DIR`, then `/tmp/drover-sandbox`.
//! Usage errors are clap's (exit 2); failures print one message and exit 1; `exec` passes
//! the command's exit code through. [`main`] is the whole program (`main.rs` calls it):
//! parse, run on a two-worker runtime, print a failure as one line.

use crate::binaries;
use crate::bus;
use crate::cluster::{Cluster, ClusterOptions, MAX_MANAGERS, MAX_NODES};
use crate::files;
use crate::node;
use crate::process;
use crate::state::{ENV_FILE, State};
use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use drover_protocol::{NodeName, UnitName};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

pub const DEFAULT_DIR: &str = "/tmp/drover-sandbox";

#[derive(Debug, Parser)]
#[command(
    name = "drover-sandbox",
    version,
    about = "A local drover cluster of real systemd --user nodes on this machine"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a sandbox in the background and wait until every node is online.
    Up {
        /// Number of nodes, named node1..nodeN (default 3).
        #[arg(long, value_name = "N", conflicts_with = "node",
              value_parser = clap::value_parser!(u16).range(1..=MAX_NODES as i64))]
        nodes: Option<u16>,
        /// A node name (repeat for more nodes).
        #[arg(long = "node", value_name = "NAME", value_parser = parse_node_name)]
        node: Vec<String>,
        /// Sandbox directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Plaintext between agents and manager (on loopback) instead of the
        /// default mutual TLS with certificates from `DIR/pki`.
        #[arg(long)]
        no_tls: bool,
        /// Also give every node drover's BlueChi compatibility templates
        /// (bluechi-proxy@.service, bluechi-dep@.service), so units written
        /// for BlueChi (Wants=bluechi-proxy@node2_db.service) work.
        #[arg(long)]
        bluechi_compat: bool,
        /// Also run drover-dns beside the manager, answering for the zone
        /// `drover.` on a free loopback port (DROVER_DNS=HOST:PORT in sandbox.env).
        #[arg(long)]
        dns: bool,
        /// Run N managers (1 to 3) that elect their leader on a local etcd (Debian's
        /// etcd-server), each on its own bus and loopback address like a host of its
        /// own; sandbox.env gets DROVER_BUS_K and DROVER_MANAGER_PID_K for each manager K
        /// and DROVER_ETCD (DROVER_BUS stays the first's, which leads at first).
        #[arg(long, value_name = "N",
              value_parser = clap::value_parser!(u16).range(1..=MAX_MANAGERS as i64))]
        managers: Option<u16>,
    },
    /// Run a command inside a node (its namespaces and environment).
    Exec {
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        #[arg(value_parser = parse_node_name)]
        node: String,
        /// The command, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Copy unit files into a node and reload its systemd.
    Install {
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        #[arg(value_parser = parse_node_name)]
        node: String,
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Stop a sandbox and remove everything it made (idempotent).
    Down {
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Build a 3-node cluster in a temporary directory, drive it with droverctl, tear it down.
    Demo,
}

fn parse_node_name(s: &str) -> Result<String, String> {
    NodeName::new(s)
        .map(|n| n.as_str().to_string())
        .map_err(|e| e.to_string())
}

/// The sandbox directory: `--dir`, else `$DROVER_SANDBOX_DIR`, else [`DEFAULT_DIR`].
pub fn resolve_dir(dir: Option<PathBuf>) -> PathBuf {
    dir.or_else(|| std::env::var_os("DROVER_SANDBOX_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

/// The whole program: what `main.rs` calls.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drover-sandbox: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("drover-sandbox: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one command; returns the process exit code.
pub async fn run(cli: Cli) -> Result<u8> {
    match cli.command {
        Command::Up {
            nodes,
            node,
            dir,
            no_tls,
            bluechi_compat,
            dns,
            managers,
        } => {
            let mut opts = if node.is_empty() {
                ClusterOptions::with_nodes(usize::from(nodes.unwrap_or(3)))
            } else {
                ClusterOptions {
                    nodes: node,
                    ..ClusterOptions::default()
                }
            };
            opts.dir = Some(resolve_dir(dir));
            opts.tls = !no_tls;
            opts.bluechi_compat = bluechi_compat;
            opts.metrics = true;
            opts.managers = managers.map(usize::from);
            up(opts, dns).await
        }
        Command::Exec { dir, node, cmd } => exec(&resolve_dir(dir), &node, &cmd),
        Command::Install { dir, node, files } => install(&resolve_dir(dir), &node, &files).await,
        Command::Down { dir } => down(&resolve_dir(dir)),
        Command::Demo => demo().await,
    }
}

async fn up(opts: ClusterOptions, dns: bool) -> Result<u8> {
    let mut interrupt = interrupt_stream()?;
    // Ctrl-C while starting drops the half-built cluster, whose Drop tears it down.
    let mut cluster = tokio::select! {
        c = Cluster::start(opts) => c?,
        _ = interrupt.recv() => bail!("interrupted; nothing was left running"),
    };
    if dns {
        cluster.start_dns("").await?;
    }
    let metrics = cluster.metrics_url();
    let mut env = files::env_lines(cluster.bus_address(), cluster.dir(), metrics.as_deref());
    if let Some(address) = cluster.dns_address() {
        env.push_str(&files::dns_line(address));
    }
    if let Some(etcd) = cluster.etcd_url() {
        env.push_str(&files::managers_lines(&cluster.managers(), &etcd));
    }
    let env_file = cluster.dir().join(ENV_FILE);
    // Written while the cluster value still owns the sandbox: a failure here drops it,
    // which tears it down, instead of leaving a sandbox nobody was told about.
    std::fs::write(&env_file, &env).with_context(|| format!("writing {}", env_file.display()))?;
    cluster.detach()?;
    print!("{env}");
    Ok(0)
}

/// SIGINT (Ctrl-C) as a stream; once created, SIGINT no longer kills the process.
fn interrupt_stream() -> Result<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("installing the Ctrl-C handler")
}

fn load(dir: &Path) -> Result<State> {
    State::load(dir)?.with_context(|| {
        format!(
            "no sandbox in {} (no state.json); start one with `drover-sandbox up`",
            dir.display()
        )
    })
}

fn exec(dir: &Path, node_name: &str, cmd: &[String]) -> Result<u8> {
    let state = load(dir)?;
    let pid = live_node_pid(&state, node_name)?;
    let argv: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let status = node::exec_command(&state.dir, node_name, pid, &argv)
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("running nsenter for node {node_name}"))?;
    Ok(exit_code(status))
}

/// The shell convention: the exit code, or 128 + the signal that killed it.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}

fn live_node_pid(state: &State, node_name: &str) -> Result<u32> {
    let pid = state
        .node(node_name)?
        .systemd_pid
        .with_context(|| format!("node {node_name} was never started"))?;
    if !process::alive(pid) {
        bail!(
            "node {node_name} is not running (its systemd pid {pid} is gone); run `drover-sandbox down` and `up` again"
        );
    }
    Ok(pid)
}

async fn install(dir: &Path, node_name: &str, unit_files: &[PathBuf]) -> Result<u8> {
    let state = load(dir)?;
    live_node_pid(&state, node_name)?;
    let target_dir = node::unit_dir(&state.dir, node_name);
    for file in unit_files {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("{} has no usable file name", file.display()))?;
        let unit = UnitName::new(name)
            .with_context(|| format!("{} is not a unit file name", file.display()))?;
        std::fs::copy(file, target_dir.join(unit.as_str()))
            .with_context(|| format!("copying {} into node {node_name}", file.display()))?;
    }
    bus::reload_systemd(&node::bus_address(&state.dir, node_name)).await?;
    for file in unit_files {
        println!("installed {} on {node_name}", file.display());
    }
    Ok(0)
}

fn down(dir: &Path) -> Result<u8> {
    let Some(state) = State::load(dir)? else {
        println!("no sandbox in {}; nothing to do", dir.display());
        return Ok(0);
    };
    let errors = state.teardown();
    if !errors.is_empty() {
        bail!(
            "teardown of {} failed:\n  {}",
            dir.display(),
            errors.join("\n  ")
        );
    }
    println!("sandbox in {} is down", dir.display());
    Ok(0)
}

const DEMO_UNIT: &str = "\
[Unit]
Description=drover demo: a oneshot that succeeds

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/echo hello from drover-demo
";

/// The cross-node part of the demo: need-db on node1 depends on db on node3.
const DEMO_DB: &str = "\
[Unit]
Description=drover demo: a database on node3

[Service]
ExecStart=/bin/sleep infinity
";
const DEMO_NEED_DB: &str = "\
[Unit]
Description=drover demo: needs db.service on node3
Wants=drover-proxy@node3_db.service
After=drover-proxy@node3_db.service

[Service]
ExecStart=/bin/sleep infinity
";

async fn demo() -> Result<u8> {
    binaries::build_companions_under_cargo()?;
    let droverctl = binaries::locate("droverctl")?;
    // One stream for the whole run: a Ctrl-C between two waits is not lost.
    let mut interrupt = interrupt_stream()?;
    println!("starting a 3-node sandbox...");
    let cluster = tokio::select! {
        c = Cluster::start(ClusterOptions::with_nodes(3)) => c?,
        _ = interrupt.recv() => bail!("interrupted; nothing was left running"),
    };
    println!(
        "sandbox up in {} (manager bus {})",
        cluster.dir().display(),
        cluster.bus_address()
    );
    let result = tokio::select! {
        r = demo_steps(&cluster, &droverctl) => r,
        _ = interrupt.recv() => Err(anyhow::anyhow!("interrupted")),
    };
    println!("tearing down...");
    let down = cluster.down().await;
    result?;
    down?;
    println!("done");
    Ok(0)
}

async fn demo_steps(cluster: &Cluster, droverctl: &Path) -> Result<()> {
    droverctl_step(cluster, droverctl, &["status"]).await?;
    cluster
        .install_unit("node2", "drover-demo.service", DEMO_UNIT)
        .await?;
    println!("(installed drover-demo.service on node2)");
    droverctl_step(
        cluster,
        droverctl,
        &["list-units", "node2", "--filter", "drover-demo*"],
    )
    .await?;
    droverctl_step(
        cluster,
        droverctl,
        &["start", "node2", "drover-demo.service"],
    )
    .await?;
    // Started, the unit is loaded and shows up.
    droverctl_step(
        cluster,
        droverctl,
        &["list-units", "node2", "--filter", "drover-demo*"],
    )
    .await?;
    droverctl_step(cluster, droverctl, &["status"]).await?;

    // A cross-node dependency: starting need-db on node1 starts db on node3 first.
    cluster.install_unit("node3", "db.service", DEMO_DB).await?;
    cluster
        .install_unit("node1", "need-db.service", DEMO_NEED_DB)
        .await?;
    println!(
        "\n(installed db.service on node3, and need-db.service on node1 with\n \
         Wants=drover-proxy@node3_db.service + After=drover-proxy@node3_db.service)"
    );
    droverctl_step(cluster, droverctl, &["start", "node1", "need-db.service"]).await?;
    droverctl_step(
        cluster,
        droverctl,
        &["list-units", "node3", "--filter", "*db.service*"],
    )
    .await?;
    droverctl_step(cluster, droverctl, &["proxies"]).await?;
    Ok(())
}

async fn droverctl_step(cluster: &Cluster, droverctl: &Path, args: &[&str]) -> Result<()> {
    println!(
        "\n$ droverctl {}",
        args.iter()
            .map(|a| shown_arg(a))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = tokio::process::Command::new(droverctl)
        .arg("--bus")
        .arg(cluster.bus_address())
        .args(args)
        .env("DROVER_BUS", cluster.bus_address())
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), out)
        .await
        .context("droverctl did not finish within 60 s")?
        .context("running droverctl")?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("droverctl {} failed ({})", args.join(" "), out.status);
    }
    Ok(())
}

fn shown_arg(arg: &str) -> String {
    if arg.contains(['*', ' ', '?']) {
        files::shell_quote(arg)
    } else {
        arg.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::tests::leftovers;
    use crate::state::TeardownOnDrop;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exec_install_and_down_work_on_a_detached_sandbox() {
        let dir = PathBuf::from(format!("/tmp/drover-sb-cli-{}", std::process::id()));
        let opts = ClusterOptions {
            dir: Some(dir.clone()),
            ..ClusterOptions::with_nodes(2)
        };
        let cluster = Cluster::start_base(&opts, Vec::new()).await.unwrap();
        cluster.detach().unwrap();
        // Detached, the sandbox has no owner: this one tears it down if an assert fails.
        let held = TeardownOnDrop::new(State::load(&dir).unwrap().unwrap());
        let state = held.state().clone();

        let sh = |script: &str| vec!["/bin/sh".to_string(), "-c".to_string(), script.to_string()];
        assert_eq!(
            exec(&dir, "node1", &sh("exit 3")).unwrap(),
            3,
            "exit code passes through"
        );
        assert_eq!(exec(&dir, "node2", &sh("kill -9 $$")).unwrap(), 128 + 9);
        let err = exec(&dir, "node7", &sh("true")).unwrap_err().to_string();
        assert!(err.contains("no node 'node7'"), "{err}");

        let unit = dir.join("cli-demo.service");
        std::fs::write(&unit, "[Service]\nType=oneshot\nExecStart=/bin/true\n").unwrap();
        assert_eq!(
            install(&dir, "node2", std::slice::from_ref(&unit))
                .await
                .unwrap(),
            0
        );
        let cat = vec![
            "systemctl".to_string(),
            "--user".to_string(),
            "cat".into(),
            "cli-demo.service".into(),
        ];
        assert_eq!(
            exec(&dir, "node2", &cat).unwrap(),
            0,
            "installed and loaded on node2"
        );
        assert_ne!(exec(&dir, "node1", &cat).unwrap(), 0, "not on node1");
        let bad = dir.join("not-a-unit.txt");
        std::fs::write(&bad, "x").unwrap();
        assert!(install(&dir, "node2", &[bad]).await.is_err());

        assert_eq!(down(&dir).unwrap(), 0);
        assert_eq!(leftovers(&state), Vec::<String>::new());
        held.release();
        assert_eq!(down(&dir).unwrap(), 0, "down is idempotent");
        assert!(
            exec(&dir, "node1", &sh("true"))
                .unwrap_err()
                .to_string()
                .contains("no sandbox")
        );
    }

    #[test]
    fn dir_defaults_to_the_given_one_then_the_default() {
        assert_eq!(resolve_dir(Some("/x".into())), PathBuf::from("/x"));
        if std::env::var_os("DROVER_SANDBOX_DIR").is_none() {
            assert_eq!(resolve_dir(None), PathBuf::from(DEFAULT_DIR));
        }
    }
}
