//! Trust on real systemd nodes with mutual TLS (the sandbox's default): real
//! `drover-agent` processes with certificates the manager must refuse, a real
//! manager whose certificate the agents must refuse, revocation and rotation
//! on `SIGHUP` of the manager and of an agent, and a node admitted by its
//! certificate alone (`AllowCertifiedNodes`) as a proxy target and requester,
//! and a TLS agent against a plaintext manager.
//!
//! Each case asserts what a user sees: the node's status in `ListNodes` and
//! `droverctl status`, and the line in the manager's or the agent's log that
//! says why. "No other session dropped" is read from the manager's log: each
//! healthy node registered exactly once and never disconnected.

use drover_sandbox::{ClusterOptions, ExtraAgent};
use drover_testkit::prelude::*;
use drover_tls::pki::{Options, Pki, RevokeTarget, Validity};
use nix::sys::signal::Signal;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// A step that involves a reconnect, a reload or a refusal on a loaded machine.
const T: Duration = Duration::from_secs(20);
const DAY: Duration = Duration::from_secs(86_400);

fn options(force: bool) -> Options {
    Options {
        validity: Validity::days(30).unwrap(),
        force,
    }
}

fn node(name: &str) -> drover_protocol::NodeName {
    drover_protocol::NodeName::new(name).unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits until the file at `path` contains `needle` after byte `from`;
/// returns that part of the file.
async fn wait_log(path: &Path, from: usize, needle: &str) -> String {
    let what = format!("{} to say {needle:?}", path.display());
    let found = eventually(T, &what, || async {
        read(path).get(from..).is_some_and(|t| t.contains(needle))
    })
    .await;
    let text = read(path);
    let tail = text.get(from..).unwrap_or_default().to_string();
    if let Err(e) = found {
        panic!("{e:#}; it says:\n{tail}");
    }
    tail
}

/// Where the manager's log ends now.
fn mark(c: &TestCluster) -> usize {
    read(&c.log_path("manager")).len()
}

fn assert_untouched(c: &TestCluster, names: &[&str]) {
    for name in names {
        assert_eq!(
            c.tls_registrations(name),
            (1, false),
            "{name} registered once and was never dropped"
        );
    }
}

/// `name` is offline (or absent) for the API and for `droverctl status`.
async fn assert_offline(c: &TestCluster, name: &str) {
    let nodes = c.api().await.list_nodes().await;
    assert!(
        nodes.iter().all(|(n, s, _)| n != name || s == "offline"),
        "{name} must not be online: {nodes:?}"
    );
    let out = c.ctl_ok(&["status"]).await;
    assert!(
        out.lines()
            .filter(|l| l.starts_with(name))
            .all(|l| l.contains("offline")),
        "{out}"
    );
}

/// Stops an extra agent and waits for it to end.
async fn stop_extra(c: &mut TestCluster, agent: &ExtraAgent) {
    drover_sandbox::process::signal(agent.pid, Signal::SIGTERM).unwrap();
    let pid = agent.pid;
    let ended = eventually(T, "the extra agent to end", || {
        let ended = c.extra_agent_exit(pid).unwrap().is_some();
        async move { ended }
    })
    .await;
    ended.unwrap();
}

/// An extra agent that must refuse to start: exit status 1, and its log.
async fn refused_at_start(c: &mut TestCluster, agent: &ExtraAgent) -> String {
    let pid = agent.pid;
    let mut status = None;
    let ended = eventually(T, "the agent to exit", || {
        status = c.extra_agent_exit(pid).unwrap();
        let done = status.is_some();
        async move { done }
    })
    .await;
    ended.unwrap();
    assert_eq!(status.unwrap().code(), Some(1), "{}", read(&agent.log));
    read(&agent.log)
}

/// The TLS keys of an agent config, pointing at `cert` and `key`.
fn tls_override(cert: &Path, key: &Path) -> String {
    format!(
        "TLSCertificate={}\nTLSPrivateKey={}\n",
        cert.display(),
        key.display()
    )
}

/// Copies `from`'s manager certificate and key over the cluster's, and
/// reloads the manager; returns once the reload put them in force.
async fn swap_manager_certificate(c: &TestCluster, from: &Pki) {
    let pki = c.pki().unwrap();
    for (src, dst) in [
        (from.manager_certificate(), pki.manager_certificate()),
        (from.manager_key(), pki.manager_key()),
    ] {
        // Through a temporary file: the manager never reads half a file.
        let tmp = dst.with_extension("new");
        std::fs::copy(&src, &tmp).unwrap();
        std::fs::rename(&tmp, &dst).unwrap();
    }
    let serial = drover_tls::ServerSettings::load(&pki.manager_files())
        .unwrap()
        .serial()
        .to_string();
    reload_manager(c, &format!("(manager certificate serial {serial},")).await;
}

/// SIGHUP to the manager; waits for its log to say `needle`.
async fn reload_manager(c: &TestCluster, needle: &str) -> String {
    let from = mark(c);
    c.signal_manager(Signal::SIGHUP).unwrap();
    wait_log(&c.log_path("manager"), from, needle).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_with_certificates_the_manager_must_refuse_never_register() {
    // node3's own agent is stopped: impostors claim node3 from its bus (a
    // bus has one agent).
    let mut c = TestCluster::start(3).await;
    c.stop_agent("node3").await.unwrap();
    c.wait_status("node3", "offline", T).await;
    let manager_log = c.log_path("manager");
    let n3 = node("node3");

    // A certificate for node3 from another CA.
    let rogue = Pki::new(c.dir().join("rogue"));
    rogue.create_ca(&options(false)).unwrap();
    rogue.issue_node(&n3, &options(false)).unwrap();
    let from = mark(&c);
    let agent = c
        .start_agent_with(
            "node3",
            "node3",
            &tls_override(&rogue.node_certificate(&n3), &rogue.node_key(&n3)),
        )
        .await
        .unwrap();
    let said = wait_log(&manager_log, from, "TLS handshake refused").await;
    assert!(said.contains("UnknownIssuer"), "{said}");
    let agent_said = wait_log(
        &agent.log,
        0,
        "the manager refused this node's certificate: it is not from the manager's CA",
    )
    .await;
    assert!(agent_said.contains("refused node 'node3'"), "{agent_said}");
    assert_offline(&c, "node3").await;
    stop_extra(&mut c, &agent).await;

    // Plaintext to the TLS manager.
    let from = mark(&c);
    let agent = c
        .start_agent_with(
            "node3",
            "node3",
            "TLSCertificate=\nTLSPrivateKey=\nTLSCertificateAuthority=\nTLSRevocationList=\n",
        )
        .await
        .unwrap();
    let said = wait_log(&manager_log, from, "TLS handshake refused").await;
    assert!(said.contains("corrupt message"), "{said}");
    wait_log(&agent.log, 0, "the manager answered with TLS").await;
    assert_offline(&c, "node3").await;
    stop_extra(&mut c, &agent).await;

    // An expired certificate of the fleet's CA: the agent itself refuses it.
    let expired = Pki::new(c.dir().join("expired"));
    std::fs::create_dir_all(expired.dir()).unwrap();
    let pki = c.pki().unwrap();
    for (src, dst) in [
        (pki.ca_certificate(), expired.ca_certificate()),
        (pki.ca_key(), expired.ca_key()),
    ] {
        std::fs::copy(src, dst).unwrap();
    }
    let now = SystemTime::now();
    expired
        .issue_node(
            &n3,
            &Options {
                validity: Validity {
                    not_before: now - 10 * DAY,
                    not_after: now - DAY,
                },
                force: false,
            },
        )
        .unwrap();
    let agent = c
        .start_agent_with(
            "node3",
            "node3",
            &tls_override(&expired.node_certificate(&n3), &expired.node_key(&n3)),
        )
        .await
        .unwrap();
    let said = refused_at_start(&mut c, &agent).await;
    assert!(
        said.contains("the certificate expired on") && said.contains("node3.pem"),
        "{said}"
    );
    assert_offline(&c, "node3").await;

    // node1's valid certificate in an agent configured as node3: refused
    // before it dials (the manager would answer IdentityMismatch).
    let n1 = node("node1");
    let agent = c
        .start_agent_with(
            "node3",
            "node3",
            &tls_override(&pki.node_certificate(&n1), &pki.node_key(&n1)),
        )
        .await
        .unwrap();
    let said = refused_at_start(&mut c, &agent).await;
    assert!(
        said.contains("is for node 'node1', but this agent is node 'node3'"),
        "{said}"
    );
    assert_offline(&c, "node3").await;

    // node3's own certificate, revoked: refused at every handshake.
    pki.revoke(&[RevokeTarget::Node(n3.clone())]).unwrap();
    reload_manager(&c, "1 revoked certificate(s)").await;
    let from = mark(&c);
    let agent = c.start_agent_with("node3", "node3", "").await.unwrap();
    let said = wait_log(&manager_log, from, "TLS handshake refused").await;
    assert!(said.contains("Revoked"), "{said}");
    // The agent says the manager refused its certificate, not that the
    // manager is unreachable.
    let said = wait_log(
        &agent.log,
        0,
        "the manager refused this node's certificate: it is revoked",
    )
    .await;
    assert!(said.contains("refused node 'node3'"), "{said}");
    assert_offline(&c, "node3").await;
    stop_extra(&mut c, &agent).await;

    // The sandbox's handle on extra agents refuses a pid it did not start.
    assert!(c.extra_agent_exit(1).is_err());
    // Meanwhile the real nodes were never disturbed.
    assert_untouched(&c, &["node1", "node2"]);
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_an_online_node_drops_its_session_on_reload_and_no_other() {
    let c = TestCluster::start(3).await;
    let pki = c.pki().unwrap();
    let revoked = pki.revoke(&[RevokeTarget::Node(node("node2"))]).unwrap();
    let serial = revoked[0].serial.to_string();

    let from = mark(&c);
    let said = reload_manager(&c, "config reload: dropping the session of node node2").await;
    assert!(
        said.contains(&format!("its certificate (serial {serial}) is revoked")),
        "{said}"
    );
    c.wait_status("node2", "offline", T).await;
    // Its agent redials and is refused at the handshake from now on.
    let said = wait_log(&c.log_path("manager"), from, "TLS handshake refused").await;
    assert!(said.contains("Revoked"), "{said}");
    wait_log(
        &c.log_path("node2"),
        0,
        "the manager refused this node's certificate: it is revoked",
    )
    .await;
    assert_offline(&c, "node2").await;
    assert_untouched(&c, &["node1", "node3"]);
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_refuse_a_manager_of_another_name_or_ca_and_rotation_drops_nothing() {
    let mut c = TestCluster::start(2).await;
    let pki = c.pki().unwrap();

    // Rotation: a new manager certificate (now also for manager.test) and a
    // new node2 certificate, one reload.
    let manager = pki
        .issue_manager(&["127.0.0.1", "manager.test"], &options(true))
        .unwrap();
    pki.issue_node(&node("node2"), &options(true)).unwrap();
    reload_manager(
        &c,
        &format!("(manager certificate serial {},", manager.serial),
    )
    .await;
    // An agent that accepts only manager.test registers: the new
    // certificate is in force.
    c.stop_agent("node1").await.unwrap();
    let strict = c
        .start_agent_with("node1", "node1", "TLSControllerName=manager.test\n")
        .await
        .unwrap();
    c.wait_status("node1", "online", T).await;
    assert_untouched(&c, &["node2"]);
    stop_extra(&mut c, &strict).await;
    c.wait_status("node1", "offline", T).await;

    // A manager certificate from another CA: the agent refuses the manager.
    let rogue = Pki::new(c.dir().join("rogue"));
    rogue.create_ca(&options(false)).unwrap();
    rogue
        .issue_manager(&["127.0.0.1"], &options(false))
        .unwrap();
    swap_manager_certificate(&c, &rogue).await;
    let from = mark(&c);
    c.start_agent("node1").await.unwrap();
    let said = wait_log(&c.log_path("node1"), 0, "refusing the manager").await;
    assert!(said.contains("UnknownIssuer"), "{said}");
    assert!(said.contains("TLSCertificateAuthority"), "{said}");
    // The manager's side shows the agent's alert.
    wait_log(
        &c.log_path("manager"),
        from,
        "received fatal alert: UnknownCA",
    )
    .await;
    assert_offline(&c, "node1").await;
    c.stop_agent("node1").await.unwrap();

    // A certificate of the fleet's CA for another name than the one dialled.
    let elsewhere = Pki::new(c.dir().join("elsewhere"));
    std::fs::create_dir_all(elsewhere.dir()).unwrap();
    for (src, dst) in [
        (pki.ca_certificate(), elsewhere.ca_certificate()),
        (pki.ca_key(), elsewhere.ca_key()),
    ] {
        std::fs::copy(src, dst).unwrap();
    }
    elsewhere
        .issue_manager(&["elsewhere.test"], &options(false))
        .unwrap();
    swap_manager_certificate(&c, &elsewhere).await;
    let from = read(&c.log_path("node1")).len();
    c.start_agent("node1").await.unwrap();
    let said = wait_log(&c.log_path("node1"), from, "refusing the manager").await;
    assert!(said.contains("not valid for name \"127.0.0.1\""), "{said}");
    assert_offline(&c, "node1").await;
    c.stop_agent("node1").await.unwrap();

    // The fleet's certificate back: node1 registers again; node2 (whose
    // session predates every swap) was never dropped.
    pki.issue_manager(&["127.0.0.1"], &options(true)).unwrap();
    swap_manager_certificate(&c, &pki).await;
    c.start_agent("node1").await.unwrap();
    c.wait_status("node1", "online", T).await;
    assert_untouched(&c, &["node2"]);
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sighup_puts_a_rotated_certificate_in_force_for_the_next_dial() {
    let mut c = TestCluster::start(2).await;
    let pki = c.pki().unwrap();
    let n1 = node("node1");
    let agent_log = c.log_path("node1");

    let rotated = pki.issue_node(&n1, &options(true)).unwrap();
    let from = read(&agent_log).len();
    c.signal_agent("node1", Signal::SIGHUP).unwrap();
    wait_log(
        &agent_log,
        from,
        &format!(
            "SIGHUP: TLS files read again (certificate serial {})",
            rotated.serial
        ),
    )
    .await;
    // The session up stays.
    c.wait_status("node1", "online", T).await;
    assert_untouched(&c, &["node1", "node2"]);

    // At the next dial the manager sees the new certificate.
    let registered_new = format!("node node1 (certificate serial {},", rotated.serial);
    let from = mark(&c);
    c.stop_manager().await.unwrap();
    c.start_manager().await.unwrap();
    c.wait_status("node1", "online", T).await;
    wait_log(&c.log_path("manager"), from, &registered_new).await;

    // A broken certificate file on reload: logged, the rotated one stays.
    std::fs::write(pki.node_certificate(&n1), "-----BEGIN garbage").unwrap();
    let from = read(&agent_log).len();
    c.signal_agent("node1", Signal::SIGHUP).unwrap();
    let said = wait_log(
        &agent_log,
        from,
        "SIGHUP: cannot load the TLS files, keeping the TLS settings in force",
    )
    .await;
    assert!(said.contains("node1.pem"), "{said}");
    let from = mark(&c);
    c.stop_manager().await.unwrap();
    c.start_manager().await.unwrap();
    c.wait_status("node1", "online", T).await;
    wait_log(&c.log_path("manager"), from, &registered_new).await;
    assert!(c.agent_pid("node1").is_some());
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_admitted_by_its_certificate_alone_is_a_proxy_target_and_requester() {
    // node3 is in no list: AllowCertifiedNodes admits it by its certificate.
    // Every node may depend on every node (the sandbox's [node N] sections).
    let mut c = TestCluster::with(ClusterOptions {
        allowed_nodes: Some(vec!["node1".into(), "node2".into()]),
        manager_extra_config: "[drover-manager]\nAllowCertifiedNodes=true\n".into(),
        ..ClusterOptions::with_nodes(3)
    })
    .await;
    let conf = read(&c.dir().join("manager.conf"));
    assert!(conf.contains("AllowedNodeNames=node1,node2\n"), "{conf}");
    let nodes = c.api().await.list_nodes().await;
    assert!(
        nodes.iter().any(|(n, s, _)| n == "node3" && s == "online"),
        "{nodes:?}"
    );

    // node1 needs db on node3 (the certified node as a target) ...
    c.install("node3", "db.service", SLEEPER).await;
    c.install(
        "node1",
        "web.service",
        &requester("Requires", "drover-proxy@node3_db.service"),
    )
    .await;
    c.systemctl_ok("node1", &["start", "web.service"]).await;
    c.wait_state("node3", "db.service", "active", T).await;
    c.wait_state("node1", "web.service", "active", T).await;

    // ... and node3 needs cache on node2 (the certified node as a requester).
    c.install("node2", "cache.service", SLEEPER).await;
    c.install(
        "node3",
        "app.service",
        &requester("Requires", "drover-proxy@node2_cache.service"),
    )
    .await;
    c.systemctl_ok("node3", &["start", "app.service"]).await;
    c.wait_state("node2", "cache.service", "active", T).await;
    c.wait_state("node3", "app.service", "active", T).await;

    let table = c.ctl_ok(&["proxies"]).await;
    for want in ["node3", "db.service", "cache.service"] {
        assert!(table.contains(want), "{table}");
    }

    // A manager restart while node3 is away: node1 re-registers first and
    // replays its proxy for node3, which must wait for node3, not fail.
    c.stop_agent("node3").await.unwrap();
    c.stop_manager().await.unwrap();
    c.start_manager().await.unwrap();
    c.wait_status("node1", "online", T).await;
    c.wait_status("node2", "online", T).await;
    c.start_agent("node3").await.unwrap();
    c.wait_status("node3", "online", T).await;
    c.stays("node1", "web.service", "active", Duration::from_secs(2))
        .await;
    let proxy_log = c
        .unit_log("node1", "drover-proxy@node3_db.service")
        .unwrap();
    assert!(!proxy_log.contains("no such node"), "{proxy_log}");
    // Stopping the requesters releases both references (the dep units go).
    c.systemctl_ok("node1", &["stop", "web.service"]).await;
    c.systemctl_ok("node3", &["stop", "app.service"]).await;
    c.wait_state("node3", "drover-dep@db.service.service", "inactive", T)
        .await;
    c.wait_state("node2", "drover-dep@cache.service.service", "inactive", T)
        .await;
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_agent_and_a_plaintext_manager_are_told_apart_in_the_log() {
    let mut c = TestCluster::with(ClusterOptions {
        tls: false,
        ..ClusterOptions::with_nodes(2)
    })
    .await;
    // node2's own agent is stopped: a TLS agent claims node2 from its bus.
    c.stop_agent("node2").await.unwrap();
    c.wait_status("node2", "offline", T).await;
    assert!(c.pki().is_none());
    let pki = Pki::new(c.dir().join("pki"));
    pki.create_ca(&options(false)).unwrap();
    let n2 = node("node2");
    pki.issue_node(&n2, &options(false)).unwrap();
    let from = mark(&c);
    let agent = c
        .start_agent_with(
            "node2",
            "node2",
            &format!(
                "{}TLSCertificateAuthority={}\n",
                tls_override(&pki.node_certificate(&n2), &pki.node_key(&n2)),
                pki.ca_certificate().display()
            ),
        )
        .await
        .unwrap();
    wait_log(
        &c.log_path("manager"),
        from,
        "the peer started a TLS handshake, and this link is plaintext",
    )
    .await;
    wait_log(&agent.log, 0, "refusing the manager").await;
    assert_offline(&c, "node2").await;
    stop_extra(&mut c, &agent).await;
    c.down().await;
}
