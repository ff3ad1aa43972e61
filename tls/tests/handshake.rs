//! Real TLS over loopback TCP between drover's acceptor and connector (or a
//! raw rustls client playing an impostor), with certificates made by
//! `drover_tls::pki`. Every refusal has its own test and checks both what the
//! manager learnt (the reason) and that the client got nothing through.

#![cfg(feature = "pki")]

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use drover_testkit::tls::raw_client;
use drover_tls::{ClientSettings, Connector, Error, TlsFiles};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

#[tokio::test]
async fn mutual_handshake_yields_the_node_identity() {
    let fleet = Fleet::new();
    let mut server = Server::start(fleet.server_settings()).await;
    let connector = fleet.connector("node1");
    assert_eq!(connector.settings().identity().node().as_str(), "node1");

    let mut tls = server.connect(&connector).await.unwrap();
    let id = server.outcome().await.unwrap();
    assert_eq!(id.node().as_str(), "node1");
    assert_eq!(id.serial(), &fleet.node1.serial);
    let skew = |a: SystemTime, b: SystemTime| a.max(b).duration_since(a.min(b)).unwrap();
    assert!(skew(id.not_after(), fleet.node1.not_after) < Duration::from_secs(1));
    assert_eq!(&id, connector.settings().identity());
    assert_eq!(echo(&mut tls, b"ping").await.unwrap(), b"ping");

    // The manager's certificate also names its IP address.
    let by_ip = Connector::new(fleet.client_settings("node2"), "127.0.0.1").unwrap();
    let mut tls = server.connect(&by_ip).await.unwrap();
    assert_eq!(server.outcome().await.unwrap().node().as_str(), "node2");
    assert_eq!(echo(&mut tls, b"pong").await.unwrap(), b"pong");
}

#[tokio::test]
async fn no_client_certificate_is_refused() {
    let fleet = Fleet::new();
    let mut server = Server::start(fleet.server_settings()).await;
    let client = raw_client(&fleet.pki.ca_certificate(), None);
    let seen = raw_attempt(&server, &client).await;
    let why = server.refused().await;
    assert!(why.contains("no certificates"), "{why}");
    assert!(why.starts_with("[no_certificate] "), "{why}");
    assert_ne!(seen, "accepted");
}

#[tokio::test]
async fn client_certificate_from_another_ca_is_refused() {
    let fleet = Fleet::new();
    let other = Fleet::new();
    let mut server = Server::start(fleet.server_settings()).await;
    // Trusts the real manager, presents a node1 certificate of another CA.
    let files = TlsFiles {
        ca_bundle: fleet.pki.ca_certificate(),
        crl: None,
        ..other.pki.node_files(&node("node1"))
    };
    let connector = Connector::new(ClientSettings::load(&files).unwrap(), "localhost").unwrap();
    let seen = match server.connect(&connector).await {
        Ok(mut tls) => echo(&mut tls, b"x").await.unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    let why = server.refused().await;
    assert!(why.contains("UnknownIssuer"), "{why}");
    assert!(why.starts_with("[certificate] "), "{why}");
    assert!(seen.contains("UnknownCA"), "{seen}");
}

#[tokio::test]
async fn expired_client_certificate_is_refused() {
    let fleet = Fleet::new();
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let (cert, key) = odd_client_cert(
        &fleet,
        "expired",
        vec![dns("node1")],
        Some((now - 10 * day, now - day)),
    );
    // drover's own loader refuses to present it...
    let err = ClientSettings::load(&fleet.files_with(cert.clone(), key.clone())).unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err}");
    // ...and the manager refuses it from anyone else.
    let mut server = Server::start(fleet.server_settings()).await;
    let client = raw_client(&fleet.pki.ca_certificate(), Some((&cert, &key)));
    let seen = raw_attempt(&server, &client).await;
    let why = server.refused().await;
    assert!(why.contains("expired"), "{why}");
    assert!(why.starts_with("[expired] "), "{why}");
    assert!(seen.contains("CertificateExpired"), "{seen}");
}

#[tokio::test]
async fn client_certificate_without_dns_name_is_refused() {
    let fleet = Fleet::new();
    let ip = rcgen::SanType::IpAddress("10.0.0.1".parse().unwrap());
    let (cert, key) = odd_client_cert(&fleet, "nodns", vec![ip], None);
    let err = ClientSettings::load(&fleet.files_with(cert.clone(), key.clone())).unwrap_err();
    assert!(matches!(err, Error::NotANodeCertificate { .. }), "{err}");

    let mut server = Server::start(fleet.server_settings()).await;
    let client = raw_client(&fleet.pki.ca_certificate(), Some((&cert, &key)));
    let seen = raw_attempt(&server, &client).await;
    let why = server.refused().await;
    assert!(why.contains("no DNS name"), "{why}");
    assert_ne!(seen, "accepted");

    // No SAN at all: the CN "node1" does not count.
    let (cert, key) = odd_client_cert(&fleet, "nosan", vec![], None);
    let client = raw_client(&fleet.pki.ca_certificate(), Some((&cert, &key)));
    raw_attempt(&server, &client).await;
    let why = server.refused().await;
    assert!(why.contains("no DNS name"), "{why}");
}

#[tokio::test]
async fn client_certificate_with_two_dns_names_is_refused() {
    let fleet = Fleet::new();
    let (cert, key) = odd_client_cert(&fleet, "two", vec![dns("node1"), dns("node2")], None);
    let err = ClientSettings::load(&fleet.files_with(cert.clone(), key.clone())).unwrap_err();
    assert!(err.to_string().contains("2 DNS names"), "{err}");

    let mut server = Server::start(fleet.server_settings()).await;
    let client = raw_client(&fleet.pki.ca_certificate(), Some((&cert, &key)));
    let seen = raw_attempt(&server, &client).await;
    let why = server.refused().await;
    assert!(
        why.contains("2 DNS names in its subjectAltName (node1, node2)"),
        "{why}"
    );
    assert_ne!(seen, "accepted");

    // 100 names: the refusal counts them all and shows the first few.
    let many: Vec<_> = (0..100).map(|i| dns(&format!("n{i}"))).collect();
    let (cert, key) = odd_client_cert(&fleet, "many", many, None);
    let client = raw_client(&fleet.pki.ca_certificate(), Some((&cert, &key)));
    raw_attempt(&server, &client).await;
    let why = server.refused().await;
    assert!(
        why.contains("100 DNS names in its subjectAltName (n0, n1, n2, n3, …)"),
        "{why}"
    );
}

#[tokio::test]
async fn client_certificate_with_invalid_node_name_is_refused() {
    let fleet = Fleet::new();
    let (cert, key) = odd_client_cert(&fleet, "under", vec![dns("bar_db")], None);
    let mut server = Server::start(fleet.server_settings()).await;
    let client = raw_client(&fleet.pki.ca_certificate(), Some((&cert, &key)));
    raw_attempt(&server, &client).await;
    let why = server.refused().await;
    assert!(why.contains("not a drover node name"), "{why}");
    assert!(why.starts_with("[identity] "), "{why}");
}

#[tokio::test]
async fn revoked_client_certificate_is_refused() {
    let fleet = Fleet::new();
    let revoked = fleet
        .pki
        .revoke(&[fleet.pki.revoke_target("node1").unwrap()])
        .unwrap();
    assert_eq!(revoked[0].serial, fleet.node1.serial);
    let settings = fleet.server_settings();
    assert_eq!(settings.revoked_count(), 1);
    let mut server = Server::start(settings).await;

    let connector = fleet.connector("node1");
    let seen = match server.connect(&connector).await {
        Ok(mut tls) => echo(&mut tls, b"x").await.unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    let why = server.refused().await;
    assert!(why.contains("Revoked"), "{why}");
    assert!(why.starts_with("[revoked] "), "{why}");
    assert!(seen.contains("CertificateRevoked"), "{seen}");

    // The CRL revokes that certificate, not the node's others nor other nodes.
    let mut tls = server.connect(&fleet.connector("node2")).await.unwrap();
    assert_eq!(server.outcome().await.unwrap().node().as_str(), "node2");
    assert_eq!(echo(&mut tls, b"ok").await.unwrap(), b"ok");
    fleet.pki.issue_node(&node("node1"), &forced(10)).unwrap();
    let mut tls = server.connect(&fleet.connector("node1")).await.unwrap();
    let fresh = server.outcome().await.unwrap();
    assert_ne!(fresh.serial(), &fleet.node1.serial);
    assert_eq!(echo(&mut tls, b"ok").await.unwrap(), b"ok");
}

#[tokio::test]
async fn reload_tells_which_online_sessions_are_now_revoked() {
    let fleet = Fleet::new();
    let mut server = Server::start(fleet.server_settings()).await;
    let mut one = server.connect(&fleet.connector("node1")).await.unwrap();
    let id1 = server.outcome().await.unwrap();
    let mut two = server.connect(&fleet.connector("node2")).await.unwrap();
    let id2 = server.outcome().await.unwrap();
    assert!(!server.acceptor.settings().is_revoked(&id1));

    fleet
        .pki
        .revoke(&[fleet.pki.revoke_target("node1").unwrap()])
        .unwrap();
    let before = server.acceptor.reload(fleet.server_settings());
    let now = server.acceptor.settings();
    assert!(now.is_revoked(&id1));
    assert!(!now.is_revoked(&id2));
    assert!(!before.is_revoked(&id1));

    // The reload itself drops nothing: dropping is the manager's call.
    assert_eq!(echo(&mut one, b"still").await.unwrap(), b"still");
    assert_eq!(echo(&mut two, b"here").await.unwrap(), b"here");
    // New handshakes see the new CRL.
    let _ = server.connect(&fleet.connector("node1")).await;
    assert!(server.refused().await.contains("Revoked"));
}

#[tokio::test]
async fn plaintext_to_the_acceptor_fails_fast() {
    use tokio::io::AsyncWriteExt;
    let fleet = Fleet::new();
    let mut server = Server::start(fleet.server_settings()).await;
    // A plaintext drover hello (u32 length + body), an HTTP request, a line:
    // sent without closing, so only the bytes themselves can end it.
    let greetings: [&[u8]; 3] = [
        b"\x00\x00\x00\x0bhello node1",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"hello\n",
    ];
    for bytes in greetings {
        let mut tcp = server.tcp().await;
        tcp.write_all(bytes).await.unwrap();
        let started = std::time::Instant::now();
        let why = server.refused().await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "took {:?}",
            started.elapsed()
        );
        assert!(!why.contains("timed out"), "{why}");
        assert!(why.starts_with("[protocol] "), "{why}");
        drop(tcp);
    }
}

#[tokio::test]
async fn agent_refuses_a_manager_certificate_for_another_name() {
    let fleet = Fleet::new();
    let mut server = Server::start(fleet.server_settings()).await;
    for dialled in ["manager.example", "127.0.0.2"] {
        let connector = Connector::new(fleet.client_settings("node1"), dialled).unwrap();
        let err = server.connect(&connector).await.unwrap_err().to_string();
        assert!(err.contains("not valid for name"), "{dialled}: {err}");
        // The manager never got a verified client either.
        server.refused().await;
    }
}

#[tokio::test]
async fn agent_refuses_a_manager_from_another_ca() {
    let fleet = Fleet::new();
    let rogue = Fleet::new();
    let mut server = Server::start(rogue.server_settings()).await;
    let err = server
        .connect(&fleet.connector("node1"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("UnknownIssuer"), "{err}");
    server.refused().await;
}

#[tokio::test]
async fn agent_refuses_a_node_certificate_posing_as_the_manager() {
    // A node's key in the wrong hands must not make a manager: node
    // certificates are for client authentication only. (drover's own loader
    // refuses to serve one, so the rogue is plain rustls.)
    let fleet = Fleet::new();
    let n2 = node("node2");
    let addr = raw_server(&fleet.pki.node_certificate(&n2), &fleet.pki.node_key(&n2)).await;
    let connector = Connector::new(fleet.client_settings("node1"), "node2").unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let err = connector.connect(tcp).await.unwrap_err().to_string();
    assert!(err.contains("server authentication"), "{err}");
}

#[tokio::test]
async fn manager_certificate_rotates_on_reload_without_dropping_connections() {
    let fleet = Fleet::new();
    let mut server = Server::start(fleet.server_settings()).await;
    let connector = fleet.connector("node1");
    let mut before = server.connect(&connector).await.unwrap();
    server.outcome().await.unwrap();
    let old_cert = before.get_ref().1.peer_certificates().unwrap()[0].clone();

    let renewed = fleet
        .pki
        .issue_manager(&["localhost"], &forced(20))
        .unwrap();
    assert_ne!(renewed.serial, fleet.manager.serial);
    server.acceptor.reload(fleet.server_settings());
    assert_eq!(server.acceptor.settings().serial(), &renewed.serial);

    assert_eq!(echo(&mut before, b"alive").await.unwrap(), b"alive");
    let mut after = server.connect(&connector).await.unwrap();
    server.outcome().await.unwrap();
    let new_cert = after.get_ref().1.peer_certificates().unwrap()[0].clone();
    let on_disk = CertificateDer::from_pem_file(fleet.pki.manager_certificate()).unwrap();
    assert_eq!(new_cert, on_disk);
    assert_ne!(new_cert, old_cert);
    assert_eq!(echo(&mut after, b"new").await.unwrap(), b"new");
    assert_eq!(echo(&mut before, b"old").await.unwrap(), b"old");
}

#[tokio::test]
async fn node_certificate_rotates_on_reload() {
    let fleet = Fleet::new();
    let mut server = Server::start(fleet.server_settings()).await;
    let connector = fleet.connector("node1");
    let mut before = server.connect(&connector).await.unwrap();
    assert_eq!(
        server.outcome().await.unwrap().serial(),
        &fleet.node1.serial
    );

    let renewed = fleet.pki.issue_node(&node("node1"), &forced(20)).unwrap();
    connector.reload(fleet.client_settings("node1"));
    let mut after = server.connect(&connector).await.unwrap();
    assert_eq!(server.outcome().await.unwrap().serial(), &renewed.serial);
    assert_eq!(echo(&mut after, b"a").await.unwrap(), b"a");
    assert_eq!(echo(&mut before, b"b").await.unwrap(), b"b");
}

/// `SwitchController` to another host: the derived connector checks the new
/// name, on the same settings (a reload of either reaches both).
#[tokio::test]
async fn a_connector_for_another_name_checks_that_name_on_the_same_settings() {
    let fleet = Fleet::new();
    let mut server = Server::start(fleet.server_settings()).await;
    let wrong = Connector::new(fleet.client_settings("node1"), "manager.example").unwrap();
    let right = wrong.with_server_name("127.0.0.1").unwrap();
    assert!(std::sync::Arc::ptr_eq(&wrong.settings(), &right.settings()));
    let mut tls = server.connect(&right).await.unwrap();
    assert_eq!(server.outcome().await.unwrap().node().as_str(), "node1");
    assert_eq!(echo(&mut tls, b"ok").await.unwrap(), b"ok");
    let err = server.connect(&wrong).await.unwrap_err().to_string();
    assert!(err.contains("not valid for name"), "{err}");
    server.refused().await;
    // Garbage is refused, and changes nothing.
    assert!(matches!(
        wrong.with_server_name("not a name!"),
        Err(Error::ServerName { .. })
    ));
    // A reload through the original reaches the derived one.
    wrong.reload(fleet.client_settings("node1"));
    assert!(std::sync::Arc::ptr_eq(&wrong.settings(), &right.settings()));
}
