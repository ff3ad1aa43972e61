//! `drover-bench`'s arguments: misuse is refused with a clear error before
//! any daemon starts.

use std::process::Command;

fn bench(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_drover-bench"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("drover-bench runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn pin_nodes_outside_the_proxy_benchmark_is_refused() {
    let (ok, stderr) = bench(&["start-unit", "--pin-nodes"]);
    assert!(!ok);
    assert!(
        stderr.contains("--pin-nodes is an option of the proxy benchmark"),
        "{stderr}"
    );
}

#[test]
fn pin_nodes_takes_no_value() {
    let (ok, stderr) = bench(&["proxy", "--pin-nodes=yes"]);
    assert!(!ok);
    assert!(stderr.contains("--pin-nodes"), "{stderr}");
}
