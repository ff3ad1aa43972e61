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

use crate::api::{Api, BUS_NAME, DROVER_MONITOR_IFACE, MONITOR_IFACE};

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
            type Row = (String, String, String, String, String, String, u64, u64);
            let Ok((rows,)) = msg.body().deserialize::<(Vec<Row>,)>() else {
                return Vec::new();
            };
            let change = |(node, unit, kind, active, sub, reason, guid, index): Row| Change {
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
        let h = msg.header();
        let member = h.member()?.as_str().to_owned();
        let b = msg.body();
        Some(match member.as_str() {
            "UnitNew" => {
                let (node, unit, reason) = b.deserialize().ok()?;
                Ev::New { node, unit, reason }
            }
            "UnitRemoved" => {
                let (node, unit, reason) = b.deserialize().ok()?;
                Ev::Removed { node, unit, reason }
            }
            "UnitStateChanged" => {
                let (node, unit, active, sub, reason) = b.deserialize().ok()?;
                Ev::State {
                    node,
                    unit,
                    active,
                    sub,
                    reason,
                }
            }
            "UnitPropertiesChanged" => {
                let (node, unit, interface, props): (
                    String,
                    String,
                    String,
                    drover_bus::marshal::OrderedProperties,
                ) = b.deserialize().ok()?;
                // In the order the signal carries them (systemd's, as BlueChi).
                let keys: Vec<String> = props.keys().map(str::to_owned).collect();
                Ev::Props {
                    node,
                    unit,
                    interface,
                    keys,
                }
            }
            "PeerRemoved" => {
                let (reason,) = b.deserialize().ok()?;
                Ev::PeerRemoved { reason }
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
            .controller()
            .await
            .call("CreateMonitor", &())
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

    pub async fn subscribe(&self, node: &str, unit: &str) -> zbus::Result<u32> {
        self.proxy.call("Subscribe", &(node, unit)).await
    }

    pub async fn subscribe_list(&self, node: &str, units: &[&str]) -> zbus::Result<u32> {
        self.proxy.call("SubscribeList", &(node, units)).await
    }

    /// `io.drover.Monitor.Follow()`.
    pub async fn follow(&self) -> zbus::Result<Vec<(String, String, String, String, u64, u64)>> {
        let p = zbus::Proxy::new(
            &self.conn,
            BUS_NAME,
            self.path.clone(),
            DROVER_MONITOR_IFACE,
        )
        .await?;
        p.call("Follow", &()).await
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
