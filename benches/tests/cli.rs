//! `drover-bench`'s arguments: misuse is refused with a clear error before
//! any daemon starts.

use drover_testkit::process::Run;
use std::process::Command;

fn bench(args: &[&str]) -> Run {
    Command::new(env!("CARGO_BIN_EXE_drover-bench"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("drover-bench runs")
        .into()
}

#[test]
fn pin_nodes_outside_the_proxy_benchmark_is_refused() {
    let run = bench(&["start-unit", "--pin-nodes"]);
    assert!(!run.success());
    assert!(
        run.stderr
            .contains("--pin-nodes is an option of the proxy benchmark"),
        "{}",
        run.stderr
    );
}

#[test]
fn pin_nodes_takes_no_value() {
    let run = bench(&["proxy", "--pin-nodes=yes"]);
    assert!(!run.success());
    assert!(run.stderr.contains("--pin-nodes"), "{}", run.stderr);
}
