//! Where configuration comes from, in order (later layers override earlier).

use std::path::PathBuf;

/// The files one binary reads. [`Sources::system`] gives the installed
/// locations; tests and the sandbox use [`Sources::only`] so the host's
/// `/etc/drover` never leaks into them.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// Vendor defaults, e.g. `/usr/share/drover/manager.conf` (missing is fine).
    pub vendor: Option<PathBuf>,
    /// Administrator file, e.g. `/etc/drover/manager.conf` (missing is fine).
    pub etc: Option<PathBuf>,
    /// Drop-in directory, e.g. `/etc/drover/manager.conf.d` (`*.conf`, alphabetical).
    pub dropins: Option<PathBuf>,
    /// Read `DROVER_LOG_LEVEL`, `DROVER_LOG_TARGET`, `DROVER_LOG_IS_QUIET`.
    pub env: bool,
    /// `-c FILE`: must exist; applied last.
    pub extra: Option<PathBuf>,
}

impl Sources {
    /// Installed locations for `name` (`manager` or `agent`), plus `-c FILE`.
    pub fn system(name: &str, extra: Option<PathBuf>) -> Self {
        Self {
            vendor: Some(PathBuf::from(format!("/usr/share/drover/{name}.conf"))),
            etc: Some(PathBuf::from(format!("/etc/drover/{name}.conf"))),
            dropins: Some(PathBuf::from(format!("/etc/drover/{name}.conf.d"))),
            env: true,
            extra,
        }
    }

    /// Only `-c FILE` (and the environment): `--no-default-config`.
    pub fn only(extra: Option<PathBuf>) -> Self {
        Self {
            env: true,
            extra,
            ..Self::default()
        }
    }
}
