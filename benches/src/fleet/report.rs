//! The figures of one fleet run ([`Row`]) and their CSV form: one header,
//! one line per run, appended to the file so runs made one by one end up in
//! one table (`scripts/fleet-plot` draws it). Pure.

use std::fmt::Write as _;

/// Everything measured at one fleet size and transport. Times in seconds or
/// milliseconds as the column name says; memory in KiB; `None` when the
/// phase did not run (written as an empty field).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub nodes: usize,
    pub transport: String,
    /// Load average (1 min) of the machine when the run started.
    pub load_at_start: f64,
    pub online_cold_s: f64,
    /// Failed connects, handshakes cut off, refusals while all came online.
    pub cold_failed: (u64, u64, u64),
    pub idle_seconds: f64,
    pub idle_cpu_pct: f64,
    /// The load generator's own CPU in the same window (shares the cores).
    pub generator_cpu_pct: f64,
    /// Manager with no node connected.
    pub rss_empty_kib: u64,
    pub anon_empty_kib: u64,
    /// Manager with every node online, idle.
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub list_nodes_ms: Option<f64>,
    pub status_ms: Option<f64>,
    pub start_ms: Option<f64>,
    pub start_3_ms: Option<f64>,
    pub list_units_ms: Option<f64>,
    pub list_units_rows: Option<usize>,
    pub list_units_peak_kib: Option<u64>,
    pub list_units_error: Option<String>,
    /// `droverctl list-units` over every node (node by node): wall time,
    /// rows printed, droverctl's peak RSS, the manager's peak RSS meanwhile.
    pub ctl_list_ms: Option<f64>,
    pub ctl_list_rows: Option<usize>,
    pub ctl_list_peak_kib: Option<u64>,
    pub ctl_list_manager_peak_kib: Option<u64>,
    pub ctl_list_error: Option<String>,
    /// A monitor on `*`: `UnitStateChanged` heard of the replay, and the
    /// loaded units there are.
    pub star_replay: Option<(u64, u64)>,
    pub monitor_per_s: Option<f64>,
    pub monitor_p50_ms: Option<f64>,
    pub monitor_p99_ms: Option<f64>,
    pub monitor_sent: Option<u64>,
    pub monitor_lost: Option<u64>,
    pub online_half_s: Option<f64>,
    pub half_failed: Option<(u64, u64, u64)>,
    pub online_restart_s: Option<f64>,
    pub restart_failed: Option<(u64, u64, u64)>,
    /// With health checks declared: the units with a check the manager
    /// listed, the verdict flips sent in the windows with flips, and the
    /// manager's CPU with flips minus without (median of the pairs, % of a
    /// core).
    pub health_units: Option<usize>,
    pub health_flips: Option<u64>,
    pub health_extra_cpu_pct: Option<f64>,
}

impl Row {
    /// Manager memory per node: (RSS, RssAnon) over the empty manager, KiB.
    pub fn per_node_kib(&self) -> (f64, f64) {
        let n = self.nodes.max(1) as f64;
        (
            self.rss_kib.saturating_sub(self.rss_empty_kib) as f64 / n,
            self.anon_kib.saturating_sub(self.anon_empty_kib) as f64 / n,
        )
    }
}

/// The CSV header, in the order of [`csv_line`].
pub const HEADER: &str = "nodes,transport,load_at_start,online_cold_s,cold_connect_failed,\
cold_handshake_failed,cold_refused,idle_seconds,idle_cpu_pct,generator_cpu_pct,rss_empty_kib,\
anon_empty_kib,rss_kib,anon_kib,rss_per_node_kib,anon_per_node_kib,list_nodes_ms,status_ms,\
start_ms,start_3_ms,list_units_ms,list_units_rows,list_units_peak_kib,list_units_error,\
star_replay_heard,star_replay_units,monitor_per_s,monitor_p50_ms,monitor_p99_ms,monitor_sent,monitor_lost,online_half_s,\
half_failed,online_restart_s,restart_connect_failed,restart_handshake_failed,restart_refused,\
ctl_list_ms,ctl_list_rows,ctl_list_peak_kib,ctl_list_manager_peak_kib,ctl_list_error,\
health_units,health_flips,health_extra_cpu_pct";

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map(ToString::to_string).unwrap_or_default()
}

fn optf(v: Option<f64>, places: usize) -> String {
    v.map(|v| format!("{v:.places$}")).unwrap_or_default()
}

/// A field with no comma, quote or line break (errors are free text).
fn field(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            ',' | '"' | '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

/// One CSV line for `row` (no line break).
pub fn csv_line(row: &Row) -> String {
    let (rss_n, anon_n) = row.per_node_kib();
    let mut s = String::new();
    let _ = write!(
        s,
        "{},{},{:.2},{:.3},{},{},{},{:.1},{:.2},{:.2},{},{},{},{},{:.2},{:.2},",
        row.nodes,
        field(&row.transport),
        row.load_at_start,
        row.online_cold_s,
        row.cold_failed.0,
        row.cold_failed.1,
        row.cold_failed.2,
        row.idle_seconds,
        row.idle_cpu_pct,
        row.generator_cpu_pct,
        row.rss_empty_kib,
        row.anon_empty_kib,
        row.rss_kib,
        row.anon_kib,
        rss_n,
        anon_n,
    );
    let half = row
        .half_failed
        .map(|(a, b, c)| (a + b + c).to_string())
        .unwrap_or_default();
    let (rc, rh, rr) = match row.restart_failed {
        Some((a, b, c)) => (a.to_string(), b.to_string(), c.to_string()),
        None => Default::default(),
    };
    let _ = write!(
        s,
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
        optf(row.list_nodes_ms, 3),
        optf(row.status_ms, 3),
        optf(row.start_ms, 3),
        optf(row.start_3_ms, 3),
        optf(row.list_units_ms, 1),
        opt(&row.list_units_rows),
        opt(&row.list_units_peak_kib),
        field(row.list_units_error.as_deref().unwrap_or("")),
        opt(&row.star_replay.map(|r| r.0)),
        opt(&row.star_replay.map(|r| r.1)),
        optf(row.monitor_per_s, 0),
        optf(row.monitor_p50_ms, 2),
        optf(row.monitor_p99_ms, 2),
        opt(&row.monitor_sent),
        opt(&row.monitor_lost),
        optf(row.online_half_s, 3),
        half,
        optf(row.online_restart_s, 3),
        rc,
        rh,
        rr,
    );
    let _ = write!(
        s,
        ",{},{},{},{},{},{},{},{}",
        optf(row.ctl_list_ms, 1),
        opt(&row.ctl_list_rows),
        opt(&row.ctl_list_peak_kib),
        opt(&row.ctl_list_manager_peak_kib),
        field(row.ctl_list_error.as_deref().unwrap_or("")),
        opt(&row.health_units),
        opt(&row.health_flips),
        optf(row.health_extra_cpu_pct, 3),
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_a_field_for_every_column() {
        let columns = HEADER.split(',').count();
        let empty = Row::default();
        assert_eq!(csv_line(&empty).split(',').count(), columns);
        let full = Row {
            nodes: 10,
            transport: "tls".into(),
            rss_empty_kib: 1000,
            rss_kib: 1200,
            list_units_error: Some("too big, \"really\"\nyes".into()),
            half_failed: Some((1, 2, 3)),
            restart_failed: Some((4, 5, 6)),
            start_ms: Some(0.5),
            ctl_list_rows: Some(7),
            ctl_list_error: Some("exit 1, 7 rows".into()),
            ..Row::default()
        };
        let line = csv_line(&full);
        assert_eq!(line.split(',').count(), columns, "{line}");
        assert!(line.starts_with("10,tls,"));
        assert!(line.contains(",20.00,"), "RSS per node: {line}");
        assert!(line.ends_with(",6,,4,5,6,,7,,,exit 1  7 rows,,,"), "{line}");
        assert!(!line.contains('"') && !line.contains('\n'));
    }
}
