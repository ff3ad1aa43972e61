//! Health checks of the whole agent against a real `systemd --user` node,
//! with a fake manager reading what the agent sends: each check kind against
//! real listeners and real commands, the counters over down/up cycles, a
//! hanging check, a check as a non-root `User=`, bad `[X-Drover]` sections,
//! `HealthOnFailure=restart`, pushed health with its time to live, the
//! snapshot at registration and after a daemon-reload. Every node, process
//! and directory a test makes goes in `Drop`.

mod common;

use common::*;
use drover_protocol::{Event, Health, HealthSnapshot, HealthState, ToManager};
use drover_testkit::process::{TempDir, free_port};
use std::path::Path;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// A node, the agent on it and the fake manager's session with it. Fields
/// drop in order: the agent goes before the node its checks run against.
struct Rig {
    agent: InProcessAgent,
    session: ManagerSession,
    manager: FakeManager,
    node: SystemdNode,
    /// The snapshot parts the session began with.
    snapshot: Vec<HealthSnapshot>,
    /// Health news read while waiting for another unit's.
    pending: Vec<(String, Health)>,
}

impl Rig {
    /// Starts a node with `units` installed, the agent, and accepts its session.
    async fn start(tag: &str, units: &[(&str, &str)]) -> Rig {
        Self::start_running(tag, units, &[]).await
    }

    /// [`Rig::start`], with the units `running` started before the agent.
    async fn start_running(tag: &str, units: &[(&str, &str)], running: &[&str]) -> Rig {
        let node = SystemdNode::start(&format!("health-{tag}"), "node").await;
        for (name, text) in units {
            write(&node.unit_dir().join(name), text);
        }
        node.reload().await;
        for unit in running {
            let out = node.systemctl(&["start", unit]);
            assert!(out.status.success(), "start {unit}: {out:?}");
        }
        let manager = FakeManager::bind().await;
        let agent = InProcessAgent::start(&node, "node", manager.port(), || {});
        let mut session = accept(&manager, 1).await;
        let snapshot = read_snapshot(&mut session).await;
        Rig {
            agent,
            session,
            manager,
            node,
            snapshot,
            pending: Vec::new(),
        }
    }

    fn ctl(&self, args: &[&str]) {
        let out = self.node.systemctl(args);
        assert!(
            out.status.success(),
            "systemctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The next health change of `unit` the agent sends.
    async fn next_health(&mut self, unit: &str) -> Health {
        self.next_health_within(unit, T)
            .await
            .unwrap_or_else(|| panic!("no health news of {unit} within {T:?}"))
    }

    async fn next_health_within(&mut self, unit: &str, within: Duration) -> Option<Health> {
        if let Some(i) = self.pending.iter().position(|(u, _)| u == unit) {
            return Some(self.pending.remove(i).1);
        }
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let m = self
                .session
                .maybe(left, |m| {
                    matches!(m, ToManager::Event(Event::UnitHealth { .. }))
                })
                .await?;
            let ToManager::Event(Event::UnitHealth {
                unit: u, health, ..
            }) = m
            else {
                unreachable!()
            };
            if u.as_str() == unit {
                return Some(health);
            }
            self.pending.push((u.to_string(), health));
        }
    }

    /// Health news of `unit` until one in `state`; returns it.
    async fn until(&mut self, unit: &str, state: HealthState) -> Health {
        loop {
            let h = self.next_health(unit).await;
            if h.state == state {
                return h;
            }
        }
    }
}

fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Accepts the agent's session as the real manager does by default: no
/// heartbeats of its own, so the agent does not watch for its silence.
async fn accept(manager: &FakeManager, session_id: u64) -> ManagerSession {
    let accepted = drover_protocol::handshake::Accepted {
        session_id,
        heartbeat_interval_ms: 0,
        heartbeat_threshold_ms: 0,
        manager_version: "fake".into(),
        resync_interval_ms: 0,
        epoch: 0,
    };
    manager.accept_with("node", accepted, T).await
}

/// The snapshot parts a session begins with (the first frames).
async fn read_snapshot(session: &mut ManagerSession) -> Vec<HealthSnapshot> {
    let mut parts = Vec::new();
    loop {
        match session.recv(T).await {
            Some(Some(ToManager::Event(Event::HealthSnapshot { part, .. }))) => {
                let last = part.is_last();
                parts.push(part);
                if last {
                    return parts;
                }
            }
            Some(Some(ToManager::Heartbeat)) => continue,
            other => panic!("the session did not begin with the health snapshot: {other:?}"),
        }
    }
}

/// A service listening on TCP `port` (HTTP: `/` answers 200, anything
/// missing 404), with `x_drover` as its `[X-Drover]` section.
fn http_server(port: u16, x_drover: &str) -> String {
    format!(
        "[Service]\nExecStart=/usr/bin/python3 -m http.server {port} --bind 127.0.0.1 --directory /\n\n[X-Drover]\n{x_drover}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_check_against_a_real_listener_down_and_up() {
    let port = free_port();
    let mut r = Rig::start(
        "tcp",
        &[(
            "db.service",
            &http_server(
                port,
                &format!("HealthTCP=127.0.0.1:{port}\nHealthInterval=200ms\nHealthRetries=2"),
            ),
        )],
    )
    .await;
    // Not loaded yet (systemd loads units when they are needed): no health.
    assert!(
        r.snapshot.last().unwrap().units.is_empty(),
        "{:?}",
        r.snapshot
    );

    r.ctl(&["start", "db.service"]);
    let h = r.until("db.service", HealthState::Healthy).await;
    assert_eq!(h.reason, "");
    // Stop the listener's process only (the unit restarts nothing): the
    // unit goes inactive, so health has no verdict.
    r.ctl(&["stop", "db.service"]);
    let h = r.until("db.service", HealthState::Starting).await;
    assert_eq!(h.reason, "the unit is not active");
    r.ctl(&["start", "db.service"]);
    r.until("db.service", HealthState::Healthy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_check_passes_on_2xx_and_fails_with_the_status_line() {
    let (a, b) = (free_port(), free_port());
    let mut r = Rig::start(
        "http",
        &[
            (
                "web-ok.service",
                &http_server(a, &format!("HealthHTTP=http://127.0.0.1:{a}/\nHealthRetries=1")),
            ),
            (
                "web-404.service",
                &http_server(
                    b,
                    &format!("HealthHTTP=http://127.0.0.1:{b}/no-such-file\nHealthRetries=1\nHealthStartPeriod=0"),
                ),
            ),
        ],
    )
    .await;
    r.ctl(&["start", "web-ok.service", "web-404.service"]);
    let ok = r.until("web-ok.service", HealthState::Healthy).await;
    assert!(ok.reason.starts_with("HTTP/1.0 200"), "{ok:?}");
    let bad = r.until("web-404.service", HealthState::Unhealthy).await;
    // Before the server listens the connect fails; once it does, 404.
    if !bad.reason.contains("404") {
        assert!(bad.reason.contains("connect to 127.0.0.1"), "{bad:?}");
    }
}

/// `HealthCmd=` with retries 3: exactly three failed runs make it unhealthy,
/// one success makes it healthy, over many down/up cycles (the counters are
/// consecutive and reset by the opposite result).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_check_counts_consecutive_failures_over_many_cycles() {
    let tmp = TempDir::new("drover-health-cmd");
    let flag = tmp.join("ok");
    let runs = tmp.join("runs");
    let check = format!(
        "HealthCmd=/bin/sh -c 'echo run >> {runs}; test -e {flag} || {{ echo no flag; exit 1; }}'\nHealthInterval=100ms\nHealthRetries=3",
        runs = runs.display(),
        flag = flag.display()
    );
    let mut r = Rig::start(
        "cmd",
        &[(
            "app.service",
            &format!("[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\n{check}\n"),
        )],
    )
    .await;
    write(&flag, "");
    r.ctl(&["start", "app.service"]);
    r.until("app.service", HealthState::Healthy).await;
    let count = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    for cycle in 0..5 {
        std::fs::remove_file(&flag).unwrap();
        let before = count();
        let h = r.next_health("app.service").await;
        assert_eq!(h.state, HealthState::Unhealthy, "cycle {cycle}");
        assert_eq!(h.reason, "exit status 1: no flag", "cycle {cycle}");
        // The run that saw the flag gone may have started before it went.
        let failed = count() - before;
        assert!(
            (3..=4).contains(&failed),
            "cycle {cycle}: {failed} runs to turn unhealthy"
        );
        write(&flag, "");
        let h = r.next_health("app.service").await;
        assert_eq!(h.state, HealthState::Healthy, "cycle {cycle}");
    }
}

/// A check that hangs is killed at its timeout with everything it started,
/// and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_check_times_out_and_leaves_nothing_behind() {
    let tmp = TempDir::new("drover-health-hang");
    let pids = tmp.join("pids");
    let check = format!(
        "HealthCmd=/bin/sh -c 'sleep 300 & echo $! >> {p}; echo $$ >> {p}; echo waiting; sleep 300'\nHealthTimeout=300ms\nHealthRetries=1",
        p = pids.display()
    );
    let mut r = Rig::start(
        "hang",
        &[(
            "app.service",
            &format!("[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\n{check}\n"),
        )],
    )
    .await;
    r.ctl(&["start", "app.service"]);
    let h = r.until("app.service", HealthState::Unhealthy).await;
    assert_eq!(
        h.reason,
        "timed out after 300ms (systemd killed its cgroup): waiting"
    );
    let listed = std::fs::read_to_string(&pids).unwrap();
    let pids: Vec<i32> = listed
        .lines()
        .map(|l| l.trim().parse().unwrap_or_else(|_| panic!("{listed:?}")))
        .collect();
    assert!(pids.len() >= 2, "{listed}");
    for pid in &pids[..2] {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s
                    .rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))),
            "process {pid} of the check survived"
        );
    }
}

/// The check of a unit with `User=nobody` runs as nobody (uid and groups),
/// never as root, although the agent is root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_runs_as_the_units_non_root_user() {
    let tmp = TempDir::new("drover-health-user");
    // nobody must be able to write its answer here.
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    let out = tmp.join("ids");
    let check = format!(
        "HealthCmd=/bin/sh -c 'id -u > {o}; id -G >> {o}; echo $HOME $USER >> {o}'\nHealthRetries=1",
        o = out.display()
    );
    let mut r = Rig::start(
        "user",
        &[(
            "app.service",
            &format!("[Service]\nUser=nobody\nExecStart=/bin/sleep 600\n[X-Drover]\n{check}\n"),
        )],
    )
    .await;
    r.ctl(&["start", "app.service"]);
    r.until("app.service", HealthState::Healthy).await;
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(nobody.uid.to_string().as_str()),
        "{text}"
    );
    let groups: Vec<&str> = lines.next().unwrap().split(' ').collect();
    assert!(!groups.contains(&"0"), "{text}");
    assert!(groups.contains(&nobody.gid.to_string().as_str()), "{text}");
    // systemd sets USER for a service with User= (HOME is the manager's
    // own in a user manager).
    assert!(
        lines.next().is_some_and(|l| l.ends_with(" nobody")),
        "{text}"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&out).unwrap().uid(), nobody.uid.as_raw());
}

/// `Port=` and `Ports=` are `[X-Drover]` keys: a unit declaring them is
/// checked as any other, and garbage in them (reported in the agent's log
/// and keeping the unit out of port answers) never makes it unhealthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_keys_do_not_touch_health_even_when_garbage() {
    let (a, b) = (free_port(), free_port());
    let mut r = Rig::start(
        "ports",
        &[
            (
                "web.service",
                &http_server(
                    a,
                    &format!("HealthTCP=127.0.0.1:{a}\nHealthInterval=200ms\nPort={a}\nPorts=http:{a},admin:9"),
                ),
            ),
            (
                "junk.service",
                &http_server(
                    b,
                    &format!("HealthTCP=127.0.0.1:{b}\nHealthInterval=200ms\nPort=http\nPorts=a_b:0,x"),
                ),
            ),
        ],
    )
    .await;
    r.ctl(&["start", "web.service", "junk.service"]);
    for unit in ["web.service", "junk.service"] {
        loop {
            let h = r.next_health(unit).await;
            // Before the server listens a connect may fail; a section
            // error (naming a key) would be the bug.
            assert!(!h.reason.contains("key '"), "{unit}: {h:?}");
            if h.state == HealthState::Healthy {
                break;
            }
        }
    }
}

/// A bad `[X-Drover]` section is the unit's health, naming file, line and
/// key; fixing it and reloading takes effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sections_are_unhealthy_with_file_line_and_key_until_fixed() {
    let port = free_port();
    let mut r = Rig::start(
        "bad",
        &[
            (
                "db.service",
                &http_server(port, &format!("HealthTCP=127.0.0.1:{port}")),
            ),
            (
                "db.service.d/50-health.conf",
                "[X-Drover]\n# too many\nHealthRetries=many\n",
            ),
            ("two.service", "[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\nHealthTCP=127.0.0.1:1\nHealthCmd=/bin/true\n"),
            ("typo.service", "[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\nHealthTcp=127.0.0.1:1\n"),
        ],
    )
    .await;
    // Health is known once systemd loads a unit: starting does.
    r.ctl(&["start", "db.service", "two.service", "typo.service"]);
    let mut reasons = std::collections::HashMap::new();
    for unit in ["db.service", "two.service", "typo.service"] {
        let h = r.next_health(unit).await;
        reasons.insert(unit, (h.state, h.reason));
    }
    let reason = |name: &str| reasons[name].clone();
    let dropin = r.node.unit_dir().join("db.service.d/50-health.conf");
    assert_eq!(
        reason("db.service"),
        (
            HealthState::Unhealthy,
            format!(
                "{}:3: key 'HealthRetries': 'many' is not a number from 1 to 100",
                dropin.display()
            )
        )
    );
    let (state, why) = reason("two.service");
    assert_eq!(state, HealthState::Unhealthy);
    assert!(
        why.contains(":5: key 'HealthCmd': a unit has one check")
            || why.contains("already declares"),
        "{why}"
    );
    let (state, why) = reason("typo.service");
    assert_eq!(state, HealthState::Unhealthy);
    assert!(why.contains(":4: key 'HealthTcp': unknown key"), "{why}");
    // Fixed by a later drop-in, after a daemon-reload.
    write(
        &r.node.unit_dir().join("db.service.d/60-fix.conf"),
        "[X-Drover]\nHealthRetries=2\n",
    );
    r.node.reload().await;
    // Active already: checked from now on.
    let h = r.next_health("db.service").await;
    assert_eq!((h.state, h.reason.as_str()), (HealthState::Starting, ""));
    r.until("db.service", HealthState::Healthy).await;
}

/// `HealthOnFailure=restart`: the agent asks systemd to restart the unit
/// once it turns unhealthy; after the restart it is checked afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_failure_restart_restarts_the_unit() {
    let tmp = TempDir::new("drover-health-restart");
    let starts = tmp.join("starts");
    // Healthy from its second start on.
    let unit = format!(
        "[Service]\nExecStart=/bin/sh -c 'echo start >> {s}; exec sleep 600'\n[X-Drover]\nHealthCmd=/bin/sh -c 'test $(wc -l < {s}) -ge 2'\nHealthRetries=1\nHealthOnFailure=restart\n",
        s = starts.display()
    );
    let mut r = Rig::start("restart", &[("app.service", &unit)]).await;
    r.ctl(&["start", "app.service"]);
    r.until("app.service", HealthState::Unhealthy).await;
    // The restart: no verdict while it is not active, then healthy.
    r.until("app.service", HealthState::Healthy).await;
    let n = std::fs::read_to_string(&starts).unwrap().lines().count();
    assert_eq!(n, 2, "started {n} times");
}

/// Pushed health: `ReportHealth` sets the verdict, which turns unhealthy when
/// its time to live runs out; garbage and undeclared units are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_health_holds_for_its_time_to_live() {
    let mut r = Rig::start(
        "push",
        &[
            (
                "app.service",
                "[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\nHealthPush=yes\n",
            ),
            ("plain.service", "[Service]\nExecStart=/bin/sleep 600\n"),
        ],
    )
    .await;
    let conn = zbus::connection::Builder::address(r.node.bus_address().as_str())
        .build()
        .await
        .unwrap();
    let report = |unit: &str, state: &str, reason: &str, ttl: u64| {
        let conn = conn.clone();
        let (unit, state, reason) = (unit.to_owned(), state.to_owned(), reason.to_owned());
        async move {
            conn.call_method(
                Some("org.eclipse.bluechi.Agent"),
                "/org/eclipse/bluechi",
                Some("io.drover.Agent"),
                "ReportHealth",
                &(unit, state, reason, ttl),
            )
            .await
            .map(|_| ())
            .map_err(|e| match e {
                zbus::Error::MethodError(name, msg, _) => {
                    format!("{}: {}", name.as_str(), msg.unwrap_or_default())
                }
                other => other.to_string(),
            })
        }
    };
    // Not loaded yet: nothing is known of it.
    let err = report("app.service", "healthy", "", 1_000_000)
        .await
        .unwrap_err();
    assert!(
        err.starts_with("org.freedesktop.DBus.Error.Failed: "),
        "{err}"
    );
    r.ctl(&["start", "app.service", "plain.service"]);
    let h = r.until("app.service", HealthState::Starting).await;
    let _ = h;
    let err = report("plain.service", "healthy", "", 1_000_000)
        .await
        .unwrap_err();
    assert!(
        err.starts_with(
            "org.freedesktop.DBus.Error.Failed: plain.service declares no pushed health"
        ),
        "{err}"
    );
    for (unit, state, ttl) in [
        ("app", "healthy", 1_000_000u64),
        ("app.service", "great", 1_000_000),
        ("app.service", "healthy", 0),
    ] {
        let err = report(unit, state, "", ttl).await.unwrap_err();
        assert!(
            err.starts_with("org.freedesktop.DBus.Error.InvalidArgs"),
            "{err}"
        );
    }
    report("app.service", "healthy", "serving", 600_000)
        .await
        .unwrap();
    let h = r.next_health("app.service").await;
    assert_eq!(
        (h.state, h.reason.as_str()),
        (HealthState::Healthy, "serving")
    );
    // Renewed twice within its TTL: no news.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        report("app.service", "healthy", "serving", 600_000)
            .await
            .unwrap();
    }
    let h = r.next_health("app.service").await;
    assert_eq!(h.state, HealthState::Unhealthy);
    assert_eq!(
        h.reason,
        "no report within its time to live (the last one said healthy)"
    );
    let (state, _, since): (String, String, u64) = conn
        .call_method(
            Some("org.eclipse.bluechi.Agent"),
            "/org/eclipse/bluechi",
            Some("io.drover.Agent"),
            "GetUnitHealth",
            &("app.service",),
        )
        .await
        .unwrap()
        .body()
        .deserialize()
        .unwrap();
    assert_eq!(state, "unhealthy");
    assert!(since > 0);
}

/// A new session begins with the snapshot of every declared unit; unchanged
/// results send nothing at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_gets_the_snapshot_and_unchanged_results_send_nothing() {
    let port = free_port();
    let mut r = Rig::start(
        "snapshot",
        &[(
            "db.service",
            &http_server(
                port,
                &format!("HealthTCP=127.0.0.1:{port}\nHealthInterval=100ms"),
            ),
        )],
    )
    .await;
    r.ctl(&["start", "db.service"]);
    r.until("db.service", HealthState::Healthy).await;
    // Ten intervals of passing runs: not one frame but heartbeats.
    let quiet = r
        .session
        .maybe(Duration::from_secs(1), |m| {
            !matches!(m, ToManager::Heartbeat)
        })
        .await;
    assert_eq!(quiet, None);
    let Rig {
        agent,
        session,
        manager,
        node,
        ..
    } = r;
    drop(session);
    let mut session = accept(&manager, 2).await;
    let parts = read_snapshot(&mut session).await;
    let units = &parts.last().unwrap().units;
    assert_eq!(units.len(), 1);
    assert_eq!(units[0].health.state, HealthState::Healthy);
    assert_eq!(
        parts.last().unwrap().node.as_ref().unwrap().system_state,
        "running"
    );
    agent.stop(T).await;
    drop(node);
}

/// Units that run before the agent starts are read at its start; a check
/// added to a running unit by a drop-in and a daemon-reload is read then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_units_are_read_at_start_and_after_a_reload() {
    let (a, b) = (free_port(), free_port());
    let mut r = Rig::start_running(
        "running",
        &[
            (
                "db.service",
                &http_server(a, &format!("HealthTCP=127.0.0.1:{a}")),
            ),
            (
                "web.service",
                &format!(
                    "[Service]\nExecStart=/usr/bin/python3 -m http.server {b} --bind 127.0.0.1 --directory /\n"
                ),
            ),
        ],
        &["db.service", "web.service"],
    )
    .await;
    let units = &r.snapshot.last().unwrap().units;
    assert_eq!(units.len(), 1, "{units:?}");
    assert_eq!(units[0].unit.as_str(), "db.service");
    if units[0].health.state != HealthState::Healthy {
        r.until("db.service", HealthState::Healthy).await;
    }
    write(
        &r.node.unit_dir().join("web.service.d/health.conf"),
        &format!("[X-Drover]\nHealthHTTP=http://127.0.0.1:{b}/\n"),
    );
    r.node.reload().await;
    r.until("web.service", HealthState::Healthy).await;
    // And taken away again: none.
    std::fs::remove_file(r.node.unit_dir().join("web.service.d/health.conf")).unwrap();
    r.node.reload().await;
    let h = r.next_health("web.service").await;
    assert_eq!(h.state, HealthState::None);
}

/// On a node where nothing declares health the agent does not follow the
/// units; a daemon-reload that adds a check to a running unit starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_the_first_check_is_read() {
    let b = free_port();
    let mut r = Rig::start_running(
        "first-check",
        &[(
            "web.service",
            &format!(
                "[Service]\nExecStart=/usr/bin/python3 -m http.server {b} --bind 127.0.0.1 --directory /\n"
            ),
        )],
        &["web.service"],
    )
    .await;
    assert!(r.snapshot.last().unwrap().units.is_empty());
    write(
        &r.node.unit_dir().join("web.service.d/health.conf"),
        &format!("[X-Drover]\nHealthHTTP=http://127.0.0.1:{b}/\n"),
    );
    r.node.reload().await;
    r.until("web.service", HealthState::Healthy).await;
}
