//! Loading settings from files: every wrong file is a clear error that names
//! it, never a panic; private keys open to group or others are refused.

#![cfg(feature = "pki")]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::*;
use drover_tls::{ClientSettings, Connector, Error, ServerSettings, TlsFiles};

/// Applies `change` to the manager's files and to node1's, loads both, and
/// returns the agent's error after checking the manager failed the same way.
fn refused(fleet: &Fleet, change: impl Fn(TlsFiles) -> TlsFiles) -> Error {
    let server = ServerSettings::load(&change(fleet.pki.manager_files()))
        .expect_err("the manager loaded it");
    let client = ClientSettings::load(&change(fleet.pki.node_files(&node("node1"))))
        .expect_err("an agent loaded it");
    assert_eq!(
        std::mem::discriminant(&server),
        std::mem::discriminant(&client),
        "manager: {server}; agent: {client}"
    );
    client
}

fn copy(fleet: &Fleet, name: &str, contents: &[u8]) -> PathBuf {
    let path = fleet.pki.dir().join(name);
    fs::write(&path, contents).unwrap();
    path
}

fn names(err: &Error, path: &Path) {
    let message = err.to_string();
    assert!(
        message.contains(&path.display().to_string()),
        "the error does not name {}: {message}",
        path.display()
    );
}

#[test]
fn good_files_load() {
    let fleet = Fleet::new();
    let server = ServerSettings::load(&fleet.pki.manager_files()).unwrap();
    assert_eq!(server.serial(), &fleet.manager.serial);
    assert_eq!(server.revoked_count(), 0);
    let client = fleet.client_settings("node1");
    assert_eq!(client.identity().node().as_str(), "node1");
}

#[test]
fn missing_and_unreadable_files() {
    let fleet = Fleet::new();
    let nowhere = fleet.pki.dir().join("nowhere.pem");
    let changes: [fn(TlsFiles, PathBuf) -> TlsFiles; 4] = [
        |f, p| TlsFiles {
            certificate: p,
            ..f
        },
        |f, p| TlsFiles {
            private_key: p,
            ..f
        },
        |f, p| TlsFiles { ca_bundle: p, ..f },
        |f, p| TlsFiles { crl: Some(p), ..f },
    ];
    for change in changes {
        let err = refused(&fleet, |base| change(base, nowhere.clone()));
        assert!(matches!(err, Error::Read { .. }), "{err}");
        assert!(err.to_string().contains("No such file"), "{err}");
        names(&err, &nowhere);
    }
    // A directory, and an endless device.
    let err = refused(&fleet, |base| TlsFiles {
        ca_bundle: fleet.pki.dir().to_owned(),
        ..base
    });
    assert!(matches!(err, Error::Read { .. }), "{err}");
    let err = refused(&fleet, |base| TlsFiles {
        certificate: "/dev/zero".into(),
        ..base
    });
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
}

#[test]
fn private_key_readable_by_others_is_refused() {
    let fleet = Fleet::new();
    let files = fleet.pki.manager_files();
    let mode = |m| {
        fs::set_permissions(&files.private_key, fs::Permissions::from_mode(m)).unwrap();
    };
    for open in [0o644, 0o640, 0o604, 0o660, 0o602] {
        mode(open);
        let err = ServerSettings::load(&files).unwrap_err();
        assert!(
            matches!(err, Error::KeyPermissions { .. }),
            "{open:o}: {err}"
        );
        let message = err.to_string();
        assert!(message.contains(&format!("mode {open:04o}")), "{message}");
        assert!(message.contains("chmod 600"), "{message}");
        names(&err, &files.private_key);
    }
    for private in [0o600, 0o400] {
        mode(private);
        ServerSettings::load(&files).unwrap();
    }
}

#[test]
fn garbage_pem_gives_clear_errors() {
    let fleet = Fleet::new();
    let cases: [(&str, &[u8], &str); 6] = [
        ("empty", b"", "holds no certificate"),
        ("text", b"hello, I am not PEM\n", "holds no certificate"),
        (
            "unterminated",
            b"-----BEGIN CERTIFICATE-----\nMIIB\n",
            "not valid PEM",
        ),
        (
            "base64",
            b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
            "not valid PEM",
        ),
        (
            "der",
            b"-----BEGIN CERTIFICATE-----\nAAAAAAAA\n-----END CERTIFICATE-----\n",
            "cannot be parsed",
        ),
        (
            "binary",
            &[0x30, 0x82, 0xff, 0xff, 0x00, 0x01, 0xfe, 0x0a],
            "holds no certificate",
        ),
    ];
    for (name, bytes, expect) in cases {
        let path = copy(&fleet, &format!("{name}.pem"), bytes);
        let err = refused(&fleet, |base| TlsFiles {
            certificate: path.clone(),
            ..base
        });
        assert!(err.to_string().contains(expect), "{name}: {err}");
        names(&err, &path);
    }

    // The same garbage as a CA bundle, a key and a CRL.
    let path = copy(
        &fleet,
        "badca.pem",
        b"-----BEGIN CERTIFICATE-----\nAAAAAAAA\n-----END CERTIFICATE-----\n",
    );
    let err = refused(&fleet, |base| TlsFiles {
        ca_bundle: path.clone(),
        ..base
    });
    assert!(matches!(err, Error::BadCaCertificate { .. }), "{err}");
    names(&err, &path);

    for (name, bytes, expect) in [
        ("nokey.key", &b"nothing here\n"[..], "holds no private key"),
        (
            "badkey.key",
            b"-----BEGIN PRIVATE KEY-----\nAAAAAAAA\n-----END PRIVATE KEY-----\n",
            "cannot be used",
        ),
        (
            "enc.key",
            b"-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
            "encrypted",
        ),
    ] {
        let path = fleet.pki.dir().join(name);
        write_private(&path, bytes);
        let err = refused(&fleet, |base| TlsFiles {
            private_key: path.clone(),
            ..base
        });
        assert!(err.to_string().contains(expect), "{name}: {err}");
        names(&err, &path);
    }

    for (name, bytes, expect) in [
        (
            "nocrl.pem",
            &b"no crl\n"[..],
            "holds no certificate revocation list",
        ),
        (
            "badcrl.pem",
            b"-----BEGIN X509 CRL-----\nAAAAAAAA\n-----END X509 CRL-----\n",
            "cannot be used",
        ),
    ] {
        let path = copy(&fleet, name, bytes);
        let err = refused(&fleet, |base| TlsFiles {
            crl: Some(path.clone()),
            ..base
        });
        assert!(err.to_string().contains(expect), "{name}: {err}");
        names(&err, &path);
    }
}

#[test]
fn two_keys_in_one_file_are_refused() {
    let fleet = Fleet::new();
    let key = fs::read(fleet.pki.manager_key()).unwrap();
    let path = fleet.pki.dir().join("two.key");
    write_private(&path, &[key.clone(), key].concat());
    let err = refused(&fleet, |base| TlsFiles {
        private_key: path.clone(),
        ..base
    });
    assert!(matches!(err, Error::SeveralKeys { count: 2, .. }), "{err}");
}

#[test]
fn key_of_another_certificate_is_refused() {
    let fleet = Fleet::new();
    let files = TlsFiles {
        private_key: fleet.pki.node_key(&node("node2")),
        ..fleet.pki.node_files(&node("node1"))
    };
    let err = ClientSettings::load(&files).unwrap_err();
    assert!(matches!(err, Error::KeyMismatch { .. }), "{err}");
    assert!(err.to_string().contains("does not belong to"), "{err}");
    names(&err, &files.private_key);
    names(&err, &files.certificate);
}

#[test]
fn crl_of_another_ca_is_refused() {
    let fleet = Fleet::new();
    let other = Fleet::new();
    let files = TlsFiles {
        crl: Some(other.pki.crl()),
        ..fleet.pki.manager_files()
    };
    let err = refused(&fleet, |base| TlsFiles {
        crl: Some(other.pki.crl()),
        ..base
    });
    assert!(matches!(err, Error::CrlNotFromCa { .. }), "{err}");
    names(&err, &other.pki.crl());
    // With both CAs in the bundle (a rotation), the other CA's CRL is fine.
    let bundle = fleet.pki.dir().join("bundle.pem");
    fs::write(
        &bundle,
        [
            fs::read(fleet.pki.ca_certificate()).unwrap(),
            fs::read(other.pki.ca_certificate()).unwrap(),
        ]
        .concat(),
    )
    .unwrap();
    ServerSettings::load(&TlsFiles {
        ca_bundle: bundle,
        ..files
    })
    .unwrap();
}

#[test]
fn own_certificate_out_of_validity_is_refused() {
    let fleet = Fleet::new();
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    for (tag, from, until, expect) in [
        ("old", now - 10 * day, now - day, "expired on"),
        ("future", now + day, now + 10 * day, "not valid before"),
    ] {
        let (cert, key) = odd_client_cert(&fleet, tag, vec![dns("node1")], Some((from, until)));
        let err = ClientSettings::load(&fleet.files_with(cert.clone(), key)).unwrap_err();
        assert!(err.to_string().contains(expect), "{tag}: {err}");
        names(&err, &cert);
    }
}

#[test]
fn certificates_for_the_wrong_side_are_refused() {
    let fleet = Fleet::new();
    let err = ClientSettings::load(&fleet.pki.manager_files()).unwrap_err();
    assert!(matches!(err, Error::WrongPurpose { .. }), "{err}");
    assert!(err.to_string().contains("drover-pki node"), "{err}");
    let err = ServerSettings::load(&fleet.pki.node_files(&node("node1"))).unwrap_err();
    assert!(matches!(err, Error::WrongPurpose { .. }), "{err}");
    assert!(err.to_string().contains("drover-pki manager"), "{err}");
}

#[test]
fn server_name_must_be_a_name_or_an_address() {
    let fleet = Fleet::new();
    for bad in ["", "not a name!", "exa_mple..com", "[::1]"] {
        let err = Connector::new(fleet.client_settings("node1"), bad).unwrap_err();
        assert!(matches!(err, Error::ServerName { .. }), "{bad:?}: {err}");
    }
    for good in ["manager.example", "10.1.2.3", "::1", "localhost"] {
        Connector::new(fleet.client_settings("node1"), good).unwrap();
    }
}
