//! The reference rules, driven event by event with paused tokio time.

use super::*;
use drover_protocol::dep_unit::dep_target;
use tokio::time::advance;

const GRACE: Duration = Duration::from_secs(18);
const S_A: u64 = 10;
const S_A2: u64 = 11;
const S_B: u64 = 20;
const S_C: u64 = 30;

fn n(s: &str) -> NodeName {
    NodeName::new(s).unwrap()
}

fn u(s: &str) -> UnitName {
    UnitName::new(s).unwrap()
}

/// Nodes a, b, c, d; a and c may depend on b; d on nothing.
fn policy() -> Policy {
    Policy::new(
        ["a", "b", "c", "d"].map(n),
        [(n("a"), vec![n("b")]), (n("c"), vec![n("b")])],
        GRACE,
    )
}

fn now() -> Instant {
    Instant::now()
}

/// a, b and c online.
fn setup() -> References {
    let mut r = References::new(policy());
    r.node_online(&n("a"), S_A, now());
    r.node_online(&n("b"), S_B, now());
    r.node_online(&n("c"), S_C, now());
    r
}

fn notices(actions: &[Action]) -> Vec<(String, Notice)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Notify { to, notice, .. } => Some((to.to_string(), notice.clone())),
            _ => None,
        })
        .collect()
}

fn node_offline(proxy_id: u64, offline_for_ms: Option<u64>) -> Notice {
    Notice::TargetNodeOffline {
        proxy_id,
        offline_for_ms,
    }
}

fn state(active: &str, reason: Reason) -> TargetChange {
    TargetChange::State {
        active_state: active.into(),
        sub_state: "x".into(),
        reason,
    }
}

fn target_notice(id: u64, change: TargetChange) -> Notice {
    Notice::ProxyTarget {
        proxy_id: id,
        change,
    }
}

/// Sends every pending dep command, acknowledges it, and returns them as
/// (start?, unit) — in the order they would go out.
fn ack_all(r: &mut References) -> Vec<(bool, String)> {
    let mut sent = Vec::new();
    loop {
        let cmds = r.dep_commands();
        if cmds.is_empty() {
            return sent;
        }
        for cmd in cmds {
            sent.push((cmd.start, cmd.unit.to_string()));
            r.dep_result(&cmd, DepOutcome::Done);
        }
    }
}

fn row_states(r: &References) -> Vec<(String, String, &'static str, String, u32)> {
    r.rows()
        .into_iter()
        .map(|row| {
            (
                row.requester.to_string(),
                format!("{}:{}", row.node, row.unit),
                row.state,
                row.target_state,
                row.references,
            )
        })
        .collect()
}

#[test]
fn dep_unit_names() {
    assert_eq!(
        dep_target("drover-dep@db.service.service"),
        Some(u("db.service"))
    );
    assert_eq!(
        dep_target("drover-dep@x@y.socket.service"),
        Some(u("x@y.socket"))
    );
    assert_eq!(dep_target("drover-dep@.service"), None);
    assert_eq!(dep_target("drover-dep@db.service"), None, "no type left");
    assert_eq!(dep_target("other@db.service.service"), None);
}

#[tokio::test(start_paused = true)]
async fn unknown_and_not_allowed_nodes_get_proxy_error() {
    let mut r = setup();
    let out = r.proxy_new(&n("a"), S_A, &n("nowhere"), &u("db.service"), 1, now());
    assert_eq!(
        notices(&out),
        [(
            "a".into(),
            Notice::ProxyError {
                proxy_id: 1,
                message: "no such node nowhere".into()
            }
        )]
    );
    let out = r.proxy_new(&n("d"), 40, &n("b"), &u("db.service"), 2, now());
    assert_eq!(
        notices(&out),
        [(
            "d".into(),
            Notice::ProxyError {
                proxy_id: 2,
                message: "node d may not depend on units of node b: add b to AllowDependenciesOn in [node d]".into()
            }
        )]
    );
    // Default deny also covers a node's own units and unlisted pairs.
    assert!(policy().check(&n("b"), &n("b")).is_err());
    assert!(policy().check(&n("a"), &n("c")).is_err());
    // Nothing is watched, nothing sent to b; the refused proxy is listed as
    // failed (only for a node that exists).
    assert!(!out.iter().any(|a| matches!(a, Action::Watch { .. })));
    assert!(r.dep_commands().is_empty());
    assert_eq!(
        row_states(&r),
        [(
            "d".into(),
            "b:db.service".into(),
            "failed",
            "unknown".into(),
            0
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn a_node_unknown_to_the_config_becomes_a_target_once_online() {
    // "e" is in no list (a node admitted by its certificate alone); the
    // config lets a depend on it.
    let policy = Policy::new(
        ["a", "b"].map(n),
        [(n("a"), vec![n("b"), n("e")]), (n("e"), vec![n("a")])],
        GRACE,
    );
    let mut r = References::new(policy);
    r.node_online(&n("a"), S_A, now());
    let out = r.proxy_new(&n("a"), S_A, &n("e"), &u("db.service"), 1, now());
    assert_eq!(
        notices(&out),
        [(
            "a".into(),
            Notice::ProxyError {
                proxy_id: 1,
                message: "no such node e".into()
            }
        )]
    );
    r.node_online(&n("e"), 50, now());
    let out = r.proxy_new(&n("a"), S_A, &n("e"), &u("db.service"), 2, now());
    assert!(notices(&out).is_empty(), "{out:?}");
    assert!(
        out.iter().any(|a| matches!(a, Action::Watch { .. })),
        "{out:?}"
    );
    assert_eq!(r.dep_commands().len(), 1);
    // As a requester it needed nothing more: a requester is online.
    assert!(r.policy().check(&n("e"), &n("a")).is_ok());
}

#[test]
fn with_certified_admission_a_named_target_is_known_before_it_registers() {
    let section = |name: &str, allowed: Option<bool>, deps: &[&str]| drover_config::NodeSection {
        name: n(name),
        allowed,
        allow_dependencies_on: deps.iter().map(|d| n(d)).collect(),
    };
    let mut config = ManagerConfig {
        allowed_nodes: vec![n("a")],
        nodes: vec![
            section("a", None, &["e", "banned"]),
            section("banned", Some(false), &[]),
        ],
        ..ManagerConfig::default()
    };
    // Names only: e is nobody until it registers.
    let names_only = Policy::from_config(&config, [n("a")]);
    assert_eq!(
        names_only.check(&n("a"), &n("e")),
        Err("no such node e".into())
    );
    // Certified admission: e may come, so a's proxy waits for it; a node
    // kept out by Allowed=false stays unknown.
    config.tls = Some(drover_config::TlsFiles {
        certificate: "/x/m.pem".into(),
        private_key: "/x/m.key".into(),
        ca_bundle: "/x/ca.pem".into(),
        crl: None,
    });
    config.allow_certified_nodes = true;
    let certified = Policy::from_config(&config, [n("a")]);
    assert_eq!(certified.check(&n("a"), &n("e")), Ok(()));
    assert_eq!(
        certified.check(&n("a"), &n("banned")),
        Err("no such node banned".into())
    );
    // Only names some node may depend on: any other stays unknown.
    assert!(certified.check(&n("a"), &n("zzz")).is_err());
}

#[test]
fn with_a_pattern_a_matching_named_target_is_known_before_it_registers() {
    let config = ManagerConfig::parse_str(
        "[drover-manager]\nAllowedNodeNames=a,edge-*\n\
         [node a]\nAllowDependenciesOn=edge-1,other,edge-9\n\
         [node edge-9]\nAllowed=false\n",
    )
    .unwrap();
    let policy = Policy::from_config(&config, [n("a")]);
    assert_eq!(policy.check(&n("a"), &n("edge-1")), Ok(()));
    // No pattern admits it, or Allowed=false keeps it out: nobody until it
    // registers (and it cannot).
    assert_eq!(
        policy.check(&n("a"), &n("other")),
        Err("no such node other".into())
    );
    assert_eq!(
        policy.check(&n("a"), &n("edge-9")),
        Err("no such node edge-9".into())
    );
}

#[tokio::test(start_paused = true)]
async fn first_reference_watches_starts_dep_and_relays_state() {
    let mut r = setup();
    let out = r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    assert_eq!(
        out,
        [Action::Watch {
            node: n("b"),
            unit: u("db.service")
        }]
    );
    let cmds = r.dep_commands();
    assert_eq!(cmds.len(), 1);
    assert!(cmds[0].start);
    assert_eq!(cmds[0].session, S_B);
    assert!(
        r.dep_commands().is_empty(),
        "one command in flight per target"
    );
    r.dep_result(&cmds[0], DepOutcome::Done);
    assert!(r.dep_commands().is_empty(), "acknowledged");
    assert_eq!(
        row_states(&r),
        [(
            "a".into(),
            "b:db.service".into(),
            "waiting",
            "unknown".into(),
            1
        )]
    );

    // The watch replays the known state (virtual), then real changes follow.
    for change in [
        TargetChange::New {
            reason: Reason::Virtual,
        },
        state("activating", Reason::Virtual),
        state("activating", Reason::Real),
    ] {
        let out = r.target_event(&n("b"), &u("db.service"), &change);
        assert_eq!(notices(&out), [("a".into(), target_notice(1, change))]);
    }
    assert_eq!(row_states(&r)[0].2, "waiting");
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    assert_eq!(
        row_states(&r),
        [(
            "a".into(),
            "b:db.service".into(),
            "active",
            "active".into(),
            1
        )]
    );
    // Events of other units or unwatched targets are not relayed.
    assert!(
        r.target_event(&n("b"), &u("other.service"), &state("failed", Reason::Real))
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn second_requester_shares_the_dep() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));

    let out = r.proxy_new(&n("c"), S_C, &n("b"), &u("db.service"), 7, now());
    assert!(!out.iter().any(|a| matches!(a, Action::Watch { .. })));
    // c hears of the target once B confirms the start that covers it (see
    // a_later_requester_waits_for_the_start_that_covers_it).
    assert!(notices(&out).is_empty(), "{out:?}");
    // The re-add sends StartDep again (it covers a dep stopped with its target).
    assert_eq!(ack_all(&mut r), [(true, "db.service".into())]);
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 2);
    assert!(
        row_states(&r)
            .iter()
            .all(|row| row.2 == "active" && row.4 == 2)
    );

    // One goes: the dep stays. The last goes: StopDep and unwatch.
    assert!(
        r.proxy_removed(&n("a"), &n("b"), &u("db.service"), 1, now())
            .is_empty()
    );
    assert!(ack_all(&mut r).is_empty());
    let out = r.proxy_removed(&n("c"), &n("b"), &u("db.service"), 7, now());
    assert_eq!(
        out,
        [Action::Unwatch {
            node: n("b"),
            unit: u("db.service")
        }]
    );
    assert_eq!(ack_all(&mut r), [(false, "db.service".into())]);
    assert!(r.rows().is_empty());
    assert!(
        r.targets.is_empty(),
        "nothing left once the stop is acknowledged"
    );
}

fn state_sub(active: &str, sub: &str, reason: Reason) -> TargetChange {
    TargetChange::State {
        active_state: active.into(),
        sub_state: sub.into(),
        reason,
    }
}

#[tokio::test(start_paused = true)]
async fn two_proxies_of_one_requester_for_one_target_both_count_and_keep_the_dep_in_order() {
    // Node a runs a unit written for BlueChi (bluechi-proxy@b_db.service,
    // proxy 1) and one written for drover (drover-proxy@b_db.service, proxy 2).
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    let first = r.dep_commands();
    assert_eq!(first.len(), 1);
    // While StartDep #1 is in flight, the second proxy arrives.
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 2, now());
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 2);
    assert!(
        r.dep_commands().is_empty(),
        "serialised behind the one in flight"
    );
    r.dep_result(&first[0], DepOutcome::Done);
    let second = r.dep_commands();
    assert_eq!(second.len(), 1);
    assert!(second[0].start && second[0].generation > first[0].generation);
    r.dep_result(&second[0], DepOutcome::Done);
    assert_eq!(r.rows().len(), 2, "one row per proxy");
    let out = r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    assert_eq!(
        notices(&out),
        [
            ("a".into(), target_notice(1, state("active", Reason::Real))),
            ("a".into(), target_notice(2, state("active", Reason::Real))),
        ]
    );
    // The same proxy announced again in the same session is still one.
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 2, now());
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 2);
    ack_all(&mut r);
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));

    // One released: the other keeps the dep.
    assert!(notices(&r.proxy_removed(&n("a"), &n("b"), &u("db.service"), 1, now())).is_empty());
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 1);
    assert!(r.dep_commands().is_empty(), "no StopDep while one is left");
    assert!(r.dep_wanted(&n("b"), &u("db.service")));

    // Both released: the dep stops. Added again while the StopDep is in
    // flight: the StartDep follows the StopDep, never the other way round.
    r.proxy_removed(&n("a"), &n("b"), &u("db.service"), 2, now());
    let stop = r.dep_commands();
    assert!(!stop[0].start);
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 3, now());
    assert!(r.dep_commands().is_empty());
    r.dep_result(&stop[0], DepOutcome::Done);
    assert_eq!(ack_all(&mut r), [(true, "db.service".into())]);
}

#[tokio::test(start_paused = true)]
async fn two_proxies_of_one_requester_resume_each_and_the_unannounced_one_goes_after_grace() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 2, now());
    ack_all(&mut r);
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    r.node_offline(&n("a"), now());
    // The agent restarted: it adopts both proxy units, with new ids.
    r.node_online(&n("a"), S_A2, now());
    for id in [7, 8] {
        let out = r.proxy_new(&n("a"), S_A2, &n("b"), &u("db.service"), id, now());
        assert_eq!(
            notices(&out).last(),
            Some(&(
                "a".into(),
                target_notice(id, state("active", Reason::Virtual))
            )),
            "proxy {id} resumes with the target's state"
        );
    }
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 2);
    assert!(r.dep_commands().is_empty(), "nothing happens on b");
    advance(GRACE + Duration::from_secs(1)).await;
    r.tick(now());
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 2);

    // Once more, but only one of the two comes back: the other goes after
    // the grace period, and the dep stays for the one left.
    r.node_offline(&n("a"), now());
    r.node_online(&n("a"), 12, now());
    r.proxy_new(&n("a"), 12, &n("b"), &u("db.service"), 1, now());
    advance(GRACE - Duration::from_secs(1)).await;
    r.tick(now());
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 2, "within grace");
    advance(Duration::from_secs(2)).await;
    r.tick(now());
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 1);
    assert!(r.dep_commands().is_empty());
    assert!(r.dep_wanted(&n("b"), &u("db.service")));
}

#[tokio::test(start_paused = true)]
async fn start_dep_failure_fails_the_waiting_requesters_only() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    // c arrives; its StartDep fails (say the dep's unit file broke meanwhile).
    r.proxy_new(&n("c"), S_C, &n("b"), &u("db.service"), 5, now());
    // c was completed by the replay of `active`: make a waiting one instead
    // (c's agent releases proxy 5 and announces a new one).
    r.target_event(
        &n("b"),
        &u("db.service"),
        &state("activating", Reason::Real),
    );
    r.proxy_removed(&n("c"), &n("b"), &u("db.service"), 5, now());
    r.proxy_new(&n("c"), S_C, &n("b"), &u("db.service"), 6, now());
    let cmds = r.dep_commands();
    assert_eq!(cmds.len(), 1);
    let out = r.dep_result(
        &cmds[0],
        DepOutcome::Failed("unit db.service on node b cannot be started: bad-setting".into()),
    );
    assert_eq!(
        notices(&out),
        [(
            "c".into(),
            Notice::ProxyError {
                proxy_id: 6,
                message: "unit db.service on node b cannot be started: bad-setting".into()
            }
        )]
    );
    let rows = row_states(&r);
    assert_eq!(rows[0].2, "active", "a was active and stays");
    assert_eq!(rows[1].2, "failed");
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 1);
    // Not retried on its own.
    assert!(r.dep_commands().is_empty());

    // A unit that does not exist: the only (waiting) requester fails and
    // the dep is stopped again.
    r.proxy_new(&n("a"), S_A, &n("b"), &u("missing.service"), 9, now());
    let cmds = r.dep_commands();
    let out = r.dep_result(
        &cmds[0],
        DepOutcome::Failed("Unit missing.service not found.".into()),
    );
    assert!(
        matches!(&notices(&out)[0].1, Notice::ProxyError { proxy_id: 9, message } if message.contains("not found"))
    );
    assert!(out.contains(&Action::Unwatch {
        node: n("b"),
        unit: u("missing.service")
    }));
    assert_eq!(ack_all(&mut r), [(false, "missing.service".into())]);
    // The agent forgets the failed proxy: it stays listed for a grace period.
    r.proxy_removed(&n("a"), &n("b"), &u("missing.service"), 9, now());
    assert!(
        r.rows()
            .iter()
            .any(|row| row.unit.as_str() == "missing.service" && row.state == "failed")
    );
    advance(GRACE).await;
    r.tick(now());
    assert!(
        !r.rows()
            .iter()
            .any(|row| row.unit.as_str() == "missing.service")
    );
}

#[tokio::test(start_paused = true)]
async fn real_target_failure_fails_waiting_and_ends_active_proxies() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    // B going offline (virtual inactive/agent-offline, virtual removal)
    // while waiting changes nothing.
    r.target_event(
        &n("b"),
        &u("db.service"),
        &TargetChange::State {
            active_state: "inactive".into(),
            sub_state: AGENT_OFFLINE.into(),
            reason: Reason::Virtual,
        },
    );
    r.target_event(
        &n("b"),
        &u("db.service"),
        &TargetChange::Removed {
            reason: Reason::Virtual,
        },
    );
    assert_eq!(row_states(&r)[0].2, "waiting");
    r.target_event(&n("b"), &u("db.service"), &state("failed", Reason::Real));
    assert_eq!(row_states(&r)[0].2, "failed");
    assert_eq!(ack_all(&mut r), [(false, "db.service".into())]);

    // Active, then a real stop: the reference ends (agent a stops its proxy
    // unit and its ProxyRemoved finds nothing).
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 2, now());
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    ack_all(&mut r);
    let out = r.target_event(&n("b"), &u("db.service"), &state("inactive", Reason::Real));
    assert_eq!(notices(&out).len(), 1, "relayed to a");
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 0);
    assert!(r.rows().is_empty(), "ended proxies are not listed");
    assert_eq!(ack_all(&mut r), [(false, "db.service".into())]);
    assert!(
        r.proxy_removed(&n("a"), &n("b"), &u("db.service"), 2, now())
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn requester_back_within_grace_resumes_without_touching_the_target() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    r.proxy_new(&n("a"), S_A, &n("b"), &u("web.service"), 2, now());
    ack_all(&mut r);
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    r.node_offline(&n("a"), now());
    // Changes of the target while a is away are not sent anywhere, but
    // they are applied: web becomes active.
    let out = r.target_event(&n("b"), &u("web.service"), &state("active", Reason::Real));
    assert!(notices(&out).is_empty());
    advance(GRACE - Duration::from_secs(1)).await;
    assert!(notices(&r.tick(now())).is_empty());
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 1);

    // Back, with new proxy ids (its agent restarted): matched on (a, b, unit).
    r.node_online(&n("a"), S_A2, now());
    let out = r.proxy_new(&n("a"), S_A2, &n("b"), &u("db.service"), 100, now());
    assert_eq!(
        notices(&out),
        [
            (
                "a".into(),
                target_notice(
                    100,
                    TargetChange::New {
                        reason: Reason::Virtual
                    }
                )
            ),
            (
                "a".into(),
                target_notice(100, state("active", Reason::Virtual))
            ),
        ]
    );
    r.proxy_new(&n("a"), S_A2, &n("b"), &u("web.service"), 101, now());
    assert!(r.dep_commands().is_empty(), "nothing happens on b");
    // Past the old deadline nothing is dropped.
    advance(Duration::from_secs(5)).await;
    r.tick(now());
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 1);
    assert_eq!(r.live_count(&n("b"), &u("web.service")), 1);
    // New ids are the ones notices use now.
    let out = r.target_event(&n("b"), &u("db.service"), &state("failed", Reason::Real));
    assert!(matches!(
        notices(&out)[0].1,
        Notice::ProxyTarget { proxy_id: 100, .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn requester_away_past_grace_loses_its_references() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    r.proxy_new(&n("c"), S_C, &n("b"), &u("db.service"), 2, now());
    r.proxy_new(&n("a"), S_A, &n("b"), &u("web.service"), 3, now());
    ack_all(&mut r);
    r.node_offline(&n("a"), now());
    assert_eq!(r.next_deadline(), Some(now() + GRACE));
    // Back online but never re-announcing web (its proxy is gone on a).
    advance(Duration::from_secs(2)).await;
    r.node_online(&n("a"), S_A2, now());
    r.proxy_new(&n("a"), S_A2, &n("b"), &u("db.service"), 1, now());
    advance(GRACE).await;
    let out = r.tick(now());
    assert!(out.contains(&Action::Unwatch {
        node: n("b"),
        unit: u("web.service")
    }));
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 2);
    assert_eq!(ack_all(&mut r), [(false, "web.service".into())]);

    // a goes away for good: db still has c, so only web... nothing else stops.
    r.node_offline(&n("a"), now());
    advance(GRACE).await;
    r.tick(now());
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 1);
    assert!(ack_all(&mut r).is_empty(), "c still holds db");
    r.node_offline(&n("c"), now());
    advance(GRACE).await;
    r.tick(now());
    assert_eq!(ack_all(&mut r), [(false, "db.service".into())]);
}

#[tokio::test(start_paused = true)]
async fn zero_grace_drops_at_once() {
    let mut r = References::new(Policy::new(
        ["a", "b"].map(n),
        [(n("a"), vec![n("b")])],
        Duration::ZERO,
    ));
    r.node_online(&n("a"), S_A, now());
    r.node_online(&n("b"), S_B, now());
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    r.node_offline(&n("a"), now());
    r.tick(now());
    assert_eq!(ack_all(&mut r), [(false, "db.service".into())]);
}

#[tokio::test(start_paused = true)]
async fn target_node_back_within_grace_keeps_active_proxies() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    r.node_offline(&n("b"), now());
    // The subscription layer relays the virtual offline news: ignored.
    let out = r.target_event(
        &n("b"),
        &u("db.service"),
        &state_sub("inactive", AGENT_OFFLINE, Reason::Virtual),
    );
    assert_eq!(notices(&out).len(), 1);
    advance(GRACE - Duration::from_millis(1)).await;
    assert!(r.tick(now()).is_empty());
    assert_eq!(row_states(&r)[0].2, "active");
    // Nothing can be sent to b while it is away.
    assert!(r.dep_commands().is_empty());
    r.node_online(&n("b"), 21, now());
    advance(GRACE).await;
    let out = r.tick(now());
    assert!(notices(&out).is_empty(), "the deadline was cancelled");
    assert_eq!(row_states(&r)[0].2, "active");
    // The want is replayed to the new session of b.
    let cmds = r.dep_commands();
    assert_eq!(cmds.len(), 1);
    assert!(cmds[0].start);
    assert_eq!(cmds[0].session, 21);
}

#[tokio::test(start_paused = true)]
async fn target_node_away_past_grace_stops_active_proxies_not_waiting_ones() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    r.proxy_new(&n("c"), S_C, &n("b"), &u("db.service"), 2, now());
    ack_all(&mut r);
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    // c's proxy was re-added and is waiting again.
    r.target_event(
        &n("b"),
        &u("db.service"),
        &state("activating", Reason::Real),
    );
    r.proxy_removed(&n("c"), &n("b"), &u("db.service"), 2, now());
    r.proxy_new(&n("c"), S_C, &n("b"), &u("db.service"), 3, now());
    let inflight = r.dep_commands();
    let out = r.node_offline(&n("b"), now());
    // The waiting proxy hears why it waits; the active one hears nothing yet.
    assert_eq!(notices(&out), [("c".into(), node_offline(3, Some(0)))]);
    // The StartDep in flight ends with Offline: not a failure.
    assert!(r.dep_result(&inflight[0], DepOutcome::Offline).is_empty());
    // A new proxy while b is away waits; the last news of b is stale, so
    // what is known is `inactive` (virtual), never the old `active`. It is
    // told only that b is offline.
    let out = r.proxy_new(&n("a"), S_A, &n("b"), &u("web.service"), 4, now());
    assert_eq!(notices(&out), [("a".into(), node_offline(4, Some(0)))]);
    let rows = row_states(&r);
    assert_eq!(
        rows[0],
        (
            "a".into(),
            "b:db.service".into(),
            "active",
            "inactive".into(),
            2
        )
    );
    assert_eq!(rows[1].2, "waiting");

    advance(GRACE).await;
    let out = r.tick(now());
    let gone = state_sub("inactive", AGENT_OFFLINE, Reason::Real);
    assert_eq!(
        notices(&out),
        [("a".into(), target_notice(1, gone.clone()))]
    );
    // Only waiting proxies are left; they keep waiting.
    let rows = row_states(&r);
    assert!(rows.iter().all(|row| row.2 == "waiting"), "{rows:?}");
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 1);

    // b returns: the waiting proxies hear it; outstanding StartDeps go out
    // (db for c, web for a).
    let out = r.node_online(&n("b"), 22, now());
    let mut back = notices(&out);
    back.sort_by_key(|(to, _)| to.clone());
    assert_eq!(
        back,
        [
            ("a".into(), Notice::TargetNodeOnline { proxy_id: 4 }),
            ("c".into(), Notice::TargetNodeOnline { proxy_id: 3 })
        ]
    );
    let mut sent = ack_all(&mut r);
    sent.sort();
    assert_eq!(
        sent,
        [(true, "db.service".into()), (true, "web.service".into())]
    );
    // a re-announces the ended proxy (same id): it hears the outcome again.
    r.node_offline(&n("a"), now());
    r.node_online(&n("a"), S_A2, now());
    let out = r.proxy_new(&n("a"), S_A2, &n("b"), &u("db.service"), 1, now());
    assert_eq!(notices(&out), [("a".into(), target_notice(1, gone))]);
}

#[tokio::test(start_paused = true)]
async fn stop_dep_of_an_offline_target_is_sent_when_it_returns() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    r.node_offline(&n("b"), now());
    r.proxy_removed(&n("a"), &n("b"), &u("db.service"), 1, now());
    assert!(r.dep_commands().is_empty());
    r.node_online(&n("b"), 23, now());
    assert_eq!(ack_all(&mut r), [(false, "db.service".into())]);
    assert!(r.targets.is_empty());
}

#[tokio::test(start_paused = true)]
async fn reload_revoking_permission_drops_references_at_once() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    r.proxy_new(&n("c"), S_C, &n("b"), &u("db.service"), 2, now());
    r.proxy_new(&n("c"), S_C, &n("b"), &u("web.service"), 3, now());
    ack_all(&mut r);
    // c loses its permission; a keeps it; e is a new node a may depend on.
    let out = r.reload(Policy::new(
        ["a", "b", "c", "d", "e"].map(n),
        [(n("a"), vec![n("b"), n("e")])],
        GRACE,
    ));
    let mut got = notices(&out);
    got.sort_by_key(|(_, n)| format!("{n:?}"));
    assert_eq!(got.len(), 2);
    for (to, notice) in &got {
        assert_eq!(to, "c");
        assert!(
            matches!(notice, Notice::ProxyError { message, .. } if message.contains("revoked") && message.contains("AllowDependenciesOn in [node c]")),
            "{notice:?}"
        );
    }
    assert!(out.contains(&Action::Unwatch {
        node: n("b"),
        unit: u("web.service")
    }));
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 1);
    assert_eq!(ack_all(&mut r), [(false, "web.service".into())]);
    // The new permission works at once.
    r.node_online(&n("e"), 50, now());
    let out = r.proxy_new(&n("a"), S_A, &n("e"), &u("x.service"), 9, now());
    assert!(out.contains(&Action::Watch {
        node: n("e"),
        unit: u("x.service")
    }));
    // A reload that removes a known node: references to it are dropped too.
    r.reload(Policy::new(
        ["a", "b"].map(n),
        [(n("a"), vec![n("b"), n("e")])],
        GRACE,
    ));
    assert_eq!(r.live_count(&n("e"), &u("x.service")), 0);
}

#[tokio::test(start_paused = true)]
async fn manager_restart_rebuilds_references_and_stops_only_orphans() {
    // A fresh manager: b registers first, a re-announces a bit later.
    let mut r = References::new(policy());
    r.node_online(&n("b"), S_B, now());
    assert!(
        r.dep_commands().is_empty(),
        "nothing is stopped on register"
    );
    advance(Duration::from_secs(3)).await;
    r.node_online(&n("a"), S_A, now());
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 4, now());
    // The re-announce restarts the dep that is running anyway (a no-op).
    assert_eq!(ack_all(&mut r), [(true, "db.service".into())]);
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Virtual));
    assert_eq!(row_states(&r)[0].2, "active");

    // One grace period after b registered: sweep its running dep units.
    advance(GRACE - Duration::from_secs(3)).await;
    let out = r.tick(now());
    assert_eq!(
        out,
        [Action::Sweep {
            node: n("b"),
            session: S_B
        }]
    );
    r.sweep_result(&n("b"), S_B, &[u("db.service"), u("orphan.service")]);
    assert_eq!(ack_all(&mut r), [(false, "orphan.service".into())]);
    assert_eq!(r.live_count(&n("b"), &u("db.service")), 1);
    assert!(!r.targets.contains_key(&(n("b"), u("orphan.service"))));
    // A sweep answer for an older session of b is ignored.
    r.sweep_result(&n("b"), 1, &[u("stale.service")]);
    assert!(r.dep_commands().is_empty());
    // The sweep is once per registration (a's own sweep comes later).
    advance(GRACE).await;
    let out = r.tick(now());
    assert!(
        !out.iter()
            .any(|a| matches!(a, Action::Sweep { node, .. } if node == &n("b")))
    );
}

fn sweeps(out: &[Action]) -> Vec<String> {
    out.iter()
        .filter_map(|a| match a {
            Action::Sweep { node, .. } => Some(node.to_string()),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn no_sweep_while_a_node_that_may_depend_on_the_target_is_awaited() {
    // A fresh manager with a 60 s warm-up: b registers, a (which may
    // depend on b) is late; d depends on nothing and never comes.
    let warm = Duration::from_secs(60);
    let mut r = References::new(policy()).warm_up_until(now() + warm);
    r.node_online(&n("b"), S_B, now());
    r.node_online(&n("c"), S_C, now());
    advance(GRACE).await;
    assert_eq!(
        sweeps(&r.tick(now())),
        ["c"],
        "c's sweep is due (nobody depends on c); b's waits: a's deps on b may still be re-announced"
    );
    assert!(
        r.next_deadline() > Some(now()),
        "nothing due while a is awaited"
    );
    // a comes back late: b's sweep gives a's re-announcements one grace
    // period, then stops only the orphan.
    advance(Duration::from_secs(5)).await;
    r.node_online(&n("a"), S_A, now());
    assert_eq!(r.next_deadline(), Some(now() + GRACE));
    advance(Duration::from_secs(1)).await;
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 4, now());
    assert_eq!(ack_all(&mut r), [(true, "db.service".into())]);
    advance(GRACE - Duration::from_secs(1) - Duration::from_millis(1)).await;
    assert!(sweeps(&r.tick(now())).is_empty());
    advance(Duration::from_millis(1)).await;
    let mut due = sweeps(&r.tick(now()));
    due.sort();
    assert_eq!(due, ["a", "b"]);
    r.sweep_result(&n("b"), S_B, &[u("db.service"), u("orphan.service")]);
    assert_eq!(ack_all(&mut r), [(false, "orphan.service".into())]);
}

#[tokio::test(start_paused = true)]
async fn the_warm_up_deadline_lets_the_sweep_run_without_the_absent_node() {
    let warm = Duration::from_secs(60);
    let mut r = References::new(policy()).warm_up_until(now() + warm);
    // a and c may depend on b; neither comes back.
    r.node_online(&n("b"), S_B, now());
    assert_eq!(r.next_deadline(), Some(now() + warm));
    advance(warm - Duration::from_millis(1)).await;
    assert!(sweeps(&r.tick(now())).is_empty());
    advance(Duration::from_millis(1)).await;
    assert_eq!(sweeps(&r.tick(now())), ["b"]);
}

#[tokio::test(start_paused = true)]
async fn a_node_nobody_may_depend_on_is_swept_after_its_grace_period_as_before() {
    // d may depend on nothing and nobody depends on a: a's sweep does not
    // wait for d, nor for anyone.
    let mut r = References::new(policy()).warm_up_until(now() + Duration::from_secs(600));
    r.node_online(&n("a"), S_A, now());
    advance(GRACE).await;
    assert_eq!(sweeps(&r.tick(now())), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn failed_proxy_outcome_is_replayed_to_a_returning_requester() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    let cmds = r.dep_commands();
    r.node_offline(&n("a"), now());
    let out = r.dep_result(&cmds[0], DepOutcome::Failed("boom".into()));
    assert!(notices(&out).is_empty(), "a is away");
    r.node_online(&n("a"), S_A2, now());
    let out = r.proxy_new(&n("a"), S_A2, &n("b"), &u("db.service"), 1, now());
    assert!(
        matches!(&notices(&out)[0].1, Notice::ProxyError { proxy_id: 1, message } if message.contains("boom"))
    );
    assert_eq!(
        ack_all(&mut r),
        [(false, "db.service".into())],
        "no new StartDep for the old proxy; the dep is stopped"
    );
    // A new proxy (new id) is a fresh start.
    r.proxy_new(&n("a"), S_A2, &n("b"), &u("db.service"), 2, now());
    assert_eq!(ack_all(&mut r), [(true, "db.service".into())]);
}

#[tokio::test(start_paused = true)]
async fn notices_never_reach_a_newer_session_with_old_ids() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    r.node_offline(&n("a"), now());
    r.node_online(&n("a"), S_A2, now());
    // a is online again but has not re-announced: nothing for it yet.
    let out = r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    assert!(notices(&out).is_empty());
    for action in r.proxy_new(&n("a"), S_A2, &n("b"), &u("db.service"), 2, now()) {
        if let Action::Notify { session, .. } = action {
            assert_eq!(session, S_A2);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn dead_references_are_bounded_per_requester() {
    let mut r = setup();
    for i in 0..(MAX_DEAD_PER_REQUESTER as u64 + 10) {
        r.proxy_new(&n("d"), 40, &n("b"), &u(&format!("u{i}.service")), i, now());
    }
    let rows = r.rows();
    assert_eq!(rows.len(), MAX_DEAD_PER_REQUESTER);
    assert!(rows.iter().all(|row| row.state == "failed"));
    // The oldest went first.
    assert!(!rows.iter().any(|row| row.unit.as_str() == "u0.service"));
    // Unknown target nodes are never stored.
    r.proxy_new(&n("d"), 40, &n("zz"), &u("x.service"), 1, now());
    assert_eq!(r.rows().len(), MAX_DEAD_PER_REQUESTER);
}

#[tokio::test(start_paused = true)]
async fn down_news_before_the_dep_start_is_confirmed_does_not_fail_a_waiting_proxy() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    let cmds = r.dep_commands();
    assert_eq!(cmds.len(), 1);
    // While StartDep runs, the target's old state and a probe's load/unload
    // arrive as real news: they are not relayed and fail nothing.
    let out = r.target_event(&n("b"), &u("db.service"), &state("inactive", Reason::Real));
    assert!(notices(&out).is_empty(), "{out:?}");
    let out = r.target_event(
        &n("b"),
        &u("db.service"),
        &TargetChange::Removed {
            reason: Reason::Real,
        },
    );
    assert!(notices(&out).is_empty(), "{out:?}");
    assert_eq!(row_states(&r)[0].2, "waiting");
    // The start fails: its error is the reason the requester hears.
    let out = r.dep_result(
        &cmds[0],
        DepOutcome::Failed("unit db.service on node b cannot be started: not found".into()),
    );
    assert_eq!(
        notices(&out),
        [(
            "a".to_string(),
            Notice::ProxyError {
                proxy_id: 1,
                message: "unit db.service on node b cannot be started: not found".into()
            }
        )]
    );
}

/// Issue 14 item 6, the failure before the confirmation: the target failed
/// right after its start, and B's news of it arrived while StartDep was
/// still running (held back then). B confirms the start only after that news,
/// so the state known at the confirmation is the start's outcome: the
/// waiting proxy fails with it at once. (It was replayed as a *virtual*
/// state, which the requesting agent ignores: the proxy hung `activating`
/// for its whole start timeout.)
#[tokio::test(start_paused = true)]
async fn a_target_down_when_its_start_is_confirmed_fails_the_waiting_proxy() {
    for down in ["failed", "inactive"] {
        let mut r = setup();
        r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
        let cmds = r.dep_commands();
        for change in [
            state("activating", Reason::Real),
            state("active", Reason::Real),
            state(down, Reason::Real),
        ] {
            let out = r.target_event(&n("b"), &u("db.service"), &change);
            assert!(notices(&out).is_empty(), "{out:?}");
        }
        let out = r.dep_result(&cmds[0], DepOutcome::Done);
        assert_eq!(
            notices(&out),
            [(
                "a".to_string(),
                Notice::ProxyError {
                    proxy_id: 1,
                    message: format!("db.service on node b is {down} (x)")
                }
            )],
            "{down}"
        );
        assert_eq!(row_states(&r)[0].2, "failed");
        // Nothing holds the dep any more.
        assert_eq!(ack_all(&mut r), [(false, "db.service".into())]);
    }
}

/// Issue 14 item 6, the failure after the confirmation, at each point it
/// can reach the manager: as B's real news (relayed, the agent's rule fails
/// the proxy), or as B's *replay* of the state — B's agent got the
/// `Subscribe` for the target only after the start job ended, so it answers
/// with a virtual state, which here is the start's outcome too. A virtual
/// `agent-offline` says nothing about the target: the proxy keeps waiting.
#[tokio::test(start_paused = true)]
async fn a_target_down_after_its_confirmed_start_fails_the_waiting_proxy_whatever_the_reason() {
    // Real news.
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    let out = r.target_event(&n("b"), &u("db.service"), &state("failed", Reason::Real));
    assert_eq!(
        notices(&out),
        [(
            "a".to_string(),
            target_notice(1, state("failed", Reason::Real))
        )]
    );
    assert_eq!(row_states(&r)[0].2, "failed");

    // B's late replay, virtual.
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    let out = r.target_event(
        &n("b"),
        &u("db.service"),
        &TargetChange::New {
            reason: Reason::Virtual,
        },
    );
    assert_eq!(notices(&out).len(), 1, "the New is relayed: {out:?}");
    let out = r.target_event(&n("b"), &u("db.service"), &state("failed", Reason::Virtual));
    assert_eq!(
        notices(&out),
        [(
            "a".to_string(),
            Notice::ProxyError {
                proxy_id: 1,
                message: "db.service on node b is failed (x)".into()
            }
        )]
    );
    assert_eq!(row_states(&r)[0].2, "failed");

    // B offline: nothing is decided.
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    let offline = TargetChange::State {
        active_state: "inactive".into(),
        sub_state: AGENT_OFFLINE.into(),
        reason: Reason::Virtual,
    };
    let out = r.target_event(&n("b"), &u("db.service"), &offline);
    assert!(
        !notices(&out)
            .iter()
            .any(|(_, n)| matches!(n, Notice::ProxyError { .. })),
        "{out:?}"
    );
    assert_eq!(row_states(&r)[0].2, "waiting");
    // An active proxy is not failed by a virtual down either.
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    assert_eq!(row_states(&r)[0].2, "active");
    let out = r.target_event(&n("b"), &u("db.service"), &state("failed", Reason::Virtual));
    assert!(
        !notices(&out)
            .iter()
            .any(|(_, n)| matches!(n, Notice::ProxyError { .. })),
        "{out:?}"
    );
    assert_eq!(row_states(&r)[0].2, "active");
}

/// The race behind "db.service is inactive (dead)" on a healthy proxy: B's
/// agent replays the target from a cache that has not yet seen a stop (stale
/// "active"), then forwards that stop, then the new start. Nothing reaches the
/// waiting proxy before B confirms the dep start; the confirmation completes it.
#[tokio::test(start_paused = true)]
async fn a_waiting_proxy_completes_on_the_confirmed_start_not_on_older_news() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    let cmds = r.dep_commands();
    for change in [
        state("active", Reason::Virtual),
        state("deactivating", Reason::Real),
        state("inactive", Reason::Real),
        state("activating", Reason::Real),
        state("active", Reason::Real),
    ] {
        let out = r.target_event(&n("b"), &u("db.service"), &change);
        assert!(notices(&out).is_empty(), "{change:?} reached A: {out:?}");
        assert_eq!(row_states(&r)[0].2, "waiting");
    }
    let out = r.dep_result(&cmds[0], DepOutcome::Done);
    assert_eq!(
        notices(&out).last(),
        Some(&(
            "a".to_string(),
            target_notice(1, state("active", Reason::Virtual))
        ))
    );
    assert_eq!(row_states(&r)[0].2, "active");
    // From now on real news decides: a stop ends the proxy.
    let out = r.target_event(&n("b"), &u("db.service"), &state("inactive", Reason::Real));
    assert_eq!(
        notices(&out),
        [(
            "a".to_string(),
            target_notice(1, state("inactive", Reason::Real))
        )]
    );
    assert!(row_states(&r).is_empty(), "ended proxies are not listed");
}

/// A second requester of a running target waits for its own confirmation too,
/// and the first one hears nothing of it.
#[tokio::test(start_paused = true)]
async fn a_later_requester_waits_for_the_start_that_covers_it() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    ack_all(&mut r);
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    assert_eq!(row_states(&r)[0].2, "active");
    let out = r.proxy_new(&n("c"), S_C, &n("b"), &u("db.service"), 7, now());
    assert!(notices(&out).is_empty(), "{out:?}");
    let cmds = r.dep_commands();
    assert_eq!(cmds.len(), 1, "the re-add sends StartDep again");
    let out = r.dep_result(&cmds[0], DepOutcome::Done);
    let heard: Vec<_> = notices(&out);
    assert!(heard.iter().all(|(to, _)| to == "c"), "{heard:?}");
    assert_eq!(
        heard.last(),
        Some(&(
            "c".to_string(),
            target_notice(7, state("active", Reason::Virtual))
        ))
    );
    assert!(row_states(&r).iter().all(|row| row.2 == "active"));
}

#[tokio::test(start_paused = true)]
async fn a_waiting_proxy_hears_that_its_target_node_is_offline_and_for_how_long() {
    // Policy: a may depend on b. b has not connected since the manager started.
    let mut r = References::new(policy());
    r.node_online(&n("a"), S_A, now());
    let out = r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    assert_eq!(notices(&out), [("a".into(), node_offline(1, None))]);

    // b comes, the dep is confirmed and the target is still starting.
    r.node_online(&n("b"), S_B, now());
    ack_all(&mut r);
    // b goes away after 5 s; the waiting proxy is told at once.
    advance(Duration::from_secs(5)).await;
    let out = r.node_offline(&n("b"), now());
    assert_eq!(notices(&out), [("a".into(), node_offline(1, Some(0)))]);
    // A proxy announced 93 s later hears how long b has been away; a
    // resumed one (a reconnected) too.
    advance(Duration::from_secs(93)).await;
    let out = r.proxy_new(&n("a"), S_A, &n("b"), &u("web.service"), 2, now());
    assert_eq!(notices(&out), [("a".into(), node_offline(2, Some(93_000)))]);
    r.node_offline(&n("a"), now());
    r.node_online(&n("a"), S_A2, now());
    let out = r.proxy_new(&n("a"), S_A2, &n("b"), &u("db.service"), 7, now());
    assert_eq!(notices(&out), [("a".into(), node_offline(7, Some(93_000)))]);

    // Refused proxies and active ones are not told anything about b.
    let out = r.proxy_new(&n("d"), 40, &n("b"), &u("db.service"), 9, now());
    assert!(matches!(
        notices(&out)[..],
        [(_, Notice::ProxyError { .. })]
    ));
}

/// BlueChi's `proxy-service-fails-on-execstart`: a `Type=simple` target comes up
/// and fails right away, and B's news of both arrives before B confirms the dep
/// start. A `bluechi-proxy@` reference hears the `active` it was held back from,
/// then the failure, both as real news (its agent completes the proxy, then
/// stops it: `inactive`, as BlueChi's). A `drover-proxy@` reference of the same
/// target, in the same round, fails with the reason instead.
#[tokio::test(start_paused = true)]
async fn a_bluechi_proxy_whose_target_ran_then_failed_completes_and_ends() {
    let mut r = setup();
    r.proxy_new_of(
        ProxyTemplate::Bluechi,
        &n("a"),
        S_A,
        &n("b"),
        &u("db.service"),
        1,
        now(),
    );
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 2, now());
    let cmds = r.dep_commands();
    assert_eq!(cmds.len(), 1);
    let up = state("active", Reason::Real);
    for change in [state("activating", Reason::Real), up.clone()] {
        let out = r.target_event(&n("b"), &u("db.service"), &change);
        assert!(notices(&out).is_empty(), "held back: {out:?}");
    }
    let out = r.target_event(&n("b"), &u("db.service"), &state("failed", Reason::Real));
    assert!(notices(&out).is_empty(), "held back: {out:?}");
    let out = r.dep_result(&cmds[0], DepOutcome::Done);
    assert_eq!(
        notices(&out),
        [
            ("a".to_string(), target_notice(1, up)),
            (
                "a".to_string(),
                target_notice(1, state("failed", Reason::Real))
            ),
            (
                "a".to_string(),
                Notice::ProxyError {
                    proxy_id: 2,
                    message: "db.service on node b is failed (x)".into()
                }
            ),
        ]
    );
    // Neither holds the dep any more; only the failed one is listed.
    assert_eq!(
        row_states(&r).iter().map(|row| row.2).collect::<Vec<_>>(),
        ["failed"]
    );
    assert_eq!(ack_all(&mut r), [(false, "db.service".into())]);
}

/// The same target failing after the confirmation, while a `bluechi-proxy@`
/// reference still waits (the confirmation found it `activating`): the real
/// failure ends it the same way, `active` first.
#[tokio::test(start_paused = true)]
async fn a_bluechi_proxy_waiting_past_the_confirmation_ends_as_bluechis_too() {
    let mut r = setup();
    r.proxy_new_of(
        ProxyTemplate::Bluechi,
        &n("a"),
        S_A,
        &n("b"),
        &u("db.service"),
        1,
        now(),
    );
    let cmds = r.dep_commands();
    let up = state("active", Reason::Real);
    r.target_event(&n("b"), &u("db.service"), &up);
    // A restart in between: the confirmation finds it activating again.
    r.target_event(
        &n("b"),
        &u("db.service"),
        &state("activating", Reason::Real),
    );
    let out = r.dep_result(&cmds[0], DepOutcome::Done);
    assert!(
        !notices(&out)
            .iter()
            .any(|(_, n)| matches!(n, Notice::ProxyError { .. })),
        "{out:?}"
    );
    let out = r.target_event(&n("b"), &u("db.service"), &state("failed", Reason::Real));
    assert_eq!(
        notices(&out),
        [
            ("a".to_string(), target_notice(1, up)),
            (
                "a".to_string(),
                target_notice(1, state("failed", Reason::Real))
            ),
        ]
    );
    assert_eq!(ack_all(&mut r), [(false, "db.service".into())]);
}

/// A target that never came up (a oneshot failing in its start) fails a
/// `bluechi-proxy@` reference with the reason, as it fails BlueChi's proxy;
/// so does an `active` B sent before this start was wanted (a stale one).
#[tokio::test(start_paused = true)]
async fn a_bluechi_proxy_whose_target_never_ran_fails_with_the_reason() {
    for before_start in [false, true] {
        let mut r = setup();
        if before_start {
            // An earlier proxy of the same target came and went: its news,
            // `active` included, is older than the next start.
            r.proxy_new(&n("c"), S_C, &n("b"), &u("db.service"), 9, now());
            ack_all(&mut r);
            r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
            r.proxy_removed(&n("c"), &n("b"), &u("db.service"), 9, now());
            ack_all(&mut r);
        }
        r.proxy_new_of(
            ProxyTemplate::Bluechi,
            &n("a"),
            S_A,
            &n("b"),
            &u("db.service"),
            1,
            now(),
        );
        let cmds = r.dep_commands();
        assert_eq!(cmds.len(), 1, "{before_start}");
        for change in [
            state("activating", Reason::Real),
            state("failed", Reason::Real),
        ] {
            r.target_event(&n("b"), &u("db.service"), &change);
        }
        let out = r.dep_result(&cmds[0], DepOutcome::Done);
        assert_eq!(
            notices(&out),
            [(
                "a".to_string(),
                Notice::ProxyError {
                    proxy_id: 1,
                    message: "db.service on node b is failed (x)".into()
                }
            )],
            "{before_start}"
        );
    }
}

fn health(state: HealthState, reason: &str) -> TargetChange {
    TargetChange::Health(Health::new(state, reason, 0))
}

/// A target with a check: its active completes nothing until the check
/// passes, and the requester is told the health before the state, in the
/// order its own view needs to reach the same verdict.
#[tokio::test(start_paused = true)]
async fn a_proxy_to_a_checked_target_completes_only_once_it_is_healthy() {
    let mut r = setup();
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 1, now());
    let cmds = r.dep_commands();
    let starting = health(HealthState::Starting, "");
    r.target_event(&n("b"), &u("db.service"), &starting);
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    let out = r.dep_result(&cmds[0], DepOutcome::Done);
    let told: Vec<_> = notices(&out).into_iter().map(|(_, n)| n).collect();
    assert_eq!(told.first(), Some(&target_notice(1, starting)));
    assert_eq!(
        told.last(),
        Some(&target_notice(1, state("active", Reason::Virtual)))
    );
    assert_eq!(row_states(&r)[0].2, "waiting", "active but not yet healthy");
    // Unhealthy keeps it waiting (the proxy's timeout ends it, not this).
    let sick = health(HealthState::Unhealthy, "connection refused");
    let out = r.target_event(&n("b"), &u("db.service"), &sick);
    assert_eq!(notices(&out), [("a".to_string(), target_notice(1, sick))]);
    assert_eq!(row_states(&r)[0].2, "waiting");
    let well = health(HealthState::Healthy, "");
    r.target_event(&n("b"), &u("db.service"), &well);
    assert_eq!(row_states(&r)[0].2, "active");
    // Turning unhealthy later ends nothing (the requester's unit decides).
    r.target_event(
        &n("b"),
        &u("db.service"),
        &health(HealthState::Unhealthy, "x"),
    );
    assert_eq!(row_states(&r)[0].2, "active");
}

/// A `bluechi-proxy@` reference whose checked target ran during its start
/// but never turned healthy, then failed: it is told the health first, so
/// the `active` completes nothing on either side and the failure fails it
/// (health is drover's; a proxy waits for it whatever its family).
#[tokio::test(start_paused = true)]
async fn a_bluechi_proxy_whose_checked_target_ran_unhealthy_then_failed_fails() {
    let mut r = setup();
    r.proxy_new_of(
        ProxyTemplate::Bluechi,
        &n("a"),
        S_A,
        &n("b"),
        &u("db.service"),
        1,
        now(),
    );
    let cmds = r.dep_commands();
    let starting = health(HealthState::Starting, "");
    let up = state("active", Reason::Real);
    let down = state("failed", Reason::Real);
    for change in [starting.clone(), up.clone(), down.clone()] {
        let out = r.target_event(&n("b"), &u("db.service"), &change);
        assert!(notices(&out).is_empty(), "held back: {out:?}");
    }
    let out = r.dep_result(&cmds[0], DepOutcome::Done);
    assert_eq!(
        notices(&out),
        [
            ("a".to_string(), target_notice(1, starting)),
            ("a".to_string(), target_notice(1, up)),
            ("a".to_string(), target_notice(1, down)),
        ]
    );
    assert_eq!(
        row_states(&r).iter().map(|row| row.2).collect::<Vec<_>>(),
        ["failed"]
    );
}

/// The figures the metrics endpoint shows follow the references: by state,
/// targets, errors by class, stale collections, activation times.
#[tokio::test(start_paused = true)]
async fn the_stats_follow_the_references() {
    let mut r = setup();
    let stats = r.stats();
    // Refused: an unknown node, a node a may not depend on.
    r.proxy_new(&n("a"), S_A, &n("nowhere"), &u("db.service"), 1, now());
    r.proxy_new(&n("a"), S_A, &n("c"), &u("db.service"), 2, now());
    assert_eq!(stats.errors(), [1, 1, 0, 0]);
    assert_eq!(
        stats.states(),
        [0, 0, 1, 0],
        "only the known target is kept"
    );
    // A waits 250 ms for its target, then is active.
    r.proxy_new(&n("a"), S_A, &n("b"), &u("db.service"), 3, now());
    assert_eq!(stats.states(), [1, 0, 1, 0]);
    assert_eq!(stats.targets(), 1);
    ack_all(&mut r);
    advance(Duration::from_millis(250)).await;
    r.target_event(&n("b"), &u("db.service"), &state("active", Reason::Real));
    assert_eq!(stats.states(), [0, 1, 1, 0]);
    let (count, sum) = crate::nodes::link_stats::totals(stats.activation());
    assert_eq!(count, 1);
    assert!((sum - 0.25).abs() < 1e-6, "{sum}");
    // A dep that cannot start fails its waiting proxy.
    r.proxy_new(&n("c"), S_C, &n("b"), &u("missing.service"), 4, now());
    assert_eq!(stats.targets(), 2);
    let cmds = r.dep_commands();
    r.dep_result(&cmds[0], DepOutcome::Failed("not found".into()));
    assert_eq!(stats.errors(), [1, 1, 1, 0]);
    assert_eq!(stats.states(), [0, 1, 2, 0]);
    assert_eq!(stats.targets(), 1);
    // The target stops for real: the active proxy ends.
    r.target_event(&n("b"), &u("db.service"), &state("failed", Reason::Real));
    assert_eq!(stats.states(), [0, 0, 2, 1]);
    // A new one waits, then its target fails before it is up.
    r.proxy_new(&n("c"), S_C, &n("b"), &u("web.service"), 5, now());
    ack_all(&mut r);
    r.target_event(&n("b"), &u("web.service"), &state("failed", Reason::Real));
    assert_eq!(stats.errors(), [1, 1, 1, 1]);
    // One more waits; its requester goes away past the grace period.
    r.proxy_new(&n("a"), S_A, &n("b"), &u("log.service"), 6, now());
    assert_eq!(stats.states(), [1, 0, 3, 1]);
    r.node_offline(&n("a"), now());
    advance(GRACE).await;
    r.tick(now());
    assert_eq!(stats.stale(), 1);
    assert_eq!(stats.targets(), 0);
    // Every count matches a walk of the references.
    let mut walked = [0i64; 4];
    for t in r.targets.values() {
        for rf in t.refs.values() {
            let slot = match rf.state {
                RefState::Waiting => 0,
                RefState::Active => 1,
                RefState::Failed(_) => 2,
                RefState::Ended(_) => 3,
            };
            walked[slot] += 1;
        }
    }
    assert_eq!(stats.states(), walked);
    drop(r);
    assert_eq!(
        stats.states(),
        [0, 0, 0, 0],
        "dropped references give back their count"
    );
}
