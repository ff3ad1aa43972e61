//! Helpers for this crate's unit tests.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The environment of a test that moves the default config search under
/// `root` (`DROVER_CONFIG_ROOT`, [`crate::layers::ROOT_ENV`]) and sets
/// nothing else.
pub fn config_root_env(root: &Path) -> impl Fn(&str) -> Option<OsString> + use<> {
    let root = root.as_os_str().to_owned();
    move |k| (k == crate::layers::ROOT_ENV).then(|| root.clone())
}

/// A fresh directory under the system temp dir, removed on drop (also when
/// the test panics).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "drover-config-test-{tag}-{}-{n}",
            std::process::id()
        ));
        // A leftover from a killed earlier run with the same pid is stale.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `text` to `name` inside the directory and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write temp file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A shipped vendor file with every commented-out `#Key=default` line of a
/// key in `keys` made live, and how many such lines there were: the vendor
/// files show each default in a comment, and tests check that what they show
/// is the real default.
pub fn uncomment_defaults(text: &str, keys: &[&str]) -> (String, usize) {
    let mut shown = 0;
    let uncommented = text
        .lines()
        .map(
            |line| match line.strip_prefix('#').and_then(|l| l.split_once('=')) {
                Some((k, _)) if keys.contains(&k) => {
                    shown += 1;
                    format!("{}\n", &line[1..])
                }
                _ => format!("{line}\n"),
            },
        )
        .collect();
    (uncommented, shown)
}
