//! The link to the manager: connect, handshake, serve a session, reconnect.
//!
//! One [`Link::run`] loop owns the connection for the agent's lifetime:
//!
//! 1. **Connect**: the manager's host is resolved again on every attempt (its
//!    address may change), TCP with `TCP_NODELAY`, `SO_KEEPALIVE` with the
//!    configured idle/interval/count, `IP_RECVERR` and `TCP_USER_TIMEOUT`
//!    ([`link_user_timeout`]), so a dead peer is seen quickly; with TLS configured ([`LinkConfig::tls`]) the TLS 1.3
//!    handshake, which refuses a manager whose certificate does not chain to
//!    the agent's CA bundle or does not name `TLSControllerName` (else the
//!    host dialled) — a rogue manager would own the node; then
//!    [`agent_hello`](drover_protocol::link::agent_hello) with a timeout. A refusal is logged (at error level
//!    for certificate problems) and retried with the backoff below, as any
//!    failed attempt. In TLS 1.3 the manager judges the agent's own
//!    certificate after the agent's side of the handshake is done, so a
//!    refused agent certificate shows as an error reading the welcome.
//! 2. **Session** (one per accepted handshake, numbered by `epoch`): a reader,
//!    a writer task fed by the bounded [`Outbox`](crate::link::outbox::Outbox) queue, and a heartbeat
//!    timer, both timer and silence threshold negotiated with what the
//!    manager announced ([`crate::link::heartbeat`]). Each request runs as its own task, at most
//!    [`LinkConfig::max_in_flight`] at once (the reader waits for a slot, so
//!    TCP pushes back on the manager — nothing unbounded is fed from the
//!    network). The session ends when the manager closes, sends something
//!    that is not a valid frame, stays silent longer than the heartbeat
//!    threshold, stops reading (queue full), or the agent shuts down.
//! 3. **Backoff**: retries forever with jittered exponential backoff — the
//!    first retry after 100–250 ms, doubling, capped at
//!    max(`HeartbeatInterval`, 1 s) — so thousands of agents do not reconnect
//!    in lockstep. Failures are logged until `ConnectionRetryCountUntilQuiet`,
//!    which is said once; then only at debug level until connected again.
//!
//! 4. **Switch** (`SwitchController`, [`crate::link::target`]): the session or
//!    connection attempt in progress is dropped and the new endpoint dialled
//!    at once, without backoff. With TLS the manager's certificate must name
//!    `TLSControllerName` when it is set, whatever host is dialled; without
//!    it, the host dialled — after a switch, the new host
//!    ([`LinkConfig::tls_name_follows_host`]), as at start.
//!
//! 5. **Several managers** (a high-availability group: `ControllerHost=`
//!    lists more than one): one dialer per manager runs steps 1 and 3 on its
//!    own. A standby answers the hello with *parked* and keeps the link; the
//!    dialer waits on it, without a deadline (TCP keepalive sees a dead
//!    peer), for the welcome the standby sends the moment it leads. Every
//!    welcome goes to [`crate::link::follow::Follow`]: taken (a newer leader
//!    ends the session in progress politely, as a switch does), kept away
//!    (the session stays) or refused (an epoch lower than the highest seen).
//!    So a failover costs the agents no heartbeat threshold and no backoff:
//!    they hold a parked link to every standby beside their session, and
//!    also survive the leader's host dying without a TCP reset. A session
//!    that changes manager is a new session, exactly as after a manager
//!    restart: the agent resyncs, and stops no unit, proxy or dependency
//!    unit for it (proxies keep their grace period, `crate::proxies`).
//!
//! Invariants: replies and events of a session that ended are dropped (see
//! [`crate::link::outbox`]); a shutdown closes the connection politely (queued
//! messages are flushed, then the write side is shut down); nothing sent by
//! the manager can make the agent panic or grow memory without bound.
//!
//! # Parts
//!
//! One concept per module; imports run down this list, never up:
//! * `driver` — [`Link`], the loop: the dialers, [`Follow`](crate::link::follow::Follow)'s
//!   verdict on every welcome, one session at a time, switches.
//! * `dialer` — one manager's dialer: attempts, parked links, backoff.
//! * `session` — one session: reader, writer, heartbeat and resync timers.
//! * `connect` — one attempt: TCP and its socket options, TLS, the hello.
//! * `report` — how a failed attempt is logged and shown in `STATUS=`.
//! * `outcome` — [`LinkState`], [`ConnectError`], [`SessionEnd`].
//! * `backoff` — [`Backoff`]; `config` — [`LinkConfig`].

mod backoff;
mod config;
mod connect;
mod dialer;
mod driver;
mod outcome;
mod report;
mod session;

pub use backoff::Backoff;
pub use config::{Keepalive, LinkConfig};
pub use connect::{AGENT_VERSION, LinkIo, LinkStream, link_user_timeout};
pub use driver::Link;
pub use outcome::{ConnectError, LinkState, SessionEnd};

#[cfg(test)]
mod tests;
