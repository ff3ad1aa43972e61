//! High availability on etcd (docs/ha.md): the election and its fence.
//!
//! * [`fence`] — whether this manager may lead now, on the local monotonic
//!   clock; the node lifecycle's phase and the API read it.
//! * [`election`] — campaign, lead (keep the lease), stand by (watch),
//!   resign; tells the manager through its [`seat::Relay`].
//! * [`seat`] — what leading means for the manager ([`seat::Seat`]) and the
//!   ordered queue that carries the election's word to it.
//! * [`thread`] — the election on an OS thread with its own runtime, so
//!   the manager's work does not delay a renewal.
//! * [`etcd`], [`wire`] — etcd's v3 JSON gateway over HTTP/1.1, and its
//!   message bodies (pure).
//!
//! Imports run one way: `thread` → `election` → `seat`, `etcd` → `wire`;
//! `fence` imports nothing of the manager. Nothing here imports the rest of the manager.

pub mod election;
pub mod etcd;
pub mod fence;
pub mod seat;
pub mod thread;
pub mod wire;
