//! drover benchmarks. Run by hand (`make bench`), not in CI: timings on a
//! shared 2-core machine are noisy, so every comparison is interleaved in one
//! run against its baseline, and medians and tails are reported.
//!
//! * `start-unit`: remote `StartUnit` of a trivial oneshot through manager +
//!   agent, until `JobRemoved`, vs the same call made directly on that node's
//!   systemd bus, until systemd's `JobRemoved`. Target: overhead ≤ 1 ms median.
//! * `proxy`: start of a unit whose dependency lives on another node (through
//!   `drover-proxy@`), vs the same pair on one node (see `proxy.rs`). Target:
//!   overhead ≤ 5 ms median. `--helper-b PATH` compares two helper binaries in
//!   the same run: the proxy template runs A (`--helper-a PATH`, default the
//!   `drover-proxy` the sandbox found) and B by turns, one cross-node sample of
//!   each per round, interleaved with the local and node2-alone samples, and
//!   reports each helper's figures and B against A (paired, with a confidence
//!   interval for the difference of the cross-node start).
//! * `events`: unit events/s from fake agents through a release manager to
//!   1 and 10 monitors, with manager CPU and RSS (see `events.rs`).
//! * `ctl`: `droverctl status` and `droverctl start NODE UNIT` as whole processes
//!   (wall time, page faults, CPU, max RSS) against busctl making the same calls on
//!   sd-bus, the stand-in for bluechictl (see `ctl.rs`). Target: no slower.
//! * also reports the idle RSS of the manager and of each agent.

//!
//! Layout: [`cli`] (the command, `start-unit` and `rss`), `proxy`, `events` and `ctl`
//! (one benchmark each), `stats` (medians, tails, paired overhead; pure).

pub mod cli;
mod ctl;
mod events;
mod proxy;
mod stats;
