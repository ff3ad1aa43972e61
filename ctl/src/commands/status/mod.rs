//! `status [NODE] [-w]`: the nodes drover-manager knows, as bluechictl prints them;
//! `status NODE UNIT... [-w]`: units of one node (see [`units`]).
//!
//! Table `NODE | STATE | IP | LAST SEEN | HEALTH` with bluechictl's column widths (30,
//! 10, 24, 28) for its four columns, then drover's HEALTH. LAST SEEN is `now` for an
//! online node, `never` for an offline node with a zero `LastSeenTimestamp`, else the
//! local time of the last contact. HEALTH is the node's own health (systemd's
//! `SystemState`, the node checks of its `agent.conf`; `-` while unknown: offline, not
//! reported, or a manager without `io.drover.Controller.ListNodeHealth`). Data: one
//! `Controller.ListNodes`, one `io.drover.Controller.ListNodeHealth`, plus
//! `LastSeenTimestamp` of each offline node (online nodes need none, which keeps a
//! fleet-wide status cheap).
//!
//! On a manager of a high-availability group (`io.drover.Controller` `Epoch` above 0)
//! a line above the table says who leads and the epoch (`Leader: mgr-a:842 (this
//! manager), epoch 12`, from `Leading`, `Leader` and `Epoch`); a manager alone (epoch 0)
//! prints the table alone, as always, and `--json` stays the array of nodes. A standby
//! refuses `ListNodes` with `io.drover.NotLeader`, which droverctl reports naming the
//! leader (exit 1).
//!
//! `-w` reprints the table whenever a node object emits `PropertiesChanged` (its
//! `Status` changes, or its health: `io.drover.Node`'s `Health`), until Ctrl-C; on a terminal the screen is cleared first, into a
//! pipe the tables follow one another (with `--json`: one compact array per line).

pub mod units;

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::Serialize;

use drover_bus::bluechi::NODE_PATH_PREFIX;
use drover_bus::bus::PROPERTIES_IFACE;
use drover_protocol::error_names::{UNKNOWN_METHOD, UNKNOWN_OBJECT};
use drover_protocol::{NodeName, UnitName};

/// What a bus says for an interface an object does not have.
const UNKNOWN_INTERFACE: &str = "org.freedesktop.DBus.Error.UnknownInterface";
/// What a bus says for a property an interface does not have.
const UNKNOWN_PROPERTY: &str = "org.freedesktop.DBus.Error.UnknownProperty";

use crate::client::{CallContext, Client};
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::follow::{self, CLEAR_SCREEN, ManagerWatch};
use crate::output::{Width, json, local_time, table};
use crate::parse::{parse_node, parse_unit};

/// How many `LastSeenTimestamp` reads are in flight at once.
const PARALLEL_READS: usize = 32;

#[derive(Debug, clap::Args)]
pub struct Status {
    /// Show only this node
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: Option<NodeName>,

    /// Show these units of NODE instead; without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_unit, requires = "node")]
    pub units: Vec<UnitName>,

    /// Keep watching and reprint on every change, until Ctrl-C
    #[arg(short, long)]
    pub watch: bool,
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
    /// The node's health state, `-` while unknown.
    pub health: String,
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
    /// The node's health (`starting`, `healthy`, `unhealthy`), `-` while unknown.
    pub health: &'a str,
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
                n.health.clone(),
            ]
        })
        .collect();
    table(
        &[
            ("NODE", Width::Fixed(30)),
            ("STATE", Width::Fixed(10)),
            ("IP", Width::Fixed(24)),
            ("LAST SEEN", Width::Fixed(28)),
            ("HEALTH", Width::Fit),
        ],
        &rows,
    )
}

pub fn render_json(nodes: &[NodeStatus]) -> String {
    json(&json_docs(nodes))
}

fn json_docs(nodes: &[NodeStatus]) -> Vec<NodeStatusJson<'_>> {
    nodes
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
            health: &n.health,
        })
        .collect()
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

/// Every online node's health state (`io.drover.Controller.ListNodeHealth`); none
/// from a manager that does not serve it.
async fn node_health(client: &Client) -> Result<Vec<(String, String)>, CtlError> {
    let drover = client.drover_controller().await?;
    match drover.list_node_health().await {
        Ok(rows) => Ok(rows
            .into_iter()
            .map(|(node, state, ..)| (node, state))
            .collect()),
        Err(e)
            if crate::client::error_name(&e).is_some_and(|(name, _)| {
                name == UNKNOWN_METHOD || name == UNKNOWN_INTERFACE || name == UNKNOWN_OBJECT
            }) =>
        {
            Ok(Vec::new())
        }
        Err(e) => {
            let cc = CallContext {
                what: "io.drover.Controller.ListNodeHealth",
                ..Default::default()
            };
            Err(client.classify(e, cc).await)
        }
    }
}

/// The most characters of the manager's `Leader` droverctl prints.
const MAX_LEADER: usize = 256;

/// The line above the node table on a manager of a high-availability group
/// (`io.drover.Controller` `Epoch` above 0): who leads and the epoch, e.g.
/// `Leader: mgr-a:842 (this manager), epoch 12`. `None` from a manager alone
/// (epoch 0) or one without `io.drover.Controller`, which print exactly the
/// table they always printed.
async fn leadership(client: &Client) -> Result<Option<String>, CtlError> {
    let drover = client.drover_controller().await?;
    let absent = |e: &zbus::Error| {
        crate::client::error_name(e).is_some_and(|(name, _)| {
            name == UNKNOWN_INTERFACE || name == UNKNOWN_PROPERTY || name == UNKNOWN_OBJECT
        })
    };
    let cc = CallContext {
        what: "reading io.drover.Controller.Epoch",
        ..Default::default()
    };
    let epoch = match drover.epoch().await {
        Ok(epoch) => epoch,
        Err(e) if absent(&e) => return Ok(None),
        Err(e) => return Err(client.classify(e, cc).await),
    };
    if epoch == 0 {
        return Ok(None);
    }
    let cc = CallContext {
        what: "reading io.drover.Controller.Leading",
        ..Default::default()
    };
    let leading = client.check(drover.leading().await, cc).await?;
    // A manager from before `Leader` existed: the line says less.
    let leader = match drover.leader().await {
        Ok(l) => crate::output::one_line(&l, MAX_LEADER),
        Err(e) if absent(&e) => String::new(),
        Err(e) => {
            let cc = CallContext {
                what: "reading io.drover.Controller.Leader",
                ..Default::default()
            };
            return Err(client.classify(e, cc).await);
        }
    };
    Ok(Some(leader_line(leading, &leader, epoch)))
}

/// The line `leadership` prints.
fn leader_line(leading: bool, leader: &str, epoch: u64) -> String {
    match (leading, leader.is_empty()) {
        (true, false) => format!("Leader: {leader} (this manager), epoch {epoch}\n"),
        (true, true) => format!("Leader: this manager, epoch {epoch}\n"),
        (false, false) => format!("Leader: {leader} (not this manager), epoch {epoch}\n"),
        (false, true) => format!("Leader: none known (this manager stands by), epoch {epoch}\n"),
    }
}

/// The rows for `status [NODE]`.
async fn fetch(client: &Client, only: Option<&NodeName>) -> Result<Vec<NodeStatus>, CtlError> {
    let controller = client.controller().await?;
    let cc = CallContext {
        what: "ListNodes",
        ..Default::default()
    };
    let listed = client.check(controller.list_nodes().await, cc).await?;
    let selected: Vec<_> = match only {
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
    // Only offline nodes need a call (their last-seen time); online ones
    // are rows at once, so a fleet of online nodes costs one call in all.
    let mut nodes = Vec::with_capacity(selected.len());
    let mut offline = Vec::new();
    for (name, path, state, ip) in selected {
        if state != "online" {
            offline.push((nodes.len(), name.clone(), path));
        }
        nodes.push(NodeStatus {
            name,
            state,
            ip,
            last_seen: LastSeen::Now,
            health: "-".to_owned(),
        });
    }
    for (node, state) in node_health(client).await? {
        if let Some(n) = nodes.iter_mut().find(|n| n.name == node) {
            n.health = state;
        }
    }
    let seen: Vec<(usize, LastSeen)> = stream::iter(offline)
        .map(|(i, name, path)| async move {
            let usec = last_seen(client, &name, path.to_string()).await?;
            Ok::<_, CtlError>((i, LastSeen::from_timestamp(usec)))
        })
        .buffered(PARALLEL_READS)
        .try_collect()
        .await?;
    for (i, last_seen) in seen {
        nodes[i].last_seen = last_seen;
    }
    Ok(nodes)
}

/// What comes above the table: the [`leadership`] line in text mode; nothing
/// with `--json` (its array of nodes stays as it is).
async fn header(client: &Client, json_mode: bool) -> Result<String, CtlError> {
    if json_mode {
        return Ok(String::new());
    }
    Ok(leadership(client).await?.unwrap_or_default())
}

/// Output for one (re)print. `watch` makes JSON one compact line per table.
fn render(nodes: &[NodeStatus], json_mode: bool, watch: bool) -> String {
    match (json_mode, watch) {
        (true, false) => render_json(nodes),
        (true, true) => {
            let mut s = serde_json::to_string(&json_docs(nodes)).unwrap_or_default();
            s.push('\n');
            s
        }
        (false, _) => render_table(nodes),
    }
}

impl Run for Status {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        if !self.units.is_empty() {
            let Some(node) = self.node else {
                return Err(CtlError::Usage("units need a node".to_owned()));
            };
            return units::run(ctx, node, self.units, self.watch).await;
        }
        let client = ctx.client().await?.clone();
        if !self.watch {
            let nodes = fetch(&client, self.node.as_ref()).await?;
            let mut text = header(&client, ctx.json()).await?;
            text.push_str(&render(&nodes, ctx.json(), false));
            return ctx.emit(&text);
        }

        let mut manager = ManagerWatch::new(&client, "watching").await?;
        // Subscribe before the first print so no change falls between the two.
        let mut changes =
            follow::signal_stream(&client, &manager, NODE_PATH_PREFIX, true, PROPERTIES_IFACE)
                .await?;
        let clear = follow::stdout_is_tty();
        let interrupted = follow::interrupted();
        tokio::pin!(interrupted);
        let json = ctx.json();
        loop {
            let fetched = async {
                let nodes = fetch(&client, self.node.as_ref()).await?;
                let head = header(&client, json).await?;
                Ok::<_, CtlError>((nodes, head))
            };
            let (nodes, head) = match fetched.await {
                Ok(n) => n,
                // A change signal can beat the owner change when the manager
                // exits, for the table's calls and the leader line's alike.
                Err(CtlError::ManagerUnreachable { bus }) => {
                    return Err(CtlError::ManagerLeft {
                        bus,
                        what: "watching",
                    });
                }
                Err(e) => return Err(e),
            };
            let mut text = if clear {
                CLEAR_SCREEN.to_owned()
            } else {
                String::new()
            };
            text.push_str(&head);
            text.push_str(&render(&nodes, json, true));
            ctx.emit(&text)?;
            tokio::select! {
                msg = follow::next_signal(&mut changes, &client) => { msg?; }
                gone = manager.gone() => return Err(gone),
                r = &mut interrupted => return r,
            }
            // One reprint for a burst of changes (several nodes at once).
            while let Some(Some(msg)) = futures::FutureExt::now_or_never(changes.next()) {
                msg.map_err(|e| CtlError::Other(format!("reading signals failed: {e}")))?;
            }
        }
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
                health: "healthy".into(),
            },
            NodeStatus {
                name: "node-b".into(),
                state: "offline".into(),
                ip: String::new(),
                last_seen: LastSeen::from_timestamp(0),
                health: "-".into(),
            },
            NodeStatus {
                name: "node-c".into(),
                state: "offline".into(),
                ip: String::new(),
                last_seen: LastSeen::from_timestamp(1_700_000_000_000_000),
                health: "-".into(),
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
        assert_eq!(fields[3].len(), 28);
        assert_eq!(fields[4], "HEALTH");
        assert!(lines[1].chars().all(|c| c == '='));
        assert_eq!(lines[1].len(), 30 + 10 + 24 + 28 + "healthy".len() + 4 * 3);
        let row: Vec<&str> = lines[2].split('|').map(str::trim).collect();
        assert_eq!(row, ["node-a", "online", "127.0.0.1", "now", "healthy"]);
        let row: Vec<&str> = lines[3].split('|').map(str::trim).collect();
        assert_eq!(row, ["node-b", "offline", "", "never", "-"]);
        let row: Vec<&str> = lines[4].split('|').map(str::trim).collect();
        assert_eq!(row[3].len(), "YYYY-MM-DD HH:MM:SS".len());
        // Columns line up: the IP column starts at the same offset in every line.
        let col = lines[0].find("IP").unwrap();
        assert_eq!(&lines[2][col..col + 9], "127.0.0.1");
    }

    #[test]
    fn leader_lines() {
        assert_eq!(
            leader_line(true, "mgr-a:842", 12),
            "Leader: mgr-a:842 (this manager), epoch 12\n"
        );
        assert_eq!(leader_line(true, "", 3), "Leader: this manager, epoch 3\n");
        assert_eq!(
            leader_line(false, "mgr-b:842", 4),
            "Leader: mgr-b:842 (not this manager), epoch 4\n"
        );
        assert!(leader_line(false, "", 4).contains("none known"));
    }

    #[test]
    fn json_shape() {
        let v: serde_json::Value = serde_json::from_str(&render_json(&sample())).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr.len(), 3);
        assert_eq!(
            arr[0],
            serde_json::json!({"node": "node-a", "state": "online", "ip": "127.0.0.1",
                               "last_seen": "now", "last_seen_usec": null, "health": "healthy"})
        );
        assert_eq!(arr[1]["last_seen"], "never");
        assert_eq!(arr[1]["last_seen_usec"], 0);
        assert_eq!(arr[2]["last_seen_usec"], 1_700_000_000_000_000u64);
    }
}
