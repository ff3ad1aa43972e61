//! What a user checks with `dig` (a real DNS client) against the real
//! drover-dns beside a real manager and two `systemd --user` nodes: the
//! nodes where `web.service` is active and healthy are answered, a node that
//! turns unhealthy (its `HealthCmd=` fails, docs/health.md) is gone from the
//! answers one TTL after the manager knows, and back once healthy again;
//! NXDOMAIN and NODATA carry the SOA; with the manager stopped, the last
//! good answer is served stale with `StaleTTL`. SRV records carry the
//! ports the unit declares on each node (`[X-Drover]` `Port=`/`Ports=`,
//! read by the node's agent and sent to the manager).
//!
//! Both agents reach the manager from 127.0.0.1, so `web.service.drover`
//! has one distinct address; each node is told apart by its
//! `web.service.NODE.drover` name.

use drover_testkit::prelude::*;
use drover_testkit::process::TempDir;
use drover_testkit::wait::poll;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::dig;

const WEB: &str = "web.service";
/// The TTL drover-dns is given here.
const TTL: Duration = Duration::from_secs(2);
const T: Duration = Duration::from_secs(30);

/// web.service: runs, and is healthy while `flag` exists (checked every 100 ms).
fn web_unit(flag: &Path) -> String {
    format!(
        "[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\n\
         HealthCmd=/bin/sh -c 'test -e {}'\n\
         HealthInterval=100ms\nHealthStartupInterval=100ms\nHealthRetries=1\n",
        flag.display()
    )
}

async fn health_of(c: &TestCluster, node: &str) -> String {
    let out = c.ctl_ok(&["--json", "health", node, WEB]).await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v[0]["state"].as_str().unwrap_or_default().to_owned()
}

/// Waits until the manager says `web.service` on `node` is `want`; returns when it did.
async fn wait_health(c: &TestCluster, node: &str, want: &str) -> Instant {
    let what = format!("{WEB} on {node} is {want}");
    poll(T, Duration::from_millis(50), &what, || async {
        health_of(c, node).await == want
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    Instant::now()
}

fn set_flag(flag: &Path, on: bool) {
    if on {
        std::fs::write(flag, "").unwrap();
    } else {
        std::fs::remove_file(flag).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dig_answers_the_healthy_nodes_and_drops_an_unhealthy_one_within_one_ttl() {
    let tmp = TempDir::new("drover-dns-dig");
    let flags = [tmp.join("ok1"), tmp.join("ok2")];
    let mut c = TestCluster::start(2).await;
    for (flag, node) in flags.iter().zip(["node1", "node2"]) {
        set_flag(flag, true);
        c.install(node, WEB, &web_unit(flag)).await;
        c.systemctl_ok(node, &["start", WEB]).await;
    }
    wait_health(&c, "node1", "healthy").await;
    wait_health(&c, "node2", "healthy").await;
    let dns = c
        .start_dns(&format!("TTL={}s\nStaleTTL=7s", TTL.as_secs()))
        .await
        .unwrap();

    let all = dig(dns, &["web.service.drover", "A"]).await;
    assert_eq!(all.status, "NOERROR", "{all:?}");
    assert!(all.flags.contains(&"aa".to_string()), "{all:?}");
    assert_eq!(all.answer_data(), ["127.0.0.1"], "{all:?}");
    assert!(
        all.answer.iter().all(|r| r.1 <= 2),
        "TTL at most 2 s: {all:?}"
    );
    for node in ["node1", "node2"] {
        let one = dig(dns, &[&format!("web.service.{node}.drover"), "A"]).await;
        assert_eq!(one.answer_data(), ["127.0.0.1"], "{node}: {one:?}");
    }
    // NODATA (no IPv6 address) and NXDOMAIN (a unit that runs nowhere) carry the SOA.
    let aaaa = dig(dns, &["web.service.drover", "AAAA"]).await;
    assert_eq!(
        (aaaa.status.as_str(), aaaa.answer.len()),
        ("NOERROR", 0),
        "{aaaa:?}"
    );
    assert_eq!(aaaa.authority_types(), ["SOA"], "{aaaa:?}");
    let none = dig(dns, &["nothing.service.drover", "A"]).await;
    assert_eq!(none.status, "NXDOMAIN", "{none:?}");
    assert_eq!(none.authority_types(), ["SOA"], "{none:?}");
    let elsewhere = dig(dns, &["web.service.node9.drover", "A"]).await;
    assert_eq!(elsewhere.status, "NXDOMAIN", "{elsewhere:?}");

    // node2 turns unhealthy: one TTL after the manager knows, it is gone.
    set_flag(&flags[1], false);
    let known = wait_health(&c, "node2", "unhealthy").await;
    tokio::time::sleep_until((known + TTL).into()).await;
    let gone = dig(dns, &["web.service.node2.drover", "A"]).await;
    assert_eq!(
        gone.status, "NXDOMAIN",
        "node2 still answered a TTL later: {gone:?}"
    );
    assert_eq!(gone.authority_types(), ["SOA"], "{gone:?}");
    let kept = dig(dns, &["web.service.node1.drover", "A"]).await;
    assert_eq!(kept.answer_data(), ["127.0.0.1"], "{kept:?}");
    let all = dig(dns, &["web.service.drover", "A"]).await;
    assert_eq!(
        all.answer_data(),
        ["127.0.0.1"],
        "node1 still serves: {all:?}"
    );

    // Both unhealthy: the unit runs nowhere healthy.
    set_flag(&flags[0], false);
    let known = wait_health(&c, "node1", "unhealthy").await;
    tokio::time::sleep_until((known + TTL).into()).await;
    let nowhere = dig(dns, &["web.service.drover", "A"]).await;
    assert_eq!(nowhere.status, "NXDOMAIN", "{nowhere:?}");

    // Healthy again: back within one TTL.
    set_flag(&flags[0], true);
    set_flag(&flags[1], true);
    wait_health(&c, "node1", "healthy").await;
    let known = wait_health(&c, "node2", "healthy").await;
    tokio::time::sleep_until((known + TTL).into()).await;
    for node in ["node1", "node2"] {
        let back = dig(dns, &[&format!("web.service.{node}.drover"), "A"]).await;
        assert_eq!(back.answer_data(), ["127.0.0.1"], "{node}: {back:?}");
    }

    // The manager goes away: the last good answer is served stale (StaleTTL=7).
    c.stop_manager().await.unwrap();
    let stopped = Instant::now();
    tokio::time::sleep_until((stopped + TTL).into()).await;
    let stale = dig(dns, &["web.service.node1.drover", "A"]).await;
    assert_eq!(stale.status, "NOERROR", "{stale:?}");
    assert_eq!(stale.answer_data(), ["127.0.0.1"], "{stale:?}");
    assert_eq!(stale.answer[0].1, 7, "served with the stale TTL: {stale:?}");
    // A unit never asked before has no last good answer: SERVFAIL.
    let unknown = dig(dns, &["db.service.drover", "A"]).await;
    assert_eq!(unknown.status, "SERVFAIL", "{unknown:?}");
    c.down().await;
}

/// `droverctl --json where web`: the ports of `node`'s row.
async fn ports_of(c: &TestCluster, node: &str) -> serde_json::Value {
    let out = c.ctl_ok(&["--json", "where", "web"]).await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == node)
        .map(|r| r["ports"].clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dig_srv_gets_each_nodes_declared_ports() {
    let mut c = TestCluster::start(2).await;
    let units = [
        ("node1", "Ports=HTTP:8080\n"),
        ("node2", "Port=9000\nPorts=http:8081,admin:9090\n"),
    ];
    for (node, keys) in units {
        let text = format!("[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\n{keys}");
        c.install(node, WEB, &text).await;
        c.systemctl_ok(node, &["start", WEB]).await;
    }
    // The manager has them once where says so.
    for (node, want) in [
        ("node1", serde_json::json!([{"name": "http", "port": 8080}])),
        (
            "node2",
            serde_json::json!([
                {"name": "", "port": 9000},
                {"name": "admin", "port": 9090},
                {"name": "http", "port": 8081}
            ]),
        ),
    ] {
        let what = format!("ports of {WEB} on {node}");
        if let Err(e) = poll(T, Duration::from_millis(50), &what, || async {
            ports_of(&c, node).await == want
        })
        .await
        {
            panic!("{e:#}: {}", ports_of(&c, node).await);
        }
    }
    let dns = c.start_dns("TTL=2s").await.unwrap();
    let http = dig(dns, &["_http._tcp.web.service.drover", "SRV"]).await;
    assert_eq!(http.status, "NOERROR", "{http:?}");
    assert_eq!(
        http.answer_data(),
        [
            "0 0 8080 web.service.node1.drover.",
            "0 0 8081 web.service.node2.drover."
        ],
        "{http:?}"
    );
    let unnamed = dig(dns, &["_port._tcp.web.service.drover", "SRV"]).await;
    assert_eq!(
        unnamed.answer_data(),
        ["0 0 9000 web.service.node2.drover."],
        "{unnamed:?}"
    );
    let none = dig(dns, &["_db._tcp.web.service.drover", "SRV"]).await;
    assert_eq!(none.status, "NXDOMAIN", "{none:?}");
    c.down().await;
}
