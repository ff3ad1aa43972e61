//! drover-protocol: the vocabulary the manager and its agents share.
//!
//! The agent ↔ manager wire is drover's own protocol (not D-Bus):
//!
//! * [`codec`] — length-prefixed frames (u32 big-endian length, hard cap checked
//!   *before* allocating) carrying postcard-encoded messages.
//! * [`handshake`] — the first frame each way: the agent's [`handshake::Hello`]
//!   (magic, protocol version, node name) and the manager's [`handshake::Welcome`]
//!   (accepted with a session id and heartbeat settings, or refused with a reason).
//!   A version mismatch is detected from the fixed prefix alone, so it is a clear
//!   error on both sides even when the rest of the frame layout changed.
//! * [`message`] — what flows after the handshake: requests with correlation ids
//!   (manager → agent), exactly one reply per request, events and heartbeats.
//! * [`tag`] — modification tags that order unit-state records across reconnects.
//! * [`names`] — validated node and unit names; every name from outside passes here.
//! * [`bus_label`] — systemd's object path escaping of names (unit and node paths).
//! * [`link`] — a framed connection over any `AsyncRead + AsyncWrite` (TCP today,
//!   TLS later) with the handshake helpers for both sides.

pub mod bus_label;
pub mod codec;
pub mod handshake;
pub mod link;
pub mod message;
pub mod names;
pub mod tag;

pub use codec::{FrameCodec, FrameError, MAX_FRAME_LEN};
pub use handshake::{Hello, PROTOCOL_VERSION, RefuseReason, Welcome};
pub use message::{
    Event, Marshalled, Notice, Reason, RemoteError, Request, Response, TargetChange, ToAgent,
    ToManager, UnitInfo,
};
pub use names::{NameError, NodeName, UnitName};
pub use tag::ModTag;
