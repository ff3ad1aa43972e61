//! `get-default NODE` and `set-default NODE TARGET`.
//!
//! get-default prints the node's default target (`Node.GetDefaultTarget`).
//! set-default calls `Node.SetDefaultTarget(TARGET, force=true)` as bluechictl and
//! systemctl do, and reports the symlink changes on stderr in systemctl's words. A
//! TARGET that is not a `.target` unit is refused before anything is sent.

use serde::Serialize;

use drover_protocol::{NodeName, UnitName};

use crate::client::CallContext;
use crate::commands::unit_files::{ChangesJson, change_line, changes_json};
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::json;
use crate::parse::{parse_node, parse_target};

#[derive(Debug, clap::Args)]
pub struct GetDefault {
    /// Node to ask
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,
}

#[derive(Debug, clap::Args)]
pub struct SetDefault {
    /// Node to change
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,

    /// A target unit; without a suffix '.target' is assumed
    #[arg(value_name = "TARGET", value_parser = parse_target)]
    pub target: UnitName,
}

/// The JSON form of get-default. Keys are a stable interface.
#[derive(Debug, Serialize)]
pub struct DefaultJson<'a> {
    pub node: &'a str,
    pub default_target: &'a str,
}

impl Run for GetDefault {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let proxy = client.node(&self.node).await?;
        let what = format!("GetDefaultTarget on node {}", self.node);
        let cc = CallContext::on(&what, &self.node, None);
        let target = client.check(proxy.get_default_target().await, cc).await?;
        let text = if ctx.json() {
            json(&[DefaultJson {
                node: self.node.as_str(),
                default_target: &target,
            }])
        } else {
            format!("{target}\n")
        };
        ctx.emit(&text)
    }
}

impl Run for SetDefault {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let proxy = client.node(&self.node).await?;
        let what = format!("SetDefaultTarget {} on node {}", self.target, self.node);
        let cc = CallContext::on(&what, &self.node, Some(&self.target));
        let changes = client
            .check(
                proxy.set_default_target(self.target.as_str(), true).await,
                cc,
            )
            .await?;
        if ctx.json() {
            let doc = [ChangesJson {
                node: self.node.as_str(),
                operation: "SetDefaultTarget",
                carries_install_info: None,
                changes: changes_json(changes),
                reloaded: false,
            }];
            ctx.emit(&json(&doc))
        } else {
            let text: String = changes.iter().map(change_line).collect();
            ctx.warn(&text);
            Ok(())
        }
    }
}
