//! Typed value parsers shared by the manager and agent loaders.
//!
//! Every parser takes the [`Entry`] it reads and the file it came from, so
//! each error names file, line and key. Values are strict: a number must parse
//! completely, a boolean must be one of the known words, a name list must hold
//! only valid node names.

use crate::ini::Entry;
use crate::{ConfigError, LogLevel, LogTarget, LoggingConfig};
use drover_protocol::NodeName;
use std::path::Path;

/// The file and entry being applied; builds errors that name all three.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub path: &'a Path,
    pub entry: &'a Entry,
}

impl<'a> At<'a> {
    /// An error about this entry's value. When the value looks like it ends in
    /// a comment (`2000 # ms`), the message says that comments must be on their
    /// own line: the syntax is systemd's, where `#` after a value is part of it.
    pub fn err(&self, message: impl Into<String>) -> ConfigError {
        let mut message = message.into();
        if has_trailing_comment(self.value()) {
            message.push_str(" (comments must be on their own line)");
        }
        ConfigError::Value {
            path: self.path.to_path_buf(),
            line: self.entry.line,
            key: self.entry.key.clone(),
            message,
        }
    }

    /// A warning about this entry, worded as [`At::err`] words an error.
    pub fn warning(&self, message: impl std::fmt::Display) -> String {
        format!(
            "{}:{}: key '{}': {message}",
            self.path.display(),
            self.entry.line,
            self.entry.key
        )
    }

    pub fn value(&self) -> &'a str {
        &self.entry.value
    }

    pub fn boolean(&self) -> Result<bool, ConfigError> {
        parse_bool(self.value()).ok_or_else(|| {
            self.err(format!(
                "'{}' is not a boolean (use true/yes/on/1 or false/no/off/0)",
                self.value()
            ))
        })
    }

    /// An unsigned number in `min..=max`.
    pub fn number(&self, min: u64, max: u64) -> Result<u64, ConfigError> {
        let v = self.value();
        // `u64::from_str` accepts a leading '+'; config numbers are plain digits.
        let n = if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
            v.parse::<u64>().ok()
        } else {
            None
        };
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(n),
            Some(_) => Err(self.err(format!("{v} is out of range {min}..={max}"))),
            None => Err(self.err(format!("'{v}' is not a number"))),
        }
    }

    pub fn u32_in(&self, min: u32, max: u32) -> Result<u32, ConfigError> {
        // The range check above keeps the value inside u32.
        self.number(u64::from(min), u64::from(max))
            .map(|n| u32::try_from(n).unwrap_or(max))
    }

    pub fn port(&self) -> Result<u16, ConfigError> {
        self.number(1, u64::from(u16::MAX))
            .map(|n| u16::try_from(n).unwrap_or(u16::MAX))
    }

    /// A comma-separated list of node names, spaces around items allowed,
    /// empty items skipped (a trailing comma is harmless), duplicates removed
    /// keeping the first.
    pub fn node_list(&self) -> Result<Vec<NodeName>, ConfigError> {
        let mut out: Vec<NodeName> = Vec::new();
        for item in self.value().split(',').map(str::trim) {
            if item.is_empty() {
                continue;
            }
            if crate::pattern::is_pattern(item) {
                return Err(self.err(format!(
                    "'{item}' is a pattern; this key takes node names only \
                     (patterns are accepted in AllowedNodeNames)"
                )));
            }
            let name = NodeName::new(item).map_err(|e| self.err(e.to_string()))?;
            if !out.contains(&name) {
                out.push(name);
            }
        }
        Ok(out)
    }
}

/// A `#` or `;` after whitespace inside a value: what a comment after a value
/// looks like in formats that allow one (systemd's INI, and so drover's, does not).
pub(crate) fn has_trailing_comment(value: &str) -> bool {
    value
        .char_indices()
        .any(|(i, c)| (c == '#' || c == ';') && value[..i].ends_with(char::is_whitespace))
}

/// systemd's boolean words, case-insensitive.
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    const TRUE: &[&str] = &["true", "t", "yes", "y", "on", "1"];
    const FALSE: &[&str] = &["false", "f", "no", "n", "off", "0"];
    if TRUE.iter().any(|w| w.eq_ignore_ascii_case(s)) {
        Some(true)
    } else if FALSE.iter().any(|w| w.eq_ignore_ascii_case(s)) {
        Some(false)
    } else {
        None
    }
}

/// Applies `LogLevel`, `LogTarget`, `LogIsQuiet`; returns false for any other key.
pub(crate) fn apply_logging(at: At<'_>, log: &mut LoggingConfig) -> Result<bool, ConfigError> {
    match at.entry.key.as_str() {
        "LogLevel" => {
            log.level = LogLevel::parse(at.value()).ok_or_else(|| {
                at.err(format!(
                    "'{}' is not a log level (DEBUG, INFO, WARN, ERROR; upper case)",
                    at.value()
                ))
            })?;
        }
        "LogTarget" => {
            log.target = LogTarget::parse(at.value()).ok_or_else(|| {
                at.err(format!(
                    "'{}' is not a log target (journald, stderr, stderr-full)",
                    at.value()
                ))
            })?;
        }
        "LogIsQuiet" => log.quiet = at.boolean()?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// The error for a key no loader knows, with a hint when only the case differs.
pub(crate) fn unknown_key(at: At<'_>, section: &str, known: &[&str]) -> ConfigError {
    let hint = known
        .iter()
        .find(|k| k.eq_ignore_ascii_case(&at.entry.key))
        .map(|k| format!(" (did you mean '{k}'? keys are case-sensitive)"))
        .unwrap_or_default();
    at.err(format!("unknown key in [{section}]{hint}"))
}

/// Reads `DROVER_LOG_LEVEL`, `DROVER_LOG_TARGET`, `DROVER_LOG_IS_QUIET` through
/// `get` (the real environment, or a map in tests). An unset or empty variable
/// changes nothing; a non-UTF-8 or unknown value is an error naming the variable.
pub(crate) fn apply_env(
    get: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    log: &mut LoggingConfig,
) -> Result<(), ConfigError> {
    let read = |var: &str| -> Result<Option<String>, ConfigError> {
        match get(var) {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => v.into_string().map(Some).map_err(|_| ConfigError::Env {
                var: var.into(),
                message: "not valid UTF-8".into(),
            }),
        }
    };
    let bad = |var: &str, v: &str, expected: &str| ConfigError::Env {
        var: var.into(),
        message: format!("'{v}' is not one of {expected}"),
    };
    if let Some(v) = read("DROVER_LOG_LEVEL")? {
        log.level = LogLevel::parse(&v)
            .ok_or_else(|| bad("DROVER_LOG_LEVEL", &v, "DEBUG, INFO, WARN, ERROR"))?;
    }
    if let Some(v) = read("DROVER_LOG_TARGET")? {
        log.target = LogTarget::parse(&v)
            .ok_or_else(|| bad("DROVER_LOG_TARGET", &v, "journald, stderr, stderr-full"))?;
    }
    if let Some(v) = read("DROVER_LOG_IS_QUIET")? {
        log.quiet = parse_bool(&v)
            .ok_or_else(|| bad("DROVER_LOG_IS_QUIET", &v, "true/yes/on/1, false/no/off/0"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::ffi::OsString;

    fn at_value<T>(value: &str, f: impl FnOnce(At<'_>) -> T) -> T {
        let entry = Entry {
            key: "K".into(),
            value: value.into(),
            line: 7,
        };
        f(At {
            path: Path::new("f.conf"),
            entry: &entry,
        })
    }

    #[test]
    fn booleans() {
        for t in ["true", "TRUE", "t", "Yes", "y", "on", "1"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["false", "F", "no", "N", "OFF", "0"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for bad in ["", "2", "yess", "enable", " true"] {
            assert_eq!(parse_bool(bad), None, "{bad}");
        }
        let err = at_value("maybe", |a| a.boolean()).unwrap_err().to_string();
        assert_eq!(
            err,
            "f.conf:7: key 'K': 'maybe' is not a boolean (use true/yes/on/1 or false/no/off/0)"
        );
    }

    #[test]
    fn numbers_parse_fully() {
        assert_eq!(at_value("65535", |a| a.port()).unwrap(), 65535);
        for bad in ["0", "65536", "-1", "+5", "12a", "", " 1", "1.5", "0x10"] {
            assert!(at_value(bad, |a| a.port()).is_err(), "{bad:?}");
        }
        assert_eq!(
            at_value("18446744073709551615", |a| a.number(0, u64::MAX)).unwrap(),
            u64::MAX
        );
        assert!(at_value("18446744073709551616", |a| a.number(0, u64::MAX)).is_err());
        assert_eq!(at_value("127", |a| a.u32_in(0, 127)).unwrap(), 127);
        assert!(at_value("128", |a| a.u32_in(0, 127)).is_err());
    }

    #[test]
    fn a_comment_after_a_value_is_refused_and_the_error_says_why() {
        let err = at_value("2000 # ms", |a| a.number(0, 10_000))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "f.conf:7: key 'K': '2000 # ms' is not a number (comments must be on their own line)"
        );
        let err = at_value("yes ; really", |a| a.boolean())
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("(comments must be on their own line)"),
            "{err}"
        );
        let err = at_value("a,b  # the two", |a| a.node_list())
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("(comments must be on their own line)"),
            "{err}"
        );
        // No hint where there is nothing that looks like a comment.
        let err = at_value("20#00", |a| a.number(0, 10_000))
            .unwrap_err()
            .to_string();
        assert_eq!(err, "f.conf:7: key 'K': '20#00' is not a number");
        assert!(!has_trailing_comment("#hash-first"));
        assert!(has_trailing_comment("x\t# y"));
    }

    #[test]
    fn node_lists() {
        let names = at_value(" a , b,a,, c ,", |a| a.node_list()).unwrap();
        let names: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(at_value("", |a| a.node_list()).unwrap().is_empty());
        let err = at_value("good,bad_name", |a| a.node_list())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("f.conf:7: key 'K':"), "{err}");
        assert!(err.contains("bad_name"), "{err}");
        let err = at_value("a,edge-*", |a| a.node_list())
            .unwrap_err()
            .to_string();
        assert!(err.contains("'edge-*' is a pattern"), "{err}");
    }

    #[test]
    fn env_overrides_and_errors() {
        let env = |pairs: &[(&str, &str)]| {
            let m: HashMap<String, OsString> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), OsString::from(v)))
                .collect();
            move |k: &str| m.get(k).cloned()
        };
        let mut log = LoggingConfig::default();
        apply_env(
            &env(&[
                ("DROVER_LOG_LEVEL", "DEBUG"),
                ("DROVER_LOG_TARGET", "stderr-full"),
                ("DROVER_LOG_IS_QUIET", "yes"),
            ]),
            &mut log,
        )
        .unwrap();
        assert_eq!(
            log,
            LoggingConfig {
                level: LogLevel::Debug,
                target: LogTarget::StderrFull,
                quiet: true
            }
        );
        // Empty means unset.
        apply_env(&env(&[("DROVER_LOG_LEVEL", "")]), &mut log).unwrap();
        assert_eq!(log.level, LogLevel::Debug);
        let err = apply_env(&env(&[("DROVER_LOG_LEVEL", "debug")]), &mut log).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Env { var, .. } if var == "DROVER_LOG_LEVEL"),
            "{err}"
        );
        let err = apply_env(&env(&[("DROVER_LOG_IS_QUIET", "sure")]), &mut log).unwrap_err();
        assert!(err.to_string().contains("DROVER_LOG_IS_QUIET"), "{err}");
    }
}
