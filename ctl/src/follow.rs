//! Shared machinery of the commands that run until interrupted: `monitor`,
//! `status -w`, `metrics listen`.
//!
//! Invariants:
//! * signals are read from **one** message stream per command, so they are handled in
//!   the order the bus delivered them (several zbus signal streams polled by `select!`
//!   would reorder e.g. a virtual `UnitStateChanged` and the `UnitRemoved` after it);
//! * that stream is drained while method calls are in flight: zbus applies
//!   back-pressure when a match queue is full, which would also hold up the reply;
//! * only drover-manager speaks: a signal counts only when its sender is the unique
//!   name that owned `org.eclipse.bluechi` when the command started ([`Follow`]), and
//!   only the bus daemon says that the owner changed ([`ManagerWatch`]); anyone may
//!   send a signal to our unique name;
//! * such a command ends in exactly three ways: SIGINT/SIGTERM (exit 0, after closing
//!   what it created on the manager), drover-manager leaving the bus
//!   ([`CtlError::ManagerLeft`], exit 1), or our own bus connection closing (exit 1).

use std::num::NonZeroUsize;

use std::io::Write;

use drover_bus::sender::{Dropped, Owner, Verdict};
use futures::StreamExt;
use tokio::signal::unix::{SignalKind, signal};
use zbus::{MatchRule, MessageStream, message::Type as MessageType};

use crate::client::Client;
use crate::error::CtlError;
use drover_bus::bluechi::BUS_NAME;

/// How many signals may wait in a follow stream while a call is answered. Large, so
/// that a burst (a wildcard subscription replays every unit of every node) does not
/// stall the connection while we print.
pub const FOLLOW_QUEUE: usize = 16_384;

/// Waits for SIGINT (Ctrl-C) or SIGTERM.
pub async fn interrupted() -> Result<(), CtlError> {
    let install =
        |kind| signal(kind).map_err(|e| CtlError::Other(format!("cannot handle signals: {e}")));
    let mut int = install(SignalKind::interrupt())?;
    let mut term = install(SignalKind::terminate())?;
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    Ok(())
}

/// Signals of `interface` sent by drover-manager, on one object path or (with
/// `namespace`) below a path prefix, in bus order. Only the manager's unique name
/// as `manager` knew it at start speaks (see [`Follow`]).
pub async fn signal_stream(
    client: &Client,
    manager: &ManagerWatch,
    path: &str,
    namespace: bool,
    interface: &str,
) -> Result<Follow, CtlError> {
    let rule = MatchRule::builder()
        .msg_type(MessageType::Signal)
        .sender(BUS_NAME)
        .interface(interface);
    let rule = if namespace {
        rule.path_namespace(path)
    } else {
        rule.path(path)
    };
    let rule = rule
        .build()
        .map_err(|e| CtlError::Other(format!("cannot match signals on {path}: {e}")))?;
    let queue = NonZeroUsize::new(FOLLOW_QUEUE);
    let stream = MessageStream::for_match_rule(rule, client.connection(), queue)
        .await
        .map_err(|e| CtlError::Other(format!("cannot match signals on {path}: {e}")))?;
    Ok(Follow {
        stream,
        manager: manager.owner.unique().map(str::to_owned),
        speaker: manager.owner.describe(),
        dropped: Dropped::new("droverctl's stream of the manager's signals"),
    })
}

/// A stream of the manager's signals that yields only those the manager sent.
///
/// Any local user may send a signal to droverctl's unique name, and the bus
/// delivers it whatever our match rule's `sender=` says (that filters broadcasts
/// only); a forged `UnitStateChanged` would be printed in the operator's terminal
/// as the manager's word. So every message whose sender is not the unique name
/// that owned `org.eclipse.bluechi` when the command started is dropped, counted
/// and said on stderr at a bounded rate (`drover_bus::sender::Dropped`). A new
/// owner is no speaker either: [`ManagerWatch`] ends the command when the owner
/// changes.
pub struct Follow {
    stream: MessageStream,
    manager: Option<String>,
    speaker: String,
    dropped: Dropped,
}

impl Follow {
    /// Signals dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.total()
    }
}

impl futures::Stream for Follow {
    type Item = zbus::Result<zbus::Message>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let msg = match std::task::ready!(this.stream.poll_next_unpin(cx)) {
                Some(Ok(msg)) => msg,
                other => return std::task::Poll::Ready(other),
            };
            let sender = msg.header().sender().map(|s| s.as_str().to_owned());
            if sender.is_some() && sender == this.manager {
                return std::task::Poll::Ready(Some(Ok(msg)));
            }
            let sender = sender.unwrap_or_else(|| "(no sender)".to_owned());
            if let Some(line) = this.dropped.note(&msg, &sender, &this.speaker) {
                let mut err = std::io::stderr().lock();
                let _ = writeln!(err, "droverctl: {line}");
            }
        }
    }
}

/// Ends with the error to report once drover-manager leaves the bus (any change of
/// owner of `org.eclipse.bluechi`: a restarted manager knows nothing of our
/// monitor), or once our connection closes. Only the bus daemon's own
/// `NameOwnerChanged` counts: a forged one is ignored.
pub struct ManagerWatch {
    owner: Owner,
    changes: MessageStream,
    bus: String,
    what: &'static str,
}

impl ManagerWatch {
    /// `what` names what stops, e.g. `"monitoring"`.
    pub async fn new(client: &Client, what: &'static str) -> Result<ManagerWatch, CtlError> {
        let (owner, changes) = Owner::follow(client.connection(), BUS_NAME, NonZeroUsize::new(16))
            .await
            .map_err(|e| CtlError::Other(format!("cannot watch drover-manager: {e}")))?;
        Ok(ManagerWatch {
            owner,
            changes,
            bus: client.target().to_string(),
            what,
        })
    }

    /// Resolves when the manager is gone; the error says so.
    pub async fn gone(&mut self) -> CtlError {
        while let Some(msg) = self.changes.next().await {
            let Ok(msg) = msg else { continue };
            if let Verdict::OwnerChanged { .. } = self.owner.judge(&msg) {
                return CtlError::ManagerLeft {
                    bus: self.bus.clone(),
                    what: self.what,
                };
            }
        }
        CtlError::BusClosed {
            bus: self.bus.clone(),
        }
    }
}

/// The next message of a follow stream; the end of the stream means our connection
/// closed.
pub async fn next_signal(stream: &mut Follow, client: &Client) -> Result<zbus::Message, CtlError> {
    match stream.next().await {
        Some(Ok(m)) => Ok(m),
        Some(Err(e)) => Err(CtlError::Other(format!("reading signals failed: {e}"))),
        None => Err(CtlError::BusClosed {
            bus: client.target().to_string(),
        }),
    }
}

/// The member name of a signal, or "".
pub fn member(msg: &zbus::Message) -> String {
    msg.header()
        .member()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default()
}

/// ANSI "clear screen, cursor home", as bluechictl prints before a reprint; only
/// used when stdout is a terminal (a pipe gets the tables one after another).
pub const CLEAR_SCREEN: &str = "\x1b[2J\x1b[H";

/// Whether stdout is a terminal.
pub fn stdout_is_tty() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stdout())
}
