//! The answer cache: one entry per unit, pure (the caller passes the time),
//! so every rule here is unit-tested without a clock or a manager.
//!
//! * An answer is **fresh** for `ttl` after it arrived; queries get it with
//!   the seconds it has left as their TTL, so a resolver that caches it never
//!   keeps it past the moment drover-dns would ask the manager again.
//! * An expired entry (or a unit seen for the first time) is fetched again,
//!   once: queries that come while the fetch runs wait for it (never a
//!   second `Where` for the same unit).
//! * Every fetch takes a token from a bucket that holds `rate` tokens and
//!   gains `rate` per second: a hard bound on the `Where` calls queries can
//!   cause, whatever names they ask for.
//! * **Serve-stale** (RFC 8767): when the fetch fails (the manager is
//!   unreachable) or no token is left, the last good answer is served with
//!   TTL `stale_ttl`, for at most `max_stale` after it arrived; a failed unit
//!   is not asked again for `ttl`. With no good answer: SERVFAIL.
//! * An answer marked incomplete (the manager is warming up) that names no
//!   node is not believed: the last good answer is served stale instead,
//!   else SERVFAIL, never a final "nowhere".
//! * At most `capacity` entries: a new unit pushes out the one used least
//!   recently (never one being fetched). New entries only come with a token,
//!   so eviction work is bounded by the rate too.
//!
//! `F` is the handle of a fetch in flight (a shared future in the server).

use crate::source::{Answer, SourceError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The cache's knobs (from dns.conf).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub ttl: Duration,
    pub stale_ttl: Duration,
    pub max_stale: Duration,
    pub capacity: usize,
    /// `Where` calls per second (and the burst).
    pub rate: u32,
}

/// What a query is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An answer and the TTL (seconds) to give it.
    Answer { answer: Arc<Answer>, ttl: u32 },
    /// Nothing to say: SERVFAIL.
    Unavailable,
}

/// What to do with a query.
#[derive(Debug, Clone)]
pub enum Decision<F> {
    Ready(Outcome),
    /// Wait for the fetch in flight.
    Wait(F),
    /// Start a fetch, register it with [`Cache::started`], wait for it.
    Fetch,
}

#[derive(Debug)]
struct Entry<F> {
    good: Option<(Arc<Answer>, Instant)>,
    /// After a failure: no new fetch before this.
    retry_at: Option<Instant>,
    inflight: Option<F>,
    used: Instant,
}

/// The token bucket bounding `Where` calls.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Option<Instant>,
}

#[derive(Debug)]
pub struct Cache<F> {
    settings: Settings,
    entries: HashMap<String, Entry<F>>,
    bucket: Bucket,
    fetches: u64,
}

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

impl<F: Clone> Cache<F> {
    pub fn new(settings: Settings) -> Self {
        let tokens = f64::from(settings.rate.max(1));
        Self {
            settings,
            entries: HashMap::new(),
            bucket: Bucket { tokens, at: None },
            fetches: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Fetches started so far (each one `Where` call).
    pub fn fetches(&self) -> u64 {
        self.fetches
    }

    fn take_token(&mut self, now: Instant) -> bool {
        let rate = f64::from(self.settings.rate.max(1));
        if let Some(at) = self.bucket.at {
            let gained = now.saturating_duration_since(at).as_secs_f64() * rate;
            self.bucket.tokens = (self.bucket.tokens + gained).min(rate);
        }
        self.bucket.at = Some(now);
        if self.bucket.tokens >= 1.0 {
            self.bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn stale(settings: &Settings, good: &Option<(Arc<Answer>, Instant)>, now: Instant) -> Outcome {
        match good {
            Some((answer, at)) if now.saturating_duration_since(*at) <= settings.max_stale => {
                Outcome::Answer {
                    answer: answer.clone(),
                    ttl: secs(settings.stale_ttl),
                }
            }
            _ => Outcome::Unavailable,
        }
    }

    /// What to do with a query for `unit` at `now`.
    pub fn decide(&mut self, unit: &str, now: Instant) -> Decision<F> {
        let ttl = self.settings.ttl;
        if let Some(entry) = self.entries.get_mut(unit) {
            entry.used = now;
            if let Some((answer, at)) = &entry.good {
                let age = now.saturating_duration_since(*at);
                if age < ttl {
                    return Decision::Ready(Outcome::Answer {
                        answer: answer.clone(),
                        ttl: secs(ttl - age),
                    });
                }
            }
            if let Some(f) = &entry.inflight {
                return Decision::Wait(f.clone());
            }
            let waiting = entry.retry_at.is_some_and(|t| now < t);
            if waiting {
                return Decision::Ready(Self::stale(&self.settings, &entry.good, now));
            }
        }
        if self.take_token(now) {
            return Decision::Fetch;
        }
        let good = self.entries.get(unit).and_then(|e| e.good.clone());
        Decision::Ready(Self::stale(&self.settings, &good, now))
    }

    /// A fetch for `unit` started (after [`Decision::Fetch`]). False when
    /// there is no room (every entry is being fetched): answer SERVFAIL.
    pub fn started(&mut self, unit: &str, fetch: F, now: Instant) -> bool {
        if !self.entries.contains_key(unit) && self.entries.len() >= self.settings.capacity {
            let victim = self
                .entries
                .iter()
                .filter(|(_, e)| e.inflight.is_none())
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone());
            match victim {
                Some(k) => {
                    self.entries.remove(&k);
                }
                None => return false,
            }
        }
        self.fetches += 1;
        let entry = self.entries.entry(unit.to_string()).or_insert(Entry {
            good: None,
            retry_at: None,
            inflight: None,
            used: now,
        });
        entry.inflight = Some(fetch);
        entry.used = now;
        true
    }

    /// The fetch for `unit` ended with `result`; returns what every query
    /// that waited for it is answered with.
    pub fn finished(
        &mut self,
        unit: &str,
        result: Result<Answer, SourceError>,
        now: Instant,
    ) -> Outcome {
        let settings = self.settings.clone();
        let Some(entry) = self.entries.get_mut(unit) else {
            return Outcome::Unavailable;
        };
        entry.inflight = None;
        match result {
            Ok(answer) if answer.complete || !answer.rows.is_empty() => {
                let answer = Arc::new(answer);
                entry.good = Some((answer.clone(), now));
                entry.retry_at = None;
                Outcome::Answer {
                    answer,
                    ttl: secs(settings.ttl),
                }
            }
            // Incomplete and empty, or failed: not an answer to keep.
            _ => {
                entry.retry_at = Some(now + settings.ttl);
                Self::stale(&settings, &entry.good, now)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Row;

    fn settings() -> Settings {
        Settings {
            ttl: Duration::from_secs(5),
            stale_ttl: Duration::from_secs(30),
            max_stale: Duration::from_secs(3600),
            capacity: 3,
            rate: 10,
        }
    }

    fn answer(nodes: &[&str]) -> Answer {
        Answer {
            rows: nodes
                .iter()
                .map(|n| Row {
                    node: (*n).into(),
                    address: "10.0.0.1".into(),
                    ports: vec![],
                })
                .collect(),
            complete: true,
        }
    }

    fn nodes(o: &Outcome) -> (Vec<String>, u32) {
        match o {
            Outcome::Answer { answer, ttl } => {
                (answer.rows.iter().map(|r| r.node.clone()).collect(), *ttl)
            }
            Outcome::Unavailable => panic!("unavailable"),
        }
    }

    fn ready(d: Decision<u32>) -> Outcome {
        match d {
            Decision::Ready(o) => o,
            other => panic!("not ready: {other:?}"),
        }
    }

    #[test]
    fn fresh_answers_count_down_then_one_fetch_serves_all_waiters() {
        let t0 = Instant::now();
        let mut c: Cache<u32> = Cache::new(settings());
        assert!(matches!(c.decide("web.service", t0), Decision::Fetch));
        assert!(c.started("web.service", 7, t0));
        // A second query while it runs waits for the same fetch.
        assert!(matches!(c.decide("web.service", t0), Decision::Wait(7)));
        let o = c.finished("web.service", Ok(answer(&["n1", "n2"])), t0);
        assert_eq!(nodes(&o), (vec!["n1".into(), "n2".into()], 5));
        let o = ready(c.decide("web.service", t0 + Duration::from_millis(2500)));
        assert_eq!(nodes(&o).1, 2);
        // Expired: fetched again, and the new answer replaces the old one.
        assert!(matches!(
            c.decide("web.service", t0 + Duration::from_secs(5)),
            Decision::Fetch
        ));
        assert!(c.started("web.service", 8, t0 + Duration::from_secs(5)));
        let o = c.finished(
            "web.service",
            Ok(answer(&["n2"])),
            t0 + Duration::from_secs(5),
        );
        assert_eq!(nodes(&o), (vec!["n2".into()], 5));
        assert_eq!(c.fetches(), 2);
    }

    #[test]
    fn a_failed_fetch_serves_the_last_good_answer_stale_and_waits_before_asking_again() {
        let t0 = Instant::now();
        let mut c: Cache<u32> = Cache::new(settings());
        assert!(matches!(c.decide("web.service", t0), Decision::Fetch));
        c.started("web.service", 1, t0);
        c.finished("web.service", Ok(answer(&["n1"])), t0);
        let t1 = t0 + Duration::from_secs(6);
        assert!(matches!(c.decide("web.service", t1), Decision::Fetch));
        c.started("web.service", 2, t1);
        let o = c.finished("web.service", Err(SourceError("gone".into())), t1);
        assert_eq!(nodes(&o), (vec!["n1".into()], 30));
        // Not asked again within one TTL of the failure: stale meanwhile.
        let o = ready(c.decide("web.service", t1 + Duration::from_secs(1)));
        assert_eq!(nodes(&o), (vec!["n1".into()], 30));
        assert!(matches!(
            c.decide("web.service", t1 + Duration::from_secs(5)),
            Decision::Fetch
        ));
        // Past max_stale, nothing is served.
        let late = t0 + Duration::from_secs(3601);
        c.started("web.service", 3, late);
        let o = c.finished("web.service", Err(SourceError("gone".into())), late);
        assert_eq!(o, Outcome::Unavailable);
        // A unit never answered: SERVFAIL when its fetch fails.
        assert!(matches!(c.decide("db.service", late), Decision::Fetch));
        c.started("db.service", 4, late);
        let o = c.finished("db.service", Err(SourceError("gone".into())), late);
        assert_eq!(o, Outcome::Unavailable);
    }

    #[test]
    fn an_incomplete_empty_answer_is_not_taken_as_nowhere() {
        let t0 = Instant::now();
        let mut c: Cache<u32> = Cache::new(settings());
        assert!(matches!(c.decide("web.service", t0), Decision::Fetch));
        c.started("web.service", 1, t0);
        let empty = Answer {
            rows: vec![],
            complete: false,
        };
        assert_eq!(
            c.finished("web.service", Ok(empty.clone()), t0),
            Outcome::Unavailable
        );
        let t1 = t0 + Duration::from_secs(5);
        assert!(matches!(c.decide("web.service", t1), Decision::Fetch));
        c.started("web.service", 2, t1);
        c.finished("web.service", Ok(answer(&["n1"])), t1);
        let t2 = t1 + Duration::from_secs(5);
        assert!(matches!(c.decide("web.service", t2), Decision::Fetch));
        c.started("web.service", 3, t2);
        let o = c.finished("web.service", Ok(empty), t2);
        assert_eq!(nodes(&o), (vec!["n1".into()], 30));
        // Complete and empty is a real answer: nowhere.
        let t3 = t2 + Duration::from_secs(5);
        assert!(matches!(c.decide("web.service", t3), Decision::Fetch));
        c.started("web.service", 4, t3);
        let o = c.finished("web.service", Ok(answer(&[])), t3);
        assert_eq!(nodes(&o), (vec![], 5));
    }

    #[test]
    fn fetches_are_bounded_by_the_rate_whatever_is_asked() {
        let t0 = Instant::now();
        let mut c: Cache<u32> = Cache::new(Settings {
            capacity: 1000,
            ..settings()
        });
        let mut fetched = 0;
        for i in 0..100u32 {
            let unit = format!("u{i}.service");
            if let Decision::Fetch = c.decide(&unit, t0) {
                c.started(&unit, i, t0);
                c.finished(&unit, Ok(answer(&[])), t0);
                fetched += 1;
            } else {
                assert_eq!(ready(c.decide(&unit, t0)), Outcome::Unavailable);
            }
        }
        assert_eq!(fetched, 10, "the burst is one second's worth");
        // Half a second later: five more tokens.
        let t1 = t0 + Duration::from_millis(500);
        let more = (100..200u32)
            .filter(|i| matches!(c.decide(&format!("u{i}.service"), t1), Decision::Fetch))
            .count();
        assert_eq!(more, 5);
        // Out of tokens, an expired entry is served stale instead.
        let t2 = t0 + Duration::from_secs(6);
        for i in 200..210u32 {
            let _ = c.decide(&format!("u{i}.service"), t2);
        }
        let o = ready(c.decide("u0.service", t2));
        assert_eq!(nodes(&o), (vec![], 30));
    }

    #[test]
    fn the_cache_stays_within_capacity_and_keeps_what_is_used() {
        let t0 = Instant::now();
        let mut c: Cache<u32> = Cache::new(settings());
        for (i, unit) in ["a.service", "b.service", "c.service"].iter().enumerate() {
            let t = t0 + Duration::from_millis(i as u64);
            assert!(matches!(c.decide(unit, t), Decision::Fetch));
            c.started(unit, 0, t);
            c.finished(unit, Ok(answer(&["n"])), t);
        }
        // a is used again; b is now the least recently used.
        let _ = c.decide("a.service", t0 + Duration::from_millis(10));
        let t = t0 + Duration::from_millis(20);
        assert!(matches!(c.decide("d.service", t), Decision::Fetch));
        assert!(c.started("d.service", 0, t));
        assert_eq!(c.len(), 3);
        assert!(matches!(c.decide("a.service", t), Decision::Ready(_)));
        assert!(matches!(c.decide("c.service", t), Decision::Ready(_)));
        // b was evicted: asking for it fetches again.
        assert!(matches!(c.decide("b.service", t), Decision::Fetch));
        // Entries being fetched are never evicted; with no room, no fetch.
        let mut full: Cache<u32> = Cache::new(Settings {
            capacity: 1,
            ..settings()
        });
        assert!(matches!(full.decide("a.service", t0), Decision::Fetch));
        assert!(full.started("a.service", 0, t0));
        assert!(matches!(full.decide("b.service", t0), Decision::Fetch));
        assert!(!full.started("b.service", 0, t0));
        assert_eq!(full.len(), 1);
    }
}
