//! The index's rules on plain data: rows follow events, go stale with
//! their node and expire, the cap evicts the unit asked about least
//! recently, and the filters of `Where`.

use super::*;
use drover_protocol::Reason;

fn unit(s: &str) -> UnitName {
    UnitName::new(s).unwrap()
}

fn node(s: &str) -> NodeName {
    NodeName::new(s).unwrap()
}

fn state(a: &str, s: &str) -> Change {
    Change::State {
        active_state: a.into(),
        sub_state: s.into(),
        reason: Reason::Real,
    }
}

fn health(state: HealthState) -> Change {
    Change::Health {
        state,
        reason: String::new(),
        since_usec: 0,
        origin: Reason::Real,
    }
}

fn names(index: &Index, u: &UnitName, f: &Filter, now: u64, retention: u64) -> Vec<String> {
    index
        .select(u, f, now, retention)
        .map(|rows| rows.map(|(n, _)| n.to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn rows_follow_the_events_of_indexed_units_only() {
    let mut ix = Index::new(8);
    let web = unit("web.service");
    let (n1, n2) = (node("n1"), node("n2"));
    ix.apply(&n1, 1, &web, &state("active", "running"), 10);
    assert_eq!(ix.row_count(), 0, "not indexed: ignored");
    assert!(ix.insert(&web).is_none());
    ix.apply(
        &n1,
        1,
        &web,
        &Change::New {
            reason: Reason::Virtual,
        },
        10,
    );
    ix.apply(&n1, 1, &web, &state("active", "running"), 11);
    ix.apply(&n2, 2, &web, &state("failed", "failed"), 12);
    let f = Filter::default();
    assert_eq!(names(&ix, &web, &f, 20, 100), ["n1"]);
    let all = Filter {
        all: true,
        ..Filter::default()
    };
    assert_eq!(names(&ix, &web, &all, 20, 100), ["n1", "n2"]);
    // The same state again does not move `since`; a new one does.
    ix.apply(&n1, 1, &web, &state("active", "running"), 30);
    let since = |ix: &Index| {
        ix.select(&web, &f, 40, 100)
            .and_then(|mut r| r.next().map(|(_, r)| r.since_usec))
    };
    assert_eq!(since(&ix), Some(11));
    ix.apply(&n1, 1, &web, &state("reloading", "reload"), 31);
    assert_eq!(since(&ix), Some(31), "reloading counts as up");
    ix.apply(
        &n1,
        1,
        &web,
        &Change::Removed {
            reason: Reason::Real,
        },
        32,
    );
    assert!(names(&ix, &web, &all, 40, 100) == ["n2"]);
    assert!(ix.select(&unit("db.service"), &f, 0, 0).is_none());
}

#[test]
fn healthy_means_up_and_healthy_or_without_a_check() {
    let mut ix = Index::new(8);
    let web = unit("web.service");
    ix.insert(&web);
    for (i, h) in HealthState::ALL.iter().enumerate() {
        let n = node(&format!("n{i}"));
        // Health may come before the state (a new watch hears it first).
        ix.apply(&n, 1, &web, &health(*h), 1);
        assert!(names(&ix, &web, &Filter::default(), 2, 9).is_empty() || i > 0);
        ix.apply(&n, 1, &web, &state("active", "running"), 2);
    }
    ix.apply(&node("n9"), 1, &web, &state("inactive", "dead"), 2);
    let healthy = Filter {
        healthy: true,
        ..Filter::default()
    };
    // n0 none, n1 starting, n2 healthy, n3 unhealthy.
    assert_eq!(names(&ix, &web, &healthy, 3, 9), ["n0", "n2"]);
    assert_eq!(
        names(&ix, &web, &Filter::default(), 3, 9),
        ["n0", "n1", "n2", "n3"]
    );
    // `all` does not widen `healthy`.
    let both = Filter {
        healthy: true,
        all: true,
        ..Filter::default()
    };
    assert_eq!(names(&ix, &web, &both, 3, 9), ["n0", "n2"]);
}

#[test]
fn an_offline_node_goes_stale_then_expires_or_comes_back_fresh() {
    let mut ix = Index::new(8);
    let (web, db) = (unit("web.service"), unit("db.service"));
    let (n1, n2) = (node("n1"), node("n2"));
    ix.insert(&web);
    ix.insert(&db);
    ix.apply(&n1, 5, &web, &state("active", "running"), 1);
    ix.apply(&n1, 5, &db, &state("active", "running"), 1);
    ix.apply(&n2, 6, &web, &state("active", "running"), 1);
    assert_eq!(ix.node_offline(&n1, 4, 100), 0, "not its session");
    assert_eq!(ix.node_offline(&n1, 5, 100), 2);
    let stale = Filter {
        stale: true,
        ..Filter::default()
    };
    assert_eq!(names(&ix, &web, &Filter::default(), 150, 1000), ["n2"]);
    assert_eq!(names(&ix, &web, &stale, 150, 1000), ["n1", "n2"]);
    let row = ix
        .select(&web, &stale, 150, 1000)
        .and_then(|mut r| r.next().map(|(_, r)| r.clone()))
        .unwrap();
    assert_eq!((row.stale_since_usec, row.since_usec), (Some(100), 100));
    // Past the retention it is left out at once, removed by `expire`.
    assert_eq!(names(&ix, &web, &stale, 1100, 1000), ["n2"]);
    // Back with session 7: web is reported again, db is not.
    ix.apply(&n1, 7, &web, &state("active", "running"), 200);
    assert_eq!(
        names(&ix, &web, &Filter::default(), 210, 1000),
        ["n1", "n2"]
    );
    let row = ix
        .select(&web, &Filter::default(), 210, 1000)
        .and_then(|mut r| r.next().map(|(_, r)| r.clone()))
        .unwrap();
    assert_eq!(
        (row.stale_since_usec, row.since_usec, row.session),
        (None, 200, 7)
    );
    assert_eq!(ix.expire(&n1, 5), 1, "db's stale row of session 5");
    assert_eq!(names(&ix, &db, &stale, 210, 1000), Vec::<String>::new());
    // drop_stale keeps the current session's rows.
    ix.apply(&n2, 6, &db, &state("active", "running"), 1);
    ix.node_offline(&n2, 6, 300);
    ix.apply(&n2, 8, &web, &state("active", "running"), 301);
    assert_eq!(ix.drop_stale(&n2, 8), 1);
    assert_eq!(
        names(&ix, &web, &Filter::default(), 310, 1000),
        ["n1", "n2"]
    );
}

#[test]
fn the_cap_evicts_the_unit_asked_about_least_recently() {
    let mut ix = Index::new(2);
    let (a, b, c) = (unit("a.service"), unit("b.service"), unit("c.service"));
    assert_eq!(ix.insert(&a), None);
    assert_eq!(ix.insert(&b), None);
    ix.touch(&a);
    assert_eq!(ix.insert(&c), Some(b.clone()));
    assert!(ix.contains(&a) && ix.contains(&c) && !ix.contains(&b));
    assert_eq!(ix.len(), 2);
    assert_eq!(ix.insert(&c), None, "already there");
}

#[test]
fn node_filters_parse_names_and_patterns_and_refuse_garbage() {
    let mut ix = Index::new(2);
    let web = unit("web.service");
    ix.insert(&web);
    for n in ["edge-1", "edge-2", "core-1"] {
        ix.apply(&node(n), 1, &web, &state("active", "running"), 1);
    }
    let with = |glob: &str| Filter {
        nodes: NodeFilter::parse(glob).unwrap(),
        ..Filter::default()
    };
    assert_eq!(names(&ix, &web, &with("*"), 2, 9).len(), 3);
    assert_eq!(
        names(&ix, &web, &with("edge-*"), 2, 9),
        ["edge-1", "edge-2"]
    );
    assert_eq!(names(&ix, &web, &with("core-1"), 2, 9), ["core-1"]);
    assert!(names(&ix, &web, &with("nope"), 2, 9).is_empty());
    for bad in [
        "a**",
        "[",
        "edge/1",
        "x\u{0}",
        &"a*".repeat(200),
        &"a".repeat(10_000),
    ] {
        assert!(NodeFilter::parse(bad).is_err(), "{bad}");
    }
}
