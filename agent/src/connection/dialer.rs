//! One manager's dialer: connects, waits on a parked link for its verdict,
//! hands a welcome to the link's loop and waits until the loop is done with
//! it, then dials again after its backoff (steps 1, 3 and 5 of the module
//! docs of `crate::connection`).
//!
//! Invariants: a dialer holds at most one connection to its manager; a
//! parked link waits without a deadline (TCP keepalive sees a dead peer) and
//! resets the backoff, as a welcome does; a failure is counted, logged
//! ([`super::report`]) and shown in the link's state only while no session
//! runs; the status line speaks of a failure only when there is one manager
//! (with several, one standing by is no news); a shutdown ends the dialer at
//! any await.

use super::backoff::Backoff;
use super::config::LinkConfig;
use super::connect::{LinkStream, connect};
use super::outcome::{ConnectError, LinkState};
use super::report::{log_failure, notify_failure, quiet_limit};
use crate::link::target::Endpoint;
use crate::notify;
use crate::stats::Stats;
use drover_protocol::link::{AgentFramed, Answer};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

/// A manager's welcome, handed by its dialer to the link's loop.
pub(super) struct Offer {
    pub(super) endpoint: Endpoint,
    pub(super) framed: AgentFramed<LinkStream>,
    pub(super) accepted: drover_protocol::handshake::Accepted,
    /// Dropped when the link is done with this manager's link: its dialer
    /// dials again.
    pub(super) done: oneshot::Sender<()>,
}

/// One manager's dialer: connects, waits on a parked link for its
/// verdict, hands a welcome to the link's loop and waits until the loop
/// is done with it, then dials again after its backoff. Runs until the
/// loop stops polling it. `state` hears the failures in a row, `stats`
/// counts them;
/// `managers` is how many dialers run.
pub(super) async fn dial(
    cfg: &LinkConfig,
    state: &watch::Sender<LinkState>,
    stats: &Stats,
    target: &Endpoint,
    managers: usize,
    offers: mpsc::Sender<Offer>,
    shutdown: &CancellationToken,
) {
    let endpoint = target.to_string();
    let mut failures = 0u32;
    let mut backoff = Backoff::new(cfg.backoff_cap());
    let mut said_parked: Option<String> = None;
    while !shutdown.is_cancelled() {
        let mut answer = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = connect(cfg, target) => a,
        };
        // A parked link waits (without a deadline) for its verdict.
        let accepted = loop {
            match answer {
                Ok(Answer::Accepted(framed, accepted)) => break Ok((framed, accepted)),
                Ok(Answer::Parked(link, message)) => {
                    if said_parked.as_deref() != Some(message.as_str()) {
                        tracing::info!(
                            "the manager at {endpoint} stands by ({message}); the link \
                             waits there for it to lead"
                        );
                        said_parked = Some(message);
                    }
                    failures = 0;
                    backoff.reset();
                    answer = tokio::select! {
                        _ = shutdown.cancelled() => return,
                        v = link.verdict() => v.map_err(ConnectError::from),
                    };
                }
                Err(e) => break Err(e),
            }
        };
        match accepted {
            Ok((framed, accepted)) => {
                if failures > quiet_limit(cfg) {
                    tracing::info!(
                        "reached the manager at {endpoint} again after {failures} failed \
                         attempts"
                    );
                }
                failures = 0;
                backoff.reset();
                said_parked = None;
                let (done, finished) = oneshot::channel::<()>();
                let offer = Offer {
                    endpoint: target.clone(),
                    framed,
                    accepted,
                    done,
                };
                if offers.send(offer).await.is_err() {
                    return;
                }
                // Until the session ends, or the link turned the welcome down.
                let _ = finished.await;
            }
            Err(err) => {
                failures = failures.saturating_add(1);
                stats.connect_failed();
                log_failure(cfg, &endpoint, &err, failures);
                // The link's state tells failures while no session runs.
                state.send_if_modified(|s| match s {
                    LinkState::Connecting { failures: f } => {
                        *f = failures;
                        true
                    }
                    _ => false,
                });
                if cfg.notify && managers == 1 {
                    let (kind, why) = notify_failure(&err);
                    notify::retrying(&endpoint, &kind.with(&why), Duration::ZERO);
                }
            }
        }
        let delay = backoff.next_delay();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}
