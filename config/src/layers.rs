//! Where configuration comes from, in order (later layers override earlier):
//! drover's vendor file, BlueChi's `/etc` file and drop-ins, drover's `/etc`
//! file, drover's drop-ins (`*.conf`, sorted by file name), the
//! `DROVER_LOG_*` environment variables, then `-c FILE`.
//!
//! BlueChi's files (`/etc/bluechi/controller.conf` and `controller.conf.d/` for
//! the manager, `/etc/bluechi/agent.conf` and `agent.conf.d/` for the agent)
//! are read *under* drover's: a node moved from BlueChi keeps its settings,
//! and whatever drover's own files say wins, key by key. BlueChi's vendor file
//! (`/usr/share/bluechi…`) is not read: it holds BlueChi's defaults, not the
//! operator's choices, and drover's defaults apply instead
//! (docs/migrating-from-bluechi.md lists where they differ).
//!
//! `DROVER_CONFIG_ROOT=DIR` (absolute) makes the default search look under
//! `DIR` instead of `/` (`DIR/etc/drover/…`, `DIR/etc/bluechi/…`,
//! `DIR/usr/share/drover/…`): for tests and for checking a config tree
//! before installing it. [`Sources::from_env`] reads it.
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
    /// BlueChi's administrator file, e.g. `/etc/bluechi/controller.conf` (missing is fine).
    pub bluechi_etc: Option<PathBuf>,
    /// BlueChi's drop-in directory, e.g. `/etc/bluechi/controller.conf.d`.
    pub bluechi_dropins: Option<PathBuf>,
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

/// The environment variable that moves the default search under another root.
pub const ROOT_ENV: &str = "DROVER_CONFIG_ROOT";

impl Sources {
    /// Installed locations for `name` (`manager`, `agent`, `dns`), plus `-c FILE`.
    pub fn system(name: &str, extra: Option<PathBuf>) -> Self {
        Self::under(Path::new("/"), name, extra)
    }

    /// The installed locations for `name` with `root` standing in for `/`.
    /// BlueChi's files are read for the two daemons it has (it calls its
    /// manager the controller); drover-dns has no BlueChi counterpart.
    pub fn under(root: &Path, name: &str, extra: Option<PathBuf>) -> Self {
        let at = |path: String| root.join(path.trim_start_matches('/'));
        let bluechi = match name {
            "manager" => Some("controller"),
            "agent" => Some("agent"),
            _ => None,
        };
        Self {
            vendor: Some(at(format!("{DATADIR}/drover/{name}.conf"))),
            bluechi_etc: bluechi.map(|b| at(format!("/etc/bluechi/{b}.conf"))),
            bluechi_dropins: bluechi.map(|b| at(format!("/etc/bluechi/{b}.conf.d"))),
            etc: Some(at(format!("/etc/drover/{name}.conf"))),
            dropins: Some(at(format!("/etc/drover/{name}.conf.d"))),
            env: true,
            extra,
        }
    }

    /// What a binary's flags ask for: `--no-default-config` reads only
    /// `-c FILE` ([`Sources::only`]); otherwise [`Sources::from_env`] with the
    /// process environment.
    pub fn for_flags(
        name: &str,
        extra: Option<PathBuf>,
        no_default_config: bool,
    ) -> Result<Self, ConfigError> {
        if no_default_config {
            Ok(Self::only(extra))
        } else {
            Self::from_env(name, extra, &|v| std::env::var_os(v))
        }
    }

    /// [`Sources::system`], under `$DROVER_CONFIG_ROOT` when it is set and not
    /// empty; `env` reads one variable. A relative root is an error (it would
    /// depend on the daemon's working directory).
    pub fn from_env(
        name: &str,
        extra: Option<PathBuf>,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ConfigError> {
        match env(ROOT_ENV) {
            Some(root) if !root.is_empty() => {
                let root = PathBuf::from(root);
                if !root.is_absolute() {
                    return Err(ConfigError::Env {
                        var: ROOT_ENV.into(),
                        message: format!("'{}' is not an absolute path", root.display()),
                    });
                }
                Ok(Self::under(&root, name, extra))
            }
            _ => Ok(Self::system(name, extra)),
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

/// What loading read and what it has to say: the daemons log both at start
/// (and on reload), once logging is set up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Every file applied, in order.
    pub files: Vec<PathBuf>,
    /// Settings that were accepted but are not honoured as written (BlueChi
    /// keys drover cannot serve, BlueChi defaults that drover does not share),
    /// each naming its file, line and key.
    pub warnings: Vec<String>,
}

impl LoadReport {
    /// One line for the log: which files were read.
    pub fn files_line(&self) -> String {
        if self.files.is_empty() {
            return "no configuration file read; built-in defaults apply".into();
        }
        let list: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
        format!("configuration read from {}", list.join(", "))
    }
}

/// A typed config that files can be applied to, one after another.
pub(crate) trait Layered {
    /// Applies every entry of `doc` over the current values.
    fn apply(&mut self, doc: &Document) -> Result<(), ConfigError>;
    fn logging_mut(&mut self) -> &mut LoggingConfig;
}

/// Applies every layer of `sources` to `target`, in order, and returns the
/// files applied. `env` reads one environment variable (the process
/// environment, or a map in tests).
pub(crate) fn apply_sources<T: Layered>(
    target: &mut T,
    sources: &Sources,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Vec<PathBuf>, ConfigError> {
    let mut read = Vec::new();
    let mut apply = |target: &mut T, path: &Path, missing_ok: bool| -> Result<(), ConfigError> {
        if let Some(doc) = ini::read_file(path, missing_ok)? {
            target.apply(&doc)?;
            read.push(path.to_path_buf());
        }
        Ok(())
    };
    let file_then_dir = [
        (&sources.vendor, &None),
        (&sources.bluechi_etc, &sources.bluechi_dropins),
        (&sources.etc, &sources.dropins),
    ];
    for (file, dir) in file_then_dir {
        if let Some(path) = file {
            apply(target, path, true)?;
        }
        if let Some(dir) = dir {
            for path in dropin_files(dir)? {
                // Listed a moment ago: a file that vanished since is a real error.
                apply(target, &path, false)?;
            }
        }
    }
    if sources.env {
        crate::value::apply_env(env, target.logging_mut())?;
    }
    if let Some(path) = &sources.extra {
        apply(target, path, false)?;
    }
    Ok(read)
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
