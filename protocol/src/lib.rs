//! drover-protocol: every rule two drover processes must agree on.
//!
//! The agent ↔ manager wire is drover's own protocol (not D-Bus):
//!
//! * [`codec`] — length-prefixed frames (u32 big-endian length, hard cap checked
//!   *before* allocating) carrying postcard-encoded messages. The hello, read
//!   before anything is known about the peer, has its own small cap
//!   ([`HELLO_MAX_LEN`]), and so has the manager's answer to it
//!   ([`WELCOME_MAX_LEN`]).
//! * [`handshake`] — the first frame each way: the agent's [`handshake::Hello`]
//!   (magic, protocol version, node name) and the manager's [`handshake::Welcome`]
//!   (accepted with a session id and heartbeat settings, or refused with a reason).
//!   A version mismatch is detected from the fixed prefix alone, so it is a clear
//!   error on both sides even when the rest of the frame layout changed.
//! * [`message`] — what flows after the handshake: requests with correlation ids
//!   (manager → agent), exactly one reply per request, events and heartbeats.
//! * [`tag`] — modification tags that order unit-state records across reconnects.
//! * [`liveness`] — who sends heartbeats to whom, and the `TCP_USER_TIMEOUT`
//!   that lets the agent's heartbeats also probe the manager.
//! * `link` (feature `io`) — a framed connection over any `AsyncRead +
//!   AsyncWrite` (TCP today, TLS later) with the handshake helpers for both
//!   sides, and the socket options both ends set.
//!
//! The rules both ends of some exchange apply, each in one place:
//!
//! * [`names`] — validated node and unit names; every name from outside passes here.
//! * [`proxy_instance`] — `drover-proxy@NODE_UNIT.service` (and BlueChi's
//!   `bluechi-proxy@NODE_UNIT.service`): the helper parses it, the agent
//!   recognises proxy units by it.
//! * [`dep_unit`] — `drover-dep@UNIT.service`: the agent starts it, the manager
//!   reads targets back from it.
//! * [`job`] — the four unit jobs with systemd's and BlueChi's words for them.
//! * [`verdict`] — what a target's state and health changes mean for a proxy
//!   (agent and manager decide alike without telling each other).
//! * [`health`] — health states, verdicts and the snapshot an agent sends at
//!   registration, with their bounds.
//! * [`offline`] — how a proxy that waits for an offline node says so.
//! * [`ports`] — the ports a unit declares for discovery (`Port=`, `Ports=`)
//!   and their bounds.
//! * [`resync`] — the periodic digest of what the manager holds for a node,
//!   and the snapshot that repairs it (the hashes both ends compute).
//! * [`error_names`] — the D-Bus error names every process produces or matches.
//!
//! Features: without `io` the crate is data and rules only (serde, postcard,
//! thiserror; no tokio), for the proxy helper, droverctl and the config crate;
//! `io` adds the tokio-util codec and the link, for the agent and the manager.

pub mod codec;
pub mod dep_unit;
pub mod error_names;
pub mod handshake;
pub mod health;
pub mod job;
#[cfg(feature = "io")]
pub mod link;
pub mod liveness;
pub mod message;
pub mod names;
pub mod offline;
pub mod ports;
pub mod proxy_instance;
pub mod resync;
pub mod tag;
pub mod verdict;

#[cfg(feature = "io")]
pub use codec::FrameCodec;
pub use codec::{FrameError, MAX_FRAME_LEN};
pub use handshake::{
    HELLO_MAX_LEN, Hello, PROTOCOL_VERSION, RefuseReason, WELCOME_MAX_LEN, Welcome,
};
pub use health::{Health, HealthSnapshot, HealthState, NodeHealth, UnitHealth};
pub use job::JobKind;
pub use message::{
    Event, Marshalled, Notice, Reason, RemoteError, Request, Response, Scope, TargetChange,
    ToAgent, ToManager, UnitInfo,
};
pub use names::{NameError, NodeName, UnitName};
pub use proxy_instance::{InstanceError, ProxyInstance, ProxyMismatch, ProxyTemplate};
pub use tag::ModTag;

/// `version X.Y.Z (commit C)`: what every drover binary's `--version` says after
/// its name. A macro, not a const, so that `env!` reads the *calling* crate's
/// version and the `DROVER_GIT_COMMIT` its build script
/// (`build/git_commit.rs`) set; a crate that uses it must have that script.
#[macro_export]
macro_rules! version_line {
    () => {
        concat!(
            "version ",
            env!("CARGO_PKG_VERSION"),
            " (commit ",
            env!("DROVER_GIT_COMMIT"),
            ")"
        )
    };
}
