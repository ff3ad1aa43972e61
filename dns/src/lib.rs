//! drover-dns: answers DNS queries for a drover fleet's units, fed by the
//! manager's `io.drover.Controller.Where` over D-Bus (drover-dns(8);
//! docs/discovery.md, "DNS"). A separate program and package: nothing here
//! is linked into the manager or the agent.
//!
//! * [`labels`] — unit and node names ↔ DNS labels (reversible);
//! * [`zone`] — what a name in the zone stands for;
//! * [`source`] — where answers come from (the [`source::Source`] trait);
//!   [`feed`] is the manager over D-Bus;
//! * [`cache`] — freshness, serve-stale, the bound on `Where` calls and on
//!   memory (pure: the caller passes the time);
//! * [`records`] — the records of a reply;
//! * [`handler`] — the hickory-server request handler tying them together;
//! * [`cli`] — the command line and the process around it.

pub mod cache;
pub mod cli;
pub mod feed;
pub mod handler;
pub mod labels;
pub mod records;
pub mod source;
pub mod zone;
