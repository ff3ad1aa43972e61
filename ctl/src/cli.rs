//! The command line: global options, and value parsers that validate node names,
//! unit names, globs and timeouts before anything is sent.
//!
//! Invariant: a value that reaches a command has passed validation; a bad one is a
//! clap error (exit 2, message naming the argument) and no connection is opened.
//! Subcommands themselves are declared in [`crate::commands`].

use std::time::Duration;

use clap::Parser;
use drover_protocol::{NameError, NodeName, UnitName};

use crate::commands::Command;

/// Printed after `--help`: the exit-code contract and the environment.
const AFTER_HELP: &str = "\
Bus: --bus ADDRESS, else --user (session bus), else $DROVER_BUS, else the system bus.

Exit status:
  0  success (for start/stop/restart/reload: the job result was 'done')
  1  the operation failed: job result not 'done', node offline, unknown node or unit,
     drover-manager unreachable, timeout, any other D-Bus error
  2  usage error: unknown command or option, wrong number of arguments, invalid
     node or unit name; nothing was sent

Environment:
  DROVER_BUS  D-Bus address of the bus drover-manager is on (when neither --bus nor --user)";

/// droverctl: drive the units of a drover (BlueChi-compatible) fleet.
#[derive(Debug, Parser)]
#[command(
    name = "droverctl",
    version = concat!("version ", env!("CARGO_PKG_VERSION")),
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

    /// Print one JSON document (an array of objects) instead of a table
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// `--bus` must be a D-Bus address zbus can parse.
pub fn parse_bus_address(s: &str) -> Result<String, String> {
    <zbus::Address as std::str::FromStr>::from_str(s)
        .map(|_| s.to_owned())
        .map_err(|e| format!("not a D-Bus address: {e}"))
}

/// A node name as drover accepts it (see `drover_protocol::NodeName`).
pub fn parse_node(s: &str) -> Result<NodeName, String> {
    NodeName::new(s).map_err(|e| e.to_string())
}

/// A unit name; without a type suffix it gets `.service`, like systemctl.
pub fn parse_unit(s: &str) -> Result<UnitName, String> {
    UnitName::with_default_suffix(s).map_err(|e| match e {
        // Quote what the user typed, not the name with '.service' appended.
        NameError::BadUnit(_, why) => format!(
            "invalid unit name '{}': {why}",
            s.chars()
                .take(80)
                .flat_map(char::escape_default)
                .collect::<String>()
        ),
        other => other.to_string(),
    })
}

/// A unit that can have a job: a template (`foo@.service`) cannot be started.
pub fn parse_job_unit(s: &str) -> Result<UnitName, String> {
    let unit = parse_unit(s)?;
    if unit.is_template() {
        return Err(format!(
            "'{unit}' is a template; name an instance, e.g. '{}'",
            unit.as_str().replacen("@.", "@NAME.", 1)
        ));
    }
    Ok(unit)
}

/// A shell glob on unit names (`*`, `?`, `[...]`).
pub fn parse_glob(s: &str) -> Result<glob::Pattern, String> {
    glob::Pattern::new(s).map_err(|e| format!("invalid glob: {e}"))
}

/// Longest `--timeout` accepted: a week. Longer is a typo, not a wish.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// `--timeout SECONDS`: a positive number of seconds, fractions allowed.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err("the timeout must be a positive number of seconds".to_owned());
    }
    let d = Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())?;
    if d > MAX_TIMEOUT {
        return Err(format!(
            "the timeout is longer than {} s; leave --timeout out to wait without limit",
            MAX_TIMEOUT.as_secs()
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::EXIT_USAGE;
    use clap::error::ErrorKind;

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

    #[test]
    fn garbage_is_a_usage_error_with_usage_text() {
        usage_error(&["frob"], "Usage");
        usage_error(&["--frob", "status"], "Usage");
        usage_error(&["status", "--frob"], "Usage");
        usage_error(&["status", "a", "b"], "Usage");
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
                format!("droverctl version {}", env!("CARGO_PKG_VERSION"))
            );
        }
    }
}
