//! The requesting side of a cross-node dependency: proxies of this node on
//! units of other nodes (the state behind `drover-proxy@.service`).
//!
//! * [`registry`] — every proxy of this node and its life: created by the
//!   helper's `CreateProxy` (`crate::api`), decided by the target's fate as
//!   the manager relays it, announced to the manager in every session.
//! * [`early_start`] — the early-start path: once systemd runs a proxy
//!   unit's start job, the proxy is announced before its helper calls, so the
//!   target starts while the helper process starts.
//!
//! The target side (`drover-dep@` units) is `crate::deps`.

pub mod early_start;
pub mod registry;
