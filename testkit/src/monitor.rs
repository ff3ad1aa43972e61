//! A monitor (`org.eclipse.bluechi.Monitor`, `io.drover.Monitor`) followed over D-Bus on
//! a connection of its own: [`MonitorWatch`] keeps every event ([`Ev`]) it received, so a
//! test can look for an event that already arrived and then check that some other event
//! never came.

use crate::wait::{NotSeen, Seen};
use anyhow::{Result, bail};
use futures::StreamExt;
use std::time::Duration;
use zbus::{MatchRule, MessageStream, OwnedObjectPath};

use drover_protocol::ModTag;

use crate::api::{Api, BUS_NAME, MONITOR_IFACE};
use drover_bus::client::{
    ChangedRow, DroverMonitorProxy, MonitorProxy, PeerRemoved, SnapshotRow, UnitNew, UnitRemoved,
    UnitStateChanged, UnitsChanged,
};

/// One signal of a monitor object (BlueChi's and drover's).
#[derive(Debug, Clone, PartialEq)]
pub enum Ev {
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
        active: String,
        sub: String,
        reason: String,
    },
    Props {
        node: String,
        unit: String,
        interface: String,
        keys: Vec<String>,
    },
    PeerRemoved {
        reason: String,
    },
    /// One entry of io.drover.Monitor.UnitsChanged (the batched tagged stream).
    Changed(Change),
}

/// One entry of `io.drover.Monitor.UnitsChanged`: a unit's change with its tag.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub node: String,
    pub unit: String,
    /// `new`, `state` or `removed`.
    pub kind: String,
    pub active: String,
    pub sub: String,
    pub reason: String,
    pub tag: ModTag,
}

impl Ev {
    pub fn unit(&self) -> Option<(&str, &str)> {
        match self {
            Ev::New { node, unit, .. }
            | Ev::Removed { node, unit, .. }
            | Ev::State { node, unit, .. }
            | Ev::Props { node, unit, .. }
            | Ev::Changed(Change { node, unit, .. }) => Some((node, unit)),
            Ev::PeerRemoved { .. } => None,
        }
    }

    /// The events one signal carries: one for BlueChi's signals, every entry
    /// of a `UnitsChanged` batch, none for anything else.
    fn parse(msg: &zbus::Message) -> Vec<Ev> {
        if msg
            .header()
            .member()
            .is_some_and(|m| m.as_str() == "UnitsChanged")
        {
            let Some(rows) = UnitsChanged::from_message(msg.clone())
                .and_then(|s| s.args().ok().map(|a| a.units))
            else {
                return Vec::new();
            };
            let change =
                |(node, unit, kind, active, sub, reason, guid, index): ChangedRow| Change {
                    tag: ModTag::new(guid, index),
                    node,
                    unit,
                    kind,
                    active,
                    sub,
                    reason,
                };
            return rows.into_iter().map(|r| Ev::Changed(change(r))).collect();
        }
        Self::parse_one(msg).into_iter().collect()
    }

    fn parse_one(msg: &zbus::Message) -> Option<Ev> {
        let member = msg.header().member()?.as_str().to_owned();
        let msg = msg.clone();
        let s = |v: &str| v.to_owned();
        Some(match member.as_str() {
            "UnitNew" => {
                let signal = UnitNew::from_message(msg)?;
                let a = signal.args().ok()?;
                Ev::New {
                    node: s(a.node),
                    unit: s(a.unit),
                    reason: s(a.reason),
                }
            }
            "UnitRemoved" => {
                let signal = UnitRemoved::from_message(msg)?;
                let a = signal.args().ok()?;
                Ev::Removed {
                    node: s(a.node),
                    unit: s(a.unit),
                    reason: s(a.reason),
                }
            }
            "UnitStateChanged" => {
                let signal = UnitStateChanged::from_message(msg)?;
                let a = signal.args().ok()?;
                Ev::State {
                    node: s(a.node),
                    unit: s(a.unit),
                    active: s(a.active_state),
                    sub: s(a.sub_state),
                    reason: s(a.reason),
                }
            }
            "UnitPropertiesChanged" => {
                // Read with the ordered map (systemd's order, as BlueChi), not the
                // declaration's hash map: the order is what some tests check.
                let (node, unit, interface, props): (
                    String,
                    String,
                    String,
                    drover_bus::marshal::OrderedProperties,
                ) = msg.body().deserialize().ok()?;
                let keys: Vec<String> = props.keys().map(str::to_owned).collect();
                Ev::Props {
                    node,
                    unit,
                    interface,
                    keys,
                }
            }
            "PeerRemoved" => {
                let signal = PeerRemoved::from_message(msg)?;
                Ev::PeerRemoved {
                    reason: s(signal.args().ok()?.reason),
                }
            }
            _ => return None,
        })
    }
}

/// A monitor on its own connection, with every signal it received.
pub struct MonitorWatch {
    pub conn: zbus::Connection,
    pub path: String,
    pub proxy: zbus::Proxy<'static>,
    stream: MessageStream,
    /// Every event received so far.
    pub seen: Seen<Ev>,
}

impl MonitorWatch {
    /// A new connection to the manager's bus at `address` and a monitor owned by it.
    pub async fn create(address: &str) -> MonitorWatch {
        let api = Api::connect(address).await;
        let path: OwnedObjectPath = api
            .typed_controller()
            .await
            .create_monitor()
            .await
            .expect("CreateMonitor");
        Self::listen(api.conn, path.as_str()).await
    }

    /// Collects the signals `conn` receives from the monitor at `path` (for a
    /// peer: a connection that does not own the monitor).
    pub async fn listen(conn: zbus::Connection, path: &str) -> MonitorWatch {
        let rule = MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(BUS_NAME)
            .path(path.to_owned())
            .build()
            .expect("match rule");
        let stream =
            MessageStream::for_match_rule(rule, &conn, std::num::NonZeroUsize::new(100_000))
                .await
                .expect("match monitor signals");
        let proxy = zbus::Proxy::new(&conn, BUS_NAME, path.to_owned(), MONITOR_IFACE)
            .await
            .expect("monitor proxy");
        MonitorWatch {
            conn,
            path: path.to_owned(),
            proxy,
            stream,
            seen: Seen::default(),
        }
    }

    /// The monitor as the shared client declaration (`drover_bus::client`) types it.
    async fn typed(&self) -> zbus::Result<MonitorProxy<'static>> {
        MonitorProxy::builder(&self.conn)
            .path(self.path.clone())
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
    }

    pub async fn subscribe(&self, node: &str, unit: &str) -> zbus::Result<u32> {
        self.typed().await?.subscribe(node, unit).await
    }

    pub async fn subscribe_list(&self, node: &str, units: &[&str]) -> zbus::Result<u32> {
        self.typed().await?.subscribe_list(node, units).await
    }

    /// `io.drover.Monitor.Follow()`.
    pub async fn follow(&self) -> zbus::Result<Vec<SnapshotRow>> {
        DroverMonitorProxy::builder(&self.conn)
            .path(self.path.clone())
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?
            .follow()
            .await
    }

    /// Waits for an event (after those already looked at) for which `pred` holds.
    pub async fn expect(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Ev) -> bool,
    ) -> Result<Ev> {
        let stream = &mut self.stream;
        let more = async || match stream.next().await {
            Some(Ok(msg)) => Some(Ev::parse(&msg)),
            _ => None,
        };
        match self.seen.expect(timeout, more, pred).await {
            Ok(i) => Ok(self.seen[i].clone()),
            Err(NotSeen::Ended) => bail!("signal stream ended before: {what}"),
            Err(NotSeen::Timeout) => {
                let seen: Vec<String> = self.seen.iter().map(|e| format!("  {e:?}")).collect();
                bail!(
                    "no event within {timeout:?}: {what}\nseen:\n{}",
                    seen.join("\n")
                )
            }
        }
    }

    /// Collects whatever arrives during `d`.
    pub async fn settle(&mut self, d: Duration) {
        let stream = &mut self.stream;
        let more = async || match stream.next().await {
            Some(Ok(msg)) => Some(Ev::parse(&msg)),
            _ => None,
        };
        self.seen.settle(d, more).await;
    }

    /// Marks everything seen so far as looked at; returns the mark.
    pub fn mark(&mut self) -> usize {
        self.seen.mark()
    }

    /// Events received since `mark`.
    pub fn since(&self, mark: usize) -> &[Ev] {
        self.seen.since(mark)
    }
}
