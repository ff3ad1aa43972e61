//! The unit stream over zbus (`Systemd::unit_stream` and
//! `Systemd::follow` of `super::dbus::ZbusSystemd`): match rules for what
//! is followed, and one task that reads their messages in the order the
//! connection received them.
//!
//! **Rules.** Following [`Followed::Every`] is one rule for every signal of
//! systemd, or for every unit's state two: the manager object's signals, and
//! every object's `PropertiesChanged` of the `Unit` interface.
//!
//! A rule on the `Unit` interface names it as `arg0namespace`, not `arg0`:
//! the bus filters alike (no systemd interface lies under
//! `org.freedesktop.systemd1.Unit.`), but zbus, which matches each message
//! against the rule again on its side, reads the whole body of a message
//! for an `argN` and only its first string for `arg0namespace`, and a
//! `PropertiesChanged` of the `Unit` interface carries a dozen values.
//! Following units one by one is, for each unit, a rule for its
//! object (`PropertiesChanged`; of the `Unit` interface alone, `arg0namespace`, for a
//! unit followed for its state: systemd also announces each change of a
//! service's `Service` interface, which would otherwise wake the agent as
//! often again) and one for `UnitNew`/`UnitRemoved` of its name (`arg0`),
//! plus one for `Reloading` when there is any unit; the jobs'
//! `JobNew` and `JobRemoved` are always followed (the unit fence waits on
//! them: `crate::deps::unit_fence`). These rules never match the same
//! message twice, and the job rules are the job stream's own, which the
//! connection shares: they cost the bus nothing more.
//!
//! **Order.** Each rule is a zbus [`MessageStream`]; the reader merges the
//! streams of the current generation by their position on the connection
//! (one socket reader hands each message to every stream it matches before
//! it reads the next, so a stream with nothing ready cannot later produce
//! a message older than one another stream has ready).
//!
//! **Switching** what is followed ([`UnitStreams::follow`]): the new
//! generation's streams are made (their rules added), then systemd is asked
//! what it has loaded of it (`ListUnits`, `ListUnitsByPatterns`, or a `Ping`
//! when no unit is followed); the answer's position `at` is the switch. The
//! reader gives everything of the old generation older than `at`, then the
//! snapshot, then the new generation's messages from `at` on (older ones are
//! either the old generation's, already given, or told by the snapshot),
//! and drops the old streams, which takes their rules off the bus.
//!
//! **Senders.** Only systemd speaks for systemd (`drover_bus::sender`):
//! the bus daemon's news of who owns `org.freedesktop.systemd1` is one more
//! stream of the merge, kept across generations, and a signal counts only
//! when the owner of that point of the stream sent it; others are dropped,
//! counted and logged at a bounded rate.
//!
//! Invariants: at most one generation's streams are read at a time; the
//! switches wait in a bounded queue ([`SWITCH_QUEUE`]); every queue is
//! bounded ([`EVENT_QUEUE`]); a stream that ends (the connection is gone)
//! ends the unit stream.

use super::api::{EVENT_QUEUE, Followed, UnitSignal, UnitSignalStream};
use super::errors::call_error;
use super::signals::{follow_systemd, manager_signal, parse_unit_signal, systemd_signals};
use drover_bus::bus::PROPERTIES_IFACE;
use drover_bus::sender::{Dropped, Owner, Verdict};
use drover_bus::systemd::{
    BUS_NAME, MANAGER_IFACE, MANAGER_PATH, UNIT_IFACE, UnitTuple, unit_info, unit_path,
};
use drover_protocol::{RemoteError, Scope, UnitInfo, UnitName};
use futures::StreamExt;
use futures::stream::Peekable;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use zbus::match_rule::Builder as MatchRuleBuilder;
use zbus::message::Sequence;
use zbus::{Connection, MessageStream};

/// Switches waiting for the reader.
pub const SWITCH_QUEUE: usize = 8;

const PEER_IFACE: &str = "org.freedesktop.DBus.Peer";

type Rule = Box<dyn FnOnce(MatchRuleBuilder<'static>) -> MatchRuleBuilder<'static> + Send>;

/// The reader's end of the switches, once the stream runs.
#[derive(Debug, Default)]
pub struct UnitStreams {
    switches: Mutex<Option<mpsc::Sender<Switch>>>,
}

/// One change of what is followed, for the reader.
#[derive(Debug)]
struct Switch {
    streams: Vec<MessageStream>,
    at: Sequence,
    snapshot: UnitSignal,
}

impl UnitStreams {
    /// Starts the reader, following only the jobs.
    pub async fn start(
        &self,
        conn: &Connection,
    ) -> Result<UnitSignalStream<Sequence>, RemoteError> {
        // Who owns systemd's name first, then the rules: no signal can come
        // before its sender is known.
        let (owner, owner_changes) = follow_systemd(conn).await?;
        let streams = open(conn, &Followed::nothing()).await?;
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let (switch_tx, switches) = mpsc::channel(SWITCH_QUEUE);
        *self.lock() = Some(switch_tx);
        let merge = Merge::new(streams, owner, owner_changes);
        tokio::spawn(read(merge, switches, tx));
        Ok(rx)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<mpsc::Sender<Switch>>> {
        // Held for a clone or a store only; a poisoned lock is still consistent.
        self.switches.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// See `Systemd::follow`.
    pub async fn follow(
        &self,
        conn: &Connection,
        followed: &Followed,
        id: u64,
    ) -> Result<(), RemoteError> {
        let switches = self
            .lock()
            .clone()
            .ok_or_else(|| RemoteError::failed("the unit stream has not started"))?;
        let streams = open(conn, followed).await?;
        let (units, at) = snapshot(conn, followed).await?;
        let snapshot = UnitSignal::Snapshot {
            id,
            followed: followed.clone(),
            units,
        };
        switches
            .send(Switch {
                streams,
                at,
                snapshot,
            })
            .await
            .map_err(|_| RemoteError::failed("systemd's unit signal stream has ended"))
    }
}

/// The rules of `followed` (module docs), as streams, all on the bus.
async fn open(conn: &Connection, followed: &Followed) -> Result<Vec<MessageStream>, RemoteError> {
    let mut rules: Vec<Rule> = Vec::new();
    match followed {
        Followed::Every(Scope::Everything) => rules.push(Box::new(|rule| rule)),
        Followed::Every(Scope::State) => {
            rules.push(Box::new(|rule: MatchRuleBuilder<'static>| {
                rule.path(MANAGER_PATH).interface(MANAGER_IFACE)
            }));
            rules.push(Box::new(|rule: MatchRuleBuilder<'static>| {
                rule.interface(PROPERTIES_IFACE)
                    .member("PropertiesChanged")
                    .arg0ns(UNIT_IFACE)
            }));
        }
        Followed::Units(units) => {
            rules.push(Box::new(manager_signal("JobNew")));
            rules.push(Box::new(manager_signal("JobRemoved")));
            if !units.is_empty() {
                rules.push(Box::new(manager_signal("Reloading")));
            }
            for (unit, scope) in units {
                let path = unit_path(unit.as_str());
                let state_only = *scope == Scope::State;
                rules.push(Box::new(move |rule: MatchRuleBuilder<'static>| {
                    let rule = rule
                        .path(path)
                        .interface(PROPERTIES_IFACE)
                        .member("PropertiesChanged");
                    if state_only {
                        rule.arg0ns(UNIT_IFACE)
                    } else {
                        rule
                    }
                }));
                let name = unit.as_str().to_owned();
                rules.push(Box::new(move |rule: MatchRuleBuilder<'static>| {
                    rule.path(MANAGER_PATH)
                        .interface(MANAGER_IFACE)
                        .arg(0, name)
                }));
            }
        }
    }
    futures::future::try_join_all(rules.into_iter().map(|rule| systemd_signals(conn, rule))).await
}

/// What systemd has loaded of `followed`, and where its answer stands.
async fn snapshot(
    conn: &Connection,
    followed: &Followed,
) -> Result<(Vec<UnitInfo>, Sequence), RemoteError> {
    let (answer, method) = match followed {
        Followed::Every(_) => (
            conn.call_method(
                Some(BUS_NAME),
                MANAGER_PATH,
                Some(MANAGER_IFACE),
                "ListUnits",
                &(),
            )
            .await
            .map_err(call_error("ListUnits"))?,
            "ListUnits",
        ),
        Followed::Units(units) if units.is_empty() => {
            let answer = conn
                .call_method(Some(BUS_NAME), MANAGER_PATH, Some(PEER_IFACE), "Ping", &())
                .await
                .map_err(call_error("Ping"))?;
            return Ok((Vec::new(), answer.recv_position()));
        }
        Followed::Units(units) => {
            let states: &[&str] = &[];
            let patterns: Vec<String> = units.keys().map(pattern).collect();
            (
                conn.call_method(
                    Some(BUS_NAME),
                    MANAGER_PATH,
                    Some(MANAGER_IFACE),
                    "ListUnitsByPatterns",
                    &(states, patterns),
                )
                .await
                .map_err(call_error("ListUnitsByPatterns"))?,
                "ListUnitsByPatterns",
            )
        }
    };
    let rows: Vec<UnitTuple> = answer.body().deserialize().map_err(call_error(method))?;
    let mut units: Vec<UnitInfo> = rows.into_iter().map(unit_info).collect();
    if let Followed::Units(names) = followed {
        // A pattern names exactly its unit (see `pattern`); a systemd that
        // answered more is not believed.
        units.retain(|u| UnitName::new(u.name.as_str()).is_ok_and(|n| names.contains_key(&n)));
    }
    Ok((units, answer.recv_position()))
}

/// `unit` as a `ListUnitsByPatterns` pattern (shell globbing, `fnmatch`)
/// that matches that name only: unit names have no `*`, `?` or `[`, but
/// their escapes have `\`, which globbing reads as "the next character
/// as it is".
fn pattern(unit: &UnitName) -> String {
    unit.as_str().replace('\\', "\\\\")
}

/// The reader: the merged stream into `tx` until the connection or the
/// receiver is gone.
async fn read(
    mut merge: Merge,
    mut switches: mpsc::Receiver<Switch>,
    tx: mpsc::Sender<(Sequence, UnitSignal)>,
) {
    loop {
        let next = std::future::poll_fn(|cx| merge.poll_next(cx, &mut switches)).await;
        let Some(item) = next else { break };
        if tx.send(item).await.is_err() {
            return;
        }
    }
    tracing::debug!("systemd unit signal stream ended");
}

/// The streams of the current generation, the switches after it, and the
/// owner of systemd's name.
struct Merge {
    current: Vec<Peekable<MessageStream>>,
    /// The bus daemon's `NameOwnerChanged` of systemd's name (all
    /// generations).
    owner_changes: Peekable<MessageStream>,
    owner: Owner,
    dropped: Dropped,
    /// Messages before this position in `current` were the generation's
    /// before: given already, or told by its snapshot.
    from: Option<Sequence>,
    /// The last position given (a message two rules matched is given once).
    last: Option<Sequence>,
    switches: VecDeque<Switch>,
}

impl Merge {
    fn new(streams: Vec<MessageStream>, owner: Owner, owner_changes: MessageStream) -> Self {
        Self {
            current: streams.into_iter().map(StreamExt::peekable).collect(),
            owner_changes: owner_changes.peekable(),
            owner,
            dropped: Dropped::new("systemd's unit signals"),
            from: None,
            last: None,
            switches: VecDeque::new(),
        }
    }

    /// The next signal in the connection's order; `None` once a stream ended.
    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
        switches: &mut mpsc::Receiver<Switch>,
    ) -> Poll<Option<(Sequence, UnitSignal)>> {
        while let Poll::Ready(Some(switch)) = switches.poll_recv(cx) {
            self.switches.push_back(switch);
        }
        loop {
            let oldest = match self.oldest_ready(cx) {
                Ok(oldest) => oldest,
                Err(Ended) => return Poll::Ready(None),
            };
            if let Some(switch) = self.switches.front()
                && oldest.is_none_or(|(_, at)| at >= switch.at)
                && let Some(switch) = self.switches.pop_front()
            {
                // Nothing of the old generation older than the switch is left.
                self.current = switch
                    .streams
                    .into_iter()
                    .map(StreamExt::peekable)
                    .collect();
                self.from = Some(switch.at);
                self.last = Some(switch.at);
                return Poll::Ready(Some((switch.at, switch.snapshot)));
            }
            let Some((source, at)) = oldest else {
                return Poll::Pending;
            };
            let stream = match source {
                Source::Owner => &mut self.owner_changes,
                Source::Rule(i) => &mut self.current[i],
            };
            let Poll::Ready(Some(Ok(msg))) = stream.poll_next_unpin(cx) else {
                // It was ready a moment ago; look again.
                continue;
            };
            if source != Source::Owner
                && (self.from.is_some_and(|from| at < from) || self.last.is_some_and(|l| at <= l))
            {
                continue;
            }
            self.last = self.last.max(Some(at));
            match self.owner.judge(&msg) {
                Verdict::FromOwner => {}
                Verdict::OwnerChanged { owner } => {
                    tracing::info!(
                        "{} is now owned by {} (for systemd's unit signals)",
                        self.owner.name(),
                        owner.as_deref().unwrap_or("nobody")
                    );
                    continue;
                }
                Verdict::NotFromOwner { sender } => {
                    if let Some(line) = self.dropped.note(&msg, &sender, &self.owner.describe()) {
                        tracing::warn!("{line}");
                    }
                    continue;
                }
            }
            if let Some(signal) = parse_unit_signal(&msg) {
                return Poll::Ready(Some((at, signal)));
            }
        }
    }

    /// The stream whose next message is the oldest of those ready, and its
    /// position; errors are logged and skipped. The owner's stream comes
    /// first among equals: a `NameOwnerChanged` a rule matched too (zbus
    /// cannot check a well-known sender) is then judged once.
    fn oldest_ready(&mut self, cx: &mut Context<'_>) -> Result<Option<(Source, Sequence)>, Ended> {
        let mut oldest: Option<(Source, Sequence)> = None;
        let owner = std::iter::once((Source::Owner, &mut self.owner_changes));
        let rules = self.current.iter_mut().enumerate();
        let all = owner.chain(rules.map(|(i, s)| (Source::Rule(i), s)));
        for (i, stream) in all {
            loop {
                match Pin::new(&mut *stream).poll_peek(cx) {
                    Poll::Ready(Some(Ok(msg))) => {
                        let at = msg.recv_position();
                        if oldest.is_none_or(|(_, o)| at < o) {
                            oldest = Some((i, at));
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        tracing::warn!("reading systemd unit signals: {e}");
                        let _ = stream.poll_next_unpin(cx);
                        continue;
                    }
                    Poll::Ready(None) => return Err(Ended),
                    Poll::Pending => {}
                }
                break;
            }
        }
        Ok(oldest)
    }
}

/// A stream of the current generation ended: the connection is gone.
struct Ended;

/// Where a message of the merge comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Owner,
    Rule(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_its_unit_only() {
        let unit = |s: &str| UnitName::new(s).unwrap();
        assert_eq!(pattern(&unit("db.service")), "db.service");
        assert_eq!(
            pattern(&unit(r"dev-disk-by\x2duuid-1.device")),
            r"dev-disk-by\\x2duuid-1.device"
        );
    }
}
