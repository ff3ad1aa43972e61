//! What the `drover-sandbox` binary's tests share: running the binary, a
//! guard that brings a sandbox down, its stderr as text.

use std::process::{Command, Output};

/// Runs the `drover-sandbox` binary with `args` (without the caller's
/// `DROVER_SANDBOX_DIR`).
pub fn sandbox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drover-sandbox"))
        .args(args)
        .env_remove("DROVER_SANDBOX_DIR")
        .output()
        .expect("drover-sandbox runs")
}

/// `drover-sandbox down --dir DIR` when dropped: a test that fails after `up` leaves no
/// sandbox running (`down` of a sandbox that is gone is a no-op).
pub struct DownOnDrop(pub String);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let _ = sandbox(&["down", "--dir", &self.0]);
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
