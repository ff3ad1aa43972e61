//! The manager's health answers on D-Bus, fed by fake agents over the real
//! wire: a node's own health is the `Health` property of its
//! `io.drover.Node` object, whose changes are signalled (what `droverctl
//! status -w` refreshes on), and what one hostile agent sends is held within
//! the health book's bounds — units and reason bytes per node
//! (`drover_manager::units::health`) — while an honest node beside it is
//! answered in full and the manager keeps serving.

mod common;

use common::*;
use drover_bus::bluechi::{DROVER_NODE_IFACE, node_path};
use drover_manager::units::health::{MAX_UNITS_PER_NODE, REASON_BYTES_PER_NODE};
use drover_protocol::health::{
    Health, HealthSnapshot, HealthState, NodeHealth, REASON_MAX, SNAPSHOT_PART_MAX, UnitHealth,
};
use drover_protocol::{Event, ModTag};

type HealthRow = (String, String, String, String, u64);

fn node_health(state: HealthState, system_state: &str) -> Event {
    Event::NodeHealth(NodeHealth {
        health: Health::new(state, "", 0),
        system_state: system_state.to_owned(),
        checks: Vec::new(),
    })
}

/// Sends `event` from `agent` and waits for the `Health` property change it
/// causes on the node's object: every event the agent sent before is
/// handled by then (a session's events are handled in order).
async fn node_health_barrier(f: &Fixture, agent: &FakeAgent, node: &str, event: Event, want: &str) {
    let path = node_path(node);
    let mut changes = f.api.signals(&path, PROPERTIES_IFACE).await;
    agent.event(event).await;
    wait_changed(&mut changes, "Health", want).await;
    let now: String = f.api.get_property(&path, DROVER_NODE_IFACE, "Health").await;
    assert_eq!(now, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_health_from_one_agent_is_held_within_the_books_bounds() {
    let f = Fixture::start(config(&["bad", "good"])).await;
    let bad = f.agent("bad", reply_empty()).await;
    let good = f.agent("good", reply_empty()).await;
    let guid = bad.session_id();
    let name = |i: usize| unit_name(&format!("{i:0>240}.service"));
    let full = |i: usize| format!("{i} ").repeat(REASON_MAX)[..REASON_MAX].to_owned();
    let mut index = 0u64;
    let mut tag = || {
        index += 1;
        ModTag::new(guid, index)
    };
    // More units than a node may have; the first ones with full reasons,
    // more of them than the reason budget holds.
    let long = 2 * REASON_BYTES_PER_NODE / REASON_MAX;
    for i in 0..MAX_UNITS_PER_NODE + 1000 {
        let reason = if i < long { full(i) } else { "x".to_owned() };
        bad.event(Event::UnitHealth {
            tag: tag(),
            unit: name(i),
            health: Health::new(HealthState::Unhealthy, &reason, 0),
        })
        .await;
        // Snapshot parts, of ever new snapshots, never finished.
        if i % 256 == 0 {
            let units = (0..SNAPSHOT_PART_MAX)
                .map(|j| UnitHealth {
                    unit: name(j),
                    health: Health::new(HealthState::Unhealthy, &full(j), 0),
                })
                .collect();
            bad.event(Event::HealthSnapshot {
                tag: tag(),
                part: HealthSnapshot { units, node: None },
            })
            .await;
        }
    }
    node_health_barrier(
        &f,
        &bad,
        "bad",
        node_health(HealthState::Healthy, "running"),
        "healthy",
    )
    .await;

    let reason = full(7);
    good.event(Event::UnitHealth {
        tag: ModTag::new(good.session_id(), 1),
        unit: unit_name("db.service"),
        health: Health::new(HealthState::Unhealthy, &reason, 0),
    })
    .await;
    node_health_barrier(
        &f,
        &good,
        "good",
        node_health(HealthState::Unhealthy, "degraded"),
        "unhealthy",
    )
    .await;

    let rows: Vec<HealthRow> = f
        .api
        .call(CONTROLLER, DROVER_CONTROLLER_IFACE, "ListHealth", &())
        .await
        .expect("ListHealth answers");
    let of_bad: Vec<&HealthRow> = rows.iter().filter(|r| r.0 == "bad").collect();
    assert_eq!(
        of_bad.len(),
        MAX_UNITS_PER_NODE,
        "the extra units are ignored"
    );
    let bytes: usize = of_bad.iter().map(|r| r.3.len()).sum();
    assert!(
        bytes <= REASON_BYTES_PER_NODE,
        "{bytes} bytes of reasons held"
    );
    assert!(
        bytes > REASON_BYTES_PER_NODE - REASON_MAX,
        "the budget is used: {bytes}"
    );
    // The honest node is answered in full, by both calls.
    let db: Vec<&HealthRow> = rows.iter().filter(|r| r.0 == "good").collect();
    assert_eq!(db.len(), 1);
    assert_eq!(
        (db[0].2.as_str(), db[0].3.as_str()),
        ("unhealthy", reason.as_str())
    );
    let (state, said, _): (String, String, u64) = f
        .api
        .call(
            &node_path("good"),
            DROVER_NODE_IFACE,
            "GetUnitHealth",
            &("db.service",),
        )
        .await
        .expect("GetUnitHealth answers");
    assert_eq!(
        (state.as_str(), said.as_str()),
        ("unhealthy", reason.as_str())
    );
    assert_eq!(f.api.list_nodes().await.len(), 2);
}
