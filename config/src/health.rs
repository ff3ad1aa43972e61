//! Health check declarations: the keys of a unit's `[X-Drover]` section
//! ([`unit_declaration`]) and of a node check in `agent.conf`
//! ([`node_check`]), their defaults and their checks. Pure: the agent reads
//! the files ([`crate::unit_file`]) and runs what this returns.
//!
//! Keys (names follow Podman Quadlet's health keys; docs/health.md and
//! drover.conf(5) are the user's reference):
//!
//! | key | value | default |
//! |---|---|---|
//! | `HealthCmd=` | a command line, run without a shell (`/bin/sh -c '…'` asks for one) | — |
//! | `HealthTCP=` | `HOST:PORT` (`[v6]:PORT`): a connect succeeds | — |
//! | `HealthHTTP=` | `http://HOST[:PORT][/PATH]`: the answer is 2xx | — |
//! | `HealthPush=` | boolean: the service reports its own health | no |
//! | `HealthInterval=` | time span between checks once there is a verdict | 10s |
//! | `HealthStartupInterval=` | time span between checks while `starting` | 1s |
//! | `HealthTimeout=` | time span a check may take | 2s |
//! | `HealthRetries=` | consecutive failures before `unhealthy` | 3 |
//! | `HealthStartPeriod=` | failures in this span after activation do not count | 0 |
//! | `HealthOnFailure=` | `none`, `restart`, `stop`: what systemd is asked on `unhealthy` | none |
//! | `StopWhenUnhealthy=` | boolean, proxy units only: stop the proxy when its target turns unhealthy | no |
//!
//! The section's discovery keys `Port=` and `Ports=` are known here (one
//! table, [`UNIT_KEYS`]) and read by [`crate::ports`]; health ignores them.
//!
//! Rules: exactly one check kind per unit (two are an error naming both
//! entries); the other `Health*` keys need a check; every key may be given
//! again in a later file or line (the last wins) and an empty value resets it
//! to its default, as in systemd. Unknown keys are errors. Every error names
//! the file, the line and the key ([`crate::unit_file::UnitEntry::error`]).
//! `%n`, `%N`, `%p`, `%i` and `%%` in the check kinds' values expand as
//! systemd's specifiers do.

use crate::unit_file::UnitEntry;
use drover_protocol::UnitName;
use std::time::Duration;

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_STARTUP_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_RETRIES: u32 = 3;
/// Bounds of the duration keys and of `HealthRetries=`.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
pub const MAX_INTERVAL: Duration = Duration::from_secs(86_400);
pub const MIN_TIMEOUT: Duration = Duration::from_millis(10);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3_600);
pub const MAX_START_PERIOD: Duration = Duration::from_secs(86_400);
pub const MAX_RETRIES: u32 = 100;
/// Most words of a `HealthCmd=`.
pub const MAX_WORDS: usize = 256;

const CMD: &str = "HealthCmd";
const TCP: &str = "HealthTCP";
const HTTP: &str = "HealthHTTP";
const PUSH: &str = "HealthPush";
const INTERVAL: &str = "HealthInterval";
const STARTUP_INTERVAL: &str = "HealthStartupInterval";
const TIMEOUT: &str = "HealthTimeout";
const RETRIES: &str = "HealthRetries";
const START_PERIOD: &str = "HealthStartPeriod";
const ON_FAILURE: &str = "HealthOnFailure";
const STOP_WHEN_UNHEALTHY: &str = "StopWhenUnhealthy";

/// Every key of a unit's `[X-Drover]` section: the health keys and the
/// discovery keys ([`crate::ports`], read apart: a bad port never makes a
/// unit unhealthy).
pub const UNIT_KEYS: &[&str] = &[
    CMD,
    TCP,
    HTTP,
    PUSH,
    INTERVAL,
    STARTUP_INTERVAL,
    TIMEOUT,
    RETRIES,
    START_PERIOD,
    ON_FAILURE,
    STOP_WHEN_UNHEALTHY,
    crate::ports::PORT,
    crate::ports::PORTS,
];

/// Every key of a node check (`[health NAME]` in `agent.conf`).
pub const NODE_KEYS: &[&str] = &[
    CMD,
    TCP,
    HTTP,
    INTERVAL,
    STARTUP_INTERVAL,
    TIMEOUT,
    RETRIES,
    START_PERIOD,
];

/// What a check does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// `HealthCmd=`: the program and its arguments (no shell).
    Cmd(Vec<String>),
    /// `HealthTCP=`: a connect to `host` (name or IP literal) and `port`.
    Tcp { host: String, port: u16 },
    /// `HealthHTTP=`: a GET whose answer is 2xx.
    Http(HttpUrl),
    /// `HealthPush=yes`: the service reports (`ReportHealth`).
    Push,
}

impl Probe {
    /// The key that declared it.
    pub fn key(&self) -> &'static str {
        match self {
            Probe::Cmd(_) => CMD,
            Probe::Tcp { .. } => TCP,
            Probe::Http(_) => HTTP,
            Probe::Push => PUSH,
        }
    }
}

/// An `http://` URL, split for a GET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// Host name or IP literal (without brackets).
    pub host: String,
    pub port: u16,
    /// What the `Host:` header says (`host[:port]` as written).
    pub authority: String,
    /// Path and query (`/` when the URL has none).
    pub target: String,
}

/// `HealthOnFailure=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    #[default]
    None,
    Restart,
    Stop,
}

impl OnFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::None => "none",
            OnFailure::Restart => "restart",
            OnFailure::Stop => "stop",
        }
    }
}

/// One declared check with its timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckSpec {
    pub probe: Probe,
    pub interval: Duration,
    pub startup_interval: Duration,
    pub timeout: Duration,
    pub retries: u32,
    pub start_period: Duration,
    pub on_failure: OnFailure,
}

/// What a unit's `[X-Drover]` sections declare.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitDeclaration {
    /// The unit's check, if any.
    pub check: Option<CheckSpec>,
    /// `StopWhenUnhealthy=` (proxy units).
    pub stop_when_unhealthy: bool,
}

/// The declaration of `unit` from its `[X-Drover]` entries (fragment first,
/// then drop-ins, in order). `Err`: the first problem, naming file, line and
/// key (the unit's health is then `unhealthy` with it).
pub fn unit_declaration(unit: &UnitName, entries: &[UnitEntry]) -> Result<UnitDeclaration, String> {
    let last = last_assignments(entries, UNIT_KEYS)?;
    let check = check_spec(&last, Some(unit))?;
    let stop_when_unhealthy = match last.get(STOP_WHEN_UNHEALTHY) {
        Some(e) => {
            if drover_protocol::ProxyTemplate::of_unit(unit.as_str()).is_none() {
                return Err(e.error(format!(
                    "only proxy units (drover-proxy@NODE_UNIT.service) take it; {unit} is not one"
                )));
            }
            boolean(e)?
        }
        None => false,
    };
    Ok(UnitDeclaration {
        check,
        stop_when_unhealthy,
    })
}

/// A node check from its entries (`[health NAME]` of `agent.conf`); it must
/// declare `HealthCmd=`, `HealthTCP=` or `HealthHTTP=`.
pub fn node_check(name: &str, entries: &[UnitEntry]) -> Result<CheckSpec, String> {
    let last = last_assignments(entries, NODE_KEYS)?;
    match check_spec(&last, None)? {
        Some(spec) => Ok(spec),
        None => Err(format!(
            "node check '{name}' declares no check: give HealthCmd=, HealthTCP= or HealthHTTP="
        )),
    }
}

/// Whether `name` may name a node check: 1–64 of `[A-Za-z0-9_.-]`.
pub fn valid_node_check_name(name: &str) -> bool {
    (1..=drover_protocol::health::NODE_CHECK_NAME_MAX).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The last non-empty assignment of each key (an empty one resets); unknown
/// keys are errors.
fn last_assignments<'e>(
    entries: &'e [UnitEntry],
    known: &[&'static str],
) -> Result<std::collections::BTreeMap<&'static str, &'e UnitEntry>, String> {
    let mut last = std::collections::BTreeMap::new();
    for entry in entries {
        let Some(key) = known.iter().find(|k| **k == entry.key) else {
            return Err(entry.error(format!("unknown key; known: {}", known.join(", "))));
        };
        if entry.value.is_empty() {
            last.remove(key);
        } else {
            last.insert(*key, entry);
        }
    }
    Ok(last)
}

fn check_spec(
    last: &std::collections::BTreeMap<&'static str, &UnitEntry>,
    unit: Option<&UnitName>,
) -> Result<Option<CheckSpec>, String> {
    let mut kinds = [CMD, TCP, HTTP, PUSH]
        .into_iter()
        .filter_map(|k| last.get(k).copied())
        // `HealthPush=no` declares nothing.
        .filter(|e| e.key != PUSH || crate::value::parse_bool(&e.value) != Some(false));
    let first = kinds.next();
    if let (Some(a), Some(b)) = (first, kinds.next()) {
        return Err(b.error(format!(
            "a unit has one check, and {}:{} already declares {}=; remove one of them",
            a.path.display(),
            a.line,
            a.key
        )));
    }
    let Some(kind) = first else {
        if let Some(e) = [
            INTERVAL,
            STARTUP_INTERVAL,
            TIMEOUT,
            RETRIES,
            START_PERIOD,
            ON_FAILURE,
        ]
        .into_iter()
        .find_map(|k| last.get(k))
        {
            return Err(
                e.error("needs a check: HealthCmd=, HealthTCP=, HealthHTTP= or HealthPush=yes")
            );
        }
        if let Some(e) = last.get(PUSH) {
            boolean(e)?;
        }
        return Ok(None);
    };
    let probe = match kind.key.as_str() {
        CMD => Probe::Cmd(command(kind, unit)?),
        TCP => {
            let text = expand(kind, unit)?;
            let (host, port) = host_port(&text).map_err(|m| kind.error(m))?;
            Probe::Tcp { host, port }
        }
        HTTP => Probe::Http(http_url(&expand(kind, unit)?).map_err(|m| kind.error(m))?),
        _ => {
            boolean(kind)?;
            Probe::Push
        }
    };
    let span = |key: &str, default: Duration, min: Duration, max: Duration| match last.get(key) {
        None => Ok(default),
        Some(e) => {
            let d = crate::timespan::parse(&e.value).map_err(|m| e.error(m))?;
            if d < min || d > max {
                Err(e.error(format!(
                    "must be between {} and {}",
                    crate::timespan::format(min),
                    crate::timespan::format(max)
                )))
            } else {
                Ok(d)
            }
        }
    };
    let interval = span(INTERVAL, DEFAULT_INTERVAL, MIN_INTERVAL, MAX_INTERVAL)?;
    let startup_interval = span(
        STARTUP_INTERVAL,
        DEFAULT_STARTUP_INTERVAL.min(interval),
        MIN_INTERVAL,
        MAX_INTERVAL,
    )?;
    let timeout = span(TIMEOUT, DEFAULT_TIMEOUT, MIN_TIMEOUT, MAX_TIMEOUT)?;
    let start_period = span(
        START_PERIOD,
        Duration::ZERO,
        Duration::ZERO,
        MAX_START_PERIOD,
    )?;
    let retries = match last.get(RETRIES) {
        None => DEFAULT_RETRIES,
        Some(e) => match e.value.parse::<u32>() {
            Ok(n) if (1..=MAX_RETRIES).contains(&n) => n,
            _ => {
                return Err(e.error(format!(
                    "'{}' is not a number from 1 to {MAX_RETRIES}",
                    e.value
                )));
            }
        },
    };
    let on_failure = match last.get(ON_FAILURE) {
        None => OnFailure::None,
        Some(e) => match e.value.as_str() {
            "none" => OnFailure::None,
            "restart" => OnFailure::Restart,
            "stop" => OnFailure::Stop,
            other => {
                return Err(e.error(format!("'{other}' is not one of none, restart, stop")));
            }
        },
    };
    Ok(Some(CheckSpec {
        probe,
        interval,
        startup_interval,
        timeout,
        retries,
        start_period,
        on_failure,
    }))
}

fn boolean(e: &UnitEntry) -> Result<bool, String> {
    crate::value::parse_bool(&e.value).ok_or_else(|| {
        e.error(format!(
            "'{}' is not a boolean (use yes/no, true/false, on/off, 1/0)",
            e.value
        ))
    })
}

/// `e`'s value with systemd's specifiers expanded (no word splitting).
fn expand(e: &UnitEntry, unit: Option<&UnitName>) -> Result<String, String> {
    specifiers(&e.value, unit).map_err(|m| e.error(m))
}

/// Expands `%n` (unit name), `%N` (without its type), `%p` (prefix), `%i`
/// (instance) and `%%`; anything else after `%` is an error.
fn specifiers(text: &str, unit: Option<&UnitName>) -> Result<String, String> {
    if !text.contains('%') {
        return Ok(text.to_owned());
    }
    let Some(unit) = unit else {
        return Err("specifiers (%) need a unit; node checks take none".into());
    };
    let name = unit.as_str();
    let stem = name.rsplit_once('.').map_or(name, |(s, _)| s);
    let (prefix, instance) = stem.split_once('@').unwrap_or((stem, ""));
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push_str(name),
            Some('N') => out.push_str(stem),
            Some('p') => out.push_str(prefix),
            Some('i') => out.push_str(instance),
            Some('%') => out.push('%'),
            Some(other) => {
                return Err(format!(
                    "unknown specifier %{other} (drover expands %n, %N, %p, %i and %%)"
                ));
            }
            None => return Err("a lone % at the end (write %% for a percent sign)".into()),
        }
    }
    Ok(out)
}

/// `HealthCmd=` as words (systemd's quoting: `"…"`, `'…'`, backslash escapes
/// `\\ \" \' \n \t \s`), each with specifiers expanded.
fn command(e: &UnitEntry, unit: Option<&UnitName>) -> Result<Vec<String>, String> {
    let words = split_words(&e.value).map_err(|m| e.error(m))?;
    if words.len() > MAX_WORDS {
        return Err(e.error(format!("more than {MAX_WORDS} words")));
    }
    let words: Vec<String> = words
        .iter()
        .map(|w| specifiers(w, unit).map_err(|m| e.error(m)))
        .collect::<Result<_, _>>()?;
    match words.first() {
        None => Err(e.error("no command")),
        Some(program) if program.contains('\0') => Err(e.error("NUL in the command")),
        Some(program) if !program.starts_with('/') && program.contains('/') => Err(e.error(
            format!("'{program}': give an absolute path or a bare program name"),
        )),
        Some(_) => Ok(words),
    }
}

/// Splits a command line into words by systemd's quoting rules.
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let escaped = match chars.next() {
                    Some('\\') => '\\',
                    Some('"') => '"',
                    Some('\'') => '\'',
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some('s') | Some(' ') => ' ',
                    Some(other) => return Err(format!("unknown escape \\{other}")),
                    None => return Err("a lone \\ at the end".into()),
                };
                word.push(escaped);
                in_word = true;
            }
            '"' | '\'' if quote == Some(c) => quote = None,
            '"' | '\'' if quote.is_none() => {
                quote = Some(c);
                in_word = true;
            }
            c if c.is_whitespace() && quote.is_none() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if let Some(q) = quote {
        return Err(format!("unterminated {q} quote"));
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// `HOST:PORT` or `[V6]:PORT`.
pub fn host_port(text: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (v6, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("'{text}': unterminated ["))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| format!("'{text}': expected [ADDRESS]:PORT"))?;
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("'{v6}' is not an IPv6 address"));
        }
        (v6, port)
    } else {
        text.rsplit_once(':')
            .ok_or_else(|| format!("'{text}' is not HOST:PORT"))?
    };
    if host.contains(':') && !text.starts_with('[') {
        return Err(format!("'{text}': write an IPv6 address as [ADDRESS]:PORT"));
    }
    crate::host::check_host(host).map_err(|m| format!("'{text}': {m}"))?;
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => return Err(format!("'{port}' is not a port (1-65535)")),
    };
    Ok((host.to_owned(), port))
}

/// An `http://` URL for a GET (no user info; a fragment is dropped, as a
/// client never sends it).
pub fn http_url(text: &str) -> Result<HttpUrl, String> {
    let lower = text
        .get(..8)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    if lower.starts_with("https://") {
        return Err(format!(
            "'{text}': https is not supported (HealthHTTP= speaks plain http to a service on the node; use HealthCmd= with a client for TLS)"
        ));
    }
    let rest = match text.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &text[7..],
        _ => return Err(format!("'{text}' is not an http:// URL")),
    };
    let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(split);
    if authority.contains('@') {
        return Err(format!("'{text}': user info in the URL is not supported"));
    }
    if authority.is_empty() {
        return Err(format!("'{text}' names no host"));
    }
    let with_port = if authority.ends_with(']') || !authority.contains(':') {
        format!("{authority}:80")
    } else {
        authority.to_owned()
    };
    let (host, port) = host_port(&with_port)?;
    let target = match target {
        "" => "/".to_owned(),
        t if t.starts_with('?') => format!("/{t}"),
        t => t.to_owned(),
    };
    if target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(format!(
            "'{text}': spaces and control characters must be %-encoded in the path"
        ));
    }
    Ok(HttpUrl {
        host,
        port,
        authority: authority.to_owned(),
        target,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn e(file: &str, line: usize, key: &str, value: &str) -> UnitEntry {
        UnitEntry {
            path: PathBuf::from(file),
            line,
            key: key.into(),
            value: value.into(),
        }
    }

    fn one(key: &str, value: &str) -> Vec<UnitEntry> {
        vec![e("/u/db.service", 7, key, value)]
    }

    fn decl(unit: &str, entries: &[UnitEntry]) -> Result<UnitDeclaration, String> {
        unit_declaration(&UnitName::new(unit).unwrap(), entries)
    }

    fn spec(entries: &[UnitEntry]) -> CheckSpec {
        decl("db.service", entries).unwrap().check.unwrap()
    }

    #[test]
    fn defaults_and_each_kind() {
        let tcp = spec(&one("HealthTCP", "127.0.0.1:5432"));
        assert_eq!(
            tcp,
            CheckSpec {
                probe: Probe::Tcp {
                    host: "127.0.0.1".into(),
                    port: 5432
                },
                interval: DEFAULT_INTERVAL,
                startup_interval: DEFAULT_STARTUP_INTERVAL,
                timeout: DEFAULT_TIMEOUT,
                retries: DEFAULT_RETRIES,
                start_period: Duration::ZERO,
                on_failure: OnFailure::None,
            }
        );
        assert_eq!(
            spec(&one(
                "HealthCmd",
                "/usr/bin/pg_isready -h '/run/pg sock' -q"
            ))
            .probe,
            Probe::Cmd(vec![
                "/usr/bin/pg_isready".into(),
                "-h".into(),
                "/run/pg sock".into(),
                "-q".into()
            ])
        );
        assert_eq!(
            spec(&one("HealthHTTP", "http://[::1]:8080/health?full=1#x")).probe,
            Probe::Http(HttpUrl {
                host: "::1".into(),
                port: 8080,
                authority: "[::1]:8080".into(),
                target: "/health?full=1".into()
            })
        );
        assert_eq!(
            spec(&one("HealthHTTP", "HTTP://localhost")).probe,
            Probe::Http(HttpUrl {
                host: "localhost".into(),
                port: 80,
                authority: "localhost".into(),
                target: "/".into()
            })
        );
        assert_eq!(spec(&one("HealthPush", "yes")).probe, Probe::Push);
        assert_eq!(
            decl("db.service", &one("HealthPush", "no")).unwrap(),
            UnitDeclaration::default()
        );
        assert_eq!(decl("db.service", &[]).unwrap(), UnitDeclaration::default());
    }

    #[test]
    fn timing_keys_last_assignment_wins_and_empty_resets() {
        let s = spec(&[
            e("/u/db.service", 3, "HealthTCP", "db:1"),
            e("/u/db.service", 4, "HealthInterval", "1min 30s"),
            e("/u/db.service", 5, "HealthRetries", "9"),
            e("/u/db.service.d/a.conf", 2, "HealthRetries", "5"),
            e("/u/db.service.d/a.conf", 3, "HealthTimeout", "500ms"),
            e("/u/db.service.d/a.conf", 4, "HealthStartPeriod", "30s"),
            e("/u/db.service.d/a.conf", 5, "HealthOnFailure", "restart"),
            e("/u/db.service.d/b.conf", 1, "HealthInterval", ""),
        ]);
        assert_eq!(s.interval, DEFAULT_INTERVAL);
        assert_eq!(s.retries, 5);
        assert_eq!(s.timeout, Duration::from_millis(500));
        assert_eq!(s.start_period, Duration::from_secs(30));
        assert_eq!(s.on_failure, OnFailure::Restart);
        // The startup interval never exceeds a shorter interval.
        let s = spec(&[
            e("/u/x", 1, "HealthTCP", "db:1"),
            e("/u/x", 2, "HealthInterval", "200ms"),
        ]);
        assert_eq!(s.startup_interval, Duration::from_millis(200));
        // A drop-in can take the check away again.
        assert_eq!(
            decl(
                "db.service",
                &[
                    e("/u/x", 1, "HealthTCP", "db:1"),
                    e("/u/y", 1, "HealthTCP", "")
                ]
            )
            .unwrap()
            .check,
            None
        );
    }

    /// The discovery keys are `[X-Drover]` keys, and even garbage in them
    /// leaves the unit's health declaration alone ([`crate::ports`] says
    /// what is wrong).
    #[test]
    fn port_keys_are_known_and_not_health() {
        for value in ["8080", "garbage", ""] {
            let d = decl(
                "db.service",
                &[
                    e("/u/db.service", 2, "HealthTCP", "db:5432"),
                    e("/u/db.service", 3, "Port", value),
                    e("/u/db.service", 4, "Ports", value),
                ],
            )
            .unwrap();
            assert!(matches!(d.check.unwrap().probe, Probe::Tcp { .. }));
            let none = decl("db.service", &one("Port", value)).unwrap();
            assert_eq!(none, UnitDeclaration::default());
        }
    }

    #[test]
    fn every_bad_value_names_file_line_and_key() {
        let cases: &[(&str, &str, &str)] = &[
            ("HealthInterval", "ten", "'ten' is not a time span"),
            ("HealthInterval", "10ms", "must be between 100ms and 1d"),
            ("HealthTimeout", "2h", "must be between 10ms and 1h"),
            ("HealthRetries", "0", "'0' is not a number from 1 to 100"),
            ("HealthRetries", "-1", "is not a number"),
            (
                "HealthOnFailure",
                "kill",
                "'kill' is not one of none, restart, stop",
            ),
            ("HealthStartPeriod", "2d", "must be between 0 and 1d"),
            ("Healthcmd", "/bin/true", "unknown key"),
        ];
        for (key, value, want) in cases {
            let err = decl(
                "db.service",
                &[
                    e("/u/db.service", 2, "HealthTCP", "db:5432"),
                    e("/etc/x/50-h.conf", 9, key, value),
                ],
            )
            .unwrap_err();
            assert!(
                err.starts_with(&format!("/etc/x/50-h.conf:9: key '{key}': "))
                    && err.contains(want),
                "{key}={value}: {err}"
            );
        }
        let bad_kinds: &[(&str, &str, &str)] = &[
            ("HealthTCP", "db", "is not HOST:PORT"),
            ("HealthTCP", "db:0", "is not a port"),
            ("HealthTCP", "db:99999", "is not a port"),
            (
                "HealthTCP",
                "::1:80",
                "write an IPv6 address as [ADDRESS]:PORT",
            ),
            ("HealthTCP", "[::zz]:80", "is not an IPv6 address"),
            ("HealthTCP", "bad host:80", "'bad host:80'"),
            ("HealthHTTP", "https://db/", "https is not supported"),
            ("HealthHTTP", "ftp://db/", "is not an http:// URL"),
            ("HealthHTTP", "http://u:p@db/", "user info"),
            ("HealthHTTP", "http:///x", "names no host"),
            ("HealthHTTP", "http://db/a b", "%-encoded"),
            ("HealthCmd", "'/bin/true", "unterminated ' quote"),
            ("HealthCmd", "/bin/echo \\q", "unknown escape \\q"),
            (
                "HealthCmd",
                "bin/true",
                "absolute path or a bare program name",
            ),
            ("HealthCmd", "/bin/echo %z", "unknown specifier %z"),
            ("HealthPush", "maybe", "is not a boolean"),
        ];
        for (key, value, want) in bad_kinds {
            let err = decl("db.service", &[e("/u/db.service", 4, key, value)]).unwrap_err();
            assert!(
                err.starts_with(&format!("/u/db.service:4: key '{key}': ")) && err.contains(want),
                "{key}={value}: {err}"
            );
        }
    }

    #[test]
    fn one_kind_per_unit_and_timing_needs_a_kind() {
        let err = decl(
            "db.service",
            &[
                e("/u/db.service", 3, "HealthTCP", "db:1"),
                e("/u/db.service.d/h.conf", 2, "HealthCmd", "/bin/true"),
            ],
        )
        .unwrap_err();
        assert!(
            err.starts_with("/u/db.service:3: key 'HealthTCP': a unit has one check, and /u/db.service.d/h.conf:2 already declares HealthCmd=")
                || err.starts_with("/u/db.service.d/h.conf:2: key 'HealthCmd'")
                || err.contains("already declares"),
            "{err}"
        );
        assert!(
            err.contains("HealthCmd") && err.contains("HealthTCP"),
            "{err}"
        );
        let err = decl("db.service", &one("HealthRetries", "2")).unwrap_err();
        assert_eq!(
            err,
            "/u/db.service:7: key 'HealthRetries': needs a check: HealthCmd=, HealthTCP=, HealthHTTP= or HealthPush=yes"
        );
        // HealthPush=no plus a real kind is one kind.
        assert!(
            decl(
                "db.service",
                &[
                    e("/u", 1, "HealthPush", "no"),
                    e("/u", 2, "HealthTCP", "db:1")
                ]
            )
            .is_ok()
        );
    }

    #[test]
    fn specifiers_expand_from_the_unit_name() {
        let s = spec(&[e("/u", 1, "HealthCmd", "/bin/check %n %N %p %i 100%%")]);
        let d = decl(
            "web@8080.service",
            &[e("/u", 1, "HealthCmd", "/bin/check %n %N %p %i 100%%")],
        )
        .unwrap();
        assert_eq!(
            s.probe,
            Probe::Cmd(vec![
                "/bin/check".into(),
                "db.service".into(),
                "db".into(),
                "db".into(),
                "".into(),
                "100%".into()
            ])
        );
        assert_eq!(
            d.check.unwrap().probe,
            Probe::Cmd(vec![
                "/bin/check".into(),
                "web@8080.service".into(),
                "web@8080".into(),
                "web".into(),
                "8080".into(),
                "100%".into()
            ])
        );
        let d = decl(
            "web@8080.service",
            &[e("/u", 1, "HealthTCP", "127.0.0.1:%i")],
        )
        .unwrap();
        assert_eq!(
            d.check.unwrap().probe,
            Probe::Tcp {
                host: "127.0.0.1".into(),
                port: 8080
            }
        );
    }

    #[test]
    fn stop_when_unhealthy_is_for_proxy_units() {
        let d = decl(
            "drover-proxy@bar_db.service",
            &[e("/u", 1, "StopWhenUnhealthy", "yes")],
        )
        .unwrap();
        assert!(d.stop_when_unhealthy && d.check.is_none());
        let err = decl("db.service", &[e("/u", 1, "StopWhenUnhealthy", "yes")]).unwrap_err();
        assert!(err.contains("only proxy units"), "{err}");
    }

    #[test]
    fn node_checks() {
        let s = node_check(
            "disk",
            &[e("/etc/drover/agent.conf", 4, "HealthCmd", "/bin/true")],
        )
        .unwrap();
        assert_eq!(s.probe, Probe::Cmd(vec!["/bin/true".into()]));
        let err = node_check(
            "disk",
            &[e("/etc/drover/agent.conf", 4, "HealthOnFailure", "stop")],
        )
        .unwrap_err();
        assert!(err.contains("unknown key"), "{err}");
        let err = node_check("disk", &[]).unwrap_err();
        assert!(err.contains("declares no check"), "{err}");
        let err = node_check("d", &[e("/a", 1, "HealthCmd", "/bin/x %n")]).unwrap_err();
        assert!(err.contains("node checks take none"), "{err}");
        assert!(valid_node_check_name("disk-space_1.x"));
        assert!(!valid_node_check_name("") && !valid_node_check_name("a b"));
        assert!(!valid_node_check_name(&"a".repeat(65)));
    }

    #[test]
    fn word_splitting() {
        assert_eq!(
            split_words(r#"  a "b c" 'd "e"' f\ g h\"i "\n" "#).unwrap(),
            vec!["a", "b c", "d \"e\"", "f g", "h\"i", "\n"]
        );
        assert_eq!(split_words("''").unwrap(), vec![""]);
        assert!(split_words("").unwrap().is_empty());
        assert!(split_words("a\\").is_err());
    }
}
