//! The agent in one process for unit tests: a fake systemd, the shared
//! state, a dispatcher, and the manager's end of an open session's outbox.
//!
//! [`Rig::new`] also runs the systemd event pump (job events reach the
//! tracker, the dep waiters and the early start); [`Rig::without_events`]
//! does not, for tests that feed the pieces by hand.

use crate::dispatch::Dispatcher;
use crate::fanout::pump_events;
use crate::link::outbox::SessionKill;
use crate::state::Shared;
use crate::systemd::api::Systemd;
use crate::systemd::fake::FakeSystemd;
use drover_protocol::{ToManager, UnitName};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How long a test waits for the next message.
pub const WAIT: Duration = Duration::from_secs(5);

pub struct Rig {
    pub fake: FakeSystemd,
    pub d: Arc<Dispatcher<FakeSystemd>>,
    pub shared: Arc<Shared>,
    /// The manager's end of session 1.
    pub rx: mpsc::Receiver<ToManager>,
}

impl Rig {
    /// Session 1 open (manager session id `session_id`), outbox of 64, the
    /// event pump running.
    pub async fn new(session_id: u64) -> Rig {
        let rig = Self::without_events(64, session_id);
        let events = rig.fake.subscribe().await.unwrap();
        tokio::spawn(pump_events(
            events,
            rig.shared.clone(),
            Arc::new(rig.fake.clone()),
        ));
        rig
    }

    /// Session 1 open (manager session id `session_id`) with an outbox of
    /// `capacity`; no event pump.
    pub fn without_events(capacity: usize, session_id: u64) -> Rig {
        let fake = FakeSystemd::new();
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel(capacity);
        shared.outbox.open(1, tx, SessionKill::new());
        shared.session_started(1, session_id);
        let d = Arc::new(Dispatcher::new(Arc::new(fake.clone()), shared.clone()));
        Rig {
            fake,
            d,
            shared,
            rx,
        }
    }
}

/// The next message to the manager, within [`WAIT`].
pub async fn next(rx: &mut mpsc::Receiver<ToManager>) -> ToManager {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a message in time")
        .expect("queue open")
}

pub fn unit(s: &str) -> UnitName {
    UnitName::new(s).unwrap()
}
