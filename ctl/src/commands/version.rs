//! `version`: `droverctl version X` (the same text as `--version`); needs no bus.

use serde::Serialize;

use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::json;

/// droverctl's version, from Cargo.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, clap::Args)]
pub struct Version {}

#[derive(Debug, Serialize)]
struct VersionJson {
    name: &'static str,
    version: &'static str,
}

impl Run for Version {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let text = if ctx.json() {
            json(&[VersionJson {
                name: "droverctl",
                version: VERSION,
            }])
        } else {
            format!("droverctl version {VERSION}\n")
        };
        ctx.emit(&text)
    }
}
