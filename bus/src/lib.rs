//! drover-bus: what drover's processes share about D-Bus.
//!
//! drover speaks D-Bus on two sides — the agent to its node's systemd, and
//! every client (droverctl, the proxy helper, BlueChi's tools) to the manager
//! or the agent on BlueChi's public API. The facts those conversations depend
//! on are written once, here:
//!
//! * [`bus`] — which bus (system, session, an address), how its address is
//!   found, the connection to it, and the standard properties interface;
//! * [`bluechi`] — BlueChi's bus names, object paths and interface names;
//! * [`systemd`] — systemd's bus name, object paths and interfaces, and the
//!   `ListUnits` row `(ssssssouso)` with its conversion to and from the
//!   protocol's [`drover_protocol::UnitInfo`];
//! * [`label`] — systemd's object path label escaping, the rule behind unit
//!   and node paths;
//! * [`limits`] — how large one D-Bus message may be on the buses drover
//!   meets (a fleet-wide list is refused before it would pass it);
//! * `marshal` (feature `zbus`) — D-Bus values ↔ the wire's
//!   [`drover_protocol::Marshalled`];
//! * `client` (feature `zbus`) — the public API as a client declares it: the
//!   rows of its replies and zbus proxies of its objects (droverctl, the test
//!   kit);
//! * `name` (feature `zbus`) — owning the daemons' well-known names: one
//!   owner, never replaced, a bounded wait behind a previous owner on restart;
//! * [`timestamp`] — the clocks of BlueChi's `*Timestamp` /
//!   `*TimestampMonotonic` properties.
//!
//! D-Bus *error names* are not here: they cross drover's own wire too, so
//! they live in [`drover_protocol::error_names`].
//!
//! Feature `zbus` (default): connecting, the typed `ListUnits` row and
//! marshalling. Without it only names, paths, labels, the bus choice and the
//! clocks remain, so a process that brings its own D-Bus client (the proxy
//! helper) shares the rules without linking zbus.

pub mod bluechi;
pub mod bus;
#[cfg(feature = "zbus")]
pub mod client;
pub mod label;
pub mod limits;
#[cfg(feature = "zbus")]
pub mod marshal;
#[cfg(feature = "zbus")]
pub mod name;
#[cfg(feature = "zbus")]
pub mod sender;
pub mod systemd;
pub mod timestamp;

pub use bus::Bus;
