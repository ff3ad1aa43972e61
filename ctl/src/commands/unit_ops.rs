//! One-shot unit operations that are not jobs: `freeze|thaw NODE UNIT`,
//! `kill NODE UNIT [--kill-whom=all|main|control] [--signal=N]`,
//! `reset-failed [NODE [UNIT...]]`.
//!
//! freeze/thaw print bluechictl's `Unit X freeze operation done`; kill and
//! reset-failed print nothing on success. `--signal` is checked here (1..=64 or a
//! name), so a typo never reaches a node. With `--json` each prints one document
//! `[{"node", "unit", "operation", "result": "done", ...}]`.
//!
//! `reset-failed` without a node resets every *online* node (an offline node has
//! nothing the manager could reset; it is named on stderr and in the JSON as
//! `"result": "offline"`, and does not make the command fail).

use serde::Serialize;

use drover_protocol::{NodeName, UnitName};

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::json;
use crate::parse::{parse_job_unit, parse_node, parse_signal, parse_unit};

#[derive(Debug, clap::Args)]
pub struct UnitArgs {
    /// Node the unit lives on
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,

    /// Unit name; without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_job_unit)]
    pub unit: UnitName,
}

#[derive(Debug, clap::Args)]
pub struct Freeze {
    #[command(flatten)]
    pub args: UnitArgs,
}

#[derive(Debug, clap::Args)]
pub struct Thaw {
    #[command(flatten)]
    pub args: UnitArgs,
}

/// Which processes of the unit get the signal (systemd's `KillUnit` words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KillWhom {
    All,
    Main,
    Control,
}

impl KillWhom {
    pub fn as_str(self) -> &'static str {
        match self {
            KillWhom::All => "all",
            KillWhom::Main => "main",
            KillWhom::Control => "control",
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Kill {
    #[command(flatten)]
    pub args: UnitArgs,

    /// Which processes get the signal
    #[arg(long, value_enum, default_value = "all", value_name = "WHOM")]
    pub kill_whom: KillWhom,

    /// Signal number (1..=64) or name (TERM, SIGKILL, RTMIN+1, ...)
    #[arg(long, default_value = "15", value_parser = parse_signal, value_name = "SIGNAL")]
    pub signal: i32,
}

#[derive(Debug, clap::Args)]
pub struct ResetFailed {
    /// Only this node (default: every online node)
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: Option<NodeName>,

    /// Only these units of NODE; without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_unit, requires = "node")]
    pub units: Vec<UnitName>,
}

/// The JSON form of these operations. Keys are a stable interface.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct OpJson {
    pub node: String,
    /// null for node-wide operations (ResetFailed).
    pub unit: Option<String>,
    pub operation: &'static str,
    /// `done`, or `offline` for a node `reset-failed` skipped.
    pub result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whom: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

impl OpJson {
    fn new(node: &str, unit: Option<&UnitName>, operation: &'static str) -> OpJson {
        OpJson {
            node: node.to_owned(),
            unit: unit.map(|u| u.to_string()),
            operation,
            result: "done",
            whom: None,
            signal: None,
        }
    }
}

async fn freeze_thaw(ctx: &mut Context, args: UnitArgs, freeze: bool) -> Result<(), CtlError> {
    let client = ctx.client().await?;
    let proxy = client.node(&args.node).await?;
    let (method, word) = if freeze {
        ("FreezeUnit", "freeze")
    } else {
        ("ThawUnit", "thaw")
    };
    let what = format!("{method} of {} on node {}", args.unit, args.node);
    let cc = CallContext::on(&what, &args.node, Some(&args.unit));
    let unit = args.unit.as_str();
    let r = if freeze {
        proxy.freeze_unit(unit).await
    } else {
        proxy.thaw_unit(unit).await
    };
    client.check(r, cc).await?;
    let text = if ctx.json() {
        json(&[OpJson::new(args.node.as_str(), Some(&args.unit), method)])
    } else {
        format!("Unit {unit} {word} operation done\n")
    };
    ctx.emit(&text)
}

impl Run for Freeze {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        freeze_thaw(ctx, self.args, true).await
    }
}

impl Run for Thaw {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        freeze_thaw(ctx, self.args, false).await
    }
}

impl Run for Kill {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let args = self.args;
        let client = ctx.client().await?;
        let proxy = client.node(&args.node).await?;
        let what = format!(
            "KillUnit of {} on node {} (signal {}, {})",
            args.unit,
            args.node,
            self.signal,
            self.kill_whom.as_str()
        );
        let cc = CallContext::on(&what, &args.node, Some(&args.unit));
        let r = proxy
            .kill_unit(args.unit.as_str(), self.kill_whom.as_str(), self.signal)
            .await;
        client.check(r, cc).await?;
        if ctx.json() {
            let mut doc = OpJson::new(args.node.as_str(), Some(&args.unit), "KillUnit");
            doc.whom = Some(self.kill_whom.as_str());
            doc.signal = Some(self.signal);
            ctx.emit(&json(&[doc]))?;
        }
        Ok(())
    }
}

impl Run for ResetFailed {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?.clone();
        let mut done: Vec<OpJson> = Vec::new();
        match self.node {
            None => {
                let controller = client.controller().await?;
                let cc = CallContext {
                    what: "ListNodes",
                    ..Default::default()
                };
                let nodes = client.check(controller.list_nodes().await, cc).await?;
                let mut first_error = None;
                for (name, path, status, _) in nodes {
                    if status != "online" {
                        ctx.warn(&format!("node {name} is offline; skipped\n"));
                        let mut op = OpJson::new(&name, None, "ResetFailed");
                        op.result = "offline";
                        done.push(op);
                        continue;
                    }
                    let proxy = client.node_at(path.to_string()).await?;
                    let what = format!("ResetFailed on node {name}");
                    let cc = CallContext {
                        what: &what,
                        ..Default::default()
                    };
                    // Keep going: one node's failure must not leave the others untouched.
                    match client.check(proxy.reset_failed().await, cc).await {
                        Ok(()) => done.push(OpJson::new(&name, None, "ResetFailed")),
                        // The first error is printed by the binary when we return it.
                        Err(e) if first_error.is_some() => ctx.warn(&format!("droverctl: {e}\n")),
                        Err(e) => first_error = Some(e),
                    }
                }
                if let Some(e) = first_error {
                    return Err(e);
                }
            }
            Some(node) => {
                let proxy = client.node(&node).await?;
                if self.units.is_empty() {
                    let what = format!("ResetFailed on node {node}");
                    let cc = CallContext::on(&what, &node, None);
                    client.check(proxy.reset_failed().await, cc).await?;
                    done.push(OpJson::new(node.as_str(), None, "ResetFailed"));
                } else {
                    let mut first_error = None;
                    for unit in &self.units {
                        let what = format!("ResetFailedUnit of {unit} on node {node}");
                        let cc = CallContext::on(&what, &node, Some(unit));
                        let r = proxy.reset_failed_unit(unit.as_str()).await;
                        match client.check(r, cc).await {
                            Ok(()) => {
                                done.push(OpJson::new(node.as_str(), Some(unit), "ResetFailedUnit"))
                            }
                            Err(e) if first_error.is_some() => {
                                ctx.warn(&format!("droverctl: {e}\n"))
                            }
                            Err(e) => first_error = Some(e),
                        }
                    }
                    if let Some(e) = first_error {
                        return Err(e);
                    }
                }
            }
        }
        if ctx.json() {
            ctx.emit(&json(&done))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_json_shape() {
        let unit = UnitName::new("a.service").unwrap();
        let mut op = OpJson::new("n1", Some(&unit), "KillUnit");
        op.whom = Some("main");
        op.signal = Some(9);
        let v: serde_json::Value = serde_json::from_str(&json(&[op])).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"node": "n1", "unit": "a.service", "operation": "KillUnit",
                "result": "done", "whom": "main", "signal": 9}])
        );
        let v: serde_json::Value =
            serde_json::from_str(&json(&[OpJson::new("n1", None, "ResetFailed")])).unwrap();
        assert_eq!(v[0]["unit"], serde_json::Value::Null);
    }
}
