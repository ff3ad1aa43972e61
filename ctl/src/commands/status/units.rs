//! `status NODE UNIT... [-w]`: the state of some units of one node, as bluechictl's
//! tab-aligned table:
//!
//! ```text
//! UNIT            | LOADED        | ACTIVE        | SUBSTATE      | FREEZERSTATE  | ENABLED       | HEALTH        |
//! ----------------------------------------------------------------------------------------------------------------
//! web.service     | loaded        | active        | running       | running       | enabled       | healthy       |
//! ```
//!
//! (columns are separated by tabs, so they line up on a terminal; scripts split on
//! `|` and trim). bluechictl's six columns, then drover's HEALTH (`none` for a unit
//! without a check, `-` from a manager that does not serve `io.drover.Node`). Data:
//! `Node.GetUnitProperties(UNIT, "")` and `io.drover.Node.GetUnitHealth(UNIT)` per
//! unit. A unit systemd
//! does not know (`LoadState=not-found`, or `NoSuchUnit`) is left out of the table
//! and reported as `Unit X could not be found.` on stderr; the command then exits 1.
//!
//! `-w`: one monitor (`CreateMonitor` + `SubscribeList(NODE, UNITS)`), and a reprint
//! after every `UnitNew`, `UnitStateChanged` or `UnitRemoved` of those units, and
//! every health change (`UnitPropertiesChanged` of interface `io.drover.Health`), until
//! Ctrl-C. While watching, a failed refresh (node offline) is reported on stderr and
//! the watch goes on; the node's return triggers the next reprint.

use std::collections::HashMap;

use futures::{FutureExt, StreamExt};
use serde::Serialize;
use zbus::{OwnedVariant, Variant};

use drover_bus::bluechi::{HEALTH_IFACE, MONITOR_IFACE};
use drover_protocol::error_names::NO_SUCH_UNIT;
use drover_protocol::{NodeName, UnitName};

use crate::client::{CallContext, Client, error_name};
use crate::context::Context;
use crate::error::CtlError;
use crate::follow::{self, CLEAR_SCREEN, ManagerWatch};

/// Tab stops every 8 columns, as on a terminal.
const TAB: usize = 8;
/// Width of each value column (two tab stops).
const CELL: usize = 16;
/// Shown for a property systemd did not report (or reported empty).
const MISSING: &str = "-";

/// How long closing the monitor on Ctrl-C may take.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// One row; also the JSON form (keys are a stable interface).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnitStatus {
    pub node: String,
    pub unit: String,
    pub load: String,
    pub active: String,
    pub sub: String,
    pub freezer: String,
    pub enabled: String,
    /// `none`, `starting`, `healthy`, `unhealthy`; `-` when not known.
    pub health: String,
}

fn prop(props: &HashMap<String, OwnedVariant>, key: &str) -> String {
    match props.get(key).map(|v| &**v) {
        Some(Variant::Str(s)) if !s.as_str().is_empty() => s.as_str().to_owned(),
        _ => MISSING.to_owned(),
    }
}

impl UnitStatus {
    pub fn from_properties(
        node: &str,
        unit: &str,
        props: &HashMap<String, OwnedVariant>,
    ) -> UnitStatus {
        let id = prop(props, "Id");
        UnitStatus {
            node: node.to_owned(),
            unit: if id == MISSING { unit.to_owned() } else { id },
            load: prop(props, "LoadState"),
            active: prop(props, "ActiveState"),
            sub: prop(props, "SubState"),
            freezer: prop(props, "FreezerState"),
            enabled: prop(props, "UnitFileState"),
            health: MISSING.to_owned(),
        }
    }

    pub fn not_found(&self) -> bool {
        self.load == "not-found"
    }
}

/// Append tabs until the line (which starts at a tab stop at `start`) reaches at
/// least `start + width`; at least one tab.
fn pad_tabs(line: &mut String, start: usize, width: usize) {
    let mut pos = tab_pos(line);
    loop {
        line.push('\t');
        pos = (pos / TAB + 1) * TAB;
        if pos >= start + width {
            break;
        }
    }
}

/// The table for `rows`; the name column fits the longest of `names` (bluechictl
/// sizes it by the requested names) and the rows.
pub fn render_table(rows: &[UnitStatus], names: &[String]) -> String {
    let longest = names
        .iter()
        .map(|n| n.chars().count())
        .chain(rows.iter().map(|r| r.unit.chars().count()))
        .chain(std::iter::once("UNIT".len()))
        .max()
        .unwrap_or(0);
    let name_col = (longest / TAB + 1) * TAB;
    let line = |name: &str, cells: [&str; 6]| -> String {
        let mut l = name.to_owned();
        pad_tabs(&mut l, 0, name_col);
        let mut start = name_col;
        for c in cells {
            l.push_str("| ");
            l.push_str(c);
            let before = start;
            pad_tabs(&mut l, before, CELL);
            // Where the next cell starts: the tab stop the padding reached.
            start = tab_pos(&l);
        }
        l.push_str("|\n");
        l
    };
    let mut out = line(
        "UNIT",
        [
            "LOADED",
            "ACTIVE",
            "SUBSTATE",
            "FREEZERSTATE",
            "ENABLED",
            "HEALTH",
        ],
    );
    out.push_str(&"-".repeat(name_col + 6 * CELL + 1));
    out.push('\n');
    for r in rows {
        out.push_str(&line(
            &r.unit,
            [
                &r.load, &r.active, &r.sub, &r.freezer, &r.enabled, &r.health,
            ],
        ));
    }
    out
}

/// The display column after `l` when tabs jump to the next stop.
fn tab_pos(l: &str) -> usize {
    l.chars().fold(0, |pos, c| {
        if c == '\t' {
            (pos / TAB + 1) * TAB
        } else {
            pos + 1
        }
    })
}

/// What one round of `GetUnitProperties` found.
struct Fetched {
    rows: Vec<UnitStatus>,
    missing: Vec<String>,
}

async fn fetch(client: &Client, node: &NodeName, units: &[UnitName]) -> Result<Fetched, CtlError> {
    let proxy = client.node(node).await?;
    let drover = client.drover_node(node).await?;
    let mut rows = Vec::new();
    let mut missing = Vec::new();
    for unit in units {
        let what = format!("GetUnitProperties of {unit} on node {node}");
        match proxy.get_unit_properties(unit.as_str(), "").await {
            Ok(props) => {
                let mut row = UnitStatus::from_properties(node.as_str(), unit.as_str(), &props);
                row.health = match drover.get_unit_health(unit.as_str()).await {
                    Ok((state, ..)) => state,
                    // A manager without drover's node interface (or the node went
                    // away meanwhile): not known.
                    Err(_) => MISSING.to_owned(),
                };
                if row.not_found() {
                    missing.push(unit.to_string());
                } else {
                    rows.push(row);
                }
            }
            // An agent that looks units up with GetUnit says NoSuchUnit for a unit
            // systemd has not loaded: the same "could not be found" for the user.
            Err(e) if error_name(&e).is_some_and(|(name, _)| name == NO_SUCH_UNIT) => {
                missing.push(unit.to_string());
            }
            Err(e) => {
                let cc = CallContext::on(&what, node, Some(unit));
                return Err(client.classify(e, cc).await);
            }
        }
    }
    Ok(Fetched { rows, missing })
}

fn missing_lines(missing: &[String]) -> String {
    missing
        .iter()
        .map(|u| format!("Unit {u} could not be found.\n"))
        .collect()
}

fn render(rows: &[UnitStatus], names: &[String], json_mode: bool, watch: bool) -> String {
    match (json_mode, watch) {
        (true, false) => crate::output::json(rows),
        (true, true) => {
            let mut s = serde_json::to_string(rows).unwrap_or_default();
            s.push('\n');
            s
        }
        (false, _) => render_table(rows, names),
    }
}

pub async fn run(
    ctx: &mut Context,
    node: NodeName,
    units: Vec<UnitName>,
    watch: bool,
) -> Result<(), CtlError> {
    let names: Vec<String> = units.iter().map(|u| u.to_string()).collect();
    let client = ctx.client().await?.clone();
    if !watch {
        let f = fetch(&client, &node, &units).await?;
        let text = render(&f.rows, &names, ctx.json(), false);
        ctx.emit(&text)?;
        if f.missing.is_empty() {
            return Ok(());
        }
        ctx.warn(&missing_lines(&f.missing));
        return Err(CtlError::UnitsNotFound {
            node: node.to_string(),
            units: f.missing,
        });
    }

    let mut manager = ManagerWatch::new(&client, "watching").await?;
    let controller = client.controller().await?;
    let cc = CallContext {
        what: "CreateMonitor",
        ..Default::default()
    };
    let path = client.check(controller.create_monitor().await, cc).await?;
    let monitor = client.monitor(path.as_str()).await?;
    let mut events =
        follow::signal_stream(&client, &manager, path.as_str(), false, MONITOR_IFACE).await?;
    let unit_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let what = format!("SubscribeList({node}, {})", names.join(","));
    let cc = CallContext::on(&what, &node, None);
    // The subscription's own virtual events wait in the (large) queue; they only
    // cause one extra reprint.
    if let Err(e) = client
        .check(monitor.subscribe_list(node.as_str(), &unit_refs).await, cc)
        .await
    {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, monitor.close()).await;
        return Err(e);
    }

    let clear = follow::stdout_is_tty();
    let interrupted = follow::interrupted();
    tokio::pin!(interrupted);
    loop {
        match fetch(&client, &node, &units).await {
            Ok(f) => {
                let mut text = if clear {
                    CLEAR_SCREEN.to_owned()
                } else {
                    String::new()
                };
                text.push_str(&render(&f.rows, &names, ctx.json(), true));
                ctx.emit(&text)?;
                ctx.warn(&missing_lines(&f.missing));
            }
            // A change signal can beat the owner change when the manager exits.
            Err(CtlError::ManagerUnreachable { bus }) => {
                return Err(CtlError::ManagerLeft {
                    bus,
                    what: "watching",
                });
            }
            Err(e @ (CtlError::NodeNotFound(_) | CtlError::BusClosed { .. })) => {
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, monitor.close()).await;
                return Err(e);
            }
            // E.g. the node went offline: say so and wait for it to come back.
            Err(e) => ctx.warn(&format!("droverctl: {e}\n")),
        }
        // Wait for a change of one of the units.
        loop {
            let msg = tokio::select! {
                msg = follow::next_signal(&mut events, &client) => msg?,
                gone = manager.gone() => return Err(gone),
                r = &mut interrupted => {
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, monitor.close()).await;
                    return r;
                }
            };
            if is_refresh(&msg) {
                break;
            }
        }
        // One reprint for a burst of events.
        while let Some(Some(msg)) = events.next().now_or_never() {
            msg.map_err(|e| CtlError::Other(format!("reading signals failed: {e}")))?;
        }
    }
}

/// The monitor signals after which the table may have changed: a unit's
/// lifecycle, and its health (a property change of `io.drover.Health`).
fn is_refresh(msg: &zbus::Message) -> bool {
    match follow::member(msg).as_str() {
        "UnitNew" | "UnitStateChanged" | "UnitRemoved" => true,
        "UnitPropertiesChanged" => msg
            .body()
            .deserialize::<(&str, &str, &str, HashMap<&str, Variant<'_>>)>()
            .is_ok_and(|(_, _, interface, _)| interface == HEALTH_IFACE),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> HashMap<String, OwnedVariant> {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    OwnedVariant::try_from(Variant::from(*v)).unwrap(),
                )
            })
            .collect()
    }

    fn web() -> UnitStatus {
        UnitStatus::from_properties(
            "n1",
            "web.service",
            &props(&[
                ("Id", "web.service"),
                ("LoadState", "loaded"),
                ("ActiveState", "active"),
                ("SubState", "running"),
                ("FreezerState", "running"),
                ("UnitFileState", "enabled"),
            ]),
        )
    }

    #[test]
    fn from_properties_and_missing_values() {
        let r = web();
        assert_eq!(r.unit, "web.service");
        assert_eq!(r.enabled, "enabled");
        assert!(!r.not_found());
        let r = UnitStatus::from_properties(
            "n1",
            "x.service",
            &props(&[("LoadState", "not-found"), ("UnitFileState", "")]),
        );
        assert!(r.not_found());
        assert_eq!(r.unit, "x.service");
        assert_eq!(r.enabled, MISSING);
    }

    #[test]
    fn table_is_tab_aligned_and_splits_on_bars() {
        let mut long = web();
        long.unit = "a-rather-long-unit-name.service".into();
        long.sub = "auto-restart-queued".into();
        let names = vec!["web.service".to_owned(), long.unit.clone()];
        let t = render_table(&[web(), long], &names);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        let fields = |l: &str| {
            l.split('|')
                .map(str::trim)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            fields(lines[0]),
            [
                "UNIT",
                "LOADED",
                "ACTIVE",
                "SUBSTATE",
                "FREEZERSTATE",
                "ENABLED",
                "HEALTH",
                ""
            ]
        );
        assert!(lines[1].chars().all(|c| c == '-'));
        assert_eq!(
            fields(lines[2]),
            [
                "web.service",
                "loaded",
                "active",
                "running",
                "running",
                "enabled",
                "-",
                ""
            ]
        );
        // On a terminal every '|' of a row sits where the header's does, as long as
        // values fit their cell (the 19-character substate widens only its own line).
        let bars = |l: &str| {
            let mut pos = 0;
            let mut out = Vec::new();
            for c in l.chars() {
                if c == '|' {
                    out.push(pos);
                }
                pos = if c == '\t' {
                    (pos / 8 + 1) * 8
                } else {
                    pos + 1
                };
            }
            out
        };
        assert_eq!(bars(lines[2]), bars(lines[0]));
        assert_eq!(bars(lines[3])[..3], bars(lines[0])[..3]);
        assert_eq!(bars(lines[0])[0], 32, "name column fits the longest name");
    }
}
