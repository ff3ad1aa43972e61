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
    let by_serial = pki.revoke_target("0a:0b:0c").unwrap();
    assert_eq!(by_serial, RevokeTarget::Serial(serial.clone()));
    pki.revoke(&[by_serial]).unwrap();
    assert_eq!(
        crl(pki),
        (vec![fleet.node1.serial.clone(), serial], vec![4])
    );
    assert_eq!(mode(&pki.crl()), 0o644);

    // Neither a node with a certificate nor hex.
    let err = pki.revoke_target("nonode").unwrap_err();
    assert!(matches!(err, PkiError::UnknownRevokeTarget { .. }), "{err}");
    // A name that looks like hex but has no certificate is read as a serial.
    assert!(matches!(
        pki.revoke_target("cafe"),
        Ok(RevokeTarget::Serial(_))
    ));
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

    let (ok, out, err) = run(&["revoke", d, "node1", "ab:cd"]);
    assert!(
        ok && out.contains("node1 (serial") && out.contains("serial ab:cd revoked"),
        "{out}{err}"
    );
    let (ok, _, err) = run(&["revoke", d, "what?"]);
    assert!(!ok && err.contains("neither a node"), "{err}");
    // Errors are one line, without a backtrace, even with RUST_BACKTRACE set.
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // What it wrote works with the library.
    let pki = Pki::new(&pki_dir);
    let settings = drover_tls::ClientSettings::load(&pki.node_files(&node("node2"))).unwrap();
    assert_eq!(settings.identity().node().as_str(), "node2");
}
