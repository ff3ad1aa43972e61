//! `list-units [NODE] [--filter GLOB]`: units of every online node or of one
//! node (`Node.ListUnits`).
//!
//! Over all nodes, each online node is asked on its own (`Node.ListUnits`, a few
//! at a time, see [`crate::client::Client::each_node`]) and its rows are printed
//! as they come ([`crate::stream`]), so a fleet of any size lists with bounded
//! memory; `Controller.ListUnits` is one D-Bus reply, which a large fleet does not
//! fit. A node that cannot be listed has its reason on stderr and makes the
//! command exit 1 after printing the others. bluechictl prints nothing and fails
//! when any node fails (BlueChi's manager fails the whole call); drover shows what
//! it has and still says what is missing.
//!
//! Table `NODE | ID | ACTIVE | SUB`, each column as wide as its widest value, rows
//! sorted by node then unit so output is stable across runs. The glob matches the
//! unit name only, as in bluechictl.

use serde::Serialize;

use drover_protocol::NodeName;

use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::fit_table;
use crate::parse::{parse_glob, parse_node};
use drover_bus::systemd::UnitTuple;

#[derive(Debug, clap::Args)]
pub struct ListUnits {
    /// List only the units of this node
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: Option<NodeName>,

    /// Show only units whose name matches this glob (e.g. 'drover-*')
    #[arg(long, value_name = "GLOB", value_parser = parse_glob)]
    pub filter: Option<glob::Pattern>,
}

/// One unit of one node: the fields droverctl shows. Also the JSON form; its keys
/// are a stable interface.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct UnitRow {
    pub node: String,
    pub unit: String,
    pub active: String,
    pub sub: String,
    pub load: String,
    pub description: String,
}

impl UnitRow {
    pub fn from_tuple(node: &str, t: UnitTuple) -> UnitRow {
        let (unit, description, load, active, sub, ..) = t;
        UnitRow {
            node: node.to_owned(),
            unit,
            active,
            sub,
            load,
            description,
        }
    }
}

/// Keep the rows whose unit name matches `filter` (all without one), sorted.
pub fn select(mut rows: Vec<UnitRow>, filter: Option<&glob::Pattern>) -> Vec<UnitRow> {
    if let Some(p) = filter {
        rows.retain(|r| p.matches(&r.unit));
    }
    rows.sort();
    rows
}

const HEADERS: [&str; 4] = ["NODE", "ID", "ACTIVE", "SUB"];

/// A row's fields in the table.
fn cells(r: &UnitRow) -> Vec<String> {
    vec![
        r.node.clone(),
        r.unit.clone(),
        r.active.clone(),
        r.sub.clone(),
    ]
}

pub fn render_table(rows: &[UnitRow]) -> String {
    let cells: Vec<Vec<String>> = rows.iter().map(cells).collect();
    fit_table(&HEADERS, &cells)
}

impl Run for ListUnits {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?.clone();
        let filter = self.filter.as_ref();
        let Some(node) = &self.node else {
            return ctx
                .stream_nodes(
                    &client,
                    (&HEADERS, cells),
                    async |node| node.list_units().await,
                    |node, tuples| {
                        let rows = tuples.into_iter().map(|t| UnitRow::from_tuple(node, t));
                        select(rows.collect(), filter)
                    },
                    "units",
                )
                .await;
        };
        let mut listing = client
            .one_node(
                node,
                "ListUnits",
                async |node| node.list_units().await,
                UnitRow::from_tuple,
            )
            .await?;
        listing.rows = select(listing.rows, filter);
        ctx.emit_listing(listing, "units", render_table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::json;

    fn row(node: &str, unit: &str, active: &str, sub: &str) -> UnitRow {
        UnitRow {
            node: node.into(),
            unit: unit.into(),
            active: active.into(),
            sub: sub.into(),
            load: "loaded".into(),
            description: format!("the {unit}"),
        }
    }

    fn sample() -> Vec<UnitRow> {
        vec![
            row("node-b", "web.service", "active", "running"),
            row(
                "node-a",
                "drover-dep@db.service.service",
                "active",
                "exited",
            ),
            row("node-a", "db.service", "inactive", "dead"),
            row("node-a", "timers.target", "active", "active"),
        ]
    }

    #[test]
    fn from_tuple_takes_the_right_fields() {
        let p = zbus::OwnedObjectPath::try_from("/").unwrap();
        let t: UnitTuple = (
            "a.service".into(),
            "desc".into(),
            "loaded".into(),
            "active".into(),
            "running".into(),
            String::new(),
            p.clone(),
            0,
            String::new(),
            p,
        );
        assert_eq!(
            UnitRow::from_tuple("n", t),
            UnitRow {
                node: "n".into(),
                unit: "a.service".into(),
                active: "active".into(),
                sub: "running".into(),
                load: "loaded".into(),
                description: "desc".into(),
            }
        );
    }

    #[test]
    fn table_is_parseable_as_four_fields_and_aligned() {
        let t = render_table(&select(sample(), None));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 6);
        assert_eq!(
            lines[0].split('|').map(str::trim).collect::<Vec<_>>(),
            ["NODE", "ID", "ACTIVE", "SUB"]
        );
        assert!(lines[1].chars().all(|c| c == '='));
        let rows: Vec<Vec<&str>> = lines[2..]
            .iter()
            .map(|l| l.split('|').map(str::trim).collect())
            .collect();
        // Sorted by node, then unit.
        assert_eq!(rows[0], ["node-a", "db.service", "inactive", "dead"]);
        assert_eq!(
            rows[1],
            [
                "node-a",
                "drover-dep@db.service.service",
                "active",
                "exited"
            ]
        );
        assert_eq!(rows[3], ["node-b", "web.service", "active", "running"]);
        // Every '|' sits at the same column in every line.
        let bars = |l: &str| l.match_indices('|').map(|(i, _)| i).collect::<Vec<_>>();
        for l in &lines[2..] {
            assert_eq!(bars(l), bars(lines[0]), "{l}");
        }
        // ID column is as wide as the longest unit name.
        let id = lines[0].split(" | ").nth(1).unwrap();
        assert_eq!(id.len(), "drover-dep@db.service.service".len());
    }

    #[test]
    fn glob_filters_on_unit_name_only() {
        let p = glob::Pattern::new("d*.service").unwrap();
        let units: Vec<String> = select(sample(), Some(&p))
            .into_iter()
            .map(|r| r.unit)
            .collect();
        assert_eq!(units, ["db.service", "drover-dep@db.service.service"]);
        // A glob that looks like a node name matches nothing: nodes are not filtered.
        let p = glob::Pattern::new("node-*").unwrap();
        assert!(select(sample(), Some(&p)).is_empty());
        let p = glob::Pattern::new("*.t?rget").unwrap();
        assert_eq!(select(sample(), Some(&p))[0].unit, "timers.target");
    }

    #[test]
    fn json_shape() {
        let v: serde_json::Value = serde_json::from_str(&json(&select(sample(), None))).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr.len(), 4);
        assert_eq!(
            arr[0],
            serde_json::json!({"node": "node-a", "unit": "db.service", "active": "inactive",
                               "sub": "dead", "load": "loaded", "description": "the db.service"})
        );
    }
}
