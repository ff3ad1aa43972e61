//! drover benchmarks. Run by hand (`make bench`), not in CI: timings on a
//! shared 2-core machine are noisy, so every comparison is interleaved in one
//! run against its baseline, and medians and tails are reported.
//!
//! * `start-unit`: remote `StartUnit` of a trivial oneshot through manager +
//!   agent, until `JobRemoved`, vs the same call made directly on that node's
//!   systemd bus, until systemd's `JobRemoved`. Target: overhead ≤ 1 ms median.
//!   In the same rounds, its legs: a read of one property of the unit both
//!   ways (drover's `GetUnitProperty` against the agent's own calls to
//!   systemd: the request's way through drover without a job) and a
//!   `Peer.Ping` to the manager (the bus round trip alone); and the CPU time
//!   manager and node2's agent spent on each kind of sample.
//! * `proxy`: start of a unit whose dependency lives on another node (through
//!   `drover-proxy@`), vs the same pair on one node (see `proxy.rs`). Target:
//!   overhead ≤ 5 ms median. `--helper-b PATH` compares two helper binaries in
//!   the same run: the proxy template runs A (`--helper-a PATH`, default the
//!   `drover-proxy` the sandbox found) and B by turns, one cross-node sample of
//!   each per round, interleaved with the local and node2-alone samples, and
//!   reports each helper's figures and B against A (paired, with a confidence
//!   interval for the difference of the cross-node start). `--pin-nodes` puts
//!   each node on a CPU of its own, as if nodes were machines (`pinning.rs`).
//! * `events`: unit events/s from fake agents through a release manager to
//!   1 and 10 monitors, with manager CPU and RSS (see `events.rs`).
//! * `tls`: a TLS and a plaintext cluster side by side: `StartUnit` through
//!   drover on each, interleaved (target: TLS adds ≤ 0.1 ms median), and the
//!   manager's RSS per registered session on each (see `tls.rs`).
//! * `fleet`: N simulated agents (thousands, in this process) against a
//!   release manager: time to all online (cold, after a restart, after half
//!   the fleet drops), idle CPU and memory per node, API wall times, a
//!   `StartUnit` round trip against 3 nodes, a monitor under load; CSV for
//!   `scripts/fleet-plot` (see `fleet/mod.rs`). A small fleet runs in the
//!   normal test run (`benches/tests/fleet.rs`).
//! * `ctl`: `droverctl status` and `droverctl start NODE UNIT` as whole processes
//!   (wall time, page faults, CPU, max RSS) against a small sd-bus client making
//!   bluechictl's calls, the stand-in for bluechictl, and busctl (see `ctl.rs`).
//!   Target: no slower.
//! * `agent-cpu`: the target node's agent CPU per `StartUnit`, before, while
//!   and after a cross-node start targets that node, with a node never
//!   involved as the control (see `agent_cpu.rs`). Target: unchanged.
//! * `health`: the agent's CPU per health check run (TCP, HTTP, exec), and
//!   the node's systemd's per exec check, against windows without checks
//!   (see `health.rs`). Targets: ≤ 0.2 ms (TCP, HTTP), ≤ 3 ms (exec).
//! * `flood`: a restarted agent's time to online, and all agents' after a manager
//!   restart, under 2,000 half-open TLS handshakes from 125 addresses and under 1,000
//!   silent connections from the agents' own address, interleaved with the same
//!   restarts without a flood (see `flood.rs`). Targets: ≤ 2 s and ≤ 5 s.
//! * `dns`: queries/s and latency of `drover-dns` on loopback (a load
//!   generator in-process), the zone's SOA as the baseline against a unit's
//!   A records, rounds interleaved (see `dns.rs`). Target: ≥ 20,000 queries/s.
//! * `where`: `io.drover.Controller.Where` on 10,000 simulated nodes × 200
//!   units: manager memory per index row, latency against `Peer.Ping` and
//!   `ListNodes` interleaved, and the time from a unit event to `Where`
//!   showing it against a monitor's signal (see `fleet/discovery.rs`).
//!   Targets: ≤ 2 ms p99, within 10 ms.
//! * `resync`: N simulated agents sending the real agent's resync digests
//!   for a clean run of `--duration` seconds: the manager's snapshot
//!   requests, digests and digest bytes/s, then an injected divergence
//!   repaired (see `fleet/resync.rs`). Target: 0 snapshot requests in a
//!   one-hour clean run at 2,000 nodes.
//! * also reports the idle RSS of the manager and of each agent.
//!
//! Layout: [`cli`] (the command, `start-unit` and `rss`), `proxy`, `events`,
//! `tls`, `ctl` and `agent_cpu` (one benchmark each), [`fleet`] (a library too: the test
//! drives it), `start` (one timed `StartUnit`, a process's RSS), `procfs` (what
//! `/proc` says of a process), `pinning` (nodes on CPUs of their own), `stats`
//! (medians, tails, paired overhead; pure).

mod agent_cpu;
pub mod cli;
mod ctl;
mod dns;
mod events;
pub mod fleet;
mod flood;
mod health;
mod pinning;
mod procfs;
mod proxy;
mod start;
mod stats;
mod tls;
