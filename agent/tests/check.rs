//! `drover-agent --check`: validates what a start would load (files, flags,
//! node name, TLS files) and starts nothing; garbage is one line naming what
//! is wrong, exit 1.

use drover_testkit::process::TempDir;
use drover_tls::pki::{Options, Pki, Validity};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_drover-agent");

/// `drover-agent --check --no-default-config ARGS`: success, stdout, stderr.
fn check(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(["--check", "--no-default-config"])
        .args(args)
        .output()
        .expect("run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_valid_configuration_is_described() {
    let dir = TempDir::new("agent-check");
    let conf = dir.file(
        "a.conf",
        "[drover-agent]\nNodeName=web1\nControllerHost=192.0.2.10\n",
    );
    let (ok, out, err) = check(&["-c", conf.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("node web1 connects to the manager at 192.0.2.10:842, plaintext"),
        "{out}"
    );
    assert!(out.ends_with("the configuration is valid\n"), "{out}");
    assert!(
        out.contains("metrics: off (MetricsListenAddress unset)"),
        "{out}"
    );
    // Flags are applied as at start.
    let (ok, out, _) = check(&["-c", conf.to_str().unwrap(), "-n", "db1", "-p", "9000"]);
    assert!(
        ok && out.contains("node db1 connects to the manager at 192.0.2.10:9000"),
        "{out}"
    );
}

#[test]
fn the_metrics_endpoint_is_described_and_garbage_refused() {
    let dir = TempDir::new("agent-check-metrics");
    let conf = dir.file(
        "a.conf",
        "[drover-agent]\nNodeName=web1\nMetricsListenAddress=9843\n",
    );
    let (ok, out, err) = check(&["-c", conf.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("metrics: Prometheus endpoint http://127.0.0.1:9843/metrics"),
        "{out}"
    );
    for bad in ["localhost:9843", "0", "[::1]"] {
        let conf = dir.file(
            "b.conf",
            &format!("[drover-agent]\nNodeName=web1\nMetricsListenAddress={bad}\n"),
        );
        let (ok, out, err) = check(&["-c", conf.to_str().unwrap()]);
        assert!(!ok && out.is_empty(), "{bad}: {out}");
        assert!(
            err.starts_with("drover-agent --check: ")
                && err.contains("b.conf:3: key 'MetricsListenAddress'"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn tls_files_are_loaded_and_must_be_this_nodes() {
    let dir = TempDir::new("agent-check-tls");
    let pki = Pki::new(dir.join("ca"));
    let options = Options {
        validity: Validity::days(30).unwrap(),
        force: false,
    };
    pki.create_ca(&options).unwrap();
    let web1 = drover_protocol::NodeName::new("web1").unwrap();
    pki.issue_node(&web1, &options).unwrap();
    let conf = dir.file(
        "a.conf",
        &format!(
            "[drover-agent]\nNodeName=web1\nControllerHost=192.0.2.10\nTLSCertificate={}\n\
             TLSPrivateKey={}\nTLSCertificateAuthority={}\nTLSControllerName=manager.example.com\n",
            pki.node_certificate(&web1).display(),
            pki.node_key(&web1).display(),
            pki.ca_certificate().display()
        ),
    );
    let path = conf.to_str().unwrap();
    let (ok, out, err) = check(&["-c", path]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("mutual TLS, the manager's certificate must name manager.example.com"),
        "{out}"
    );
    // Another node's certificate: the manager would refuse it, so the check does.
    let (ok, out, err) = check(&["-c", path, "-n", "db1"]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.starts_with("drover-agent --check: ") && err.contains("node 'web1'"),
        "{err}"
    );
}

#[test]
fn garbage_is_refused_with_the_reason() {
    let dir = TempDir::new("agent-check-bad");
    for (text, expect) in [
        ("[drover-agent]\nNodeName=a_b\n", "node name"),
        ("[drover-agent]\nNodeName=a\nBogus=1\n", ":3: key 'Bogus'"),
        (
            "[drover-agent]\nNodeName=a\nControllerPort=0\n",
            "ControllerPort",
        ),
        ("\u{0}\u{ff}garbage", "bad.conf"),
        (
            "[drover-agent]\nNodeName=a\nTLSCertificate=/nonexistent/a.pem\n\
             TLSPrivateKey=/nonexistent/a.key\nTLSCertificateAuthority=/nonexistent/ca.pem\n",
            "/nonexistent/",
        ),
    ] {
        let bad = dir.file("bad.conf", text);
        let (ok, out, err) = check(&["-c", bad.to_str().unwrap()]);
        assert!(!ok, "{text:?} passed: {out}");
        assert!(out.is_empty(), "{out}");
        assert!(
            err.starts_with("drover-agent --check: ") && err.contains(expect),
            "{text:?}: {err}"
        );
    }
    let out = Command::new(BIN)
        .args(["--check", "--user"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "--check takes no bus");
}
