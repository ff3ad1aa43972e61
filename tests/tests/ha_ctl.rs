//! `droverctl` and the leader (docs/ha.md): two real `drover-manager`s on a
//! real etcd, each on its own bus like two hosts, and the real `droverctl`
//! pointed at each bus, as a user on either host would run it.
//!
//! * On the leader, `status` says who leads and the epoch above the table.
//! * On a standby, every command fails with one line naming the leader,
//!   exit 1.
//! * A manager alone (no etcd keys) prints exactly the table it always
//!   printed.

use drover_testkit::etcd::Etcd;
use drover_testkit::ha::HaManager;
use drover_testkit::prelude::*;
use std::time::Duration;

const TTL_S: u64 = 2;
const T: Duration = Duration::from_secs(20);

/// How a manager of these tests is named as leader: by the one address it
/// listens on (plaintext without `ListenAddress=` binds loopback) and its
/// agent port.
fn name_of(m: &HaManager) -> String {
    format!("127.0.0.1:{}", m.port)
}

async fn manager(extra: &str) -> HaManager {
    let conf = format!(
        "[drover-manager]\nAllowedNodeNames=node1,node2\nLogTarget=stderr\nLogLevel=DEBUG\n{extra}"
    );
    HaManager::start(&bin("drover-manager"), |_| conf).await
}

fn ha_keys(etcd: &Etcd) -> String {
    format!(
        "EtcdEndpoints={}\nEtcdKeyPrefix=/drover-test/ctl\nEtcdLeaseTTL={TTL_S}\n",
        etcd.url()
    )
}

/// The table `droverctl status` prints for node1 and node2, both offline
/// and never seen: bluechictl's widths, trailing blanks cut.
fn offline_table() -> String {
    let line = |fields: [&str; 5]| {
        format!(
            "{:<30} | {:<10} | {:<24} | {:<28} | {}",
            fields[0], fields[1], fields[2], fields[3], fields[4]
        )
        .trim_end()
        .to_string()
            + "\n"
    };
    let mut t = line(["NODE", "STATE", "IP", "LAST SEEN", "HEALTH"]);
    t.push_str(&"=".repeat(30 + 10 + 24 + 28 + "HEALTH".len() + 4 * 3));
    t.push('\n');
    t.push_str(&line(["node1", "offline", "", "never", "-"]));
    t.push_str(&line(["node2", "offline", "", "never", "-"]));
    t
}

/// A refusal as droverctl prints it: one line on stderr naming the bus
/// and the leader, nothing on stdout, exit 1.
fn assert_refused(run: Run, bus: &str, leader: &str, args: &[&str]) {
    let (code, stdout, stderr) = run.parts();
    assert_eq!(code, 1, "droverctl {args:?}: {stdout}\n{stderr}");
    assert_eq!(stdout, "", "droverctl {args:?} printed on a standby");
    assert_eq!(
        stderr,
        format!(
            "droverctl: the drover-manager on bus {bus} stands by and serves no calls; \
             the leader is {leader}. Run droverctl against the leader's bus\n"
        ),
        "droverctl {args:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_the_leader_and_a_standby_refuses_every_command_naming_it() {
    let etcd = Etcd::start().await;
    let mut a = manager(&ha_keys(&etcd)).await;
    a.until_leading(true, T).await;
    let a_epoch = a.epoch().await;
    assert!(a_epoch > 0);
    let b = manager(&ha_keys(&etcd)).await;
    let standby = &b;
    drover_testkit::wait::poll(T, drover_testkit::ha::LOOK, "B knows A's epoch", || async {
        standby.epoch().await == a_epoch
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", b.logged()));
    assert!(!b.leading().await, "two leaders");

    // On the leader: who leads and the epoch, then the table as always.
    let a_name = name_of(&a);
    let on_a = Ctl::flag(bin("droverctl"), a.bus_address());
    let out = on_a.ok(&["status"]).await;
    assert_eq!(
        out,
        format!(
            "Leader: {a_name} (this manager), epoch {a_epoch}\n{}",
            offline_table()
        )
    );
    // --json stays the array of nodes.
    let json: serde_json::Value =
        serde_json::from_str(&on_a.ok(&["--json", "status"]).await).expect("JSON");
    assert_eq!(json.as_array().map(Vec::len), Some(2), "{json}");

    // On the standby: every command refused, naming the leader.
    let on_b = Ctl::flag(bin("droverctl"), b.bus_address());
    let leader = format!("{a_name} (epoch {a_epoch})");
    for args in [
        &["status"][..],
        &["status", "-w"],
        &["status", "node1"],
        &["list-units"],
        &["list-units", "node1"],
        &["start", "node1", "web.service"],
        &["monitor"],
        &["--json", "status"],
    ] {
        assert_refused(on_b.run(args).await, b.bus_address(), &leader, args);
    }

    // The leader dies: B leads, and says so.
    a.kill();
    b.until_leading(true, T).await;
    let b_epoch = b.epoch().await;
    assert!(b_epoch > a_epoch);
    let out = on_b.ok(&["status"]).await;
    assert_eq!(
        out,
        format!(
            "Leader: {} (this manager), epoch {b_epoch}\n{}",
            name_of(&b),
            offline_table()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_alone_prints_the_table_it_always_printed() {
    let alone = manager("").await;
    assert!(alone.leading().await);
    assert_eq!(alone.epoch().await, 0);
    let ctl = Ctl::flag(bin("droverctl"), alone.bus_address());
    assert_eq!(ctl.ok(&["status"]).await, offline_table());
    let json: serde_json::Value =
        serde_json::from_str(&ctl.ok(&["--json", "status"]).await).expect("JSON");
    assert_eq!(json.as_array().map(Vec::len), Some(2), "{json}");
}
