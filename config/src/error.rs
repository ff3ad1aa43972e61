//! The one error type of this crate. Every variant that comes from a file
//! names the file and the 1-based line (and the key, for a bad value), so
//! `Display` alone tells an operator where to look.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}:{line}: key '{key}': {message}")]
    Value {
        path: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("{0}")]
    Invalid(String),
}
