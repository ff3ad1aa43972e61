//! Sample statistics: medians and tail percentiles, never single samples.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Summary {
    pub n: usize,
    pub median: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub min: Duration,
}

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(samples: &[Duration]) -> Summary {
    let mut s = samples.to_vec();
    s.sort();
    Summary {
        n: s.len(),
        median: pct(&s, 50.0),
        p90: pct(&s, 90.0),
        p99: pct(&s, 99.0),
        min: s[0],
    }
}

pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// Pairwise differences of interleaved runs: the overhead of one path over
/// the other measured under the same machine conditions.
pub fn paired_overhead(a: &[Duration], b: &[Duration]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.as_secs_f64() * 1000.0 - y.as_secs_f64() * 1000.0)
        .collect()
}

pub fn median_f64(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<_> = (1..=100).map(Duration::from_millis).collect();
        let s = summarize(&v);
        assert_eq!(s.median, Duration::from_millis(50));
        assert_eq!(s.p99, Duration::from_millis(99));
        assert_eq!(s.min, Duration::from_millis(1));
    }
}
