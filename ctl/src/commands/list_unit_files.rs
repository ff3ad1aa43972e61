//! `list-unit-files [NODE] [--filter GLOB]`: unit files of every online node or of
//! one node (`Node.ListUnitFiles`).
//!
//! Table `NODE | PATH | IS-ENABLED` (bluechictl's), each column as wide as its widest
//! value, rows sorted by node then path. The glob matches the unit file's name (as
//! with `systemctl list-unit-files PATTERN`) or its whole path (as bluechictl does),
//! so both `--filter 'web*'` and `--filter '/etc/*'` work.
//!
//! Over all nodes, node by node and printed as they come ([`crate::listing`], as
//! `list-units`): a node that cannot be listed has its reason on stderr and makes
//! the command exit 1 after the output.

use serde::Serialize;

use drover_protocol::NodeName;

use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::listing::{self, NodeRow};
use crate::parse::{parse_glob, parse_node};
use drover_bus::client::{NodeProxy, UnitFileTuple};

#[derive(Debug, clap::Args)]
pub struct ListUnitFiles {
    /// List only the unit files of this node
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: Option<NodeName>,

    /// Show only unit files whose name (or path) matches this glob
    #[arg(long, value_name = "GLOB", value_parser = parse_glob)]
    pub filter: Option<glob::Pattern>,
}

/// One unit file of one node; also the JSON form (keys are a stable interface).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct UnitFileRow {
    pub node: String,
    pub path: String,
    /// The file name, e.g. `web.service`.
    pub unit: String,
    pub state: String,
}

impl UnitFileRow {
    pub fn from_tuple(node: &str, (path, state): UnitFileTuple) -> UnitFileRow {
        let unit = path.rsplit('/').next().unwrap_or(&path).to_owned();
        UnitFileRow {
            node: node.to_owned(),
            path,
            unit,
            state,
        }
    }
}

impl NodeRow for UnitFileRow {
    type Entry = UnitFileTuple;
    const METHOD: &'static str = "ListUnitFiles";
    const WHAT: &'static str = "unit files";
    const HEADERS: &'static [&'static str] = &["NODE", "PATH", "IS-ENABLED"];

    async fn list(node: &NodeProxy<'static>) -> zbus::Result<Vec<UnitFileTuple>> {
        node.list_unit_files().await
    }

    fn from_entry(node: &str, entry: UnitFileTuple) -> Self {
        UnitFileRow::from_tuple(node, entry)
    }

    /// The file's name (`systemctl list-unit-files PATTERN`) or its whole path
    /// (bluechictl).
    fn matches(&self, filter: &glob::Pattern) -> bool {
        filter.matches(&self.unit) || filter.matches(&self.path)
    }

    fn cells(&self) -> Vec<String> {
        vec![self.node.clone(), self.path.clone(), self.state.clone()]
    }
}

impl Run for ListUnitFiles {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        listing::run::<UnitFileRow>(ctx, self.node.as_ref(), self.filter.as_ref()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listing::{render_table, select};

    fn rows() -> Vec<UnitFileRow> {
        vec![
            UnitFileRow::from_tuple(
                "b",
                ("/etc/systemd/user/web.service".into(), "enabled".into()),
            ),
            UnitFileRow::from_tuple(
                "a",
                ("/usr/lib/systemd/user/db.socket".into(), "disabled".into()),
            ),
            UnitFileRow::from_tuple(
                "a",
                ("/etc/systemd/user/web.service".into(), "static".into()),
            ),
        ]
    }

    #[test]
    fn glob_matches_name_or_path() {
        let p = glob::Pattern::new("web*").unwrap();
        assert_eq!(select(rows(), Some(&p)).len(), 2);
        let p = glob::Pattern::new("/usr/*").unwrap();
        let r = select(rows(), Some(&p));
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].unit, "db.socket");
    }

    #[test]
    fn table_layout() {
        let t = render_table(&select(rows(), None));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0].split('|').map(str::trim).collect::<Vec<_>>(),
            ["NODE", "PATH", "IS-ENABLED"]
        );
        assert!(lines[1].chars().all(|c| c == '='));
        assert_eq!(
            lines[2].split('|').map(str::trim).collect::<Vec<_>>(),
            ["a", "/etc/systemd/user/web.service", "static"]
        );
        assert_eq!(lines.len(), 5);
    }
}
