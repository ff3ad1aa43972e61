//! Units across the fleet, as clients see them: the event vocabulary and the
//! last known state of each unit with its tag ([`records`]), who watches
//! what and the fan-out of events to watchers ([`hub`], with the lazy replay
//! of a new `*` watch in [`replay`]), and the monitors
//! that turn those events into D-Bus signals ([`monitor`], with the
//! messages built by [`signals`]). The health of units and nodes as agents
//! report it is kept in [`health`] and fanned out by the hub; resync's
//! state and counters are [`resync`]'s, its rules the hub's.

pub mod health;
pub mod hub;
pub mod monitor;
pub mod records;
pub mod replay;
pub mod resync;
pub mod signals;
