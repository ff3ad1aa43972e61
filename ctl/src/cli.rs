//! The command line and the program: global options, then [`main`] (parse, run on a
//! current-thread runtime, print any error as one line `droverctl: <message>` on
//! stderr, exit with [`CtlError::exit_code`]).
//!
//! Invariant: a value that reaches a command has passed validation (the value
//! parsers in [`crate::parse`]); a bad one is a clap error (exit 2, message naming the
//! argument) and no connection is opened. Subcommands themselves are declared in
//! [`crate::commands`].

use std::io::Write;

use clap::Parser;

use crate::client::resolve_bus;
use crate::commands::Command;
use crate::context::Context;
use crate::error::{CtlError, EXIT_FAILED, EXIT_OK};
use crate::parse::parse_bus_address;

/// Printed after `--help`: the exit-code contract and the environment.
const AFTER_HELP: &str = "\
Bus: --bus ADDRESS, else --user (session bus), else $DROVER_BUS, else the system bus.

Exit status:
  0  success (start/stop/restart/reload: the job result was 'done'; is-enabled: the
     unit file is enabled; monitor, status -w, metrics listen: ended with Ctrl-C)
  1  the operation failed: job result not 'done', node offline, unknown node or unit,
     status NODE UNIT...: a unit could not be found, is-enabled: not enabled,
     drover-manager unreachable or gone, timeout, any other D-Bus error
  2  usage error: unknown command or option, wrong number of arguments, invalid
     node or unit name, signal, log level or target; nothing was sent

Environment:
  DROVER_BUS  D-Bus address of the bus drover-manager is on (when neither --bus nor --user)";

/// droverctl: drive the units of a drover (BlueChi-compatible) fleet.
#[derive(Debug, Parser)]
#[command(
    name = "droverctl",
    version = drover_protocol::version_line!(),
    about = "Control the nodes and units of a drover fleet through drover-manager's D-Bus API",
    after_help = AFTER_HELP,
    subcommand_required = true,
    arg_required_else_help = true,
    disable_version_flag = true
)]
pub struct Cli {
    /// Print version ('droverctl version X')
    // bluechictl spells it -v; clap's usual -V keeps working too. clap prints and
    // exits while parsing, so the field carries nothing.
    #[arg(short = 'v', long = "version", short_alias = 'V', action = clap::ArgAction::Version)]
    pub version: (),

    /// D-Bus address of the bus drover-manager is on (overrides $DROVER_BUS)
    #[arg(long, global = true, value_name = "ADDRESS", value_parser = parse_bus_address, conflicts_with = "user")]
    pub bus: Option<String>,

    /// Use the session bus (drover-manager run with --user)
    #[arg(long, global = true)]
    pub user: bool,

    /// Print JSON instead of text: one array of objects, or for monitor, status -w and
    /// metrics listen one JSON value per line
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// Run a parsed command line, writing command output to `out`.
/// `env_bus` is the value of `$DROVER_BUS` (passed in so callers control it).
pub async fn run(cli: Cli, env_bus: Option<&str>, out: Box<dyn Write>) -> Result<(), CtlError> {
    let target = resolve_bus(cli.bus.as_deref(), cli.user, env_bus)?;
    let mut ctx = Context::new(target, cli.json, out);
    cli.command.run(&mut ctx).await
}

/// The whole program: what `main.rs` calls. Returns the exit status.
pub fn main() -> u8 {
    // Exits 2 with usage on a bad command line, 0 for --help/--version.
    let cli = Cli::parse();
    let env_bus = std::env::var("DROVER_BUS").ok();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("droverctl: cannot start the async runtime: {e}");
            return EXIT_FAILED;
        }
    };
    let out = Box::new(std::io::stdout());
    match runtime.block_on(run(cli, env_bus.as_deref(), out)) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            if !e.is_quiet() {
                eprintln!("droverctl: {e}");
            }
            e.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::EXIT_USAGE;
    use crate::parse::parse_timeout;
    use clap::error::ErrorKind;
    use std::time::Duration;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("droverctl").chain(args.iter().copied()))
    }

    /// A usage error: exit code 2 and the rendered text names the problem.
    fn usage_error(args: &[&str], expect: &str) -> String {
        let e = parse(args).expect_err(&format!("{args:?} should be rejected"));
        assert_eq!(e.exit_code(), i32::from(EXIT_USAGE), "{args:?}: {e}");
        let text = e.render().to_string();
        assert!(text.contains(expect), "{args:?}: {text}");
        text
    }

    /// Subcommand arguments are built lazily (`defer`); a subcommand's help must still
    /// open with its own description, not the doc of an argument struct it flattens.
    #[test]
    fn each_subcommand_help_opens_with_its_description() {
        let mut cli = <Cli as clap::CommandFactory>::command();
        // Before building: the descriptions from the command list, before any deferred
        // arguments are applied.
        let abouts: Vec<(String, String)> = cli
            .get_subcommands()
            .map(|c| {
                let about = c.get_about().map(|a| a.to_string()).unwrap_or_default();
                (c.get_name().to_owned(), about)
            })
            .collect();
        cli.build();
        for (name, about) in abouts {
            assert!(!about.is_empty(), "{name} has no description");
            let sub = cli.find_subcommand_mut(&name).expect("listed above");
            let help = sub.render_help().to_string();
            assert!(help.starts_with(&about), "{name}: {help}");
        }
    }

    #[test]
    fn garbage_is_a_usage_error_with_usage_text() {
        usage_error(&["frob"], "Usage");
        usage_error(&["--frob", "status"], "Usage");
        usage_error(&["status", "--frob"], "Usage");
        usage_error(&["proxies", "a", "b"], "Usage");
        usage_error(&["start", "a"], "Usage");
        usage_error(&["start"], "Usage");
        usage_error(&["start", "a", "web", "extra"], "Usage");
        usage_error(&["daemon-reload"], "Usage");
        usage_error(&["list-units", "a", "b"], "Usage");
        usage_error(
            &["--bus", "unix:path=/x", "--user", "status"],
            "cannot be used with",
        );
    }

    #[test]
    fn no_command_prints_help_and_exits_2() {
        let e = parse(&[]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.render().to_string().contains("Usage"));
    }

    #[test]
    fn bad_names_are_rejected_before_anything_is_sent() {
        usage_error(&["start", "a_b", "web"], "invalid node name");
        usage_error(&["start", "-x", "web"], "");
        usage_error(&["status", "no/de"], "invalid node name");
        usage_error(&["list-units", "é"], "invalid node name");
        usage_error(&["daemon-reload", ""], "node name is empty");
        usage_error(&["start", "a", "a b"], "invalid unit name 'a b'");
        usage_error(&["stop", "a", ""], "invalid unit name");
        usage_error(&["restart", "a", "foo@"], "template");
        usage_error(&["reload", "a", "x/y.service"], "invalid unit name");
        usage_error(&["list-units", "--filter", "[", "a"], "invalid glob");
        usage_error(&["--bus", "nonsense", "status"], "not a D-Bus address");
    }

    #[test]
    fn bad_timeouts_are_rejected() {
        for bad in ["0", "0.0", "abc", "inf", "NaN", "1e12"] {
            usage_error(&["start", "a", "web", "--timeout", bad], "--timeout");
        }
        // clap takes "-1" for an option: still a usage error.
        usage_error(&["start", "a", "web", "--timeout", "-1"], "-1");
        usage_error(&["start", "a", "web", "--timeout=-0.5"], "positive");
        assert_eq!(parse_timeout("1.5"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn good_command_lines_parse() {
        let cli = parse(&["--json", "start", "node-a", "web", "--timeout", "10"]).unwrap();
        assert!(cli.json);
        let Command::Start(s) = cli.command else {
            panic!("not start: {:?}", cli.command)
        };
        assert_eq!(s.args.node.as_str(), "node-a");
        // No type suffix: .service, like systemctl.
        assert_eq!(s.args.unit.as_str(), "web.service");
        assert_eq!(s.args.timeout, Some(Duration::from_secs(10)));

        // Global options may follow the command, as users type them.
        let cli = parse(&["list-units", "--filter", "drover-*", "--json", "--user"]).unwrap();
        assert!(cli.json && cli.user);
        let Command::ListUnits(l) = cli.command else {
            panic!("not list-units")
        };
        assert!(l.node.is_none());
        assert!(l.filter.unwrap().matches("drover-dep@x.service"));

        let cli = parse(&["--bus", "unix:path=/run/x", "stop", "n1", "db.socket"]).unwrap();
        assert_eq!(cli.bus.as_deref(), Some("unix:path=/run/x"));
        let Command::Stop(s) = cli.command else {
            panic!("not stop")
        };
        assert_eq!(s.args.unit.as_str(), "db.socket");
        assert!(s.args.timeout.is_none());

        for cmd in [
            &["status"][..],
            &["status", "n1"],
            &["list-units", "n1"],
            &["daemon-reload", "n1"],
            &["version"],
            &["restart", "n1", "getty@tty1"],
            &["reload", "n1", "web.service"],
        ] {
            parse(cmd).unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        }
    }

    #[test]
    fn new_commands_parse_and_reject_garbage() {
        for cmd in [
            &["monitor"][..],
            &["monitor", "*"],
            &["monitor", "n1", "a,b.socket"],
            &["monitor", "*", "*"],
            &["status", "n1", "a", "b.socket", "-w"],
            &["status", "-w"],
            &["status", "n1", "--watch"],
            &["list-unit-files", "n1", "--filter", "web*"],
            &["enable", "n1", "a", "b", "-f", "--runtime", "--no-reload"],
            &["disable", "n1", "a", "--runtime", "--no-reload"],
            &["is-enabled", "n1", "a"],
            &["freeze", "n1", "a"],
            &["thaw", "n1", "a"],
            &["kill", "n1", "a", "--kill-whom=main", "--signal=KILL"],
            &["kill", "n1", "a", "--signal", "9"],
            &["reset-failed"],
            &["reset-failed", "n1"],
            &["reset-failed", "n1", "a", "b"],
            &["get-default", "n1"],
            &["set-default", "n1", "multi-user.target"],
            &["set-loglevel", "DEBUG"],
            &["set-loglevel", "n1", "info"],
            &["metrics", "enable"],
            &["metrics", "disable"],
            &["metrics", "listen"],
            &["proxies"],
            &["proxies", "n1"],
            &["drain", "n1"],
            &["drain", "n1", "web", "db.socket"],
            &["undrain", "n1"],
            &["undrain", "n1", "web"],
            &["drained"],
        ] {
            parse(cmd).unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        }
        usage_error(&["kill", "n1", "a", "--signal=0"], "invalid signal");
        usage_error(&["kill", "n1", "a", "--signal=65"], "invalid signal");
        usage_error(&["kill", "n1", "a", "--signal=TERMINATE"], "invalid signal");
        usage_error(&["kill", "n1", "a", "--kill-whom=some"], "some");
        usage_error(&["monitor", "n_1"], "invalid node name");
        usage_error(&["monitor", "n1", "a,,b"], "empty unit name");
        usage_error(&["monitor", "n1", "a", "b"], "Usage");
        usage_error(&["enable", "n1"], "Usage");
        usage_error(&["enable", "n1", "a b"], "invalid unit name");
        usage_error(&["disable", "n1", "a", "--force"], "--force");
        usage_error(&["is-enabled", "n1"], "Usage");
        usage_error(&["is-enabled", "n1", "a", "b"], "Usage");
        usage_error(&["set-default", "n1", "web.service"], "not a target");
        usage_error(&["get-default"], "Usage");
        usage_error(&["metrics", "start"], "start");
        usage_error(&["metrics"], "Usage");
        usage_error(&["set-loglevel"], "Usage");
        usage_error(&["set-loglevel", "a", "b", "c"], "Usage");
        usage_error(&["freeze", "n1", "foo@"], "template");
        usage_error(&["list-unit-files", "--filter", "["], "invalid glob");
        usage_error(&["drain"], "Usage");
        usage_error(&["drain", "n_1"], "invalid node name");
        usage_error(&["drain", "n1", "a b"], "invalid unit name");
        usage_error(&["undrain", "n1", "a/b"], "invalid unit name");
        usage_error(&["drained", "n1"], "Usage");
    }

    #[test]
    fn help_and_version() {
        let e = parse(&["--help"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DisplayHelp);
        assert_eq!(e.exit_code(), 0);
        let help = e.render().to_string();
        for needle in [
            "Usage",
            "Exit status",
            "DROVER_BUS",
            "list-units",
            "daemon-reload",
        ] {
            assert!(help.contains(needle), "{needle}: {help}");
        }
        let e = parse(&["-h"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DisplayHelp);
        // bluechictl's -v and --version, and clap's usual -V.
        for flag in ["--version", "-v", "-V"] {
            let e = parse(&[flag]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DisplayVersion, "{flag}");
            assert_eq!(
                e.render().to_string().trim(),
                format!(
                    "droverctl version {} (commit {})",
                    env!("CARGO_PKG_VERSION"),
                    env!("DROVER_GIT_COMMIT")
                )
            );
        }
    }
}
