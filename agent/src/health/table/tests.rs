//! The health table's bookkeeping, driven call by call: what runs, what is
//! sent, what is refused (the check machine itself: `super::super::machine`).

use super::*;
use drover_config::health::{DEFAULT_INTERVAL, DEFAULT_STARTUP_INTERVAL, DEFAULT_TIMEOUT};

fn unit(name: &str) -> UnitName {
    UnitName::new(name).unwrap()
}

fn spec(probe: Probe, retries: u32, on_failure: OnFailure) -> CheckSpec {
    CheckSpec {
        probe,
        interval: DEFAULT_INTERVAL,
        startup_interval: DEFAULT_STARTUP_INTERVAL,
        timeout: DEFAULT_TIMEOUT,
        retries,
        start_period: Duration::ZERO,
        on_failure,
    }
}

fn tcp() -> Probe {
    Probe::Tcp {
        host: "127.0.0.1".into(),
        port: 5432,
    }
}

fn decl(spec: CheckSpec) -> Result<UnitDeclaration, String> {
    Ok(UnitDeclaration {
        check: Some(spec),
        stop_when_unhealthy: false,
    })
}

fn states(a: &Actions) -> Vec<(String, HealthState)> {
    a.units
        .iter()
        .map(|(u, h)| (u.to_string(), h.state))
        .collect()
}

#[test]
fn a_check_runs_while_active_and_only_changes_are_sent() {
    let t0 = Instant::now();
    let table = HealthTable::default();
    let db = unit("db.service");
    let a = table.declare(&db, decl(spec(tcp(), 2, OnFailure::None)), false, t0);
    assert_eq!(states(&a), [("db.service".into(), HealthState::Starting)]);
    assert!(a.starts.is_empty(), "not active: nothing runs");
    let a = table.set_active(&db, true, t0);
    assert!(a.units.is_empty(), "starting → starting is no news");
    let [start] = &a.starts[..] else {
        panic!("{a:?}")
    };
    let g = start.generation;
    let key = Key::Unit(db.clone());
    let (a, pace) = table.result(&key, g, t0, &Outcome::Pass(String::new()));
    assert_eq!(states(&a), [("db.service".into(), HealthState::Healthy)]);
    assert_eq!(pace, Some(DEFAULT_INTERVAL));
    for _ in 0..10 {
        let (a, _) = table.result(&key, g, t0, &Outcome::Pass("ok".into()));
        assert!(a.is_empty(), "a confirming run sends nothing");
    }
    let (a, _) = table.result(&key, g, t0, &Outcome::Fail("refused".into()));
    assert!(a.is_empty());
    let (a, _) = table.result(&key, g, t0, &Outcome::Fail("refused".into()));
    assert_eq!(a.units[0].1.state, HealthState::Unhealthy);
    assert_eq!(a.units[0].1.reason, "refused");
    // Stopped: no verdict, the runner is stale.
    let a = table.set_active(&db, false, t0);
    assert_eq!(states(&a), [("db.service".into(), HealthState::Starting)]);
    assert_eq!(table.get(&db, t0).reason, NOT_ACTIVE);
    assert_eq!(
        table.result(&key, g, t0, &Outcome::Pass(String::new())).1,
        None
    );
}

#[test]
fn on_failure_is_asked_once_per_turn_to_unhealthy() {
    let t0 = Instant::now();
    let table = HealthTable::default();
    let db = unit("db.service");
    table.declare(&db, decl(spec(tcp(), 1, OnFailure::Restart)), false, t0);
    let g = table.set_active(&db, true, t0).starts[0].generation;
    let key = Key::Unit(db.clone());
    let (a, _) = table.result(&key, g, t0, &Outcome::Fail("down".into()));
    assert_eq!(
        a.on_failure,
        [(db.clone(), OnFailure::Restart, "down".into())]
    );
    let (a, _) = table.result(&key, g, t0, &Outcome::Fail("down".into()));
    assert!(a.on_failure.is_empty());
}

#[test]
fn bad_declarations_are_unhealthy_and_run_nothing() {
    let t0 = Instant::now();
    let table = HealthTable::default();
    let db = unit("db.service");
    let why = "/u/db.service:3: key 'HealthRetries': 'x' is not a number".to_owned();
    let a = table.declare(&db, Err(why.clone()), true, t0);
    assert_eq!(a.units[0].1, Health::new(HealthState::Unhealthy, &why, 0));
    assert!(a.starts.is_empty());
    // The same error again is no news; another one is.
    assert!(table.declare(&db, Err(why.clone()), true, t0).is_empty());
    let a = table.declare(&db, Err("other".into()), true, t0);
    assert_eq!(a.units[0].1.reason, "other");
    // Fixed: starting, and the check runs.
    let a = table.declare(&db, decl(spec(tcp(), 1, OnFailure::None)), true, t0);
    assert_eq!(states(&a), [("db.service".into(), HealthState::Starting)]);
    assert_eq!(a.starts.len(), 1);
    // The check removed: none.
    let a = table.declare(&db, Ok(UnitDeclaration::default()), true, t0);
    assert_eq!(states(&a), [("db.service".into(), HealthState::None)]);
    assert!(table.is_empty());
}

#[test]
fn an_unchanged_redeclaration_keeps_verdict_and_runner() {
    let t0 = Instant::now();
    let table = HealthTable::default();
    let db = unit("db.service");
    table.declare(&db, decl(spec(tcp(), 1, OnFailure::None)), false, t0);
    let g = table.set_active(&db, true, t0).starts[0].generation;
    table.result(&Key::Unit(db.clone()), g, t0, &Outcome::Pass(String::new()));
    let a = table.declare(&db, decl(spec(tcp(), 1, OnFailure::None)), true, t0);
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(table.get(&db, t0).state, HealthState::Healthy);
    // A changed one starts over.
    let a = table.declare(&db, decl(spec(tcp(), 2, OnFailure::None)), true, t0);
    assert_eq!(states(&a), [("db.service".into(), HealthState::Starting)]);
    assert_eq!(a.starts.len(), 1);
    assert!(a.starts[0].generation > g);
}

#[test]
fn pushed_health_expires_and_is_refused_where_not_declared() {
    let t0 = Instant::now();
    let table = HealthTable::default();
    let app = unit("app.service");
    let ttl = Duration::from_secs(30);
    assert_eq!(
        table.push(&app, HealthState::Healthy, "", ttl, t0),
        Err(PushError::NotPushed(app.clone()))
    );
    table.declare(&app, decl(spec(Probe::Push, 3, OnFailure::Stop)), false, t0);
    assert_eq!(
        table.push(&app, HealthState::Healthy, "", ttl, t0),
        Err(PushError::NotActive(app.clone()))
    );
    let a = table.set_active(&app, true, t0);
    assert!(a.starts.is_empty(), "nothing runs for a pushed unit");
    assert_eq!(table.get(&app, t0).reason, NO_REPORT_YET);
    let a = table
        .push(&app, HealthState::Healthy, "all good", ttl, t0)
        .unwrap();
    assert_eq!(states(&a), [("app.service".into(), HealthState::Healthy)]);
    let (_, g, at) = a.expiries[0].clone();
    assert_eq!(at, t0 + ttl);
    // Renewed before it expired: the old expiry changes nothing.
    let a = table
        .push(
            &app,
            HealthState::Healthy,
            "all good",
            ttl,
            t0 + Duration::from_secs(20),
        )
        .unwrap();
    assert!(a.units.is_empty());
    assert!(table.push_expired(&app, g, t0 + ttl).is_empty());
    let a = table.push_expired(&app, g, t0 + Duration::from_secs(50));
    assert_eq!(states(&a), [("app.service".into(), HealthState::Unhealthy)]);
    assert_eq!(
        a.units[0].1.reason,
        "no report within its time to live (the last one said healthy)"
    );
    assert_eq!(a.on_failure[0].1, OnFailure::Stop);
}

#[test]
fn snapshot_lists_declared_units_and_the_node() {
    let t0 = Instant::now();
    let table = HealthTable::default();
    table.declare(
        &unit("a.service"),
        decl(spec(tcp(), 1, OnFailure::None)),
        false,
        t0,
    );
    table.declare(&unit("b.service"), Err("bad".into()), false, t0);
    table.declare(
        &unit("c.service"),
        Ok(UnitDeclaration::default()),
        false,
        t0,
    );
    let a = table.set_system_state("degraded", t0);
    assert_eq!(
        a.node.as_ref().unwrap().health.state,
        HealthState::Unhealthy
    );
    assert!(table.set_system_state("degraded", t0).is_empty());
    let (units, node) = table.snapshot(t0 + Duration::from_millis(1500));
    let names: Vec<&str> = units.iter().map(|u| u.unit.as_str()).collect();
    assert_eq!(names, ["a.service", "b.service"]);
    assert_eq!(units[0].health.changed_ms_ago, 1500);
    assert_eq!(node.system_state, "degraded");
    assert_eq!(node.health.reason, "systemd is degraded");
}

#[test]
fn node_checks_change_the_node_health() {
    let t0 = Instant::now();
    let table = HealthTable::default();
    table.set_system_state("running", t0);
    let a = table.set_node_checks(vec![("disk".into(), spec(tcp(), 1, OnFailure::None))], t0);
    assert_eq!(a.node.as_ref().unwrap().health.state, HealthState::Starting);
    let g = a.starts[0].generation;
    let key = Key::Node("disk".into());
    let (a, _) = table.result(&key, g, t0, &Outcome::Pass(String::new()));
    assert_eq!(a.node.unwrap().health.state, HealthState::Healthy);
    let (a, _) = table.result(&key, g, t0, &Outcome::Pass(String::new()));
    assert!(a.node.is_none());
    let (a, _) = table.result(&key, g, t0, &Outcome::Fail("97% full".into()));
    let node = a.node.unwrap();
    assert_eq!(node.health.state, HealthState::Unhealthy);
    assert_eq!(node.health.reason, "check disk: 97% full");
}

#[test]
fn stop_when_unhealthy_follows_the_proxy_units_declaration() {
    let t0 = Instant::now();
    let table = HealthTable::default();
    let p = unit("drover-proxy@bar_db.service");
    let yes = Ok(UnitDeclaration {
        check: None,
        stop_when_unhealthy: true,
    });
    assert!(table.declare(&p, yes, true, t0).is_empty());
    assert!(table.stop_when_unhealthy(&p));
    table.retain(|_| false, t0);
    assert!(!table.stop_when_unhealthy(&p));
}
