//! `drover-sandbox`: a local cluster of real systemd nodes; everything lives in
//! `drover_sandbox::cli`.

fn main() -> std::process::ExitCode {
    drover_sandbox::cli::main()
}
