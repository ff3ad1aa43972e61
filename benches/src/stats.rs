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

impl Summary {
    /// `n=… min … median … p90 … p99 …`, the figures of one row of a report.
    pub fn line(&self) -> String {
        format!(
            "n={}  min {}  median {}  p90 {}  p99 {}",
            self.n,
            ms(self.min),
            ms(self.median),
            ms(self.p90),
            ms(self.p99)
        )
    }
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

/// Median and tails of samples in ms (nearest rank, as [`summarize`]).
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Spread {
    pub fn of(v: &[f64]) -> Self {
        let mut s = v.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| {
            let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
            s[rank.clamp(1, s.len()) - 1]
        };
        Spread {
            median: median_f64(v),
            p90: pct(90.0),
            p99: pct(99.0),
        }
    }
}

/// A 95% confidence interval for the median of `v` by the percentile
/// bootstrap (`resamples` resamples with replacement, a fixed seed so a run's
/// report is reproducible from its samples).
pub fn median_ci95(v: &[f64], resamples: usize) -> (f64, f64) {
    // xorshift64*: enough to draw indices, no dependency.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    };
    let mut medians: Vec<f64> = (0..resamples)
        .map(|_| {
            let draw: Vec<f64> = (0..v.len()).map(|_| v[next(v.len())]).collect();
            median_f64(&draw)
        })
        .collect();
    medians.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| medians[((q * resamples as f64) as usize).min(resamples - 1)];
    (at(0.025), at(0.975))
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
        let f: Vec<f64> = (1..=100).map(f64::from).collect();
        let sp = Spread::of(&f);
        assert_eq!((sp.p90, sp.p99), (90.0, 99.0));
    }

    #[test]
    fn the_median_interval_holds_the_median_and_narrows_with_more_samples() {
        let few: Vec<f64> = (0..30).map(|i| f64::from(i % 10)).collect();
        let many: Vec<f64> = (0..3000).map(|i| f64::from(i % 10)).collect();
        let (lo, hi) = median_ci95(&few, 1000);
        assert!(
            lo <= median_f64(&few) && median_f64(&few) <= hi,
            "{lo} {hi}"
        );
        let (mlo, mhi) = median_ci95(&many, 1000);
        assert!(mhi - mlo <= hi - lo, "[{mlo}, {mhi}] vs [{lo}, {hi}]");
    }
}
