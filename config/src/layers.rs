//! Where configuration comes from, in order (later layers override earlier):
//! vendor file, `/etc` file, drop-ins (`*.conf`, sorted by file name), the
//! `DROVER_LOG_*` environment variables, then `-c FILE`.
//!
//! Missing vendor/etc files and a missing drop-in directory are fine (a fresh
//! install has none); any other read failure, and a missing `-c FILE`, is an
//! error. Each layer is applied completely before the next one is read, so the
//! first error stops loading and names its file.

use crate::ConfigError;
use crate::ini::{self, Document};
use crate::logging::LoggingConfig;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

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

/// Where the vendor files are: `/usr/share`, or `$DROVER_DATADIR` at build
/// time (`make install PREFIX=/opt/drover` builds with `/opt/drover/share`).
pub const DATADIR: &str = match option_env!("DROVER_DATADIR") {
    Some(dir) => dir,
    None => "/usr/share",
};

impl Sources {
    /// Installed locations for `name` (`manager` or `agent`), plus `-c FILE`.
    pub fn system(name: &str, extra: Option<PathBuf>) -> Self {
        Self {
            vendor: Some(PathBuf::from(format!("{DATADIR}/drover/{name}.conf"))),
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

/// A typed config that files can be applied to, one after another.
pub(crate) trait Layered {
    /// Applies every entry of `doc` over the current values.
    fn apply(&mut self, doc: &Document) -> Result<(), ConfigError>;
    fn logging_mut(&mut self) -> &mut LoggingConfig;
}

/// Applies every layer of `sources` to `target`, in order. `env` reads one
/// environment variable (the process environment, or a map in tests).
pub(crate) fn apply_sources<T: Layered>(
    target: &mut T,
    sources: &Sources,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<(), ConfigError> {
    for path in [&sources.vendor, &sources.etc].into_iter().flatten() {
        if let Some(doc) = ini::read_file(path, true)? {
            target.apply(&doc)?;
        }
    }
    if let Some(dir) = &sources.dropins {
        for path in dropin_files(dir)? {
            // Listed a moment ago: a file that vanished since is a real error.
            if let Some(doc) = ini::read_file(&path, false)? {
                target.apply(&doc)?;
            }
        }
    }
    if sources.env {
        crate::value::apply_env(env, target.logging_mut())?;
    }
    if let Some(path) = &sources.extra
        && let Some(doc) = ini::read_file(path, false)?
    {
        target.apply(&doc)?;
    }
    Ok(())
}

/// `*.conf` entries of `dir` sorted by file name (byte order, like systemd);
/// none when the directory does not exist. Sub-directories are skipped even
/// when their name ends in `.conf`; hidden files (`.foo.conf`, editor
/// leftovers) are skipped too.
pub(crate) fn dropin_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let read_err = |source| ConfigError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read_err(e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(read_err)?;
        let name = entry.file_name();
        let bytes = name.as_encoded_bytes();
        if !bytes.ends_with(b".conf") || bytes.starts_with(b".") {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks: a link to a file counts, a dangling one
        // is reported by the read that follows.
        if std::fs::metadata(&path)
            .map(|m| m.is_dir())
            .unwrap_or(false)
        {
            continue;
        }
        files.push(path);
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::TempDir;

    #[test]
    fn dropins_sorted_filtered() {
        let dir = TempDir::new("dropins");
        for name in [
            "20-b.conf",
            "10-a.conf",
            "b.txt",
            ".hidden.conf",
            "30-c.conf.bak",
        ] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("15-dir.conf")).unwrap();
        let names: Vec<String> = dropin_files(dir.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["10-a.conf", "20-b.conf"]);
        assert!(dropin_files(&dir.path().join("absent")).unwrap().is_empty());
    }
}
