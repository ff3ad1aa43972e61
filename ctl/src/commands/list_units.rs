//! `list-units [NODE] [--filter GLOB]`: units of every online node or of one
//! node (`Node.ListUnits`).
//!
//! Over all nodes, each online node is asked on its own and its rows are printed
//! as they come ([`crate::listing`]). A node that cannot be listed has its reason
//! on stderr and makes the command exit 1 after printing the others. bluechictl
//! prints nothing and fails when any node fails (BlueChi's manager fails the whole
//! call); drover shows what it has and still says what is missing.
//!
//! Table `NODE | ID | ACTIVE | SUB`, each column as wide as its widest value, rows
//! sorted by node then unit so output is stable across runs. The glob matches the
//! unit name only, as in bluechictl.

use serde::Serialize;

use drover_protocol::NodeName;

use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::listing::{self, NodeRow};
use crate::parse::{parse_glob, parse_node};
use drover_bus::client::NodeProxy;
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

impl NodeRow for UnitRow {
    type Entry = UnitTuple;
    const METHOD: &'static str = "ListUnits";
    const WHAT: &'static str = "units";
    const HEADERS: &'static [&'static str] = &["NODE", "ID", "ACTIVE", "SUB"];

    async fn list(node: &NodeProxy<'static>) -> zbus::Result<Vec<UnitTuple>> {
        node.list_units().await
    }

    fn from_entry(node: &str, entry: UnitTuple) -> Self {
        UnitRow::from_tuple(node, entry)
    }

    /// The glob matches the unit name only, as in bluechictl.
    fn matches(&self, filter: &glob::Pattern) -> bool {
        filter.matches(&self.unit)
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.node.clone(),
            self.unit.clone(),
            self.active.clone(),
            self.sub.clone(),
        ]
    }
}

impl Run for ListUnits {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        listing::run::<UnitRow>(ctx, self.node.as_ref(), self.filter.as_ref()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listing::{render_table, select};
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
