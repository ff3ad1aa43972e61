//! The `drover-proxy` command line and what each command does.
//!
//! ```text
//! drover-proxy [--user | --bus ADDRESS] create|remove INSTANCE
//! bluechi-proxy [--user | --bus ADDRESS] create|remove INSTANCE.service
//! ```
//!
//! Run under the name `bluechi-proxy` (the BlueChi compatibility set links
//! `/usr/libexec/bluechi-proxy` to this binary, and BlueChi's
//! `bluechi-proxy@.service` runs `bluechi-proxy create %i.service`), the
//! helper takes BlueChi's argument and backs `bluechi-proxy@INSTANCE.service`
//! ([`ProxyTemplate::of_program`], [`ProxyInstance::parse_arg`]); everything
//! else is the same.
//!
//! Exit codes: 0 = done (`create`: the target is active; `remove`: the agent
//! released the proxy or holds none); 1 = the agent refused or failed, or could
//! not be reached, or (`remove`) it stopped the proxy because its target
//! failed, so that the proxy unit ends `failed` (one line on stderr says why, and systemd puts it in the
//! proxy unit's journal); 2 = a malformed instance or bad arguments, refused
//! before anything is sent.
//!
//! While `create` waits, SIGTERM or SIGINT (systemd stopping the proxy unit,
//! or its `TimeoutStartSec=` running out) releases the proxy with
//! `RemoveProxy` first — systemd runs no `ExecStop=` for a unit stopped while
//! starting — prints why the proxy was still waiting (the agent's answer to the
//! interrupted `CreateProxy`, e.g. "node bar is offline (since …, 93 s ago)"),
//! and then ends the helper by that same signal, so that
//! `SuccessExitStatus=SIGTERM` applies.
//!
//! The arguments are parsed by hand and everything blocks on one thread: the
//! helper runs once per proxy start, on the path of that start, so it stays
//! small and quick to exec (see [`crate::wire`]).

use crate::agent::{AgentClient, AgentError, Bus, CallEnd};
use crate::instance::ProxyInstance;
use drover_protocol::ProxyTemplate;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::process::ExitCode;
use std::time::Duration;

/// How long a removal may take before the helper gives up on it.
pub const REMOVE_TIMEOUT: Duration = Duration::from_secs(10);
/// After a removal, how long the helper waits for the agent's answer to the
/// interrupted `CreateProxy` (sent as the removal is handled, so it is there
/// by then or very soon after; the bound is for an agent that went away).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

pub const USAGE: &str = "\
drover-proxy: backs drover-proxy@NODE_UNIT.service; asks the local drover
agent to start UNIT on NODE (create) or to release it (remove).

Usage: drover-proxy [--user | --bus ADDRESS] create|remove INSTANCE

  create INSTANCE   ask the agent to start the target; exit 0 once it is active
  remove INSTANCE   tell the agent this proxy is no longer needed
                    (INSTANCE is NODE_UNIT, as systemd's %i gives it,
                    e.g. node2_db for db.service on node2)
  -u, --user        the agent is on the session bus (user-mode units)
      --bus ADDRESS the agent is on this D-Bus address
  -v, --version     print the version and exit
  -h, --help        print this help and exit

Run as bluechi-proxy (a link to this binary), it backs BlueChi's
bluechi-proxy@NODE_UNIT.service and takes INSTANCE as that template passes
it: NODE_UNIT.service (%i.service), e.g. node2_db.service.";

/// What the command line asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    pub user: bool,
    pub bus: Option<String>,
    pub version: bool,
    pub help: bool,
    pub command: Option<Command>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Create { instance: String },
    Remove { instance: String },
}

impl Args {
    /// Options go anywhere on the line; `--` ends them.
    pub fn parse<I: IntoIterator<Item = String>>(argv: I) -> Result<Self, String> {
        let mut args = Args::default();
        let mut words = Vec::new();
        let mut argv = argv.into_iter();
        let mut options = true;
        while let Some(arg) = argv.next() {
            match arg.as_str() {
                "--" if options => options = false,
                "-u" | "--user" if options => args.user = true,
                "-v" | "--version" if options => args.version = true,
                "-h" | "--help" if options => args.help = true,
                "--bus" if options => {
                    let value = argv.next().ok_or("--bus needs an ADDRESS")?;
                    args.bus = Some(value);
                }
                s if options && s.starts_with("--bus=") => {
                    args.bus = Some(s["--bus=".len()..].to_string());
                }
                s if options && s.starts_with('-') && s.len() > 1 => {
                    return Err(format!("unknown option '{s}'"));
                }
                _ => words.push(arg),
            }
        }
        if args.user && args.bus.is_some() {
            return Err("--user and --bus exclude each other".into());
        }
        if args.help || args.version {
            return Ok(args);
        }
        let mut words = words.into_iter();
        let verb = words
            .next()
            .ok_or("missing command: create or remove (see --help)")?;
        let instance = words
            .next()
            .ok_or_else(|| format!("{verb}: missing INSTANCE (NODE_UNIT)"))?;
        if let Some(extra) = words.next() {
            return Err(format!("unexpected argument '{extra}'"));
        }
        args.command = Some(match verb.as_str() {
            "create" => Command::Create { instance },
            "remove" => Command::Remove { instance },
            other => return Err(format!("unknown command '{other}': create or remove")),
        });
        Ok(args)
    }

    pub fn bus(&self) -> Bus {
        Bus::from_flags(self.bus.as_deref(), self.user)
    }
}

/// The binary's whole life: parse, run, report.
pub fn main() -> ExitCode {
    let mut argv = std::env::args();
    let template = ProxyTemplate::of_program(&argv.next().unwrap_or_default());
    let me = template.program();
    let args = match Args::parse(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{me}: {e}");
            return ExitCode::from(2);
        }
    };
    if args.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if args.version {
        println!("drover-proxy {}", drover_protocol::version_line!());
        return ExitCode::SUCCESS;
    }
    let Some(command) = &args.command else {
        unreachable!("Args::parse gives a command unless --help or --version");
    };
    let (create_it, instance) = match command {
        Command::Create { instance } => (true, instance),
        Command::Remove { instance } => (false, instance),
    };
    let proxy = match ProxyInstance::parse_arg(template, instance) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{me}: {e}");
            return ExitCode::from(2);
        }
    };
    let res = if create_it {
        create(args.bus(), &proxy)
    } else {
        remove(args.bus(), &proxy)
    };
    let code = match res {
        Ok(msg) => {
            println!("{me}: {msg}");
            0
        }
        Err(msg) => {
            eprintln!("{me}: {msg}");
            1
        }
    };
    // Exit now: the proxy unit becomes active when this process is gone, and
    // units ordered after it wait for that.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    std::process::exit(code)
}

/// `create`: the Ok text is the success line, the Err text the failure line.
pub fn create(bus: Bus, proxy: &ProxyInstance) -> Result<String, String> {
    let what = format!("cannot start {proxy}");
    // Signals first: a stop that arrives while connecting must still release.
    let stop = stop_signals().map_err(|e| format!("{what}: {e}"))?;
    let mut client = AgentClient::connect(bus).map_err(|e| format!("{what}: {e}"))?;
    let signal = match client.create_proxy(proxy, &stop) {
        Ok(()) => return Ok(format!("{proxy} is active")),
        Err(CallEnd::Failed(e)) => return Err(format!("{what}: {e}")),
        Err(CallEnd::Interrupted(sig)) => sig,
    };
    let released = client.remove_proxy(proxy, REMOVE_TIMEOUT);
    // The removal ends the waiting call; the agent's answer to it says why
    // the proxy was still waiting (its target's node offline, and since when).
    match client.create_proxy_answer(ANSWER_TIMEOUT) {
        Some(why) => eprintln!("drover-proxy: stopped while waiting for {proxy}: {why}"),
        None => eprintln!("drover-proxy: stopped while waiting for {proxy}"),
    }
    match released {
        Ok(()) => eprintln!("drover-proxy: released the proxy for {proxy}"),
        Err(e) => eprintln!("drover-proxy: releasing the proxy for {proxy} failed: {e}"),
    }
    die_by(signal)
}

/// `remove`. An agent that is not running holds no proxy, so there is nothing
/// to release: that is success (said so in the journal), not a failed stop.
pub fn remove(bus: Bus, proxy: &ProxyInstance) -> Result<String, String> {
    let what = format!("cannot release the proxy for {proxy}");
    let mut client = AgentClient::connect(bus).map_err(|e| format!("{what}: {e}"))?;
    match client.remove_proxy(proxy, REMOVE_TIMEOUT) {
        Ok(()) => Ok(format!("released the proxy for {proxy}")),
        Err(e @ AgentError::NotRunning { .. }) => {
            Ok(format!("nothing to release for {proxy}: {e}"))
        }
        // The agent stopped this proxy because its target failed: the stop
        // fails with that reason, so the proxy unit ends `failed`.
        Err(AgentError::Refused { reason }) => Err(format!("{proxy} ended: {reason}")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// SIGTERM and SIGINT, blocked and read from a signalfd instead.
fn stop_signals() -> nix::Result<SignalFd> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.thread_block()?;
    SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
}

/// Ends the process by `sig` with its default action, so the exit status says
/// "killed by SIGTERM" (or SIGINT) exactly as if no handler had been installed.
fn die_by(sig: Signal) -> ! {
    use nix::sys::signal::{SigHandler, raise, signal};
    // SAFETY: restoring the default disposition installs no Rust code as a handler.
    #[allow(unsafe_code)]
    let _ = unsafe { signal(sig, SigHandler::SigDfl) };
    let mut set = SigSet::empty();
    set.add(sig);
    let _ = raise(sig);
    let _ = set.thread_unblock();
    // Only reached if the signal could not be delivered; the status then is
    // the classic 128+N.
    std::process::exit(128 + sig as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Result<Args, String> {
        Args::parse(argv.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags_choose_the_bus_anywhere_on_the_line() {
        let a = parse(&["create", "n_db"]).unwrap();
        assert_eq!(a.bus(), Bus::System);
        assert_eq!(
            a.command,
            Some(Command::Create {
                instance: "n_db".into()
            })
        );
        assert_eq!(
            parse(&["--user", "create", "n_db"]).unwrap().bus(),
            Bus::Session
        );
        assert_eq!(
            parse(&["create", "n_db", "-u"]).unwrap().bus(),
            Bus::Session
        );
        for argv in [
            &["remove", "--bus", "unix:path=/x", "n_db"][..],
            &["--bus=unix:path=/x", "remove", "n_db"],
        ] {
            let a = parse(argv).unwrap();
            assert_eq!(a.bus(), Bus::Address("unix:path=/x".into()));
            assert_eq!(
                a.command,
                Some(Command::Remove {
                    instance: "n_db".into()
                })
            );
        }
        assert!(parse(&["--version"]).unwrap().version);
        assert!(parse(&["create", "-h"]).unwrap().help);
        // After "--" a word is an instance even if it looks like an option.
        assert_eq!(
            parse(&["create", "--", "-x_db"]).unwrap().command,
            Some(Command::Create {
                instance: "-x_db".into()
            })
        );
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        for (argv, why) in [
            (
                &["--user", "--bus", "unix:path=/x", "create", "n_db"][..],
                "exclude",
            ),
            (&["create"], "missing INSTANCE"),
            (&["create", "a", "b"], "unexpected argument 'b'"),
            (&["start", "n_db"], "unknown command 'start'"),
            (&[], "missing command"),
            (&["create", "n_db", "--bus"], "needs an ADDRESS"),
            (
                &["--frobnicate", "create", "n_db"],
                "unknown option '--frobnicate'",
            ),
        ] {
            let err = parse(argv).unwrap_err();
            assert!(err.contains(why), "{argv:?}: {err}");
        }
    }
}
