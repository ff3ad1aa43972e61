//! Mutual TLS on the agent port, against an in-process manager with real
//! certificates (`drover_tls::pki`) and fake agents over real TLS: every
//! refusal of issue 13 (no client certificate, another CA, expired, a
//! certificate for node1 claiming node2, revoked — also an online session
//! dropped on reload —, plaintext to a TLS manager), certified admission,
//! and rotation of the manager's and a node's certificate on reload with no
//! other session dropped.

mod common;

use common::*;
use drover_config::ManagerConfig;
use drover_protocol::link::{HandshakeError, agent_handshake};
use drover_protocol::{Hello, RefuseReason};
use drover_testkit::agent::AgentOptions;
use drover_testkit::process::TempDir;
use drover_testkit::tls::raw_client;
use drover_tls::pki::{Options, Pki, RevokeTarget, Validity};
use drover_tls::{ClientSettings, Connector};
use rustls::pki_types::ServerName;
use std::path::Path;
use std::time::{Duration, SystemTime};

const DAY: Duration = Duration::from_secs(86_400);

fn options(force: bool) -> Options {
    Options {
        validity: Validity::days(30).unwrap(),
        force,
    }
}

/// A CA with a manager certificate for 127.0.0.1 and node certificates.
fn fleet(dir: &Path, nodes: &[&str]) -> Pki {
    let pki = Pki::new(dir);
    pki.create_ca(&options(false)).unwrap();
    pki.issue_manager(&["127.0.0.1"], &options(false)).unwrap();
    let names: Vec<_> = nodes.iter().map(|n| node_name(n)).collect();
    pki.issue_nodes(&names, &options(false)).unwrap();
    pki
}

fn tls_config(pki: &Pki, nodes: &[&str]) -> ManagerConfig {
    let f = pki.manager_files();
    ManagerConfig {
        tls: Some(drover_config::TlsFiles {
            certificate: f.certificate,
            private_key: f.private_key,
            ca_bundle: f.ca_bundle,
            crl: f.crl,
        }),
        ..config(nodes)
    }
}

fn connector(pki: &Pki, node: &str) -> Connector {
    let settings = ClientSettings::load(&pki.node_files(&node_name(node))).unwrap();
    Connector::new(settings, "127.0.0.1").unwrap()
}

async fn tls_agent(
    f: &Fixture,
    pki: &Pki,
    node: &str,
    claim: &str,
) -> Result<FakeAgent, HandshakeError> {
    let opts = AgentOptions {
        tls: Some(connector(pki, node)),
        ..AgentOptions::default()
    };
    FakeAgent::connect_with(f.addr, claim, reply_empty(), opts).await
}

/// A raw TLS client's whole attempt to register as `node`: the error it saw.
async fn raw_attempt(f: &Fixture, client: &tokio_rustls::TlsConnector, node: &str) -> String {
    let tcp = tokio::net::TcpStream::connect(f.addr).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let tls = match client.connect(name, tcp).await {
        Ok(tls) => tls,
        Err(e) => return e.to_string(),
    };
    match agent_handshake(tls, &Hello::new(node, "raw"), WAIT).await {
        Ok(_) => "accepted".into(),
        Err(e) => e.to_string(),
    }
}

async fn status(f: &Fixture, node: &str) -> String {
    let path = format!("/org/eclipse/bluechi/node/{node}");
    f.get_property::<String>(&path, NODE_IFACE, "Status").await
}

#[tokio::test]
async fn refused_without_a_valid_certificate_of_the_fleet() {
    let tmp = TempDir::new("drover-tls-refusals");
    let pki = fleet(&tmp.join("pki"), &["node1", "node2"]);
    let other = fleet(&tmp.join("other"), &["node1"]);
    // Expired yesterday, signed by the fleet's CA.
    let expired = Pki::new(tmp.join("pki"));
    let now = SystemTime::now();
    expired
        .issue_node(
            &node_name("old"),
            &Options {
                validity: Validity {
                    not_before: now - 10 * DAY,
                    not_after: now - DAY,
                },
                force: false,
            },
        )
        .unwrap();
    let f = Fixture::start(tls_config(&pki, &["node1", "node2", "old"])).await;
    let ca = pki.ca_certificate();

    // No client certificate: refused inside TLS, never a drover byte.
    let seen = raw_attempt(&f, &raw_client(&ca, None), "node1").await;
    assert_ne!(seen, "accepted");
    // A certificate of another CA for an allowed name.
    let n1 = node_name("node1");
    let seen = raw_attempt(
        &f,
        &raw_client(
            &ca,
            Some((&other.node_certificate(&n1), &other.node_key(&n1))),
        ),
        "node1",
    )
    .await;
    assert_ne!(seen, "accepted");
    // An expired certificate of the fleet.
    let old = node_name("old");
    let seen = raw_attempt(
        &f,
        &raw_client(
            &ca,
            Some((&pki.node_certificate(&old), &pki.node_key(&old))),
        ),
        "old",
    )
    .await;
    assert_ne!(seen, "accepted");
    // Plaintext to a TLS manager.
    assert!(
        FakeAgent::connect(f.addr, "node1", reply_empty())
            .await
            .is_err()
    );
    // A valid certificate for node1 claiming node2.
    match tls_agent(&f, &pki, "node1", "node2").await {
        Err(HandshakeError::Refused {
            reason: RefuseReason::IdentityMismatch,
            message,
        }) => assert!(
            message.contains("node1") && message.contains("node2"),
            "{message}"
        ),
        other => panic!(
            "node1 claiming node2 must be refused: {:?}",
            other.map(|a| a.accepted.clone())
        ),
    }
    for node in ["node1", "node2", "old"] {
        assert_eq!(status(&f, node).await, "offline", "{node} never registered");
    }
    // And the real thing registers.
    let a = tls_agent(&f, &pki, "node1", "node1")
        .await
        .expect("node1 registers over TLS");
    assert!(a.session_id() > 0);
    assert_eq!(status(&f, "node1").await, "online");
}

/// Over the total pre-authentication cap, a connection that waits on its
/// silent peer gives its place to a newcomer once it is ripe, long before its
/// handshake deadline: two stalled connections fill a cap of 2, then four
/// agents connect at once; all register while the stalled ones' deadline is
/// still far away, and the stalled ones were closed.
#[tokio::test]
async fn over_the_total_cap_silent_connections_give_way_to_agents() {
    use tokio::io::AsyncReadExt;
    let tmp = TempDir::new("drover-tls-backlog");
    let nodes = ["node1", "node2", "node3", "node4"];
    let pki = fleet(&tmp.join("pki"), &nodes);
    let handshake = Duration::from_secs(30);
    let timeouts = drover_manager::Timeouts {
        handshake,
        pre_auth: drover_manager::nodes::gate::Limits {
            handshakes: 2,
            ripe_after: Duration::from_millis(150),
        },
        ..fast_timeouts()
    };
    let f = Fixture::start_with(tls_config(&pki, &nodes), timeouts).await;
    let started = std::time::Instant::now();
    // First in the accept queue, so accepted first: they take both places.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        stalled.push(tokio::net::TcpStream::connect(f.addr).await.unwrap());
    }
    let agents: Vec<_> = nodes
        .iter()
        .map(|node| {
            let opts = AgentOptions {
                tls: Some(connector(&pki, node)),
                handshake_timeout: Duration::from_secs(20),
                ..AgentOptions::default()
            };
            let (addr, node) = (f.addr, node.to_string());
            tokio::spawn(
                async move { FakeAgent::connect_with(addr, &node, reply_empty(), opts).await },
            )
        })
        .collect();
    let mut online = Vec::new();
    for (node, agent) in nodes.iter().zip(agents) {
        match agent.await.unwrap() {
            Ok(a) => online.push(a),
            Err(e) => panic!("{node} gets a place instead of being closed: {e}"),
        }
    }
    assert!(
        started.elapsed() < handshake,
        "the agents waited for the stalled connections' deadline: {:?}",
        started.elapsed()
    );
    for node in nodes {
        assert_eq!(status(&f, node).await, "online");
    }
    for mut s in stalled {
        let mut buf = [0u8; 1];
        let n = s.read(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "the stalled connection was closed");
    }
}

#[tokio::test]
async fn certified_nodes_register_unlisted_but_denied_names_stay_out() {
    let tmp = TempDir::new("drover-tls-certified");
    let pki = fleet(&tmp.join("pki"), &["node1", "extra", "banned"]);
    let mut config = tls_config(&pki, &["node1"]);
    config.allow_certified_nodes = true;
    config.nodes = vec![drover_config::NodeSection {
        name: node_name("banned"),
        allowed: Some(false),
        allow_dependencies_on: Vec::new(),
    }];
    let f = Fixture::start(config).await;
    let _extra = tls_agent(&f, &pki, "extra", "extra")
        .await
        .expect("a certified node registers");
    assert_eq!(status(&f, "extra").await, "online");
    match tls_agent(&f, &pki, "banned", "banned").await {
        Err(HandshakeError::Refused {
            reason: RefuseReason::UnknownNode,
            ..
        }) => {}
        other => panic!(
            "Allowed=false narrows: {:?}",
            other.map(|a| a.accepted.clone())
        ),
    }
}

#[tokio::test]
async fn reload_drops_revoked_and_unlisted_sessions_and_rotation_drops_nothing() {
    let tmp = TempDir::new("drover-tls-reload");
    let pki = fleet(&tmp.join("pki"), &["node1", "node2", "node3"]);
    let config = tls_config(&pki, &["node1", "node2", "node3"]);
    let f = Fixture::start(config.clone()).await;
    let reloader = f.manager().reloader().clone();
    let nodes = f.manager().lifecycle().nodes().clone();
    let a1 = tls_agent(&f, &pki, "node1", "node1").await.unwrap();
    let a2 = tls_agent(&f, &pki, "node2", "node2").await.unwrap();
    let a3 = tls_agent(&f, &pki, "node3", "node3").await.unwrap();
    let sessions = |nodes: &drover_manager::nodes::lifecycle::Nodes| {
        let r = nodes.registry();
        ["node1", "node2", "node3"].map(|n| r.session(n).map(|s| s.id()))
    };
    let before = sessions(&nodes);

    // Rotation: new manager and node2 certificates, same CA; reload.
    pki.issue_manager(&["127.0.0.1"], &options(true)).unwrap();
    pki.issue_node(&node_name("node2"), &options(true)).unwrap();
    let report = drover_manager::reload::reload(&reloader, Ok(config.clone()))
        .await
        .unwrap();
    assert!(report.tls_reloaded);
    assert!(report.dropped.is_empty(), "{:?}", report.dropped);
    assert_eq!(sessions(&nodes), before, "a rotation drops no session");
    // The rotated node2 certificate and the new manager certificate pass
    // the TLS handshake: the refusal is drover's, because node2's first
    // session is alive.
    match tls_agent(&f, &pki, "node2", "node2").await {
        Err(HandshakeError::Refused {
            reason: RefuseReason::AlreadyConnected,
            ..
        }) => {}
        other => panic!("{:?}", other.map(|a| a.accepted.clone())),
    }

    // Revocation: node1's certificate goes on the CRL; reload drops its session.
    pki.revoke(&[RevokeTarget::Node(node_name("node1"))])
        .unwrap();
    let report = drover_manager::reload::reload(&reloader, Ok(config.clone()))
        .await
        .unwrap();
    let dropped: Vec<_> = report.dropped.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(dropped, ["node1"]);
    assert!(
        report.dropped[0].1.contains("revoked"),
        "{:?}",
        report.dropped
    );
    assert_eq!(status(&f, "node1").await, "offline");
    assert!(
        nodes.registry().session("node3").map(|s| s.id()) == before[2],
        "node3 untouched"
    );
    // And refused at the next handshake.
    assert!(tls_agent(&f, &pki, "node1", "node1").await.is_err());
    drop(a1);

    // A name taken off the list: its session goes at once.
    let mut fewer = config.clone();
    fewer.allowed_nodes.retain(|n| n.as_str() != "node3");
    let report = drover_manager::reload::reload(&reloader, Ok(fewer))
        .await
        .unwrap();
    let dropped: Vec<_> = report.dropped.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(dropped, ["node3"]);
    assert_eq!(status(&f, "node3").await, "offline");
    drop((a2, a3));
}

/// A manager that stops ends every TLS session with `close_notify`: the
/// agent reads a clean end, not rustls's "peer closed connection without
/// sending TLS close_notify" (which every agent logged at each manager stop).
#[tokio::test]
async fn a_stopping_manager_ends_tls_sessions_cleanly() {
    use futures::StreamExt;
    let tmp = TempDir::new("drover-tls-close");
    let pki = fleet(&tmp.join("pki"), &["node1"]);
    let mut f = Fixture::start(tls_config(&pki, &["node1"])).await;
    let tcp = tokio::net::TcpStream::connect(f.addr).await.unwrap();
    let tls = connector(&pki, "node1").connect(tcp).await.unwrap();
    let (mut framed, _) = agent_handshake(tls, &Hello::new("node1", "raw"), WAIT)
        .await
        .expect("registered");
    assert_eq!(status(&f, "node1").await, "online");
    f.manager.take().expect("running").shutdown().await;
    let end = tokio::time::timeout(WAIT, async {
        loop {
            match framed.next().await {
                Some(Ok(_)) => continue,
                other => return other.map(|r| r.map(|_| ())),
            }
        }
    })
    .await
    .expect("the stream ends");
    assert!(end.is_none(), "a clean end of stream, got {end:?}");
}

/// Issue 25's attack on revocation: node1's certificate is rotated with
/// `--force` (the documented rotation), then node1 is revoked by name. The
/// certificate from before the rotation, whose key may be the stolen one,
/// must not register after the reload; nor the rotated one; a certificate
/// issued after the revocation does.
#[tokio::test]
async fn revoking_a_node_by_name_also_revokes_its_certificate_before_a_rotation() {
    let tmp = TempDir::new("drover-tls-rotated-revoke");
    let pki = fleet(&tmp.join("pki"), &["node1"]);
    let config = tls_config(&pki, &["node1"]);
    let f = Fixture::start(config.clone()).await;
    let reloader = f.manager().reloader().clone();
    // The attacker's copy of node1's first certificate and key.
    let stolen = tmp.join("stolen");
    std::fs::create_dir_all(stolen.join("nodes")).unwrap();
    let node1 = node_name("node1");
    for file in [pki.node_certificate(&node1), pki.node_key(&node1)] {
        let to = stolen.join("nodes").join(file.file_name().unwrap());
        std::fs::copy(&file, &to).unwrap();
    }
    let stolen_files = drover_config::TlsFiles {
        certificate: stolen.join("nodes/node1.pem"),
        private_key: stolen.join("nodes/node1.key"),
        ..pki.node_files(&node1)
    };
    let stolen_agent = || async {
        let settings = ClientSettings::load(&stolen_files).unwrap();
        let opts = AgentOptions {
            tls: Some(Connector::new(settings, "127.0.0.1").unwrap()),
            ..AgentOptions::default()
        };
        FakeAgent::connect_with(f.addr, "node1", reply_empty(), opts).await
    };
    drop(stolen_agent().await.expect("the first certificate works"));
    drover_testkit::wait::eventually(WAIT, "node1 offline", || async {
        status(&f, "node1").await == "offline"
    })
    .await
    .unwrap();

    pki.issue_node(&node1, &options(true)).unwrap();
    let revoked = pki.revoke(&[pki.revoke_target("node1").unwrap()]).unwrap();
    assert_eq!(
        revoked.len(),
        2,
        "both of node1's certificates: {revoked:?}"
    );
    let report = drover_manager::reload::reload(&reloader, Ok(config.clone()))
        .await
        .unwrap();
    assert!(report.tls_reloaded);
    let refused = stolen_agent().await;
    assert!(
        refused.is_err(),
        "the certificate before the rotation is revoked"
    );
    assert!(tls_agent(&f, &pki, "node1", "node1").await.is_err());
    assert_eq!(status(&f, "node1").await, "offline");

    // A new certificate, issued after the revocation, registers.
    pki.issue_node(&node1, &options(true)).unwrap();
    let _a = tls_agent(&f, &pki, "node1", "node1").await.unwrap();
    assert_eq!(status(&f, "node1").await, "online");
}

/// Issue 25: a CRL from before a revocation (a lower CRL number), put back
/// and reloaded, must not un-revoke: the reload keeps the CRL in force.
#[tokio::test]
async fn an_older_crl_is_refused_on_reload_and_the_one_in_force_kept() {
    let tmp = TempDir::new("drover-tls-old-crl");
    let pki = fleet(&tmp.join("pki"), &["node1", "node2"]);
    let config = tls_config(&pki, &["node1", "node2"]);
    let f = Fixture::start(config.clone()).await;
    let reloader = f.manager().reloader().clone();
    let before_revocation = std::fs::read(pki.crl()).unwrap();
    pki.revoke(&[pki.revoke_target("node1").unwrap()]).unwrap();
    let report = drover_manager::reload::reload(&reloader, Ok(config.clone()))
        .await
        .unwrap();
    assert!(report.tls_reloaded);
    assert!(tls_agent(&f, &pki, "node1", "node1").await.is_err());
    let in_force = std::fs::read(pki.crl()).unwrap();

    // The attack: the old file back in place, then a reload.
    std::fs::write(pki.crl(), &before_revocation).unwrap();
    let report = drover_manager::reload::reload(&reloader, Ok(config.clone()))
        .await
        .unwrap();
    assert!(!report.tls_reloaded, "the older CRL is refused");
    assert!(
        tls_agent(&f, &pki, "node1", "node1").await.is_err(),
        "node1 is still revoked"
    );
    let _a2 = tls_agent(&f, &pki, "node2", "node2").await.unwrap();
    assert_eq!(status(&f, "node2").await, "online");

    // A newer CRL (another revocation) is taken again.
    std::fs::write(pki.crl(), &in_force).unwrap();
    pki.revoke(&[drover_tls::pki::RevokeTarget::Serial(
        "0a:0b".parse().unwrap(),
    )])
    .unwrap();
    let report = drover_manager::reload::reload(&reloader, Ok(config))
        .await
        .unwrap();
    assert!(report.tls_reloaded);
    assert!(tls_agent(&f, &pki, "node1", "node1").await.is_err());
}
