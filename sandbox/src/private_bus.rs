//! [`PrivateBus`]: a throwaway `dbus-daemon` for tests and benchmarks that need a bus of
//! their own but no systemd (the manager's API, the agent's local API, the proxy helper,
//! droverctl against a stand-in manager).
//!
//! Session-type bus in a fresh directory under the temp dir; anyone may own any name and
//! eavesdrop (monitors). Dropping the value kills the daemon and removes the directory, also
//! when the test that made it panics.

use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// See the module docs.
pub struct PrivateBus {
    child: Child,
    dir: PathBuf,
    address: String,
}

impl PrivateBus {
    /// Starts the daemon and returns once it listens. `tag` names its directory
    /// (`<tmp>/<tag>-<pid>-<n>`), so a leftover says who made it.
    pub fn start(tag: &str) -> Result<Self> {
        Self::start_with(tag, false)
    }

    /// [`PrivateBus::start`] for a bus every local user may connect to (tests of what a
    /// non-root caller may do, with `drover_testkit::api::connect_as`).
    pub fn start_open(tag: &str) -> Result<Self> {
        Self::start_with(tag, true)
    }

    fn start_with(tag: &str, any_user: bool) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let socket = dir.join("bus");
        let conf = dir.join("bus.conf");
        std::fs::write(&conf, crate::files::bus_config_for(&socket, any_user))
            .context("writing the bus config")?;
        // The daemon's chatter (e.g. about fd limits) goes to a log, quoted on failure.
        let log = dir.join("dbus-daemon.log");
        let log_file = std::fs::File::create(&log).context("creating the daemon log")?;
        let mut child = Command::new("dbus-daemon")
            .arg("--nofork")
            .arg("--print-address")
            .arg(format!("--config-file={}", conf.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .context("starting dbus-daemon (package dbus)")?;
        let stdout = child.stdout.take().context("dbus-daemon's stdout")?;
        // Owned from here: an error below still tears the daemon down.
        let bus = Self {
            child,
            dir,
            address: format!("unix:path={}", socket.display()),
        };
        // The daemon prints its address once it listens, or exits (EOF).
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("reading dbus-daemon's address")?;
        if !line.starts_with("unix:") {
            bail!(
                "dbus-daemon did not start (printed {line:?}): {}",
                std::fs::read_to_string(&log).unwrap_or_default().trim()
            );
        }
        Ok(bus)
    }

    /// The D-Bus address clients connect to (`unix:path=…`).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The daemon's process id (to read its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The bus's own directory (for other files a test wants to keep next to it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_and_leaves_nothing_behind() {
        let bus = PrivateBus::start("drover-private-bus-test").unwrap();
        let dir = bus.dir().to_path_buf();
        let conn = zbus::connection::Builder::address(bus.address())
            .build()
            .await
            .unwrap();
        assert!(conn.unique_name().is_some());
        drop(conn);
        drop(bus);
        assert!(!dir.exists(), "{} is left behind", dir.display());
    }
}
