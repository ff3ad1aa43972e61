//! `proxies [NODE]`: the cross-node dependencies drover-manager tracks, from
//! `io.drover.Controller.ListProxies() -> a(sssssu)` (a drover extension; BlueChi
//! has no such call).
//!
//! Table `REQUESTER | TARGET NODE | UNIT | STATE | TARGET STATE | REFS`, columns as
//! wide as their widest value, rows sorted. With NODE only rows where NODE is the
//! requester or the target; an unknown NODE is an error (not an empty table), so a
//! typo is not mistaken for "no dependencies".

use serde::Serialize;

use drover_protocol::NodeName;

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::fit_table;
use crate::parse::parse_node;
use drover_bus::client::ProxyTuple;

#[derive(Debug, clap::Args)]
pub struct Proxies {
    /// Only proxies this node requested or that target this node
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: Option<NodeName>,
}

/// One proxy, also the JSON form (keys are a stable interface).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ProxyRow {
    pub requester: String,
    pub target_node: String,
    pub unit: String,
    /// `waiting`, `active` or `failed`.
    pub state: String,
    /// The target's active state as last known, or `unknown`.
    pub target_state: String,
    /// References on the target (from all requesting nodes).
    pub refs: u32,
}

impl From<ProxyTuple> for ProxyRow {
    fn from((requester, target_node, unit, state, target_state, refs): ProxyTuple) -> Self {
        ProxyRow {
            requester,
            target_node,
            unit,
            state,
            target_state,
            refs,
        }
    }
}

/// Keep rows that involve `node` (all without one), sorted.
pub fn select(mut rows: Vec<ProxyRow>, node: Option<&str>) -> Vec<ProxyRow> {
    if let Some(n) = node {
        rows.retain(|r| r.requester == n || r.target_node == n);
    }
    rows.sort();
    rows
}

pub fn render_table(rows: &[ProxyRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.requester.clone(),
                r.target_node.clone(),
                r.unit.clone(),
                r.state.clone(),
                r.target_state.clone(),
                r.refs.to_string(),
            ]
        })
        .collect();
    fit_table(
        &[
            "REQUESTER",
            "TARGET NODE",
            "UNIT",
            "STATE",
            "TARGET STATE",
            "REFS",
        ],
        &cells,
    )
}

impl Run for Proxies {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        if let Some(node) = &self.node {
            let controller = client.controller().await?;
            let cc = CallContext {
                what: "ListNodes",
                ..Default::default()
            };
            let nodes = client.check(controller.list_nodes().await, cc).await?;
            if !nodes.iter().any(|(name, ..)| name == node.as_str()) {
                return Err(CtlError::NodeNotFound(node.to_string()));
            }
        }
        let drover = client.drover_controller().await?;
        let cc = CallContext {
            what: "io.drover.Controller.ListProxies",
            ..Default::default()
        };
        let listed = client.check(drover.list_proxies().await, cc).await?;
        let rows = select(
            listed.into_iter().map(ProxyRow::from).collect(),
            self.node.as_ref().map(NodeName::as_str),
        );
        ctx.emit_rows(&rows, render_table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::json;

    fn row(req: &str, target: &str, unit: &str, refs: u32) -> ProxyRow {
        ProxyRow::from((
            req.to_owned(),
            target.to_owned(),
            unit.to_owned(),
            "active".to_owned(),
            "active".to_owned(),
            refs,
        ))
    }

    #[test]
    fn filter_on_requester_or_target_and_table() {
        let rows = vec![
            row("foo", "bar", "db.service", 2),
            row("baz", "bar", "db.service", 2),
            row("foo", "qux", "mq.socket", 1),
        ];
        let bar = select(rows.clone(), Some("bar"));
        assert_eq!(bar.len(), 2);
        assert_eq!(bar[0].requester, "baz");
        let foo = select(rows.clone(), Some("foo"));
        assert_eq!(foo.len(), 2);
        assert!(select(rows.clone(), Some("none")).is_empty());

        let t = render_table(&select(rows, None));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0].split('|').map(str::trim).collect::<Vec<_>>(),
            [
                "REQUESTER",
                "TARGET NODE",
                "UNIT",
                "STATE",
                "TARGET STATE",
                "REFS"
            ]
        );
        assert!(lines[1].chars().all(|c| c == '='));
        assert_eq!(
            lines[2].split('|').map(str::trim).collect::<Vec<_>>(),
            ["baz", "bar", "db.service", "active", "active", "2"]
        );
    }

    #[test]
    fn json_keys() {
        let v: serde_json::Value =
            serde_json::from_str(&json(&[row("foo", "bar", "db.service", 1)])).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"requester": "foo", "target_node": "bar", "unit": "db.service",
                "state": "active", "target_state": "active", "refs": 1}])
        );
    }
}
