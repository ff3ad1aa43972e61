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
