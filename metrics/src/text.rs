//! A registry ready to render ([`Exposition`]), the two text formats a
//! scraper may ask for, and the few encoding steps both daemons' collectors
//! repeat (a lone gauge or counter, build info).
//!
//! [`Exposition::render`] writes OpenMetrics (prometheus-client's only
//! format); [`classic`] turns it into Prometheus's older text format 0.0.4,
//! for a client that does not ask for OpenMetrics (`curl`, `promtool check
//! metrics`).

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The content type of [`Exposition::render`]'s text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of [`classic`]'s text (Prometheus's text format 0.0.4).
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A registry ready to render: the figures a daemon keeps as things happen
/// and the collectors that read the rest at scrape time.
#[derive(Debug)]
pub struct Exposition {
    registry: Registry,
    /// The last scrape's length: the next one's buffer is allocated at that
    /// size plus an eighth up front, so a body of a megabyte (10,000 nodes'
    /// series) is not grown and copied a dozen times on every scrape.
    last_len: AtomicUsize,
}

/// The smallest buffer a scrape starts with.
const MIN_CAPACITY: usize = 16 * 1024;

impl Exposition {
    pub fn new(registry: Registry) -> Self {
        Self {
            registry,
            last_len: AtomicUsize::new(0),
        }
    }

    /// One scrape's text, OpenMetrics.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let last = self.last_len.load(Ordering::Relaxed);
        let mut out = String::with_capacity(last.saturating_add(last / 8).max(MIN_CAPACITY));
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        self.last_len.store(out.len(), Ordering::Relaxed);
        Ok(out)
    }
}

/// OpenMetrics text in Prometheus's older text format (0.0.4), for a
/// client that does not ask for OpenMetrics (`curl`, `promtool check
/// metrics`): a counter family `x` of OpenMetrics is named by its sample
/// `x_total` there, and there is no `# EOF` or `# UNIT`. Samples are the
/// same in both formats (no exemplars or `_created` are rendered here).
pub fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            // Held until the TYPE line says whether the name changes.
            if let Some(h) = help.replace(rest) {
                push_help(&mut out, h, false);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let counter = rest.ends_with(" counter");
            if let Some(h) = help.take() {
                push_help(&mut out, h, counter);
            }
            match rest.split_once(' ') {
                Some((name, kind)) if counter => {
                    out.push_str(&format!("# TYPE {name}_total {kind}\n"))
                }
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            continue;
        }
        if let Some(h) = help.take() {
            push_help(&mut out, h, false);
        }
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    if let Some(h) = help {
        push_help(&mut out, h, false);
    }
    out
}

fn push_help(out: &mut String, help: &str, counter: bool) {
    match help.split_once(' ') {
        Some((name, text)) if counter => out.push_str(&format!("# HELP {name}_total {text}\n")),
        _ => {
            out.push_str("# HELP ");
            out.push_str(help);
            out.push('\n');
        }
    }
}

/// `usize` as a gauge's value (saturating).
pub fn clamp(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One gauge without labels.
pub fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(value);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

/// One counter without labels (`name` without `_total`).
pub fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(value);
    c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
}

/// `NAME{version,commit} 1`: which build runs.
pub fn build_info(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    version: &str,
    commit: &str,
) -> Result<(), std::fmt::Error> {
    let mut info = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(1).encode(info.encode_family(&vec![("version", version), ("commit", commit)])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_names_counters_by_their_samples() {
        let om = "# HELP a_seconds Time.\n# TYPE a_seconds histogram\na_seconds_sum 0.0\n\
                  # HELP b Things done.\n# TYPE b counter\nb_total{x=\"y\"} 2\n\
                  # HELP c Now.\n# TYPE c gauge\n# UNIT c bytes\nc 1\n# EOF\n";
        assert_eq!(
            classic(om),
            "# HELP a_seconds Time.\n# TYPE a_seconds histogram\na_seconds_sum 0.0\n\
             # HELP b_total Things done.\n# TYPE b_total counter\nb_total{x=\"y\"} 2\n\
             # HELP c Now.\n# TYPE c gauge\nc 1\n"
        );
    }
}
