//! The certificate tool: file layout and modes, refusal to overwrite keys,
//! revocation bookkeeping, and the `drover-pki` binary's surface.

#![cfg(feature = "pki")]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;
use drover_tls::Serial;
use drover_tls::pki::{Options, Pki, PkiError, RevokeTarget, Validity};
use rustls::pki_types::CertificateRevocationListDer;
use rustls::pki_types::pem::PemObject;
use x509_parser::prelude::FromDer;
use x509_parser::revocation_list::CertificateRevocationList;

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Serials listed in the CRL, and its number.
fn crl(pki: &Pki) -> (Vec<Serial>, Vec<u8>) {
    let der = CertificateRevocationListDer::from_pem_file(pki.crl()).unwrap();
    let (_, crl) = CertificateRevocationList::from_der(&der).unwrap();
    let serials = crl
        .iter_revoked_certificates()
        .map(|r| Serial::from_bytes(r.raw_serial()))
        .collect();
    (serials, crl.crl_number().unwrap().to_bytes_be())
}

#[test]
fn layout_and_modes() {
    let fleet = Fleet::new();
    let pki = &fleet.pki;
    for key in [
        pki.ca_key(),
        pki.manager_key(),
        pki.node_key(&node("node1")),
        pki.node_key(&node("node2")),
    ] {
        assert_eq!(mode(&key), 0o600, "{}", key.display());
    }
    for cert in [
        pki.ca_certificate(),
        pki.crl(),
        pki.manager_certificate(),
        pki.node_certificate(&node("node1")),
    ] {
        assert_eq!(mode(&cert), 0o644, "{}", cert.display());
    }
    assert_eq!(pki.ca_certificate(), pki.dir().join("ca.pem"));
    assert_eq!(pki.node_key(&node("n")), pki.dir().join("nodes/n.key"));
    // No temporary files left behind.
    for dir in [pki.dir().to_owned(), pki.nodes_dir()] {
        for entry in fs::read_dir(dir).unwrap() {
            let name = entry.unwrap().file_name();
            assert!(!name.to_string_lossy().starts_with('.'), "{name:?}");
        }
    }
    // A fresh CA's CRL is empty and numbered 1.
    assert_eq!(crl(pki), (vec![], vec![1]));
}

#[test]
fn existing_keys_are_kept_unless_forced() {
    let fleet = Fleet::new();
    let pki = &fleet.pki;
    let ca = fs::read(pki.ca_key()).unwrap();
    let node1 = fs::read(pki.node_key(&node("node1"))).unwrap();

    assert!(matches!(
        pki.create_ca(&days(1)),
        Err(PkiError::KeyExists { .. })
    ));
    assert!(matches!(
        pki.issue_manager(&["localhost"], &days(1)),
        Err(PkiError::KeyExists { .. })
    ));
    // node3 is new, node1 is not: nothing is written.
    let err = pki
        .issue_nodes(&[node("node3"), node("node1")], &days(1))
        .unwrap_err();
    assert!(err.to_string().contains("node1.key exists"), "{err}");
    assert!(!pki.node_key(&node("node3")).exists());
    assert_eq!(fs::read(pki.ca_key()).unwrap(), ca);
    assert_eq!(fs::read(pki.node_key(&node("node1"))).unwrap(), node1);

    // Forced, over a key someone had loosened: new key, mode 0600 again.
    fs::set_permissions(
        pki.node_key(&node("node1")),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let issued = pki.issue_node(&node("node1"), &forced(1)).unwrap();
    assert_ne!(issued.serial, fleet.node1.serial);
    assert_ne!(fs::read(pki.node_key(&node("node1"))).unwrap(), node1);
    assert_eq!(mode(&issued.private_key), 0o600);
}

#[test]
fn issuing_needs_a_ca_and_valid_names() {
    let dir = TempDir::new();
    let pki = Pki::new(dir.path().join("none"));
    assert!(matches!(
        pki.issue_nodes(&[node("n1")], &days(1)),
        Err(PkiError::NoCa { .. })
    ));
    assert!(matches!(
        pki.revoke(&[RevokeTarget::Serial("01".parse().unwrap())]),
        Err(PkiError::NoCa { .. })
    ));
    pki.create_ca(&days(1)).unwrap();
    for bad in ["bad name", "a..", "", "-x.example", "x/y"] {
        let err = pki.issue_manager(&[bad], &days(1)).unwrap_err();
        assert!(
            matches!(err, PkiError::BadServerName { .. }),
            "{bad:?}: {err}"
        );
    }
    let none: [&str; 0] = [];
    assert!(pki.issue_manager(&none, &days(1)).is_err());
    assert!(pki.issue_nodes(&[], &days(1)).is_err());
    assert!(Validity::days(0).is_err());
    // A CA key others can read is not used.
    fs::set_permissions(pki.ca_key(), fs::Permissions::from_mode(0o640)).unwrap();
    let err = pki.issue_nodes(&[node("n1")], &days(1)).unwrap_err();
    assert!(err.to_string().contains("chmod 600"), "{err}");
}

#[test]
fn revocation_accumulates_in_the_crl() {
    let fleet = Fleet::new();
    let pki = &fleet.pki;
    let target = pki.revoke_target("node1").unwrap();
    assert_eq!(target, RevokeTarget::Node(node("node1")));
    let done = pki.revoke(std::slice::from_ref(&target)).unwrap();
    assert_eq!(done[0].serial, fleet.node1.serial);
    assert!(!done[0].already);
    assert_eq!(crl(pki), (vec![fleet.node1.serial.clone()], vec![2]));

    // Again: idempotent, but the CRL is still re-signed with a new number.
    let done = pki.revoke(&[target]).unwrap();
    assert!(done[0].already);
    let serial: Serial = "0a:0b:0c".parse().unwrap();
    pki.revoke(&[RevokeTarget::Serial(serial.clone())]).unwrap();
    assert_eq!(
        crl(pki),
        (vec![fleet.node1.serial.clone(), serial], vec![4])
    );
    assert_eq!(mode(&pki.crl()), 0o644);

    // Not a node this CA issued for: an error, whatever it looks like. A
    // name that reads as hex (db2, cafe) is not taken for a serial.
    for arg in ["nonode", "cafe", "db2", "0a:0b:0c", "bad name"] {
        let err = pki.revoke_target(arg).unwrap_err();
        assert!(matches!(err, PkiError::UnknownRevokeTarget { .. }), "{err}");
        assert!(err.to_string().contains("--serial"), "{err}");
    }
    assert_eq!(crl(pki).1, vec![4], "nothing re-signed");
}

/// The attack of issue 25: a node's certificate rotated with `--force`, then
/// the node revoked by name. The old certificate (maybe the stolen key) must
/// be on the CRL too, and the manager's settings must refuse both.
#[test]
fn revoking_a_node_revokes_every_certificate_it_was_issued() {
    let fleet = Fleet::new();
    let pki = &fleet.pki;
    let old = fleet.node1.serial.clone();
    let old_pem = fs::read(pki.node_certificate(&node("node1"))).unwrap();
    let new = pki
        .issue_node(
            &node("node1"),
            &Options {
                force: true,
                ..days(10)
            },
        )
        .unwrap()
        .serial;
    assert_ne!(old, new);
    let index = pki.index().unwrap();
    assert_eq!(
        index.node_serials(&node("node1")),
        vec![old.clone(), new.clone()]
    );
    assert_eq!(index.seeded_on(), None);

    let target = pki.revoke_target("node1").unwrap();
    let done = pki.revoke(&[target]).unwrap();
    let serials: Vec<_> = done.iter().map(|d| d.serial.clone()).collect();
    assert_eq!(serials, [old.clone(), new.clone()]);
    assert!(
        done.iter()
            .all(|d| d.node == Some(node("node1")) && !d.already)
    );
    assert_eq!(crl(pki).0, [old.clone(), new.clone()]);
    // The manager's settings, loaded from the new CRL, refuse both.
    let settings = fleet.server_settings();
    let current = fleet.client_settings("node1").identity().clone();
    assert!(settings.is_revoked(&current));
    let old_der = rustls::pki_types::CertificateDer::from_pem_slice(&old_pem).unwrap();
    let old_id = drover_tls::NodeIdentity::from_certificate(&old_der).unwrap();
    assert_eq!(old_id.serial(), &old);
    assert!(
        settings.is_revoked(&old_id),
        "the certificate before the rotation"
    );
    // node2 is untouched.
    assert!(!settings.is_revoked(fleet.client_settings("node2").identity()));

    // With nodes/node1.pem gone, the index still knows node1.
    fs::remove_file(pki.node_certificate(&node("node1"))).unwrap();
    let done = pki.revoke(&[pki.revoke_target("node1").unwrap()]).unwrap();
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|d| d.already));
}

/// A directory made before the index existed: the index is seeded from the
/// certificates present, and says so.
#[test]
fn a_directory_without_an_index_gets_one_seeded_from_its_files() {
    let fleet = Fleet::new();
    let pki = &fleet.pki;
    fs::remove_file(pki.index_path()).unwrap();
    let seeded = pki.index().unwrap();
    assert!(seeded.seeded_on().is_some());
    assert_eq!(
        seeded.node_serials(&node("node1")),
        vec![fleet.node1.serial.clone()]
    );
    assert_eq!(seeded.entries().len(), 4, "{:?}", seeded.entries());
    assert!(!pki.index_path().exists(), "reading writes nothing");
    pki.issue_node(&node("node3"), &days(1)).unwrap();
    let index = pki.index().unwrap();
    assert!(index.seeded_on().is_some());
    assert_eq!(index.entries().len(), 5);
    assert_eq!(mode(&pki.index_path()), 0o644);
}

#[test]
fn validity_is_what_was_asked() {
    let fleet = Fleet::new();
    let issued = fleet
        .pki
        .issue_node(
            &node("node9"),
            &Options {
                validity: Validity::days(3).unwrap(),
                force: false,
            },
        )
        .unwrap();
    let id = fleet.client_settings("node9").identity().clone();
    assert_eq!(id.serial(), &issued.serial);
    let left = id
        .not_after()
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    let three_days = std::time::Duration::from_secs(3 * 86_400);
    assert!(left <= three_days && left > three_days - std::time::Duration::from_secs(60));
}

#[test]
fn the_binary() {
    let dir = TempDir::new();
    let pki_dir = dir.path().join("pki");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_drover-pki"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let d = pki_dir.to_str().unwrap();
    let (ok, out, _) = run(&["ca", d, "--days", "10"]);
    assert!(
        ok && out.contains("ca.pem") && out.contains("crl.pem"),
        "{out}"
    );
    let (ok, out, err) = run(&["manager", d, "manager.example", "10.0.0.1"]);
    assert!(ok && out.contains("manager.pem"), "{out}{err}");
    let (ok, out, err) = run(&["node", d, "node1", "node2"]);
    assert!(ok && out.contains("node2.pem"), "{out}{err}");

    let (ok, _, err) = run(&["node", d, "bar_db"]);
    assert!(!ok && err.contains("invalid node name 'bar_db'"), "{err}");
    let (ok, _, err) = run(&["node", d, "node1"]);
    assert!(!ok && err.contains("--force"), "{err}");
    let (ok, _, err) = run(&["node", d, "node1", "--force", "--days", "0"]);
    assert!(!ok && err.contains("1 to 36500 days"), "{err}");
    let (ok, out, err) = run(&["node", d, "node1", "--force", "--days", "2"]);
    assert!(ok && out.contains("node1.pem"), "{out}{err}");

    // node1 was issued twice (the --force above): both revoked, named.
    let (ok, out, err) = run(&["revoke", d, "node1"]);
    assert!(ok, "{out}{err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("node1 (serial "))
            .count(),
        2,
        "{out}"
    );
    let (ok, out, err) = run(&["revoke", d, "--serial", "ab:cd"]);
    assert!(ok && out.contains("serial ab:cd revoked"), "{out}{err}");
    // Without --serial, what is not a node of this CA is an error and
    // changes nothing, even when it reads as hex.
    let crl_before = fs::read(pki_dir.join("crl.pem")).unwrap();
    for arg in ["db2", "ab:cd", "what?"] {
        let (ok, out, err) = run(&["revoke", d, arg]);
        assert!(
            !ok && err.contains("not a node this CA issued"),
            "{out}{err}"
        );
    }
    let (ok, _, err) = run(&["revoke", d, "--serial", "node1"]);
    assert!(!ok && err.contains("not a certificate serial"), "{err}");
    assert_eq!(fs::read(pki_dir.join("crl.pem")).unwrap(), crl_before);
    let (ok, _, err) = run(&["revoke", d, "what?"]);
    assert!(!ok, "{err}");
    // Errors are one line, without a backtrace, even with RUST_BACKTRACE set.
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // What it wrote works with the library.
    let pki = Pki::new(&pki_dir);
    let settings = drover_tls::ClientSettings::load(&pki.node_files(&node("node2"))).unwrap();
    assert_eq!(settings.identity().node().as_str(), "node2");
}

/// `drover-pki etcd`: etcd's certificate for the names managers dial,
/// with server and client authentication (etcd's gateway dials etcd with
/// it), recorded in issued.tsv; garbage arguments are refused with one
/// line and change nothing.
#[test]
fn the_binary_issues_etcds_certificate() {
    let dir = TempDir::new();
    let pki_dir = dir.path().join("etcd-ca");
    let d = pki_dir.to_str().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_drover-pki"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // No CA yet: refused, nothing written.
    let (code, _, err) = run(&["etcd", d, "etcd1.example"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(!pki_dir.join("etcd.pem").exists());
    let (code, _, err) = run(&["ca", d]);
    assert_eq!(code, Some(0), "{err}");

    let (code, out, err) = run(&["etcd", d, "etcd1.example", "127.0.0.1", "--days", "30"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("etcd.pem") && out.contains("etcd.key"),
        "{out}"
    );
    let pki = Pki::new(&pki_dir);
    assert_eq!(mode(&pki.etcd_key()), 0o600);
    let pem = fs::read(pki.etcd_certificate()).unwrap();
    let der = rustls::pki_types::CertificateDer::from_pem_slice(&pem).unwrap();
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der).unwrap();
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth, "{eku:?}");
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    let names: Vec<String> = san.general_names.iter().map(|n| n.to_string()).collect();
    assert_eq!(
        names,
        ["DNSName(etcd1.example)", "IPAddress(7f:00:00:01)"],
        "etcd's subjectAltNames"
    );
    let index = fs::read_to_string(pki.index_path()).unwrap();
    assert!(
        index.lines().any(|l| l.contains("\tetcd\tetcd1.example\t")),
        "{index}"
    );

    // Garbage: each refused, etcd's files untouched.
    let key = fs::read(pki.etcd_key()).unwrap();
    for (args, code_wanted, said) in [
        (vec!["etcd", d], 2, "required"),
        (
            vec!["etcd", d, "bad name"],
            1,
            "neither a DNS name nor an IP address",
        ),
        (vec!["etcd", d, "x/y", "--force"], 1, "neither a DNS name"),
        (vec!["etcd", d, "etcd1.example"], 1, "--force"),
        (
            vec!["etcd", d, "etcd1.example", "--force", "--days", "0"],
            1,
            "1 to 36500 days",
        ),
        (
            vec!["etcd", d, "etcd1.example", "--days", "x"],
            2,
            "invalid value",
        ),
        (
            vec!["etcd", d, "etcd1.example", "--bogus"],
            2,
            "unexpected argument",
        ),
    ] {
        let (code, out, err) = run(&args);
        assert_eq!(code, Some(code_wanted), "{args:?}: {out}{err}");
        assert!(err.contains(said), "{args:?}: {err}");
        if code_wanted == 1 {
            assert_eq!(err.trim().lines().count(), 1, "{err}");
        }
        assert_eq!(fs::read(pki.etcd_certificate()).unwrap(), pem, "{args:?}");
        assert_eq!(fs::read(pki.etcd_key()).unwrap(), key, "{args:?}");
    }
    // --force replaces it.
    let (code, out, err) = run(&["etcd", d, "etcd2.example", "--force"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_ne!(fs::read(pki.etcd_key()).unwrap(), key);
}
