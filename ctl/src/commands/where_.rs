//! `where UNIT [--healthy] [--stale] [--drained] [--all] [--node GLOB]`: the
//! nodes where a unit runs, from the manager's unit index
//! (`io.drover.Controller.Where`, a drover extension; docs/discovery.md).
//!
//! Prints `NODE | STATE | SUB | HEALTH | ADDRESS | SINCE | FLAGS | PORTS`,
//! one row per node (FLAGS: `stale`, `drained`), or with `--json` an object
//! `{"complete": bool, "rows": [...]}`. Exits 0 when at least one row
//! matches, 1 when none does (so units and scripts can ask "is it running
//! anywhere, healthy?"). When the manager says its answer may be incomplete
//! (it is warming up after a start), a line on stderr says so.

use serde::Serialize;

use drover_protocol::UnitName;
use std::collections::HashMap;

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::{fit_table, json, local_time};
use crate::parse::parse_unit;
use drover_bus::client::WhereTuple;

#[derive(Debug, clap::Args)]
pub struct Where {
    /// Without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_unit)]
    pub unit: UnitName,

    /// Only nodes where the unit is healthy (or declares no check)
    #[arg(long)]
    pub healthy: bool,

    /// Also offline nodes' last-good rows (within StaleRetention), marked stale
    #[arg(long)]
    pub stale: bool,

    /// Also drained rows, marked drained
    #[arg(long)]
    pub drained: bool,

    /// Rows in any state (inactive, failed, ...), not only active or reloading
    #[arg(long)]
    pub all: bool,

    /// Only nodes whose name matches this name or pattern (edge-*, lab-??)
    #[arg(long = "node", value_name = "GLOB")]
    pub node: Option<String>,
}

/// One row, also the JSON form (keys are a stable interface).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WhereRow {
    pub node: String,
    pub active_state: String,
    pub sub_state: String,
    /// `none`, `starting`, `healthy` or `unhealthy`.
    pub health: String,
    pub address: String,
    /// Realtime µs of the row's last change (for a stale row: when it went stale).
    pub since_usec: u64,
    pub stale: bool,
    pub drained: bool,
    pub ports: Vec<Port>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Port {
    /// Empty for the unit's `Port=`.
    pub name: String,
    pub port: u16,
}

#[derive(Debug, Serialize)]
struct Answer<'a> {
    complete: bool,
    rows: &'a [WhereRow],
}

impl From<WhereTuple> for WhereRow {
    fn from(t: WhereTuple) -> Self {
        let (node, active_state, sub_state, health, address, since_usec, stale, drained, ports) = t;
        WhereRow {
            node,
            active_state,
            sub_state,
            health,
            address,
            since_usec,
            stale,
            drained,
            ports: ports
                .into_iter()
                .map(|(name, port)| Port { name, port })
                .collect(),
        }
    }
}

pub fn render_table(rows: &[WhereRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut flags = Vec::new();
            if r.stale {
                flags.push("stale");
            }
            if r.drained {
                flags.push("drained");
            }
            let ports: Vec<String> = r
                .ports
                .iter()
                .map(|p| match p.name.as_str() {
                    "" => p.port.to_string(),
                    name => format!("{name}:{}", p.port),
                })
                .collect();
            let or_dash = |s: String| if s.is_empty() { "-".to_owned() } else { s };
            vec![
                r.node.clone(),
                r.active_state.clone(),
                r.sub_state.clone(),
                r.health.clone(),
                or_dash(r.address.clone()),
                local_time(r.since_usec),
                or_dash(flags.join(",")),
                or_dash(ports.join(",")),
            ]
        })
        .collect();
    fit_table(
        &[
            "NODE", "STATE", "SUB", "HEALTH", "ADDRESS", "SINCE", "FLAGS", "PORTS",
        ],
        &cells,
    )
}

impl Where {
    fn options(&self) -> HashMap<&'static str, zbus::Variant<'_>> {
        let mut o = HashMap::new();
        for (key, on) in [
            ("healthy", self.healthy),
            ("stale", self.stale),
            ("drained", self.drained),
            ("all", self.all),
        ] {
            if on {
                o.insert(key, zbus::Variant::Bool(true));
            }
        }
        if let Some(glob) = &self.node {
            o.insert("nodes", zbus::Variant::from(glob.as_str()));
        }
        o
    }
}

impl Run for Where {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let drover = client.drover_controller().await?;
        let what = format!("io.drover.Controller.Where of {}", self.unit);
        let cc = CallContext {
            what: &what,
            unit: Some(&self.unit),
            ..Default::default()
        };
        let (tuples, complete) = client
            .check(drover.where_(self.unit.as_str(), self.options()).await, cc)
            .await?;
        let rows: Vec<WhereRow> = tuples.into_iter().map(WhereRow::from).collect();
        let text = if ctx.json() {
            json(&Answer {
                complete,
                rows: &rows,
            })
        } else if rows.is_empty() {
            String::new()
        } else {
            render_table(&rows)
        };
        ctx.emit(&text)?;
        if !complete {
            eprintln!(
                "droverctl: the answer may be incomplete: the manager started recently and \
                 not every node has registered yet"
            );
        }
        if rows.is_empty() {
            return Err(CtlError::NowhereToBeFound {
                unit: self.unit.to_string(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(node: &str, stale: bool, ports: Vec<(String, u16)>) -> WhereTuple {
        (
            node.to_owned(),
            "active".to_owned(),
            "running".to_owned(),
            "healthy".to_owned(),
            "10.0.0.1".to_owned(),
            7,
            stale,
            false,
            ports,
        )
    }

    #[test]
    fn the_table_shows_flags_and_ports() {
        let rows = [
            WhereRow::from(tuple("a", false, vec![])),
            WhereRow::from(tuple(
                "b",
                true,
                vec![(String::new(), 80), ("admin".into(), 9000)],
            )),
        ];
        let t = render_table(&rows);
        let lines: Vec<Vec<&str>> = t
            .lines()
            .map(|l| l.split('|').map(str::trim).collect())
            .collect();
        assert_eq!(
            lines[0],
            [
                "NODE", "STATE", "SUB", "HEALTH", "ADDRESS", "SINCE", "FLAGS", "PORTS"
            ]
        );
        assert_eq!(
            lines[2][..5],
            ["a", "active", "running", "healthy", "10.0.0.1"]
        );
        assert_eq!(lines[2][6..], ["-", "-"]);
        assert_eq!(lines[3][6..], ["stale", "80,admin:9000"]);
    }

    #[test]
    fn json_keys() {
        let rows = [WhereRow::from(tuple("a", true, vec![("http".into(), 80)]))];
        let v: serde_json::Value = serde_json::from_str(&json(&Answer {
            complete: false,
            rows: &rows,
        }))
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"complete": false, "rows": [{"node": "a",
                "active_state": "active", "sub_state": "running", "health": "healthy",
                "address": "10.0.0.1", "since_usec": 7, "stale": true, "drained": false,
                "ports": [{"name": "http", "port": 80}]}]})
        );
    }
}
