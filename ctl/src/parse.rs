//! Value parsers for the command line: node names, unit names, globs, signals,
//! log levels, targets and timeouts, validated before anything is sent.
//!
//! Invariant: a value that reaches a command has passed one of these parsers; a bad
//! one is a clap error (exit 2, message naming the argument) and no connection is
//! opened. Pure functions: no bus, no I/O, so the commands and [`crate::cli`] both
//! take them from here.

use std::time::Duration;

use drover_protocol::{NameError, NodeName, UnitName};

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
}
