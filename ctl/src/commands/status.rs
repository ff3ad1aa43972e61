//! `status [NODE]`: the nodes drover-manager knows, as bluechictl prints them.
//!
//! Table `NODE | STATE | IP | LAST SEEN` with bluechictl's column widths (30, 10, 24,
//! 28). LAST SEEN is `now` for an online node, `never` for an offline node with a zero
//! `LastSeenTimestamp`, else the local time of the last contact. Data: one
//! `Controller.ListNodes`, plus `LastSeenTimestamp` of each offline node (online nodes
//! need none, which keeps a fleet-wide status cheap).

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::Serialize;

use drover_protocol::NodeName;

use crate::cli::parse_node;
use crate::client::{CallContext, Client};
use crate::commands::{Context, Run};
use crate::error::CtlError;
use crate::output::{Width, json, local_time, table};

/// How many `LastSeenTimestamp` reads are in flight at once.
const PARALLEL_READS: usize = 32;

#[derive(Debug, clap::Args)]
pub struct Status {
    /// Show only this node
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: Option<NodeName>,
}

/// When a node was last in contact with the manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastSeen {
    /// The node is online.
    Now,
    /// Offline and never seen since the manager started.
    Never,
    /// Offline; realtime µs of the last contact.
    At(u64),
}

impl LastSeen {
    pub fn from_timestamp(usec: u64) -> LastSeen {
        if usec == 0 {
            LastSeen::Never
        } else {
            LastSeen::At(usec)
        }
    }

    pub fn text(self) -> String {
        match self {
            LastSeen::Now => "now".to_owned(),
            LastSeen::Never => "never".to_owned(),
            LastSeen::At(usec) => local_time(usec),
        }
    }
}

/// One row of the status output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub name: String,
    pub state: String,
    pub ip: String,
    pub last_seen: LastSeen,
}

/// The JSON form of a row. Keys are a stable interface.
#[derive(Debug, Serialize)]
pub struct NodeStatusJson<'a> {
    pub node: &'a str,
    pub state: &'a str,
    pub ip: &'a str,
    /// Same text as the table's LAST SEEN column.
    pub last_seen: String,
    /// Raw `LastSeenTimestamp` (realtime µs, 0 = never); null while online.
    pub last_seen_usec: Option<u64>,
}

pub fn render_table(nodes: &[NodeStatus]) -> String {
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n.name.clone(),
                n.state.clone(),
                n.ip.clone(),
                n.last_seen.text(),
            ]
        })
        .collect();
    table(
        &[
            ("NODE", Width::Fixed(30)),
            ("STATE", Width::Fixed(10)),
            ("IP", Width::Fixed(24)),
            ("LAST SEEN", Width::Fixed(28)),
        ],
        &rows,
    )
}

pub fn render_json(nodes: &[NodeStatus]) -> String {
    let docs: Vec<NodeStatusJson<'_>> = nodes
        .iter()
        .map(|n| NodeStatusJson {
            node: &n.name,
            state: &n.state,
            ip: &n.ip,
            last_seen: n.last_seen.text(),
            last_seen_usec: match n.last_seen {
                LastSeen::Now => None,
                LastSeen::Never => Some(0),
                LastSeen::At(u) => Some(u),
            },
        })
        .collect();
    json(&docs)
}

async fn last_seen(client: &Client, name: &str, path: String) -> Result<u64, CtlError> {
    let proxy = client.node_at(path).await?;
    let what = format!("reading LastSeenTimestamp of node {name}");
    match proxy.last_seen_timestamp().await {
        Ok(v) => Ok(v),
        Err(e) => {
            let ctx = CallContext {
                what: &what,
                ..Default::default()
            };
            Err(client.classify(e, ctx).await)
        }
    }
}

impl Run for Status {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?;
        let controller = client.controller().await?;
        let listed = match controller.list_nodes().await {
            Ok(l) => l,
            Err(e) => {
                let cc = CallContext {
                    what: "ListNodes",
                    ..Default::default()
                };
                return Err(client.classify(e, cc).await);
            }
        };
        let selected: Vec<_> = match &self.node {
            Some(want) => {
                let one: Vec<_> = listed
                    .into_iter()
                    .filter(|(name, ..)| name == want.as_str())
                    .collect();
                if one.is_empty() {
                    return Err(CtlError::NodeNotFound(want.to_string()));
                }
                one
            }
            None => listed,
        };
        let nodes: Vec<NodeStatus> = stream::iter(selected)
            .map(|(name, path, state, ip)| async move {
                let last_seen = if state == "online" {
                    LastSeen::Now
                } else {
                    LastSeen::from_timestamp(last_seen(client, &name, path.to_string()).await?)
                };
                Ok::<_, CtlError>(NodeStatus {
                    name,
                    state,
                    ip,
                    last_seen,
                })
            })
            .buffered(PARALLEL_READS)
            .try_collect()
            .await?;
        let text = if ctx.json() {
            render_json(&nodes)
        } else {
            render_table(&nodes)
        };
        ctx.emit(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<NodeStatus> {
        vec![
            NodeStatus {
                name: "node-a".into(),
                state: "online".into(),
                ip: "127.0.0.1".into(),
                last_seen: LastSeen::Now,
            },
            NodeStatus {
                name: "node-b".into(),
                state: "offline".into(),
                ip: String::new(),
                last_seen: LastSeen::from_timestamp(0),
            },
            NodeStatus {
                name: "node-c".into(),
                state: "offline".into(),
                ip: String::new(),
                last_seen: LastSeen::from_timestamp(1_700_000_000_000_000),
            },
        ]
    }

    #[test]
    fn table_has_bluechictl_columns() {
        let t = render_table(&sample());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5);
        let fields: Vec<&str> = lines[0].split(" | ").collect();
        assert_eq!(fields[0].len(), 30);
        assert_eq!(fields[1].len(), 10);
        assert_eq!(fields[2].len(), 24);
        assert_eq!(fields[3], "LAST SEEN");
        assert!(lines[1].chars().all(|c| c == '='));
        assert_eq!(lines[1].len(), 30 + 10 + 24 + 28 + 3 * 3);
        let row: Vec<&str> = lines[2].split('|').map(str::trim).collect();
        assert_eq!(row, ["node-a", "online", "127.0.0.1", "now"]);
        let row: Vec<&str> = lines[3].split('|').map(str::trim).collect();
        assert_eq!(row, ["node-b", "offline", "", "never"]);
        let row: Vec<&str> = lines[4].split('|').map(str::trim).collect();
        assert_eq!(row[3].len(), "YYYY-MM-DD HH:MM:SS".len());
        // Columns line up: the IP column starts at the same offset in every line.
        let col = lines[0].find("IP").unwrap();
        assert_eq!(&lines[2][col..col + 9], "127.0.0.1");
    }

    #[test]
    fn json_shape() {
        let v: serde_json::Value = serde_json::from_str(&render_json(&sample())).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr.len(), 3);
        assert_eq!(
            arr[0],
            serde_json::json!({"node": "node-a", "state": "online", "ip": "127.0.0.1",
                               "last_seen": "now", "last_seen_usec": null})
        );
        assert_eq!(arr[1]["last_seen"], "never");
        assert_eq!(arr[1]["last_seen_usec"], 0);
        assert_eq!(arr[2]["last_seen_usec"], 1_700_000_000_000_000u64);
    }
}
