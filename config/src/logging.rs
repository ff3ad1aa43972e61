//! Log level and target, and the tracing subscriber they select.
//!
//! [`init`] installs one process-wide subscriber: a reloadable level filter
//! over a single output layer (stderr, or journald). The level can change at
//! run time through [`LogHandle::set_level`] (`SetLogLevel`); the target is
//! fixed once installed. `init` is idempotent: later calls return a handle to
//! the subscriber installed first (and apply their level to it) instead of
//! panicking, because tests and library users may each call it.

use std::io::IsTerminal;
use std::sync::OnceLock;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{Layer, Registry, reload};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum LogLevel {
    Debug,
    #[default]
    Info,
    Warn,
    Error,
}

impl LogLevel {
    /// BlueChi's words, case-sensitive: `DEBUG`, `INFO`, `WARN`, `ERROR`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "DEBUG" => Some(Self::Debug),
            "INFO" => Some(Self::Info),
            "WARN" => Some(Self::Warn),
            "ERROR" => Some(Self::Error),
            _ => None,
        }
    }

    /// The tracing filter for this level (`Debug` does not include `TRACE`).
    pub fn filter(self) -> LevelFilter {
        match self {
            Self::Debug => LevelFilter::DEBUG,
            Self::Info => LevelFilter::INFO,
            Self::Warn => LevelFilter::WARN,
            Self::Error => LevelFilter::ERROR,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "DEBUG",
            Self::Info => "INFO",
            Self::Warn => "WARN",
            Self::Error => "ERROR",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogTarget {
    #[default]
    Journald,
    Stderr,
    StderrFull,
}

impl LogTarget {
    /// `journald`, `stderr`, `stderr-full`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "journald" => Some(Self::Journald),
            "stderr" => Some(Self::Stderr),
            "stderr-full" => Some(Self::StderrFull),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Journald => "journald",
            Self::Stderr => "stderr",
            Self::StderrFull => "stderr-full",
        }
    }
}

/// `LogLevel`, `LogTarget`, `LogIsQuiet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoggingConfig {
    pub level: LogLevel,
    pub target: LogTarget,
    pub quiet: bool,
}

/// Handle to change the level at run time (`SetLogLevel`).
///
/// A handle from a quiet `init`, or from an `init` that found a foreign
/// subscriber already installed, changes nothing.
#[derive(Clone)]
pub struct LogHandle {
    reload: Option<reload::Handle<LevelFilter, Registry>>,
}

impl std::fmt::Debug for LogHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogHandle")
            .field("active", &self.reload.is_some())
            .finish()
    }
}

impl LogHandle {
    pub fn set_level(&self, level: LogLevel) {
        if let Some(h) = &self.reload {
            // Fails only when the subscriber is gone, i.e. never for a global one.
            let _ = h.modify(|f| *f = level.filter());
        }
    }

    /// The level in force, `None` for an inert handle.
    pub fn level(&self) -> Option<LevelFilter> {
        self.reload.as_ref().and_then(|h| h.clone_current())
    }
}

/// The handle of the subscriber this module installed, once it did.
static INSTALLED: OnceLock<LogHandle> = OnceLock::new();

type Output = Box<
    dyn Layer<tracing_subscriber::layer::Layered<reload::Layer<LevelFilter, Registry>, Registry>>
        + Send
        + Sync,
>;

/// Installs the global tracing subscriber. Falls back to stderr when the
/// journal is not reachable (e.g. in a sandbox), and says so.
pub fn init(cfg: &LoggingConfig) -> LogHandle {
    init_muting(cfg, &[])
}

/// [`init`], with the events of `muted` targets (by prefix: a library that
/// logs every request at INFO) kept to WARN and ERROR whatever the level.
/// Only the first call in a process decides what is muted.
pub fn init_muting(cfg: &LoggingConfig, muted: &'static [&'static str]) -> LogHandle {
    if cfg.quiet {
        return LogHandle { reload: None };
    }
    let handle = INSTALLED.get_or_init(|| install(cfg, muted));
    handle.set_level(cfg.level);
    handle.clone()
}

fn install(cfg: &LoggingConfig, muted: &'static [&'static str]) -> LogHandle {
    let (filter, reload_handle) = reload::Layer::new(cfg.level.filter());
    let mut fallback_warning = None;
    let output: Output = match cfg.target {
        LogTarget::Journald => match tracing_journald::layer() {
            Ok(j) => Box::new(j.with_priority_mappings(journald_priorities())),
            Err(e) => {
                fallback_warning = Some(e);
                stderr_layer(false)
            }
        },
        LogTarget::Stderr => stderr_layer(false),
        LogTarget::StderrFull => stderr_layer(true),
    };
    let unmuted = tracing_subscriber::filter::filter_fn(move |meta| {
        *meta.level() <= tracing::Level::WARN || !muted.iter().any(|t| meta.target().starts_with(t))
    });
    let subscriber = Registry::default()
        .with(filter)
        .with(output.with_filter(unmuted));
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        // Someone else installed a subscriber first: leave it alone.
        return LogHandle { reload: None };
    }
    if let Some(e) = fallback_warning {
        tracing::warn!("journald is not reachable ({e}); logging to stderr instead");
    }
    LogHandle {
        reload: Some(reload_handle),
    }
}

/// The syslog priority of each level, as systemd's own daemons use them:
/// ERROR is `err` (3), WARN `warning` (4), INFO `info` (6), DEBUG and TRACE
/// `debug` (7). tracing-journald's default puts INFO at `notice` (5), which
/// `journalctl -p notice` would show as if every routine line mattered.
pub fn journald_priorities() -> tracing_journald::PriorityMappings {
    use tracing_journald::Priority;
    tracing_journald::PriorityMappings {
        error: Priority::Error,
        warn: Priority::Warning,
        info: Priority::Informational,
        debug: Priority::Debug,
        trace: Priority::Debug,
    }
}

/// `stderr`: level and message, like BlueChi's short form. `stderr-full`:
/// adds timestamp, target, file and line. Colours only on a terminal.
fn stderr_layer(full: bool) -> Output {
    let ansi = std::io::stderr().is_terminal();
    let base = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if full {
        Box::new(
            base.with_target(true)
                .with_file(true)
                .with_line_number(true),
        )
    } else {
        Box::new(base.without_time().with_target(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        for l in [
            LogLevel::Debug,
            LogLevel::Info,
            LogLevel::Warn,
            LogLevel::Error,
        ] {
            assert_eq!(LogLevel::parse(l.as_str()), Some(l));
        }
        assert_eq!(LogLevel::parse("info"), None);
        for t in [
            LogTarget::Journald,
            LogTarget::Stderr,
            LogTarget::StderrFull,
        ] {
            assert_eq!(LogTarget::parse(t.as_str()), Some(t));
        }
        assert_eq!(LogTarget::parse("Stderr"), None);
    }

    /// The only test in this crate that installs the global subscriber, so
    /// the order of its steps is deterministic.
    #[test]
    fn init_twice_and_set_level() {
        let quiet = init(&LoggingConfig {
            quiet: true,
            ..LoggingConfig::default()
        });
        assert_eq!(quiet.level(), None);
        quiet.set_level(LogLevel::Debug);

        let cfg = LoggingConfig {
            level: LogLevel::Warn,
            target: LogTarget::Stderr,
            quiet: false,
        };
        let h = init(&cfg);
        assert_eq!(h.level(), Some(LevelFilter::WARN));
        assert!(!tracing::enabled!(tracing::Level::INFO));
        h.set_level(LogLevel::Debug);
        assert_eq!(h.level(), Some(LevelFilter::DEBUG));
        // Callsite interest is cached; a level change must reach it.
        assert!(tracing::enabled!(tracing::Level::DEBUG));

        // A second init does not panic and controls the same subscriber.
        let again = init(&LoggingConfig {
            level: LogLevel::Error,
            ..cfg
        });
        assert_eq!(again.level(), Some(LevelFilter::ERROR));
        assert_eq!(h.level(), Some(LevelFilter::ERROR));
        assert!(!tracing::enabled!(tracing::Level::WARN));
    }
}

/// One line for a fatal error: the error and its causes joined with `: `,
/// skipping a cause whose text the line already holds (many errors repeat
/// their source in their own message, which would print it twice).
pub fn error_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod error_line_tests {
    use super::error_line;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect to the bus: {source}")]
    struct Outer {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("starting")]
    struct Context {
        #[source]
        source: Outer,
    }

    #[test]
    fn repeated_causes_are_printed_once() {
        let err = Context {
            source: Outer {
                source: std::io::Error::other("no such file"),
            },
        };
        assert_eq!(
            error_line(&err),
            "starting: cannot connect to the bus: no such file"
        );
    }
}
