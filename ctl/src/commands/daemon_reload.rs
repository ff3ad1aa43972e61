//! `daemon-reload NODE`: `Node.Reload`, systemd's daemon-reload on that node.
//!
//! Prints nothing on success (like bluechictl); with `--json` one document
//! `[{"node": N, "operation": "Reload", "result": "done"}]` so a script always gets
//! valid JSON back.

use serde::Serialize;

use drover_protocol::NodeName;

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::json;
use crate::parse::parse_node;

#[derive(Debug, clap::Args)]
pub struct DaemonReload {
    /// Node whose systemd reloads its unit files
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,
}

/// The JSON form. Keys are a stable interface.
#[derive(Debug, Serialize)]
pub struct ReloadOutcome<'a> {
    pub node: &'a str,
    pub operation: &'static str,
    pub result: &'static str,
}

impl Run for DaemonReload {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let proxy = client.node(&self.node).await?;
        if let Err(e) = proxy.reload().await {
            let what = format!("Reload on node {}", self.node);
            let cc = CallContext::on(&what, &self.node, None);
            return Err(client.classify(e, cc).await);
        }
        if ctx.json() {
            let doc = [ReloadOutcome {
                node: self.node.as_str(),
                operation: "Reload",
                result: "done",
            }];
            ctx.emit(&json(&doc))?;
        }
        Ok(())
    }
}
