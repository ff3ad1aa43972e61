//! drover-metrics: what the manager and the agent share about their
//! Prometheus endpoints (`MetricsListenAddress=`, parsed by
//! `drover_config::metrics`), so both serve the same way and each rule has
//! one home:
//!
//! * [`http`] — the endpoint: hyper's HTTP/1 server on a listener, bounded
//!   in connections, request size and time; `GET`/`HEAD /metrics` only;
//! * [`text`] — an [`Exposition`] (a prometheus-client registry) rendered as
//!   OpenMetrics, or as Prometheus's older text format for clients that do
//!   not ask for OpenMetrics;
//! * [`process`] — a process's own CPU time, memory and descriptors, read
//!   from `/proc/self` at scrape time, and their series;
//! * [`jobs`] — systemd's job results as bounded label values.
//!
//! What each daemon shows (its series, their names and prefixes) stays in
//! that daemon: `manager/src/metrics/`, `agent/src/exposition.rs`.

pub mod http;
pub mod jobs;
pub mod process;
pub mod text;

pub use text::Exposition;
