//! `drain NODE [UNIT...]`, `undrain NODE [UNIT...]` and `drained`: take a node,
//! or units on it, out of service without stopping anything, put them back,
//! and list what is out (`io.drover.Controller.Drain`, `Undrain`,
//! `ListDrained`; drover extensions, docs/discovery.md).
//!
//! `drain` and `undrain` print nothing on success. Without UNIT they act on
//! the whole node (`undrain NODE` puts back the node and every unit drained
//! on it). `drained` prints `NODE | UNIT`, sorted, `*` in UNIT for a node
//! drained as a whole (JSON: `unit` is `""` then).

use serde::Serialize;

use drover_protocol::{NodeName, UnitName};

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::fit_table;
use crate::parse::{parse_node, parse_unit};

#[derive(Debug, clap::Args)]
pub struct Drain {
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,

    /// Only these units of NODE (the node stays in service for the others);
    /// without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_unit)]
    pub units: Vec<UnitName>,
}

#[derive(Debug, clap::Args)]
pub struct Undrain {
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,

    /// Only these units of NODE; without UNIT, the node and every unit
    /// drained on it; without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_unit)]
    pub units: Vec<UnitName>,
}

#[derive(Debug, clap::Args)]
pub struct Drained {}

/// One drained entry, also the JSON form (keys are a stable interface).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct DrainedRow {
    pub node: String,
    /// `""` for the whole node.
    pub unit: String,
}

pub fn render_table(rows: &[DrainedRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let unit = if r.unit.is_empty() { "*" } else { &r.unit };
            vec![r.node.clone(), unit.to_owned()]
        })
        .collect();
    fit_table(&["NODE", "UNIT"], &cells)
}

fn names(units: &[UnitName]) -> Vec<&str> {
    units.iter().map(UnitName::as_str).collect()
}

impl Run for Drain {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let drover = client.drover_controller().await?;
        let cc = CallContext {
            what: "io.drover.Controller.Drain",
            ..Default::default()
        };
        let done = drover.drain(self.node.as_str(), &names(&self.units)).await;
        client.check(done, cc).await
    }
}

impl Run for Undrain {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let drover = client.drover_controller().await?;
        let cc = CallContext {
            what: "io.drover.Controller.Undrain",
            ..Default::default()
        };
        let done = drover
            .undrain(self.node.as_str(), &names(&self.units))
            .await;
        client.check(done, cc).await
    }
}

impl Run for Drained {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let drover = client.drover_controller().await?;
        let cc = CallContext {
            what: "io.drover.Controller.ListDrained",
            ..Default::default()
        };
        let listed = client.check(drover.list_drained().await, cc).await?;
        let mut rows: Vec<DrainedRow> = listed
            .into_iter()
            .map(|(node, unit)| DrainedRow { node, unit })
            .collect();
        rows.sort();
        ctx.emit_rows(&rows, render_table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::json;

    #[test]
    fn table_and_json() {
        let rows = vec![
            DrainedRow {
                node: "a".into(),
                unit: "".into(),
            },
            DrainedRow {
                node: "b".into(),
                unit: "web.service".into(),
            },
        ];
        let t = render_table(&rows);
        let lines: Vec<Vec<&str>> = t
            .lines()
            .map(|l| l.split('|').map(str::trim).collect())
            .collect();
        assert_eq!(lines[0], ["NODE", "UNIT"]);
        assert_eq!(lines[2], ["a", "*"]);
        assert_eq!(lines[3], ["b", "web.service"]);
        let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"node": "a", "unit": ""}, {"node": "b", "unit": "web.service"}])
        );
    }
}
