//! Agents follow the leader of two managers on a real etcd (docs/ha.md,
//! "Agents follow the leader"): real `systemd --user` nodes, real agents
//! whose `ControllerAddress=` lists both managers, a cross-node dependency
//! in use (a proxy on node1, its dependency unit on node2).
//!
//! Manager A is the sandbox's own (its port is socket-activated, so the
//! port stays open while A is dead: a dial lands in the backlog and
//! nobody answers, as when a host is gone); manager B runs on its own bus
//! like another host. What a user checks: each manager's `ListNodes`,
//! `io.drover.Controller.Leading`, `systemctl --user` on the nodes (the
//! units' `InvocationID`: a unit stopped and started again has a new one),
//! and the agents' logs.

use drover_testkit::api::DROVER_CONTROLLER_IFACE;
use drover_testkit::etcd::Etcd;
use drover_testkit::ha::{HaManager, LOOK, TwoManagers, two_managers};
use drover_testkit::prelude::*;
use drover_testkit::wait::poll;
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

const DB: &str = "db.service";
const PROXY: &str = "drover-proxy@node2_db.service";
const DEP: &str = "drover-dep@db.service.service";
const NEED_DB: &str = "need-db.service";
const NODES: [&str; 2] = ["node1", "node2"];
const TTL_S: u64 = 2;
const T: Duration = Duration::from_secs(20);
/// The target: every agent registered with the new leader within
/// this long of the leader's death.
const FOLLOW_LIMIT: Duration = Duration::from_secs(5);

async fn leading(api: &Api) -> Option<bool> {
    drover_testkit::ha::leading(api).await.ok()
}

async fn epoch(api: &Api) -> u64 {
    api.get_property(CONTROLLER_PATH, DROVER_CONTROLLER_IFACE, "Epoch")
        .await
}

/// Whether every node is online in `api`'s `ListNodes`.
async fn all_online(api: &Api) -> bool {
    drover_testkit::ha::all_online(api, &NODES).await
}

/// Polls until every node is online on `api`; returns how long it took.
async fn until_all_online(
    api: &Api,
    limit: Duration,
    what: &str,
    logs: impl Fn() -> String,
) -> Duration {
    let start = Instant::now();
    poll(limit, LOOK, what, || all_online(api))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    start.elapsed()
}

/// The units of the dependency in use, with their `InvocationID`s.
const IN_USE: [(&str, &str); 4] = [
    ("node1", NEED_DB),
    ("node1", PROXY),
    ("node2", DEP),
    ("node2", DB),
];

async fn invocations(c: &TestCluster) -> Vec<String> {
    let mut ids = Vec::new();
    for (node, unit) in IN_USE {
        assert_eq!(c.state(node, unit).await, "active", "{unit} on {node}");
        ids.push(c.prop(node, unit, "InvocationID").await);
    }
    ids
}

fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_follow_a_new_leader_within_seconds_and_never_a_deposed_one() {
    let etcd = Etcd::start().await;
    let TwoManagers {
        mut c,
        b,
        agent_logs,
    } = two_managers(&etcd, "/drover-test/follow", TTL_S).await;
    let a_api = c.api().await;
    let a = &a_api;
    let a_epoch = epoch(&a_api).await;
    let b_api = b.api.clone();
    let a_port = c.manager_port();
    let logs = |b: &HaManager, logs: &[std::path::PathBuf]| {
        let mut text = format!("manager B:\n{}\n", b.logged());
        for l in logs {
            text.push_str(&format!(
                "{}:\n{}\n",
                l.display(),
                std::fs::read_to_string(l).unwrap_or_default()
            ));
        }
        text
    };
    until_all_online(&a_api, T, "every node online on A", || {
        logs(&b, &agent_logs)
    })
    .await;
    // Each agent holds a parked link to the standby beside its session.
    let parked_on = |port: u16, logs: &[std::path::PathBuf]| {
        let needle = format!("the manager at 127.0.0.1:{port} stands by (parked: ");
        logs.iter()
            .all(|l| std::fs::read_to_string(l).is_ok_and(|t| t.contains(&needle)))
    };
    poll(T, LOOK, "agents parked on B", || {
        let ok = parked_on(b.port, &agent_logs);
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&b, &agent_logs)));

    // A cross-node dependency in use.
    c.install("node2", DB, "[Service]\nExecStart=/bin/sleep 600\n")
        .await;
    c.install(
        "node1",
        NEED_DB,
        &format!("[Unit]\nWants={PROXY}\nAfter={PROXY}\n[Service]\nExecStart=/bin/sleep 600\n"),
    )
    .await;
    c.systemctl_ok("node1", &["start", NEED_DB]).await;
    for (node, unit) in IN_USE {
        c.wait_state(node, unit, "active", T).await;
    }
    let before = invocations(&c).await;

    // The leader dies.
    c.signal_manager(Signal::SIGKILL).expect("SIGKILL A");
    let killed = Instant::now();
    let bb = &b_api;
    poll(T, LOOK, "B leads", move || leading_is(bb, true))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&b, &agent_logs)));
    let led = killed.elapsed();
    until_all_online(&b_api, FOLLOW_LIMIT, "every node online on B", || {
        logs(&b, &agent_logs)
    })
    .await;
    let followed = killed.elapsed();
    eprintln!(
        "SIGKILL of the leader: B leads after {led:?}, every agent registered with B after {followed:?}"
    );
    assert!(followed <= FOLLOW_LIMIT, "{followed:?}");
    let b_epoch = epoch(&b_api).await;
    assert!(b_epoch > a_epoch);
    // Nothing stopped: the same invocations, and they stay.
    for (node, unit) in IN_USE {
        c.stays(node, unit, "active", Duration::from_secs(2)).await;
    }
    assert_eq!(
        invocations(&c).await,
        before,
        "a unit was restarted by the failover"
    );

    // A comes back and stands by; the agents park on it.
    c.wait_manager_exit(T).await.expect("A reaped");
    c.start_manager().await.expect("A again");
    poll(T, LOOK, "A stands by", move || leading_is(a, false))
        .await
        .expect("A stands by");
    poll(T, LOOK, "agents parked on A", || {
        let ok = parked_on(a_port, &agent_logs);
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&b, &agent_logs)));

    // B is paused past its lease: A leads, the agents follow it at once.
    b.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    poll(T, LOOK, "A leads again", move || leading_is(a, true))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&b, &agent_logs)));
    until_all_online(&a_api, FOLLOW_LIMIT, "every node online on A again", || {
        logs(&b, &agent_logs)
    })
    .await;
    let followed = paused.elapsed();
    eprintln!("SIGSTOP of the leader: every agent registered with A after {followed:?}");
    assert!(followed <= FOLLOW_LIMIT, "{followed:?}");
    let a_epoch = epoch(&a_api).await;
    assert!(a_epoch > b_epoch);

    // B resumes: deposed, it does not lead, and no agent obeys it.
    b.signal(Signal::SIGCONT);
    poll(T, LOOK, "B answers again", move || leading_is(bb, false))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&b, &agent_logs)));
    poll(T, LOOK, "agents parked on B again", || {
        let ok = agent_logs.iter().all(|l| {
            std::fs::read_to_string(l).is_ok_and(|t| {
                count(
                    &t,
                    &format!("the manager at 127.0.0.1:{} stands by (parked: ", b.port),
                ) >= 2
            })
        });
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&b, &agent_logs)));
    assert!(all_online(&a_api).await, "the agents left the leader");
    for l in &agent_logs {
        let text = std::fs::read_to_string(l).expect("agent log");
        assert_eq!(
            count(
                &text,
                &format!("connected to the manager at 127.0.0.1:{} ", b.port)
            ),
            1,
            "an agent registered with the deposed B again:\n{text}"
        );
    }
    for (node, unit) in IN_USE {
        c.stays(node, unit, "active", Duration::from_secs(1)).await;
    }
    assert_eq!(
        invocations(&c).await,
        before,
        "a unit was restarted by a failover"
    );
    drop(b);
    c.down().await;
}

async fn leading_is(api: &Api, want: bool) -> bool {
    leading(api).await == Some(want)
}
