//! `drover-sandbox`: a local cluster of real systemd nodes. See `drover_sandbox::cli`.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = drover_sandbox::cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drover-sandbox: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(drover_sandbox::cli::run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("drover-sandbox: {e:#}");
            ExitCode::FAILURE
        }
    }
}
