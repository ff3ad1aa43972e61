//! `health [NODE [UNIT...]]` and `is-healthy NODE UNIT`: the health of units as
//! their agents check it (drover extensions: `io.drover.Controller.ListHealth`,
//! `io.drover.Node.GetUnitHealth`; BlueChi has no health).
//!
//! `health` prints `NODE | UNIT | HEALTH | SINCE | REASON` (the first line of the
//! reason), rows sorted: every unit that declares a check on every online node, or
//! those of NODE (an unknown NODE is an error, not an empty table), or the named
//! UNITs of NODE (a unit that declares no check shows `none`). `is-healthy` prints
//! the state and exits 0 only when it is `healthy` (for `ExecCondition=`); an
//! offline node or a unit without a verdict yet is not healthy.

use serde::Serialize;

use drover_protocol::health::one_line;
use drover_protocol::{NodeName, UnitName};

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::{fit_table, json, local_time};
use crate::parse::{parse_node, parse_unit};
use drover_bus::client::HealthTuple;

#[derive(Debug, clap::Args)]
pub struct Health {
    /// Only units of this node
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: Option<NodeName>,

    /// Only these units of NODE; without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_unit, requires = "node")]
    pub units: Vec<UnitName>,
}

#[derive(Debug, clap::Args)]
pub struct IsHealthy {
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,

    /// Without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_unit)]
    pub unit: UnitName,
}

/// One unit's health, also the JSON form (keys are a stable interface).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct HealthRow {
    pub node: String,
    pub unit: String,
    /// `none`, `starting`, `healthy` or `unhealthy`.
    pub state: String,
    /// The check's output or error (all of it; the table shows its first line).
    pub reason: String,
    /// Realtime µs when the state began; 0 for `none`.
    pub since_usec: u64,
}

impl From<HealthTuple> for HealthRow {
    fn from((node, unit, state, reason, since_usec): HealthTuple) -> Self {
        HealthRow {
            node,
            unit,
            state,
            reason,
            since_usec,
        }
    }
}

pub fn render_table(rows: &[HealthRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.node.clone(),
                r.unit.clone(),
                r.state.clone(),
                if r.since_usec == 0 {
                    "-".to_owned()
                } else {
                    local_time(r.since_usec)
                },
                one_line(&r.reason).to_owned(),
            ]
        })
        .collect();
    fit_table(&["NODE", "UNIT", "HEALTH", "SINCE", "REASON"], &cells)
}

impl Run for Health {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let Some(node) = &self.node else {
            let drover = client.drover_controller().await?;
            let cc = CallContext {
                what: "io.drover.Controller.ListHealth",
                ..Default::default()
            };
            let mut rows: Vec<HealthRow> = client
                .check(drover.list_health().await, cc)
                .await?
                .into_iter()
                .map(HealthRow::from)
                .collect();
            rows.sort();
            return ctx.emit_rows(&rows, render_table);
        };
        let proxy = client.drover_node(node).await?;
        let mut rows = Vec::new();
        if self.units.is_empty() {
            let drover = client.drover_controller().await?;
            // The node's own object answers first, so an unknown or offline node
            // is an error and not an empty table.
            let what = format!("io.drover.Node.GetHealth on node {node}");
            client
                .check(proxy.get_health().await, CallContext::on(&what, node, None))
                .await?;
            let cc = CallContext {
                what: "io.drover.Controller.ListHealth",
                ..Default::default()
            };
            rows.extend(
                client
                    .check(drover.list_health().await, cc)
                    .await?
                    .into_iter()
                    .filter(|t| t.0 == node.as_str())
                    .map(HealthRow::from),
            );
        }
        for unit in &self.units {
            let what = format!("io.drover.Node.GetUnitHealth of {unit} on node {node}");
            let cc = CallContext::on(&what, node, Some(unit));
            let (state, reason, since_usec) = client
                .check(proxy.get_unit_health(unit.as_str()).await, cc)
                .await?;
            rows.push(HealthRow {
                node: node.to_string(),
                unit: unit.to_string(),
                state,
                reason,
                since_usec,
            });
        }
        rows.sort();
        ctx.emit_rows(&rows, render_table)
    }
}

impl Run for IsHealthy {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let proxy = client.drover_node(&self.node).await?;
        let what = format!(
            "io.drover.Node.GetUnitHealth of {} on node {}",
            self.unit, self.node
        );
        let cc = CallContext::on(&what, &self.node, Some(&self.unit));
        let (state, reason, since_usec) = client
            .check(proxy.get_unit_health(self.unit.as_str()).await, cc)
            .await?;
        let healthy = state == "healthy";
        let text = if ctx.json() {
            json(&[HealthRow {
                node: self.node.to_string(),
                unit: self.unit.to_string(),
                state: state.clone(),
                reason,
                since_usec,
            }])
        } else {
            format!("{state}\n")
        };
        ctx.emit(&text)?;
        if healthy {
            Ok(())
        } else {
            Err(CtlError::NotHealthy {
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

    fn row(node: &str, unit: &str, state: &str, reason: &str, since: u64) -> HealthRow {
        HealthRow::from((
            node.to_owned(),
            unit.to_owned(),
            state.to_owned(),
            reason.to_owned(),
            since,
        ))
    }

    #[test]
    fn the_table_shows_the_first_line_of_the_reason() {
        let t = render_table(&[
            row(
                "bar",
                "db.service",
                "unhealthy",
                "\nconnect: refused\nmore",
                0,
            ),
            row("foo", "web.service", "healthy", "", 1),
        ]);
        let lines: Vec<Vec<&str>> = t
            .lines()
            .map(|l| l.split('|').map(str::trim).collect())
            .collect();
        assert_eq!(lines[0], ["NODE", "UNIT", "HEALTH", "SINCE", "REASON"]);
        assert_eq!(
            lines[2],
            ["bar", "db.service", "unhealthy", "-", "connect: refused"]
        );
        assert_eq!(lines[3][..3], ["foo", "web.service", "healthy"]);
    }

    #[test]
    fn json_keys() {
        let v: serde_json::Value =
            serde_json::from_str(&json(&[row("bar", "db.service", "healthy", "ok", 7)])).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"node": "bar", "unit": "db.service", "state": "healthy",
                "reason": "ok", "since_usec": 7}])
        );
    }
}
