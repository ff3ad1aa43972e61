//! `monitor [NODE [UNIT,...]]`: print unit events of a fleet as they happen, like
//! `bluechictl monitor`, until Ctrl-C.
//!
//! `Controller.CreateMonitor`, one match on the monitor's signals, then
//! `Monitor.SubscribeList(NODE, UNITS)` (defaults `*` and `*`). Output, exactly
//! bluechictl's:
//!
//! ```text
//! Monitor path: /org/eclipse/bluechi/monitor/1
//! Subscribing to node '*' and unit '*'
//! [node1] web.service
//!         Unit created (reason: real)
//! [node1] web.service
//!         Unit state changed (reason: real)
//!         Active: active (running)
//! [node1] web.service
//!         Unit properties changed (Interface: org.freedesktop.systemd1.Unit)
//!         ActiveState: active
//! [node1] web.service
//!         Unit removed (reason: real)
//! ```
//!
//! (the indent is one tab; property lines only for string-valued properties, sorted
//! by name). An unknown NODE is an error (BlueChi silently watches nothing).
//! `--json` prints JSON Lines: first `{"event": "Subscribed", ...}`, then one
//! object per event. Ctrl-C closes the monitor and exits 0; drover-manager leaving
//! the bus exits 1.

use std::collections::HashMap;

use drover_bus::bluechi::MONITOR_IFACE;
use serde_json::{Value as Json, json};
use zbus::{OwnedVariant, Variant};

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::follow::{self, ManagerWatch};
use crate::output::json_line;
use crate::parse::{UnitList, WILDCARD, parse_node_or_wildcard, parse_unit_list};

/// How long closing the monitor on Ctrl-C may take before we just exit (the
/// manager closes it anyway when we leave the bus).
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, clap::Args)]
pub struct Monitor {
    /// Node to watch, or '*' for every node (the default)
    #[arg(value_name = "NODE", value_parser = parse_node_or_wildcard)]
    pub node: Option<String>,

    /// Units to watch, comma-separated, or '*' for every unit (the default)
    #[arg(value_name = "UNIT,...", value_parser = parse_unit_list)]
    pub units: Option<UnitList>,
}

/// One monitor signal.
#[derive(Debug, Clone, PartialEq)]
pub enum MonitorEvent {
    New {
        node: String,
        unit: String,
        reason: String,
    },
    Removed {
        node: String,
        unit: String,
        reason: String,
    },
    State {
        node: String,
        unit: String,
        active_state: String,
        sub_state: String,
        reason: String,
    },
    Properties {
        node: String,
        unit: String,
        interface: String,
        /// Sorted by name.
        properties: Vec<(String, OwnedVariant)>,
    },
}

impl MonitorEvent {
    /// Parse a signal of `org.eclipse.bluechi.Monitor`; `None` for other members
    /// or bodies that do not match the signature (ignored, as bluechictl does).
    pub fn from_message(msg: &zbus::Message) -> Option<MonitorEvent> {
        let body = msg.body();
        match follow::member(msg).as_str() {
            "UnitNew" => {
                let (node, unit, reason): (String, String, String) = body.deserialize().ok()?;
                Some(MonitorEvent::New { node, unit, reason })
            }
            "UnitRemoved" => {
                let (node, unit, reason): (String, String, String) = body.deserialize().ok()?;
                Some(MonitorEvent::Removed { node, unit, reason })
            }
            "UnitStateChanged" => {
                let (node, unit, active_state, sub_state, reason): (
                    String,
                    String,
                    String,
                    String,
                    String,
                ) = body.deserialize().ok()?;
                Some(MonitorEvent::State {
                    node,
                    unit,
                    active_state,
                    sub_state,
                    reason,
                })
            }
            "UnitPropertiesChanged" => {
                let (node, unit, interface, props): (
                    String,
                    String,
                    String,
                    HashMap<String, OwnedVariant>,
                ) = body.deserialize().ok()?;
                let mut properties: Vec<_> = props.into_iter().collect();
                properties.sort_by(|a, b| a.0.cmp(&b.0));
                Some(MonitorEvent::Properties {
                    node,
                    unit,
                    interface,
                    properties,
                })
            }
            _ => None,
        }
    }

    /// bluechictl's text for the event.
    pub fn text(&self) -> String {
        match self {
            MonitorEvent::New { node, unit, reason } => {
                format!("[{node}] {unit}\n\tUnit created (reason: {reason})\n")
            }
            MonitorEvent::Removed { node, unit, reason } => {
                format!("[{node}] {unit}\n\tUnit removed (reason: {reason})\n")
            }
            MonitorEvent::State {
                node,
                unit,
                active_state,
                sub_state,
                reason,
            } => format!(
                "[{node}] {unit}\n\tUnit state changed (reason: {reason})\n\tActive: {active_state} ({sub_state})\n"
            ),
            MonitorEvent::Properties {
                node,
                unit,
                interface,
                properties,
            } => {
                let mut s = format!(
                    "[{node}] {unit}\n\tUnit properties changed (Interface: {interface})\n"
                );
                for (key, value) in properties {
                    if let Variant::Str(v) = &**value {
                        s.push_str(&format!("\t{key}: {}\n", v.as_str()));
                    }
                }
                s
            }
        }
    }

    /// The JSON Lines form. Keys are a stable interface.
    pub fn json(&self) -> Json {
        match self {
            MonitorEvent::New { node, unit, reason } => {
                json!({"event": "UnitNew", "node": node, "unit": unit, "reason": reason})
            }
            MonitorEvent::Removed { node, unit, reason } => {
                json!({"event": "UnitRemoved", "node": node, "unit": unit, "reason": reason})
            }
            MonitorEvent::State {
                node,
                unit,
                active_state,
                sub_state,
                reason,
            } => json!({"event": "UnitStateChanged", "node": node, "unit": unit,
                        "active_state": active_state, "sub_state": sub_state, "reason": reason}),
            MonitorEvent::Properties {
                node,
                unit,
                interface,
                properties,
            } => {
                let props: serde_json::Map<String, Json> = properties
                    .iter()
                    .map(|(k, v)| (k.clone(), variant_json(v)))
                    .collect();
                json!({"event": "UnitPropertiesChanged", "node": node, "unit": unit,
                       "interface": interface, "properties": props})
            }
        }
    }
}

/// A D-Bus value as JSON: numbers, strings, booleans as such; arrays and structs as
/// arrays; dictionaries as objects (keys as their text); file descriptors as null.
pub fn variant_json(v: &Variant<'_>) -> Json {
    match v {
        Variant::U8(n) => json!(n),
        Variant::Bool(b) => json!(b),
        Variant::I16(n) => json!(n),
        Variant::U16(n) => json!(n),
        Variant::I32(n) => json!(n),
        Variant::U32(n) => json!(n),
        Variant::I64(n) => json!(n),
        Variant::U64(n) => json!(n),
        Variant::F64(n) => json!(n),
        Variant::Str(s) => json!(s.as_str()),
        Variant::Signature(s) => json!(s.to_string()),
        Variant::ObjectPath(p) => json!(p.as_str()),
        Variant::Variant(inner) => variant_json(inner),
        Variant::Array(a) => Json::Array(a.inner().iter().map(variant_json).collect()),
        Variant::Dict(d) => Json::Object(
            d.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Variant::Str(s) => s.as_str().to_owned(),
                        other => variant_json(other).to_string(),
                    };
                    (key, variant_json(v))
                })
                .collect(),
        ),
        Variant::Structure(s) => Json::Array(s.fields().iter().map(variant_json).collect()),
        #[allow(unreachable_patterns)]
        _ => Json::Null,
    }
}

/// The lines printed before any event.
pub fn header_text(monitor: &str, node: &str, units: &[String]) -> String {
    let mut s = format!("Monitor path: {monitor}\n");
    for unit in units {
        s.push_str(&format!("Subscribing to node '{node}' and unit '{unit}'\n"));
    }
    s
}

impl Run for Monitor {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let node = self.node.unwrap_or_else(|| WILDCARD.to_owned());
        let units = self
            .units
            .map(|l| l.0)
            .unwrap_or_else(|| vec![WILDCARD.to_owned()]);
        let json_mode = ctx.json();

        let client = ctx.client().await?.clone();
        let mut manager = ManagerWatch::new(&client, "monitoring").await?;
        let controller = client.controller().await?;
        // BlueChi accepts a subscription to a node it does not know (and then shows
        // nothing forever); a typo deserves an error instead.
        if node != WILDCARD {
            let cc = CallContext {
                what: "ListNodes",
                ..Default::default()
            };
            let nodes = client.check(controller.list_nodes().await, cc).await?;
            if !nodes.iter().any(|(name, ..)| *name == node) {
                return Err(CtlError::NodeNotFound(node));
            }
        }
        let cc = CallContext {
            what: "CreateMonitor",
            ..Default::default()
        };
        let path = client.check(controller.create_monitor().await, cc).await?;
        let monitor = client.monitor(path.as_str()).await?;
        // Match before subscribing: the subscription's virtual events follow at once.
        let mut events =
            follow::signal_stream(&client, &manager, path.as_str(), false, MONITOR_IFACE).await?;

        let header = if json_mode {
            json_line(&json!({"event": "Subscribed", "monitor": path.as_str(),
                              "node": node, "units": units}))
        } else {
            header_text(path.as_str(), &node, &units)
        };
        ctx.emit(&header)?;

        let unit_refs: Vec<&str> = units.iter().map(String::as_str).collect();
        let what = format!("SubscribeList({node}, {})", units.join(","));
        let subscribe = monitor.subscribe_list(&node, &unit_refs);
        tokio::pin!(subscribe);
        let mut subscribed = false;
        let interrupted = follow::interrupted();
        tokio::pin!(interrupted);
        loop {
            tokio::select! {
                // Bus order first: events already queued are printed before we stop.
                biased;
                msg = follow::next_signal(&mut events, &client) => {
                    if let Some(ev) = MonitorEvent::from_message(&msg?) {
                        let text = if json_mode { json_line(&ev.json()) } else { ev.text() };
                        ctx.emit(&text)?;
                    }
                }
                reply = &mut subscribe, if !subscribed => {
                    let cc = CallContext { what: &what, ..Default::default() };
                    if let Err(e) = client.check(reply, cc).await {
                        // Leave nothing behind on the manager.
                        let _ = tokio::time::timeout(CLOSE_TIMEOUT, monitor.close()).await;
                        return Err(e);
                    }
                    subscribed = true;
                }
                gone = manager.gone() => return Err(gone),
                r = &mut interrupted => {
                    r?;
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, monitor.close()).await;
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(v: Variant<'static>) -> OwnedVariant {
        OwnedVariant::try_from(v).unwrap()
    }

    #[test]
    fn texts_are_bluechictls() {
        let ev = MonitorEvent::New {
            node: "n1".into(),
            unit: "a.service".into(),
            reason: "virtual".into(),
        };
        assert_eq!(
            ev.text(),
            "[n1] a.service\n\tUnit created (reason: virtual)\n"
        );
        let ev = MonitorEvent::Removed {
            node: "n1".into(),
            unit: "a.service".into(),
            reason: "real".into(),
        };
        assert_eq!(ev.text(), "[n1] a.service\n\tUnit removed (reason: real)\n");
        let ev = MonitorEvent::State {
            node: "n1".into(),
            unit: "a.service".into(),
            active_state: "inactive".into(),
            sub_state: "agent-offline".into(),
            reason: "virtual".into(),
        };
        assert_eq!(
            ev.text(),
            "[n1] a.service\n\tUnit state changed (reason: virtual)\n\tActive: inactive (agent-offline)\n"
        );
        let ev = MonitorEvent::Properties {
            node: "n1".into(),
            unit: "a.service".into(),
            interface: "org.freedesktop.systemd1.Unit".into(),
            properties: vec![
                ("ActiveState".into(), owned(Variant::from("active"))),
                ("InactiveExitTimestamp".into(), owned(Variant::from(7u64))),
                ("SubState".into(), owned(Variant::from("running"))),
            ],
        };
        assert_eq!(
            ev.text(),
            "[n1] a.service\n\tUnit properties changed (Interface: org.freedesktop.systemd1.Unit)\n\tActiveState: active\n\tSubState: running\n"
        );
        let j = ev.json();
        assert_eq!(j["event"], "UnitPropertiesChanged");
        assert_eq!(j["properties"]["InactiveExitTimestamp"], 7);
        assert_eq!(j["properties"]["SubState"], "running");
    }

    #[test]
    fn header_lists_each_unit() {
        assert_eq!(
            header_text("/org/eclipse/bluechi/monitor/3", "*", &["*".into()]),
            "Monitor path: /org/eclipse/bluechi/monitor/3\nSubscribing to node '*' and unit '*'\n"
        );
        let h = header_text("/m", "n1", &["a.service".into(), "b.socket".into()]);
        assert_eq!(h.lines().count(), 3);
        assert!(h.contains("Subscribing to node 'n1' and unit 'b.socket'"));
    }

    #[test]
    fn json_of_nested_values() {
        let arr = Variant::from(vec!["x", "y"]);
        assert_eq!(variant_json(&arr), json!(["x", "y"]));
        let b = Variant::from(true);
        assert_eq!(variant_json(&b), json!(true));
        let nested = Variant::Variant(Box::new(Variant::from(5i32)));
        assert_eq!(variant_json(&nested), json!(5));
    }
}
