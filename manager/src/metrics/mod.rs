//! What the manager measures, in one home, and the two ways it is shown:
//!
//! * [`signals`] — BlueChi's D-Bus `Metrics` signals (`EnableMetrics`), as
//!   BlueChi emits them;
//! * [`counters`] — the Prometheus counters, histograms and gauges kept as
//!   things happen (a job ends, a node registers or is refused);
//! * [`dbus_calls`] — D-Bus API calls by interface, method and result;
//! * [`exposition`] — the scrape: those counters plus the few figures read at
//!   scrape time (nodes by status, per node up and last seen, jobs in flight,
//!   monitors, the process), rendered in the OpenMetrics text format and
//!   served by `drover_metrics::http` (`MetricsListenAddress=`; the server,
//!   its bounds and the process's figures are shared with the agent).
//!
//! Invariant: a scrape never walks units and never holds a lock longer than
//! one pass over the node table (an atomic read per node; a copy of each
//! row only with `MetricsPerNode=true`).

pub mod counters;
pub mod dbus_calls;
pub mod exposition;
pub mod signals;

pub use signals::Metrics;
