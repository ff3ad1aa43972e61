//! `version`: `droverctl version X (commit C)` (the same text as `--version`); needs no bus.

use serde::Serialize;

use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::json;

/// droverctl's version, from Cargo.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit it was built from (`unknown` outside git; see build/git_commit.rs).
pub const COMMIT: &str = env!("DROVER_GIT_COMMIT");

#[derive(Debug, clap::Args)]
pub struct Version {}

#[derive(Debug, Serialize)]
struct VersionJson {
    name: &'static str,
    version: &'static str,
    commit: &'static str,
}

impl Run for Version {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let text = if ctx.json() {
            json(&[VersionJson {
                name: "droverctl",
                version: VERSION,
                commit: COMMIT,
            }])
        } else {
            format!("droverctl version {VERSION} (commit {COMMIT})\n")
        };
        ctx.emit(&text)
    }
}
