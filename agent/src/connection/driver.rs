//! The link's loop: [`Link`] owns the connection to the managers for the
//! agent's lifetime. It runs one dialer per manager of the list, judges
//! every welcome with [`Follow`], and serves one session at a time (steps 4
//! and 5 of the module docs of `crate::connection`).
//!
//! Invariants: at most one session runs; a session is numbered by `epoch`,
//! one more than the last; a welcome is taken only when [`Follow`] says so
//! (a newer leader ends the session in progress politely, a lower epoch than
//! the highest seen is refused); a switch (`SwitchController`) ends the
//! session or attempts in progress and dials the new list at once, without
//! backoff; after the loop returns, the state is [`LinkState::Stopped`].

use super::config::LinkConfig;
use super::dialer::{Offer, dial};
use super::outcome::{LinkState, SessionEnd};
use super::report::FailureKind;
use super::session::Sessions;
use crate::link::follow::{Follow, Verdict};
use crate::link::heartbeat;
use crate::link::target::Endpoint;
use crate::notify;
use crate::state::Shared;
use crate::systemd::api::Systemd;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// The session in progress.
struct Current<'a> {
    endpoint: Endpoint,
    session: std::pin::Pin<Box<dyn std::future::Future<Output = SessionEnd> + Send + 'a>>,
    /// Ends the session politely (a newer leader, a switch).
    preempt: CancellationToken,
}

/// What [`Link::run`] does next.
enum Step {
    Switched,
    Ended(SessionEnd),
    Offer(Box<Offer>),
}

/// `a:1, b:2`, for log lines.
fn list(endpoints: &[Endpoint]) -> String {
    endpoints
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The agent's end of the manager link.
pub struct Link<S> {
    cfg: LinkConfig,
    sessions: Sessions<S>,
    state: watch::Sender<LinkState>,
}

impl<S: Systemd> Link<S> {
    pub fn new(cfg: LinkConfig, systemd: Arc<S>, shared: Arc<Shared>) -> Self {
        shared.controller.init(cfg.managers());
        let sessions = Sessions::new(&cfg, systemd, shared);
        let (state, _) = watch::channel(LinkState::Connecting { failures: 0 });
        Self {
            cfg,
            sessions,
            state,
        }
    }

    /// Follows the link's state.
    pub fn watch(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    fn shared(&self) -> &Arc<Shared> {
        self.sessions.shared()
    }

    /// Connects and reconnects until `shutdown` is cancelled: one dialer per
    /// manager of the list (see the module docs, step 5), the session with
    /// the one [`Follow`] takes.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut epoch = 0u64;
        let mut follow = Follow::default();
        let mut switched = self.shared().controller.watch();
        'targets: loop {
            // Read after marking the watch seen: a switch from now on is news.
            switched.borrow_and_update();
            let targets = self.shared().controller.all();
            let (offers_tx, mut offers) = mpsc::channel::<Offer>(targets.len().max(1));
            let mut dialers =
                std::pin::pin!(futures::future::join_all(targets.iter().map(|target| {
                    dial(
                        &self.cfg,
                        &self.state,
                        &self.shared().stats,
                        target,
                        targets.len(),
                        offers_tx.clone(),
                        &shutdown,
                    )
                })));
            drop(offers_tx);
            let mut current: Option<Current<'_>> = None;
            loop {
                let step = tokio::select! {
                    biased;
                    _ = switched.changed() => Step::Switched,
                    end = async {
                        match current.as_mut() {
                            Some(c) => (&mut c.session).await,
                            None => std::future::pending().await,
                        }
                    } => Step::Ended(end),
                    offer = offers.recv() => match offer {
                        Some(offer) => Step::Offer(Box::new(offer)),
                        None => Step::Switched,
                    },
                    _ = &mut dialers, if !shutdown.is_cancelled() => Step::Switched,
                    _ = shutdown.cancelled(), if current.is_none() => break 'targets,
                };
                match step {
                    Step::Switched => {
                        if let Some(c) = current.take() {
                            c.preempt.cancel();
                            c.session.await;
                            follow.ended();
                        }
                        if shutdown.is_cancelled() {
                            break 'targets;
                        }
                        tracing::info!(
                            "SwitchController: leaving {}, dialling {}",
                            list(&targets),
                            list(&self.shared().controller.all())
                        );
                        self.state
                            .send_replace(LinkState::Connecting { failures: 0 });
                        continue 'targets;
                    }
                    Step::Ended(end) => {
                        let Some(c) = current.take() else { continue };
                        follow.ended();
                        self.state
                            .send_replace(LinkState::Connecting { failures: 0 });
                        if end == SessionEnd::Shutdown {
                            break 'targets;
                        }
                        tracing::warn!(
                            "lost the link to the manager at {}: {end}; reconnecting",
                            c.endpoint
                        );
                        if self.cfg.notify {
                            notify::retrying(
                                &c.endpoint.to_string(),
                                &FailureKind::Lost.with(&end.to_string()),
                                Duration::ZERO,
                            );
                        }
                        // Its dialer (waiting on `c.done`) dials again after its backoff.
                    }
                    Step::Offer(offer) => {
                        let leadership = offer.accepted.epoch;
                        match follow.offer(leadership) {
                            Verdict::Take => {}
                            Verdict::Keep { current: held } => {
                                tracing::debug!(
                                    "the manager at {} welcomed this node with epoch \
                                     {leadership}; staying with the session of epoch {held}",
                                    offer.endpoint
                                );
                                continue;
                            }
                            Verdict::Refuse { highest } => {
                                tracing::warn!(
                                    "refusing the manager at {}: its leadership epoch \
                                     {leadership} is lower than {highest}, the highest this \
                                     agent has seen (a deposed leader is never obeyed)",
                                    offer.endpoint
                                );
                                continue;
                            }
                        }
                        if let Some(c) = current.take() {
                            tracing::info!(
                                "the manager at {} leads now (epoch {leadership}); leaving \
                                 {}",
                                offer.endpoint,
                                c.endpoint
                            );
                            c.preempt.cancel();
                            c.session.await;
                        }
                        epoch += 1;
                        current = Some(self.start_session(epoch, *offer, &shutdown));
                    }
                }
            }
        }
        self.state.send_replace(LinkState::Stopped);
    }

    /// Starts the session of an offer the link took.
    fn start_session<'a>(
        &'a self,
        epoch: u64,
        offer: Offer,
        shutdown: &'a CancellationToken,
    ) -> Current<'a> {
        let Offer {
            endpoint,
            framed,
            accepted,
            done,
        } = offer;
        self.shared().tracker().new_session(epoch);
        self.shared().session_started(epoch, accepted.session_id);
        self.shared()
            .stats
            .session_started(endpoint.to_string(), accepted.epoch);
        self.shared()
            .status
            .set_controller(&endpoint.host, endpoint.port);
        tracing::info!(
            session = accepted.session_id,
            manager_version = %accepted.manager_version,
            "connected to the manager at {endpoint} as node '{}' (leadership epoch {})",
            self.cfg.node.as_str(),
            accepted.epoch
        );
        if self.cfg.notify {
            notify::connected(&endpoint.to_string(), self.cfg.node.as_str());
        }
        self.state.send_replace(LinkState::Connected {
            epoch,
            session_id: accepted.session_id,
        });
        let beats = heartbeat::negotiate(
            self.cfg.heartbeat_interval,
            self.cfg.heartbeat_threshold,
            accepted.heartbeat_interval_ms,
            accepted.heartbeat_threshold_ms,
        );
        for note in &beats.notes {
            tracing::warn!("{note}");
        }
        let resync = Duration::from_millis(accepted.resync_interval_ms);
        let preempt = CancellationToken::new();
        let stop = preempt.clone();
        let session = Box::pin(async move {
            let end = self
                .sessions
                .serve(epoch, framed, &beats, resync, shutdown, &stop)
                .await;
            // The dialer of this manager dials again once the session is over.
            drop(done);
            end
        });
        Current {
            endpoint,
            session,
            preempt,
        }
    }
}
