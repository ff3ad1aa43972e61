//! `set-loglevel [NODE] LEVEL`: `Controller.SetLogLevel(LEVEL)` (the manager's level)
//! or `Node.SetLogLevel(LEVEL)` (that node's agent). LEVEL is one of DEBUG, INFO,
//! WARN, ERROR (any case; sent upper-case) and is checked before anything is sent,
//! because BlueChi's controller does not reject a bad level for a node cleanly.

use serde::Serialize;

use drover_protocol::NodeName;

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::json;
use crate::parse::{parse_log_level, parse_node};

#[derive(Debug, clap::Args)]
pub struct SetLoglevel {
    /// `[NODE] LEVEL`: without NODE the manager's level is set.
    #[arg(
        value_name = "NODE|LEVEL",
        required = true,
        help = "[NODE] LEVEL: without NODE the manager's level is set"
    )]
    pub first: String,

    /// LEVEL when NODE is given: DEBUG, INFO, WARN or ERROR
    #[arg(value_name = "LEVEL")]
    pub second: Option<String>,
}

impl SetLoglevel {
    /// (node, level), validated.
    pub fn target(&self) -> Result<(Option<NodeName>, String), CtlError> {
        match &self.second {
            None => Ok((None, parse_log_level(&self.first).map_err(CtlError::Usage)?)),
            Some(level) => {
                let node = parse_node(&self.first).map_err(CtlError::Usage)?;
                Ok((Some(node), parse_log_level(level).map_err(CtlError::Usage)?))
            }
        }
    }
}

/// The JSON form. Keys are a stable interface.
#[derive(Debug, Serialize)]
pub struct LogLevelJson<'a> {
    /// null for the manager.
    pub node: Option<&'a str>,
    pub level: &'a str,
    pub result: &'static str,
}

impl Run for SetLoglevel {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        // Validate before connecting: nothing is sent for a bad level.
        let (node, level) = self.target()?;
        let client = ctx.client().await?;
        match &node {
            None => {
                let controller = client.controller().await?;
                let what = format!("SetLogLevel({level}) of drover-manager");
                let cc = CallContext {
                    what: &what,
                    ..Default::default()
                };
                client
                    .check(controller.set_log_level(&level).await, cc)
                    .await?;
            }
            Some(node) => {
                let proxy = client.node(node).await?;
                let what = format!("SetLogLevel({level}) on node {node}");
                let cc = CallContext::on(&what, node, None);
                client.check(proxy.set_log_level(&level).await, cc).await?;
            }
        }
        if ctx.json() {
            let doc = [LogLevelJson {
                node: node.as_ref().map(NodeName::as_str),
                level: &level,
                result: "done",
            }];
            ctx.emit(&json(&doc))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(first: &str, second: Option<&str>) -> SetLoglevel {
        SetLoglevel {
            first: first.into(),
            second: second.map(Into::into),
        }
    }

    #[test]
    fn levels_and_nodes_are_checked() {
        assert_eq!(cmd("debug", None).target().unwrap(), (None, "DEBUG".into()));
        let (node, level) = cmd("node1", Some("WARN")).target().unwrap();
        assert_eq!(node.unwrap().as_str(), "node1");
        assert_eq!(level, "WARN");
        for (f, s) in [
            ("LOUD", None),
            ("node1", Some("TRACE")),
            ("bad/node", Some("INFO")),
            ("", None),
            ("node1", None),
        ] {
            let e = cmd(f, s).target().unwrap_err();
            assert_eq!(e.exit_code(), crate::error::EXIT_USAGE, "{f} {s:?}: {e}");
        }
    }
}
