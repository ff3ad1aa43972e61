//! The manager's Prometheus endpoint on a real sandbox cluster, checked the
//! way an operator would: scraped over HTTP, validated by the real
//! `promtool check metrics`, scraped by a real `prometheus` server whose
//! query API must count the online nodes; figures that follow the fleet
//! (an agent stopped, a job run, an intruder refused); and garbage requests
//! that get clear answers and change nothing.

use drover_testkit::api::job_call;
use drover_testkit::http::{self, promtool_check, sample};
use drover_testkit::prelude::*;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const DETECT: Duration = Duration::from_secs(10);

/// `n` nodes whose manager serves metrics.
fn metered(n: usize) -> drover_sandbox::ClusterOptions {
    drover_sandbox::ClusterOptions {
        metrics: true,
        ..drover_sandbox::ClusterOptions::with_nodes(n)
    }
}

fn url(c: &TestCluster) -> String {
    c.metrics_url().expect("the sandbox serves metrics")
}

/// A scrape as Prometheus asks for it: OpenMetrics.
async fn scrape_openmetrics(url: &str) -> String {
    let (host, path) = http::split_url(url).unwrap();
    let a = http::request(
        host,
        &format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/openmetrics-text;version=1.0.0,\
             text/plain;version=0.0.4;q=0.5\r\nConnection: close\r\n\r\n"
        ),
    )
    .await
    .unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        a.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    a.body
}

/// Waits until `series` shows `want` in a scrape; returns that scrape.
async fn until(url: &str, series: &str, want: f64) -> String {
    until_with(url, series, |v| v == want).await
}

/// Waits until `series` shows a value `ok` accepts; returns that scrape.
async fn until_with(url: &str, series: &str, ok: impl Fn(f64) -> bool) -> String {
    until_within(DETECT, url, series, ok).await
}

/// [`until_with`] with a deadline of `within`.
async fn until_within(
    within: Duration,
    url: &str,
    series: &str,
    ok: impl Fn(f64) -> bool,
) -> String {
    http::scrape_until(within, url, series, ok).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_follows_the_fleet_and_promtool_accepts_it() {
    let mut c = TestCluster::with(metered(3)).await;
    c.install("node1", "once.service", ONESHOT_OK).await;
    let url = url(&c);

    let text = until(&url, r#"drover_nodes{status="online"}"#, 3.0).await;
    assert_eq!(
        sample(&text, r#"drover_nodes{status="offline"}"#),
        Some(0.0)
    );
    for n in ["node1", "node2", "node3"] {
        assert_eq!(
            sample(&text, &format!("drover_node_up{{node=\"{n}\"}}")),
            Some(1.0),
            "{n}"
        );
        let seen = sample(
            &text,
            &format!("drover_node_last_seen_timestamp_seconds{{node=\"{n}\"}}"),
        )
        .unwrap_or_else(|| panic!("{n} last seen in:\n{text}"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            (now - 60.0..=now + 1.0).contains(&seen),
            "{n}: {seen} vs {now}"
        );
    }
    assert!(
        sample(&text, "drover_registrations_total").unwrap() >= 3.0,
        "{text}"
    );
    assert!(sample(&text, "drover_process_resident_memory_bytes").unwrap() > 0.0);
    assert!(sample(&text, "drover_process_open_fds").unwrap() > 0.0);
    assert!(text.contains("drover_build_info{version=\""), "{text}");
    assert!(
        !text.contains("# EOF"),
        "curl gets the text format 0.0.4:\n{text}"
    );
    let om = scrape_openmetrics(&url).await;
    assert!(
        om.ends_with("# EOF\n"),
        "OpenMetrics ends with # EOF:\n{om}"
    );
    assert!(om.contains("# TYPE drover_registrations counter\n"), "{om}");
    let (ok, said) = promtool_check(&text).await;
    assert!(
        ok && said.is_empty(),
        "promtool check metrics said:\n{said}\non:\n{text}"
    );

    // The link: every agent's TLS handshake counted ok; bytes that are no TLS
    // counted as a refusal of class `protocol`; heartbeats timed against
    // NodeHeartbeatThreshold.
    assert!(
        sample(&text, r#"drover_tls_handshakes_total{result="ok"}"#).unwrap() >= 3.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"drover_tls_handshakes_total{result="protocol"}"#),
        Some(0.0)
    );
    let mut garbage = tokio::net::TcpStream::connect(("127.0.0.1", c.manager_port()))
        .await
        .unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let text = until(
        &url,
        r#"drover_tls_handshakes_total{result="protocol"}"#,
        1.0,
    )
    .await;
    drop(garbage);
    assert!(!text.contains("GET /"), "{text}");
    // Heartbeats are read a batch at a time and a batch is counted when the
    // next one is read (`HeartbeatGaps`): two batches of the sandbox's
    // 500 ms heartbeats after registration.
    let batches =
        Duration::from_millis(2 * 500 * drover_protocol::liveness::HEARTBEATS_PER_READ as u64);
    let text = until_within(
        batches + DETECT,
        &url,
        "drover_heartbeat_lateness_ratio_count",
        |n| n >= 3.0,
    )
    .await;
    // Healthy links: each heartbeat about 500 ms after the one before, a
    // quarter of the 2 s threshold, never near it.
    let mean = sample(&text, "drover_heartbeat_lateness_ratio_sum").unwrap()
        / sample(&text, "drover_heartbeat_lateness_ratio_count").unwrap();
    assert!(mean > 0.1 && mean < 0.6, "mean lateness {mean}: {text}");

    // A job: counted by type and result, timed, and no longer in flight.
    let api = c.api().await;
    let node1 = api.node("node1").await;
    let mut jobs = api.jobs().await;
    let path = job_call(&node1, "StartUnit", "once.service").await.unwrap();
    assert_eq!(jobs.removed(&path, DETECT).await.unwrap().result, "done");
    let text = until(
        &url,
        r#"drover_jobs_total{job_type="start",result="done"}"#,
        1.0,
    )
    .await;
    assert_eq!(
        sample(&text, "drover_job_duration_seconds_count"),
        Some(1.0)
    );
    assert_eq!(sample(&text, "drover_jobs_in_flight"), Some(0.0));

    // D-Bus calls by interface, method and result: the StartUnit just made;
    // a GetNode of no such node (its error class); a method the controller
    // does not have and arguments of the wrong type, neither named by what
    // the caller sent.
    const CONTROLLER: &str = "org.eclipse.bluechi.Controller";
    let calls = |text: &str, iface: &str, method: &str, result: &str| {
        sample(
            text,
            &format!(
                "drover_dbus_calls_total{{interface=\"{iface}\",method=\"{method}\",result=\"{result}\"}}"
            ),
        )
    };
    assert_eq!(
        calls(&text, "org.eclipse.bluechi.Node", "StartUnit", "ok"),
        Some(1.0),
        "{text}"
    );
    assert!(api.get_node("nosuchnode").await.is_err());
    let evil = api
        .call::<_, ()>("/org/eclipse/bluechi", CONTROLLER, "EvilMethod", &())
        .await;
    assert!(evil.is_err(), "{evil:?}");
    let bad = api
        .call::<_, String>("/org/eclipse/bluechi", CONTROLLER, "GetNode", &(7u32,))
        .await;
    assert!(bad.is_err(), "{bad:?}");
    let text = until(
        &url,
        r#"drover_dbus_calls_total{interface="org.eclipse.bluechi.Controller",method="unknown",result="UnknownMethod"}"#,
        1.0,
    )
    .await;
    assert_eq!(
        calls(&text, CONTROLLER, "GetNode", "ServiceUnknown"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        calls(&text, CONTROLLER, "GetNode", "InvalidArgs"),
        Some(1.0),
        "{text}"
    );
    assert!(
        calls(&text, CONTROLLER, "GetNode", "ok").unwrap() >= 1.0,
        "{text}"
    );
    assert!(!text.contains("EvilMethod"), "{text}");

    // A monitor whose owner leaves the bus: counted, then dropped as owner_gone.
    let monitor = c.monitor().await;
    until(&url, "drover_monitors", 1.0).await;
    drop(monitor);
    let text = until(
        &url,
        r#"drover_monitor_drops_total{reason="owner_gone"}"#,
        1.0,
    )
    .await;
    assert_eq!(sample(&text, "drover_monitors"), Some(0.0));
    assert_eq!(
        sample(&text, r#"drover_monitor_drops_total{reason="too_slow"}"#),
        Some(0.0)
    );

    // An agent stops: its node goes down in the figures.
    c.stop_agent("node3").await.unwrap();
    let text = until(&url, r#"drover_nodes{status="online"}"#, 2.0).await;
    assert_eq!(
        sample(&text, r#"drover_nodes{status="offline"}"#),
        Some(1.0)
    );
    assert_eq!(sample(&text, r#"drover_node_up{node="node3"}"#), Some(0.0));
    // Counted under why it ended: the agent closed its connection.
    let disconnects = |text: &str, reason: &str| {
        sample(
            text,
            &format!("drover_node_disconnects_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(disconnects(&text, "agent_closed"), Some(1.0), "{text}");
    for reason in [
        "heartbeat_timeout",
        "connection_lost",
        "write_blocked",
        "protocol_error",
        "replaced",
        "reload",
        "shutdown",
        "standby",
    ] {
        assert_eq!(disconnects(&text, reason), Some(0.0), "{reason}: {text}");
    }
    // A frozen agent: dropped when nothing came for the threshold, and
    // counted as a heartbeat timeout, not as the link it then finds closed.
    c.signal_agent("node2", nix::sys::signal::Signal::SIGSTOP)
        .unwrap();
    let text = until(
        &url,
        r#"drover_node_disconnects_total{reason="heartbeat_timeout"}"#,
        1.0,
    )
    .await;
    c.signal_agent("node2", nix::sys::signal::Signal::SIGCONT)
        .unwrap();
    assert_eq!(disconnects(&text, "connection_lost"), Some(0.0), "{text}");
    assert_eq!(disconnects(&text, "agent_closed"), Some(1.0), "{text}");
    c.wait_status("node2", "online", DETECT).await;

    // An intruder on node3's bus: refused, counted by reason.
    c.start_agent_named("node3", "intruder").await.unwrap();
    let text = until(
        &url,
        r#"drover_registration_refusals_total{reason="unknown_node"}"#,
        1.0,
    )
    .await;
    assert!(
        !text.contains("intruder"),
        "no label names a refused peer:\n{text}"
    );
    let (ok, said) = promtool_check(&text).await;
    assert!(
        ok && said.is_empty(),
        "promtool check metrics said:\n{said}"
    );
    c.down().await;
}

/// Cross-node dependencies in the figures: a proxy that comes up is counted
/// active and timed; a failed cross-node start (the target's unit does not
/// exist, a node that does not exist) counts a proxy error by its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_are_counted_by_state_and_their_failures_by_reason() {
    const PROXY: &str = "drover-proxy@node2_db.service";
    let c = TestCluster::with(metered(2)).await;
    let url = url(&c);
    until(&url, r#"drover_nodes{status="online"}"#, 2.0).await;
    c.install("node2", "db.service", SLEEPER).await;
    c.install("node1", "need-db.service", &requester("Wants", PROXY))
        .await;
    let out = c.systemctl("node1", &["start", "need-db.service"]).await;
    assert!(out.success(), "{out:?}");
    let text = until(&url, r#"drover_proxies{state="active"}"#, 1.0).await;
    assert_eq!(
        sample(&text, r#"drover_proxies{state="waiting"}"#),
        Some(0.0)
    );
    assert_eq!(sample(&text, "drover_proxy_targets"), Some(1.0));
    assert_eq!(
        sample(&text, "drover_proxy_activation_seconds_count"),
        Some(1.0)
    );
    assert!(sample(&text, "drover_proxy_activation_seconds_sum").unwrap() > 0.0);
    for reason in ["unknown_node", "not_allowed", "start_failed", "target_down"] {
        assert_eq!(
            sample(
                &text,
                &format!("drover_proxy_errors_total{{reason=\"{reason}\"}}")
            ),
            Some(0.0),
            "{reason}"
        );
    }

    // A failed cross-node start: node2 has no nope.service.
    let nope = "drover-proxy@node2_nope.service";
    c.install("node1", "need-nope.service", &requester("Requires", nope))
        .await;
    let out = c.systemctl("node1", &["start", "need-nope.service"]).await;
    assert!(!out.success(), "need-nope must not start: {out:?}");
    let text = until(
        &url,
        r#"drover_proxy_errors_total{reason="start_failed"}"#,
        1.0,
    )
    .await;
    assert_eq!(sample(&text, "drover_proxy_targets"), Some(1.0), "db only");
    // And one on a node that does not exist.
    let nowhere = "drover-proxy@node9_db.service";
    c.install(
        "node1",
        "need-nowhere.service",
        &requester("Requires", nowhere),
    )
    .await;
    let out = c
        .systemctl("node1", &["start", "need-nowhere.service"])
        .await;
    assert!(!out.success(), "{out:?}");
    let text = until(
        &url,
        r#"drover_proxy_errors_total{reason="unknown_node"}"#,
        1.0,
    )
    .await;
    assert!(
        !text.contains("nope") && !text.contains("node9"),
        "no label names a unit:\n{text}"
    );
    let (ok, said) = promtool_check(&text).await;
    assert!(
        ok && said.is_empty(),
        "promtool check metrics said:\n{said}"
    );

    // The requester stops: its proxy goes, and the target is no longer wanted.
    let out = c
        .systemctl("node1", &["stop", "need-db.service", PROXY])
        .await;
    assert!(out.success(), "{out:?}");
    let text = until(&url, r#"drover_proxies{state="active"}"#, 0.0).await;
    assert_eq!(sample(&text, "drover_proxy_targets"), Some(0.0));
    c.down().await;
}

/// Health in the figures: units with a check on online nodes, by state,
/// following the check's verdicts; an offline node's units leave them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_are_counted_by_health_state() {
    let tmp = drover_testkit::process::TempDir::new("drover-metrics-health");
    let flag = tmp.join("ok");
    std::fs::write(&flag, "").unwrap();
    let mut c = TestCluster::with(metered(1)).await;
    let url = url(&c);
    let db = format!(
        "[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\n\
         HealthCmd=/bin/sh -c 'test -e {}'\n\
         HealthInterval=100ms\nHealthStartupInterval=100ms\nHealthRetries=2\n",
        flag.display()
    );
    c.install("node1", "db.service", &db).await;
    c.systemctl_ok("node1", &["start", "db.service"]).await;
    let text = until(&url, r#"drover_units_health{state="healthy"}"#, 1.0).await;
    assert_eq!(
        sample(&text, r#"drover_units_health{state="unhealthy"}"#),
        Some(0.0)
    );
    std::fs::remove_file(&flag).unwrap();
    let text = until(&url, r#"drover_units_health{state="unhealthy"}"#, 1.0).await;
    assert_eq!(
        sample(&text, r#"drover_units_health{state="healthy"}"#),
        Some(0.0)
    );
    c.stop_agent("node1").await.unwrap();
    until(&url, r#"drover_units_health{state="unhealthy"}"#, 0.0).await;
    c.down().await;
}

/// systemd's `SystemState` of each node, and the fleet's nodes counted by
/// it: a failed unit makes its node `degraded`, `reset-failed` makes it
/// `running` again; a node shows one state at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_shown_by_system_state() {
    let c = TestCluster::with(metered(2)).await;
    let url = url(&c);
    let state = |text: &str, node: &str, state: &str| {
        sample(
            text,
            &format!("drover_node_system_state{{node=\"{node}\",state=\"{state}\"}}"),
        )
    };
    // A user manager may still be starting: the agent reads SystemState
    // again every 10 s.
    let text = until_within(
        Duration::from_secs(30),
        &url,
        r#"drover_nodes_by_system_state{state="running"}"#,
        |n| n == 2.0,
    )
    .await;
    for node in ["node1", "node2"] {
        assert_eq!(state(&text, node, "running"), Some(1.0), "{text}");
    }
    c.install(
        "node2",
        "broken.service",
        "[Service]\nType=oneshot\nExecStart=/bin/false\n",
    )
    .await;
    let out = c.systemctl("node2", &["start", "broken.service"]).await;
    assert!(!out.success(), "{out:?}");
    let text = until(
        &url,
        r#"drover_node_system_state{node="node2",state="degraded"}"#,
        1.0,
    )
    .await;
    assert_eq!(state(&text, "node2", "running"), None, "{text}");
    assert_eq!(state(&text, "node1", "running"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, r#"drover_nodes_by_system_state{state="degraded"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, r#"drover_nodes_by_system_state{state="running"}"#),
        Some(1.0)
    );
    let (ok, said) = promtool_check(&text).await;
    assert!(
        ok && said.is_empty(),
        "promtool check metrics said:\n{said}"
    );
    c.systemctl_ok("node2", &["reset-failed", "broken.service"])
        .await;
    until(
        &url,
        r#"drover_nodes_by_system_state{state="running"}"#,
        2.0,
    )
    .await;
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_node_series_can_be_switched_off() {
    let c = TestCluster::with(drover_sandbox::ClusterOptions {
        manager_extra_config: "[drover-manager]\nMetricsPerNode=false\n".into(),
        ..metered(2)
    })
    .await;
    let text = until(&url(&c), r#"drover_nodes{status="online"}"#, 2.0).await;
    assert!(!text.contains("drover_node_up"), "{text}");
    assert!(!text.contains("drover_node_system_state"), "{text}");
    assert!(
        text.contains("drover_nodes_by_system_state{state=\"running\"}"),
        "the fleet-wide counts stay:\n{text}"
    );
    assert!(!text.contains("node1"), "{text}");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_requests_get_clear_answers_and_change_nothing() {
    let c = TestCluster::with(metered(1)).await;
    let url = url(&c);
    // Every bound drover_metrics::http sets, with the same requests as the agent's
    // endpoint gets (tests/tests/agent_metrics.rs).
    http::garbage_is_bounded(&url).await;
    let text = until(&url, r#"drover_nodes{status="online"}"#, 1.0).await;
    let (ok, said) = promtool_check(&text).await;
    assert!(ok && said.is_empty(), "{said}");
    c.wait_status("node1", "online", DETECT).await;
    c.down().await;
}

/// A `prometheus` server started by the test, stopped when dropped.
struct Prometheus {
    child: std::process::Child,
    dir: std::path::PathBuf,
    url: String,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = std::env::temp_dir().join(format!("drover-prometheus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: drover\n    static_configs:\n      - targets: ['{target}']\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        // Prometheus cannot be handed a socket: a port free when probed, outside the
        // ephemeral range (the sandbox's way for the manager's metrics port).
        let port = drover_sandbox::free_loopback_port().unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = std::process::Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian package prometheus) is installed");
        Prometheus {
            child,
            dir,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // Killed and reaped before its data directory goes: nothing outlives the test.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_online_nodes() {
    let mut c = TestCluster::with(metered(3)).await;
    let url = url(&c);
    let (target, _) = http::split_url(&url).unwrap();
    let target = target.to_owned();
    let prometheus = Prometheus::start(&target);
    let query = |q: &str| {
        format!(
            "{}/api/v1/query?query={}",
            prometheus.url,
            q.replace('"', "%22")
                .replace('{', "%7B")
                .replace('}', "%7D")
        )
    };
    let value = |body: &str| -> Option<f64> {
        let v: serde_json::Value = serde_json::from_str(body).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    };
    let online = query(r#"drover_nodes{status="online"}"#);
    let got = eventually(
        Duration::from_secs(30),
        "prometheus to see 3 online nodes",
        || {
            let online = online.clone();
            async move {
                match http::get(&online).await {
                    Ok(a) => value(&a.body) == Some(3.0),
                    Err(_) => false,
                }
            }
        },
    )
    .await;
    assert!(got.is_ok(), "prometheus log:\n{}", prometheus.log());
    // The scrape itself is healthy in Prometheus's eyes.
    let up = http::get(&query(r#"up{job="drover"}"#)).await.unwrap();
    assert_eq!(value(&up.body), Some(1.0), "{}", up.body);

    c.stop_agent("node2").await.unwrap();
    let got = eventually(
        Duration::from_secs(30),
        "prometheus to see 2 online nodes",
        || {
            let online = online.clone();
            async move {
                match http::get(&online).await {
                    Ok(a) => value(&a.body) == Some(2.0),
                    Err(_) => false,
                }
            }
        },
    )
    .await;
    assert!(got.is_ok(), "prometheus log:\n{}", prometheus.log());
    drop(prometheus);
    c.down().await;
}

fn repo_file(path: &str) -> String {
    let at = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&at).unwrap_or_else(|e| panic!("{}: {e}", at.display()))
}

/// `promtool check rules` of `rules` (YAML), its output on failure.
fn promtool_check_rules(rules: &str) -> Result<(), String> {
    let dir = drover_testkit::process::TempDir::new("drover-rules");
    let file = dir.join("rules.yml");
    std::fs::write(&file, rules).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (Debian package prometheus) is installed");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Every `drover_` series `text` names is in the monitoring page's table.
fn assert_listed(text: &str, what: &str) {
    let page = repo_file("docs/monitoring.md");
    let table = page.split("## Example alerts").next().unwrap();
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("drover_") {
            let family = ["_total", "_bucket", "_count", "_sum"]
                .iter()
                .fold(word, |w, suffix| w.trim_end_matches(suffix));
            assert!(
                table.contains(&format!("`{family}")),
                "{what}: {word} is not in the series table of docs/monitoring.md"
            );
        }
    }
}

/// The example alerting rules the package ships are the ones the monitoring
/// page shows, pass `promtool check rules`, and every drover series they use
/// is one the page lists.
#[test]
fn the_shipped_alerts_pass_promtool_and_are_the_documented_ones() {
    let shipped = repo_file("dist/usr/share/drover/prometheus/drover-alerts.yml");
    let page = repo_file("docs/monitoring.md");
    let documented = page
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split_once("```").map(|(block, _)| block))
        .find(|b| b.starts_with("groups:"))
        .expect("a ```yaml block of rules in docs/monitoring.md");
    let rules = shipped
        .split_once("groups:")
        .map(|(_, rest)| format!("groups:{rest}"))
        .expect("the shipped rules start with groups:");
    assert_eq!(
        rules, documented,
        "the shipped rules differ from the page's"
    );
    if let Err(out) = promtool_check_rules(&rules) {
        panic!("promtool check rules:\n{out}");
    }
    assert_listed(&rules, "the alerts");
}

/// The shipped Grafana dashboard: JSON Grafana imports (a title, a data
/// source variable every query uses), and each query is PromQL that
/// `promtool` accepts (checked as a recording rule) over series the
/// monitoring page lists.
#[test]
fn the_shipped_dashboard_queries_pass_promtool() {
    let text = repo_file("dist/usr/share/drover/grafana/drover-fleet.json");
    let board: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(board["uid"], "drover-fleet");
    assert!(board["title"].is_string());
    let variables = board["templating"]["list"].as_array().expect("variables");
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
        "a data source variable"
    );
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut queries = 0;
    for panel in board["panels"].as_array().expect("panels") {
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("a query");
            queries += 1;
            rules.push_str(&format!(
                "      - record: dashboard:query_{queries}\n        expr: {}\n",
                serde_json::to_string(expr).unwrap()
            ));
            assert_listed(expr, &format!("panel {}", panel["title"]));
        }
    }
    assert!(queries >= 10, "{queries} queries");
    if let Err(out) = promtool_check_rules(&rules) {
        panic!("promtool check rules on the dashboard's queries:\n{out}\n{rules}");
    }
}
