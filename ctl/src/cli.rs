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
    version = concat!(
        "version ",
        env!("CARGO_PKG_VERSION"),
        " (commit ",
        env!("DROVER_GIT_COMMIT"),
        ")"
    ),
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

/// `*` (every node / every unit, as in BlueChi's monitor API) or a name.
pub const WILDCARD: &str = "*";

/// A node name, or `*` for every node.
pub fn parse_node_or_wildcard(s: &str) -> Result<String, String> {
    if s == WILDCARD {
        return Ok(s.to_owned());
    }
    parse_node(s).map(|n| n.to_string())
}

/// Comma-separated unit names (`a,b.socket`), each may be `*`; without a type suffix
/// a unit gets `.service`. Empty entries (`a,,b`, a trailing comma) are refused: they
/// are typos, not wishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitList(pub Vec<String>);

pub fn parse_unit_list(s: &str) -> Result<UnitList, String> {
    let mut units = Vec::new();
    for part in s.split(',') {
        if part.is_empty() {
            return Err(format!("empty unit name in the list '{s}'"));
        }
        if part == WILDCARD {
            units.push(part.to_owned());
        } else {
            units.push(parse_unit(part)?.to_string());
        }
    }
    Ok(UnitList(units))
}

/// Linux signal names `--signal` accepts (with or without `SIG`), and their numbers.
const SIGNAL_NAMES: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("IOT", libc::SIGIOT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("STKFLT", libc::SIGSTKFLT),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("POLL", libc::SIGPOLL),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

/// Highest signal number Linux has (`SIGRTMAX` of the kernel).
pub const MAX_SIGNAL: i32 = 64;

/// `--signal`: a number 1..=64, or a name such as `TERM`, `SIGTERM`, `sigkill`,
/// `RTMIN+3`, `RTMAX-1` (real-time names count from the C library's `SIGRTMIN`, as
/// `kill -l` does; the nodes run Linux with the same convention).
pub fn parse_signal(s: &str) -> Result<i32, String> {
    let bad = || {
        format!(
            "invalid signal '{s}': give a number 1..={MAX_SIGNAL} or a name such as TERM, SIGKILL, RTMIN+1"
        )
    };
    if let Ok(n) = s.parse::<i64>() {
        return match i32::try_from(n) {
            Ok(n) if (1..=MAX_SIGNAL).contains(&n) => Ok(n),
            _ => Err(bad()),
        };
    }
    let upper = s.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    if let Some(&(_, n)) = SIGNAL_NAMES.iter().find(|(known, _)| *known == name) {
        return Ok(n);
    }
    let rt = |base: i32, rest: &str, sign: i32| -> Result<i32, String> {
        let off: i32 = if rest.is_empty() {
            0
        } else {
            rest.parse().map_err(|_| bad())?
        };
        let n = base + sign * off;
        if off < 0 || !(libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&n) {
            return Err(bad());
        }
        Ok(n)
    };
    if let Some(rest) = name.strip_prefix("RTMIN") {
        let rest = rest.strip_prefix('+').unwrap_or(rest);
        return rt(libc::SIGRTMIN(), rest, 1);
    }
    if let Some(rest) = name.strip_prefix("RTMAX") {
        let rest = rest.strip_prefix('-').unwrap_or(rest);
        return rt(libc::SIGRTMAX(), rest, -1);
    }
    Err(bad())
}

/// The log levels drover-manager and drover-agent accept (BlueChi's words).
pub const LOG_LEVELS: [&str; 4] = ["DEBUG", "INFO", "WARN", "ERROR"];

/// A log level; any case is accepted and sent upper-case, as the API wants it.
pub fn parse_log_level(s: &str) -> Result<String, String> {
    let upper = s.to_ascii_uppercase();
    if LOG_LEVELS.contains(&upper.as_str()) {
        Ok(upper)
    } else {
        Err(format!(
            "invalid log level '{s}': one of {}",
            LOG_LEVELS.join(", ")
        ))
    }
}

/// A target unit (`set-default`); without a suffix `.target` is assumed.
pub fn parse_target(s: &str) -> Result<UnitName, String> {
    let with_suffix = if s.contains('.') {
        s.to_owned()
    } else {
        format!("{s}.target")
    };
    let unit = parse_unit(&with_suffix)?;
    if unit.unit_type() != "target" || unit.is_template() {
        return Err(format!("'{s}' is not a target unit"));
    }
    Ok(unit)
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
    fn signals() {
        assert_eq!(parse_signal("15"), Ok(15));
        assert_eq!(parse_signal("1"), Ok(1));
        assert_eq!(parse_signal("64"), Ok(64));
        assert_eq!(parse_signal("TERM"), Ok(libc::SIGTERM));
        assert_eq!(parse_signal("SIGKILL"), Ok(libc::SIGKILL));
        assert_eq!(parse_signal("sigusr1"), Ok(libc::SIGUSR1));
        assert_eq!(parse_signal("RTMIN"), Ok(libc::SIGRTMIN()));
        assert_eq!(parse_signal("RTMIN+2"), Ok(libc::SIGRTMIN() + 2));
        assert_eq!(parse_signal("SIGRTMAX-1"), Ok(libc::SIGRTMAX() - 1));
        for bad in [
            "0",
            "65",
            "-9",
            "99999999999",
            "",
            "TERMX",
            "SIG",
            "RTMIN+99",
            "RTMAX-x",
            "1.5",
        ] {
            assert!(parse_signal(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unit_lists_and_wildcards() {
        assert_eq!(
            parse_unit_list("a,b.socket,*").unwrap().0,
            ["a.service", "b.socket", "*"]
        );
        assert!(parse_unit_list("a,,b").is_err());
        assert!(parse_unit_list("a,").is_err());
        assert!(parse_unit_list("").is_err());
        assert!(parse_unit_list("a b").is_err());
        assert_eq!(parse_node_or_wildcard("*"), Ok("*".to_owned()));
        assert!(parse_node_or_wildcard("a*").is_err());
        assert_eq!(parse_log_level("warn"), Ok("WARN".to_owned()));
        assert!(parse_log_level("TRACE").is_err());
        assert_eq!(
            parse_target("multi-user").unwrap().as_str(),
            "multi-user.target"
        );
        assert!(parse_target("web.service").is_err());
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
