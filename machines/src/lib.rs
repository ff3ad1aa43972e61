//! drover-machines: real Debian 12 machines on one host, booted with
//! `systemd-nspawn --boot` (systemd as PID 1, a real system bus), for
//! installing drover's packages and following the operator's path.
//!
//! Modules, one concept each:
//! * [`run`]: running a command with a deadline, its output kept;
//! * [`host`]: what the host must have, the package mirror it uses, and the
//!   cgroup hierarchies a machine is booted from;
//! * [`base`]: the base tree (debootstrap, bookworm minbase plus what the
//!   machines need), built once and cached until its inputs change;
//! * [`machine`]: one machine: an overlay of the base, its own cgroups, boot,
//!   commands inside (`nsenter`), power-off;
//! * [`fleet`]: machines on a bridge of their own, torn down in `Drop` (also
//!   on failure), `state.json` for a fleet left running, and the check that
//!   nothing is left behind;
//! * [`operator`]: what an operator does, as the README and `docs/` say:
//!   install the packages with apt, make the certificates with `drover-pki`,
//!   configure and start the daemons;
//! * `main.rs`: the `drover-machines` command (`up`, `exec`, `down`, `base`,
//!   `clean`).
//!
//! Invariants: the machines reach only each other (the bridge has no host
//! address); everything a fleet makes (bridge, veths, cgroups, overlay mounts,
//! processes, its run directory) is named after its id and removed by its
//! teardown; a fleet whose owner died is removed by the next one.

pub mod base;
pub mod fleet;
pub mod host;
pub mod machine;
pub mod operator;
pub mod run;

pub use fleet::{Fleet, FleetOptions};
pub use machine::Machine;
pub use run::Output;
