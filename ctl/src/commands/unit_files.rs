//! `enable NODE UNIT... [-f|--force] [--runtime] [--no-reload]`,
//! `disable NODE UNIT... [--runtime] [--no-reload]`, `is-enabled NODE UNIT`.
//!
//! enable/disable call `Node.EnableUnitFiles` / `Node.DisableUnitFiles`, then
//! `Node.Reload` unless `--no-reload`, as bluechictl does. Like bluechictl they report
//! on stderr: for enable whether the files carried install information, then one
//! line per change, `Created symlink A -> B` or `Removed "A".` (systemctl's words).
//! Unlike bluechictl, `disable --runtime` is honoured (bluechictl reads the flag but
//! never passes it). `--json` prints one document on stdout instead.
//!
//! is-enabled prints the state systemd reports and exits 0 only for the states
//! bluechictl treats as enabled: `enabled`, `enabled-runtime`, `static`, `alias`,
//! `indirect`, `generated`.

use serde::Serialize;

use drover_protocol::{NodeName, UnitName};

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::json;
use crate::parse::{parse_node, parse_unit};
use drover_bus::client::{ChangeTuple, NodeProxy};

/// States for which `is-enabled` exits 0.
pub const ENABLED_STATES: [&str; 6] = [
    "enabled",
    "enabled-runtime",
    "static",
    "alias",
    "indirect",
    "generated",
];

#[derive(Debug, clap::Args)]
pub struct Enable {
    /// Node the unit files live on
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,

    /// Unit files to enable; without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_unit, required = true, num_args = 1..)]
    pub units: Vec<UnitName>,

    /// Replace symlinks that point to other units
    #[arg(short, long)]
    pub force: bool,

    /// Enable until the next reboot only (/run instead of /etc)
    #[arg(long)]
    pub runtime: bool,

    /// Do not make systemd reload its unit files afterwards
    #[arg(long)]
    pub no_reload: bool,
}

#[derive(Debug, clap::Args)]
pub struct Disable {
    /// Node the unit files live on
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,

    /// Unit files to disable; without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_unit, required = true, num_args = 1..)]
    pub units: Vec<UnitName>,

    /// Remove the runtime enablement (/run) instead of the persistent one (/etc)
    #[arg(long)]
    pub runtime: bool,

    /// Do not make systemd reload its unit files afterwards
    #[arg(long)]
    pub no_reload: bool,
}

#[derive(Debug, clap::Args)]
pub struct IsEnabled {
    /// Node the unit file lives on
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,

    /// Unit file; without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_unit)]
    pub unit: UnitName,
}

/// One change as JSON. Keys are a stable interface.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ChangeJson {
    #[serde(rename = "type")]
    pub kind: String,
    pub file: String,
    pub destination: String,
}

/// The JSON form of enable/disable/set-default. Keys are a stable interface.
#[derive(Debug, Serialize)]
pub struct ChangesJson<'a> {
    pub node: &'a str,
    pub operation: &'static str,
    /// Only for EnableUnitFiles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carries_install_info: Option<bool>,
    pub changes: Vec<ChangeJson>,
    /// Whether systemd was told to reload its unit files afterwards.
    pub reloaded: bool,
}

/// systemctl's line for one change.
pub fn change_line((kind, file, destination): &ChangeTuple) -> String {
    match kind.as_str() {
        "symlink" => format!("Created symlink {file} -> {destination}\n"),
        "unlink" => format!("Removed \"{file}\".\n"),
        other => format!("Unknown operation: {other} {file} {destination}\n"),
    }
}

pub fn changes_json(changes: Vec<ChangeTuple>) -> Vec<ChangeJson> {
    changes
        .into_iter()
        .map(|(kind, file, destination)| ChangeJson {
            kind,
            file,
            destination,
        })
        .collect()
}

/// bluechictl's line about install information.
pub fn install_info_line(carries: bool) -> &'static str {
    if carries {
        "The unit files included enablement information\n"
    } else {
        "The unit files did not include any enablement information\n"
    }
}

async fn reload(ctx: &mut Context, node: &NodeName) -> Result<(), CtlError> {
    let client = ctx.client().await?;
    let proxy = client.node(node).await?;
    let what = format!("Reload on node {node}");
    let cc = CallContext::on(&what, node, None);
    client.check(proxy.reload().await, cc).await
}

/// `operation` (`call`) with the unit files `units` on `node`; a failure is
/// worded for that node, and for the unit when there is only one.
async fn call_on_files<T>(
    ctx: &mut Context,
    node: &NodeName,
    units: &[UnitName],
    operation: &str,
    call: impl AsyncFnOnce(&NodeProxy<'static>, &[&str]) -> zbus::Result<T>,
) -> Result<T, CtlError> {
    let client = ctx.client().await?;
    let proxy = client.node(node).await?;
    let files: Vec<&str> = units.iter().map(UnitName::as_str).collect();
    let what = format!("{operation} on node {node}");
    let only = match units {
        [unit] => Some(unit),
        _ => None,
    };
    let r = call(&proxy, &files).await;
    client.check(r, CallContext::on(&what, node, only)).await
}

/// What `EnableUnitFiles` or `DisableUnitFiles` did on `node`.
struct FilesChanged<'a> {
    node: &'a NodeName,
    operation: &'static str,
    /// Only for EnableUnitFiles.
    carries_install_info: Option<bool>,
    changes: Vec<ChangeTuple>,
    /// Whether to make systemd reload its unit files now.
    reload: bool,
}

impl FilesChanged<'_> {
    /// Reports the changes as enable and disable both do (bluechictl's lines
    /// on stderr, or one JSON document), reloading systemd in between if asked.
    async fn report(self, ctx: &mut Context) -> Result<(), CtlError> {
        if !ctx.json() {
            let mut text = self
                .carries_install_info
                .map_or("", install_info_line)
                .to_owned();
            self.changes
                .iter()
                .for_each(|c| text.push_str(&change_line(c)));
            ctx.warn(&text);
        }
        if self.reload {
            reload(ctx, self.node).await?;
        }
        if ctx.json() {
            let doc = [ChangesJson {
                node: self.node.as_str(),
                operation: self.operation,
                carries_install_info: self.carries_install_info,
                changes: changes_json(self.changes),
                reloaded: self.reload,
            }];
            ctx.emit(&json(&doc))?;
        }
        Ok(())
    }
}

impl Run for Enable {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let (runtime, force) = (self.runtime, self.force);
        let (carries, changes) = call_on_files(
            ctx,
            &self.node,
            &self.units,
            "EnableUnitFiles",
            async |node, files| node.enable_unit_files(files, runtime, force).await,
        )
        .await?;
        let done = FilesChanged {
            node: &self.node,
            operation: "EnableUnitFiles",
            carries_install_info: Some(carries),
            changes,
            reload: !self.no_reload,
        };
        done.report(ctx).await
    }
}

impl Run for Disable {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let runtime = self.runtime;
        let changes = call_on_files(
            ctx,
            &self.node,
            &self.units,
            "DisableUnitFiles",
            async |node, files| node.disable_unit_files(files, runtime).await,
        )
        .await?;
        let done = FilesChanged {
            node: &self.node,
            operation: "DisableUnitFiles",
            carries_install_info: None,
            changes,
            reload: !self.no_reload,
        };
        done.report(ctx).await
    }
}

/// The JSON form of is-enabled. Keys are a stable interface.
#[derive(Debug, Serialize)]
pub struct IsEnabledJson<'a> {
    pub node: &'a str,
    pub unit: &'a str,
    pub state: &'a str,
    pub enabled: bool,
}

pub fn is_enabled_state(state: &str) -> bool {
    ENABLED_STATES.contains(&state)
}

impl Run for IsEnabled {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let proxy = client.node(&self.node).await?;
        let what = format!("GetUnitFileState of {} on node {}", self.unit, self.node);
        let cc = CallContext::on(&what, &self.node, Some(&self.unit));
        let state = client
            .check(proxy.get_unit_file_state(self.unit.as_str()).await, cc)
            .await?;
        let enabled = is_enabled_state(&state);
        let text = if ctx.json() {
            json(&[IsEnabledJson {
                node: self.node.as_str(),
                unit: self.unit.as_str(),
                state: &state,
                enabled,
            }])
        } else {
            format!("{state}\n")
        };
        ctx.emit(&text)?;
        if enabled {
            Ok(())
        } else {
            Err(CtlError::NotEnabled {
                unit: self.unit.to_string(),
                node: self.node.to_string(),
                state,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_lines_are_systemctls() {
        let c = (
            "symlink".to_owned(),
            "/etc/systemd/system/multi-user.target.wants/a.service".to_owned(),
            "/etc/systemd/system/a.service".to_owned(),
        );
        assert_eq!(
            change_line(&c),
            "Created symlink /etc/systemd/system/multi-user.target.wants/a.service -> /etc/systemd/system/a.service\n"
        );
        let c = ("unlink".to_owned(), "/x/y".to_owned(), String::new());
        assert_eq!(change_line(&c), "Removed \"/x/y\".\n");
        assert!(install_info_line(true).contains("included"));
        assert!(install_info_line(false).contains("did not include"));
    }

    #[test]
    fn enabled_states() {
        for s in ENABLED_STATES {
            assert!(is_enabled_state(s), "{s}");
        }
        for s in [
            "disabled",
            "masked",
            "masked-runtime",
            "linked",
            "bad",
            "transient",
            "",
        ] {
            assert!(!is_enabled_state(s), "{s}");
        }
    }

    #[test]
    fn json_shape() {
        let doc = [ChangesJson {
            node: "n1",
            operation: "DisableUnitFiles",
            carries_install_info: None,
            changes: changes_json(vec![("unlink".into(), "/a".into(), String::new())]),
            reloaded: true,
        }];
        let v: serde_json::Value = serde_json::from_str(&json(&doc)).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"node": "n1", "operation": "DisableUnitFiles",
                "changes": [{"type": "unlink", "file": "/a", "destination": ""}], "reloaded": true}])
        );
    }
}
