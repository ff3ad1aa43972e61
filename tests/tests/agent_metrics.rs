//! The agent's own Prometheus endpoint (`MetricsListenAddress=` in
//! `[drover-agent]`) on a real sandbox node, checked the way an operator
//! would: scraped over HTTP, validated by the real `promtool check metrics`;
//! figures that follow what the agent does (a node check runs, a job ends,
//! the manager goes and comes back); garbage requests bounded as for the
//! manager; and no listener at all without the key.

use drover_testkit::api::job_call;
use drover_testkit::http::{self, garbage_is_bounded, promtool_check, sample};
use drover_testkit::prelude::*;
use std::collections::HashSet;
use std::time::Duration;

const DETECT: Duration = Duration::from_secs(10);

/// The TCP ports process `pid` listens on: its sockets (`/proc/PID/fd`)
/// that its network namespace's tables (`/proc/PID/net/tcp{,6}`) list in
/// state LISTEN.
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                let port = f[1].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

/// A TCP port that accepts and closes, for a node check to pass on.
async fn accepting_port() -> (u16, tokio::task::JoinHandle<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    });
    (port, task)
}

/// Replaces `node`'s agent by one serving metrics on a free loopback port
/// (the port alone, as an operator writes it) with a TCP node check on
/// `check_port`; returns its pid and the endpoint's URL once the node is
/// online.
async fn metered_agent(c: &mut TestCluster, node: &str, check_port: u16) -> (u32, String) {
    let port = drover_sandbox::free_loopback_port().unwrap();
    c.stop_agent(node).await.unwrap();
    c.wait_status(node, "offline", DETECT).await;
    let agent = c
        .start_agent_with(
            node,
            node,
            &format!(
                "MetricsListenAddress={port}\n\n[health reach]\nHealthTCP=127.0.0.1:{check_port}\n\
                 HealthInterval=100ms\nHealthStartupInterval=100ms\n"
            ),
        )
        .await
        .unwrap();
    c.wait_status(node, "online", DETECT).await;
    (agent.pid, format!("http://127.0.0.1:{port}/metrics"))
}

/// Waits until `series` shows a value `ok` accepts; returns that scrape.
async fn until(url: &str, series: &str, ok: impl Fn(f64) -> bool) -> String {
    http::scrape_until(DETECT, url, series, ok).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_serves_its_own_figures_and_promtool_accepts_them() {
    let mut c = TestCluster::start(2).await;
    c.install("node1", "once.service", ONESHOT_OK).await;
    let (check_port, accepting) = accepting_port().await;
    let (pid, url) = metered_agent(&mut c, "node1", check_port).await;

    // What curl and promtool see: the classic text format, clean.
    let plain = http::get(&url).await.unwrap();
    assert_eq!(plain.status, 200, "{plain:?}");
    assert_eq!(
        plain.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let (ok, said) = promtool_check(&plain.body).await;
    assert!(ok && said.is_empty(), "promtool: {said}\n{}", plain.body);
    let text = &plain.body;
    assert_eq!(sample(text, "drover_agent_connected"), Some(1.0), "{text}");
    let manager = format!(
        "drover_agent_manager{{manager=\"127.0.0.1:{}\"}}",
        c.manager_port()
    );
    assert_eq!(sample(text, &manager), Some(1.0), "{text}");
    assert_eq!(sample(text, "drover_agent_reconnects_total"), Some(0.0));
    assert_eq!(sample(text, "drover_agent_leader_epoch"), Some(0.0));
    assert!(
        text.contains("drover_agent_build_info{version=\""),
        "{text}"
    );
    assert!(
        sample(text, "drover_agent_process_resident_memory_bytes").unwrap_or(0.0) > 0.0,
        "{text}"
    );
    // Every family served is in the agent's table of docs/monitoring.md, and
    // named drover_agent_ (never adding to the manager's series).
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring.md"),
    )
    .unwrap();
    let table = page
        .split("## The agent's endpoint")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/monitoring.md has the agent's section");
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    assert!(families.len() >= 12, "{families:?}");
    for family in families {
        assert!(family.starts_with("drover_agent_"), "{family}");
        assert!(
            table.contains(&format!("`{family}")),
            "{family} is not in the agent's table of docs/monitoring.md"
        );
    }
    // No manager series, no unit names: the agent's figures only.
    assert!(!text.contains("\ndrover_nodes"), "{text}");
    assert!(!text.contains(".service"), "{text}");

    // The node check runs: its counter rises, and so do its durations.
    let runs = r#"drover_agent_health_checks_total{kind="tcp",result="pass"}"#;
    let before = sample(text, runs).unwrap();
    let text = until(&url, runs, |n| n >= before + 3.0).await;
    assert!(
        sample(
            &text,
            r#"drover_agent_health_check_duration_seconds_count{kind="tcp"}"#
        )
        .unwrap()
            >= before + 3.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"drover_agent_health_checks_total{kind="cmd",result="pass"}"#
        ),
        Some(0.0)
    );

    // A job the manager relays ends on this node: counted by its result.
    let api = c.api().await;
    let node1 = api.node("node1").await;
    let mut jobs = api.jobs().await;
    let path = job_call(&node1, "StartUnit", "once.service").await.unwrap();
    assert_eq!(jobs.removed(&path, DETECT).await.unwrap().result, "done");
    let text = until(&url, r#"drover_agent_jobs_total{result="done"}"#, |n| {
        n == 1.0
    })
    .await;
    assert_eq!(sample(&text, "drover_agent_jobs_in_flight"), Some(0.0));
    drop((node1, jobs, api));

    // The manager goes: the agent says so; it comes back: one reconnect.
    c.stop_manager().await.unwrap();
    let text = until(&url, "drover_agent_connected", |n| n == 0.0).await;
    assert!(!text.contains("drover_agent_manager{"), "{text}");
    c.start_manager().await.unwrap();
    until(&url, "drover_agent_reconnects_total", |n| n == 1.0).await;
    until(&url, "drover_agent_connected", |n| n == 1.0).await;

    // The agent with the key listens on its port and nothing else; node2's
    // agent, without the key, listens on nothing.
    let host = http::split_url(&url).unwrap().0;
    let metrics_port: u16 = host.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(listening_ports(pid), vec![metrics_port]);
    let plain_agent = c.agent_pid("node2").unwrap();
    assert_eq!(listening_ports(plain_agent), Vec::<u16>::new());

    accepting.abort();
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_requests_to_an_agent_are_bounded_and_change_nothing() {
    let mut c = TestCluster::start(1).await;
    let (check_port, accepting) = accepting_port().await;
    let (_, url) = metered_agent(&mut c, "node1", check_port).await;
    garbage_is_bounded(&url).await;
    // Still serving, still clean, still connected.
    let text = until(&url, "drover_agent_connected", |n| n == 1.0).await;
    let (ok, said) = promtool_check(&text).await;
    assert!(ok && said.is_empty(), "{said}");
    c.wait_status("node1", "online", DETECT).await;
    accepting.abort();
    c.down().await;
}
