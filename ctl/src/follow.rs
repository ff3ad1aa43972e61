//! Shared machinery of the commands that run until interrupted: `monitor`,
//! `status -w`, `metrics listen`.
//!
//! Invariants:
//! * signals are read from **one** message stream per command, so they are handled in
//!   the order the bus delivered them (several zbus signal streams polled by `select!`
//!   would reorder e.g. a virtual `UnitStateChanged` and the `UnitRemoved` after it);
//! * that stream is drained while method calls are in flight: zbus applies
//!   back-pressure when a match queue is full, which would also hold up the reply;
//! * such a command ends in exactly three ways: SIGINT/SIGTERM (exit 0, after closing
//!   what it created on the manager), drover-manager leaving the bus
//!   ([`CtlError::ManagerLeft`], exit 1), or our own bus connection closing (exit 1).

use std::num::NonZeroUsize;

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
/// `namespace`) below a path prefix, in bus order.
pub async fn signal_stream(
    client: &Client,
    path: &str,
    namespace: bool,
    interface: &str,
) -> Result<MessageStream, CtlError> {
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
    MessageStream::for_match_rule(rule, client.connection(), queue)
        .await
        .map_err(|e| CtlError::Other(format!("cannot match signals on {path}: {e}")))
}

/// Ends with the error to report once drover-manager leaves the bus (any change of
/// owner of `org.eclipse.bluechi`: a restarted manager knows nothing of our
/// monitor), or once our connection closes.
pub struct ManagerWatch {
    owner: zbus::proxy::OwnerChangedStream<'static>,
    bus: String,
    what: &'static str,
}

impl ManagerWatch {
    /// `what` names what stops, e.g. `"monitoring"`.
    pub async fn new(client: &Client, what: &'static str) -> Result<ManagerWatch, CtlError> {
        let controller = client.controller().await?;
        let owner = controller
            .inner()
            .receive_owner_changed()
            .await
            .map_err(|e| CtlError::Other(format!("cannot watch drover-manager: {e}")))?;
        Ok(ManagerWatch {
            owner,
            bus: client.target().to_string(),
            what,
        })
    }

    /// Resolves when the manager is gone; the error says so.
    pub async fn gone(&mut self) -> CtlError {
        match self.owner.next().await {
            Some(_) => CtlError::ManagerLeft {
                bus: self.bus.clone(),
                what: self.what,
            },
            None => CtlError::BusClosed {
                bus: self.bus.clone(),
            },
        }
    }
}

/// The next message of a follow stream; the end of the stream means our connection
/// closed.
pub async fn next_signal(
    stream: &mut MessageStream,
    client: &Client,
) -> Result<zbus::Message, CtlError> {
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
