//! The `drover-proxy` command line and what each command does.
//!
//! ```text
//! drover-proxy [--user | --bus ADDRESS] create|remove INSTANCE
//! ```
//!
//! Exit codes: 0 = done (`create`: the target is active; `remove`: the agent
//! released the proxy or holds none); 1 = the agent refused or failed, or could
//! not be reached (one line on stderr says why, and systemd puts it in the
//! proxy unit's journal); 2 = a malformed instance or bad arguments, refused
//! before anything is sent.
//!
//! While `create` waits, SIGTERM or SIGINT (systemd stopping the proxy unit,
//! or its `TimeoutStartSec=` running out) releases the proxy with
//! `RemoveProxy` first — systemd runs no `ExecStop=` for a unit stopped while
//! starting — and then ends the helper by that same signal, so that
//! `SuccessExitStatus=SIGTERM` applies.

use crate::agent::{AgentClient, AgentError, Bus};
use crate::instance::ProxyInstance;
use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;

/// How long a removal may take before the helper gives up on it.
pub const REMOVE_TIMEOUT: Duration = Duration::from_secs(10);

/// drover-proxy: backs drover-proxy@NODE_UNIT.service; asks the local drover
/// agent to start UNIT on NODE (create) or to release it (remove).
#[derive(Debug, Parser)]
#[command(name = "drover-proxy", disable_version_flag = true)]
pub struct Args {
    /// The agent is on the session bus (user-mode units).
    #[arg(short = 'u', long = "user", global = true)]
    pub user: bool,
    /// The agent is on this D-Bus address.
    #[arg(
        long = "bus",
        value_name = "ADDRESS",
        conflicts_with = "user",
        global = true
    )]
    pub bus: Option<String>,
    /// Print the version and exit.
    #[arg(short = 'v', long = "version")]
    pub version: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Ask the agent to start the target; exit 0 once it is active.
    Create {
        /// NODE_UNIT, as systemd's %i gives it (e.g. node2_db for db.service on node2).
        instance: String,
    },
    /// Tell the agent this proxy is no longer needed.
    Remove {
        /// NODE_UNIT, as for create.
        instance: String,
    },
}

impl Args {
    pub fn bus(&self) -> Bus {
        match (&self.bus, self.user) {
            (Some(a), _) => Bus::Address(a.clone()),
            (None, true) => Bus::Session,
            (None, false) => Bus::System,
        }
    }
}

/// The binary's whole life: parse, run, report.
pub fn main() -> ExitCode {
    let args = Args::parse();
    if args.version {
        println!("drover-proxy version {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let Some(command) = &args.command else {
        eprintln!("drover-proxy: missing command: create or remove (see --help)");
        return ExitCode::from(2);
    };
    let (verb, instance) = match command {
        Command::Create { instance } => ("create", instance),
        Command::Remove { instance } => ("remove", instance),
    };
    let proxy = match ProxyInstance::parse(instance) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("drover-proxy: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drover-proxy: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let bus = args.bus();
    let res = runtime.block_on(async {
        match verb {
            "create" => create(bus, &proxy).await,
            _ => remove(bus, &proxy).await,
        }
    });
    let code = match res {
        Ok(msg) => {
            println!("drover-proxy: {msg}");
            0
        }
        Err(msg) => {
            eprintln!("drover-proxy: {msg}");
            1
        }
    };
    // Exit now: the proxy unit becomes active when this process is gone, and
    // units ordered after it wait for that. Tearing down the runtime and the
    // bus connection gains nothing (the kernel closes the socket).
    let _ = std::io::Write::flush(&mut std::io::stdout());
    std::process::exit(code)
}

/// `create`: the Ok text is the success line, the Err text the failure line.
pub async fn create(bus: Bus, proxy: &ProxyInstance) -> Result<String, String> {
    let what = format!("cannot start {proxy}");
    // Handlers first: a stop that arrives while connecting must still release.
    let (mut term, mut int) = signals().map_err(|e| format!("{what}: {e}"))?;
    let client = AgentClient::connect(bus)
        .await
        .map_err(|e| format!("{what}: {e}"))?;
    let signal = tokio::select! {
        res = client.create_proxy(proxy) => {
            return res
                .map(|()| format!("{proxy} is active"))
                .map_err(|e| format!("{what}: {e}"));
        }
        _ = term.recv() => nix::sys::signal::Signal::SIGTERM,
        _ = int.recv() => nix::sys::signal::Signal::SIGINT,
    };
    eprintln!("drover-proxy: stopped while waiting for {proxy}; releasing the proxy");
    if let Err(e) = client.remove_proxy(proxy, Some(REMOVE_TIMEOUT)).await {
        eprintln!("drover-proxy: releasing the proxy for {proxy} failed: {e}");
    }
    die_by(signal)
}

/// `remove`. An agent that is not running holds no proxy, so there is nothing
/// to release: that is success (said so in the journal), not a failed stop.
pub async fn remove(bus: Bus, proxy: &ProxyInstance) -> Result<String, String> {
    let what = format!("cannot release the proxy for {proxy}");
    let client = AgentClient::connect(bus)
        .await
        .map_err(|e| format!("{what}: {e}"))?;
    match client.remove_proxy(proxy, Some(REMOVE_TIMEOUT)).await {
        Ok(()) => Ok(format!("released the proxy for {proxy}")),
        Err(e @ AgentError::NotRunning { .. }) => {
            Ok(format!("nothing to release for {proxy}: {e}"))
        }
        Err(e) => Err(format!("{what}: {e}")),
    }
}

type SignalPair = (tokio::signal::unix::Signal, tokio::signal::unix::Signal);

fn signals() -> std::io::Result<SignalPair> {
    use tokio::signal::unix::{SignalKind, signal};
    Ok((
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    ))
}

/// Ends the process by `sig` with its default action, so the exit status says
/// "killed by SIGTERM" (or SIGINT) exactly as if no handler had been installed.
fn die_by(sig: nix::sys::signal::Signal) -> ! {
    use nix::sys::signal::{SigHandler, raise, signal};
    // SAFETY: restoring the default disposition installs no Rust code as a handler.
    let _ = unsafe { signal(sig, SigHandler::SigDfl) };
    let _ = raise(sig);
    // Only reached if the signal is blocked; the status then is the classic 128+N.
    std::process::exit(128 + sig as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("drover-proxy").chain(argv.iter().copied()))
    }

    #[test]
    fn flags_choose_the_bus_anywhere_on_the_line() {
        let a = parse(&["create", "n_db"]).unwrap();
        assert_eq!(a.bus(), Bus::System);
        assert!(matches!(a.command, Some(Command::Create { ref instance }) if instance == "n_db"));
        assert_eq!(
            parse(&["--user", "create", "n_db"]).unwrap().bus(),
            Bus::Session
        );
        assert_eq!(
            parse(&["create", "n_db", "--user"]).unwrap().bus(),
            Bus::Session
        );
        assert_eq!(
            parse(&["remove", "--bus", "unix:path=/x", "n_db"])
                .unwrap()
                .bus(),
            Bus::Address("unix:path=/x".into())
        );
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        assert!(parse(&["--user", "--bus", "unix:path=/x", "create", "n_db"]).is_err());
        assert!(parse(&["create"]).is_err());
        assert!(parse(&["create", "a", "b"]).is_err());
        assert!(parse(&["start", "n_db"]).is_err());
        for argv in [&["create"][..], &["frobnicate"]] {
            assert_eq!(parse(argv).unwrap_err().exit_code(), 2);
        }
    }
}
