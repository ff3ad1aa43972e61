//! droverctl: the command line client of drover's public D-Bus API.
//!
//! drover-manager speaks Eclipse BlueChi's API (bus name `org.eclipse.bluechi`);
//! droverctl uses nothing else, so it works against any BlueChi-compatible manager.
//! Grammar and output follow bluechictl so scripts that parse bluechictl keep
//! working; drover's improvements are exit codes that mean something (a failed job
//! exits 1), local validation of names, `--json`, `--timeout`, and clear messages when
//! the manager is not there or goes away.
//!
//! Layout:
//! * [`cli`]: global options and value parsers (validation happens at parse time);
//! * [`commands`]: one file per command, and the list that makes the command enum;
//! * [`client`]: bus choice, connection, D-Bus error → [`CtlError`] mapping;
//! * [`api`]: zbus proxies for the members used, node object paths;
//! * [`follow`]: what `monitor`, `status -w` and `metrics listen` share (one ordered
//!   signal stream, Ctrl-C, noticing that the manager left);
//! * [`output`]: tables, JSON, timestamps (pure, unit-tested);
//! * [`error`]: the error type and the exit-code contract.
//!
//! The binary is [`main`]: parse, run on a current-thread runtime, print any error as
//! one line `droverctl: <message>` on stderr, exit with [`CtlError::exit_code`].

pub mod api;
pub mod cli;
pub mod client;
pub mod commands;
pub mod error;
pub mod follow;
pub mod output;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

pub use cli::Cli;
pub use error::{CtlError, EXIT_FAILED, EXIT_OK, EXIT_USAGE};

/// Run a parsed command line, writing command output to `out`.
/// `env_bus` is the value of `$DROVER_BUS` (passed in so callers control it).
pub async fn run(cli: Cli, env_bus: Option<&str>, out: Box<dyn Write>) -> Result<(), CtlError> {
    let target = client::resolve_bus(cli.bus.as_deref(), cli.user, env_bus)?;
    let mut ctx = commands::Context::new(target, cli.json, out);
    cli.command.run(&mut ctx).await
}

/// The whole program: what `main.rs` calls.
pub fn main() -> ExitCode {
    // Exits 2 with usage on a bad command line, 0 for --help/--version.
    let cli = Cli::parse();
    let env_bus = std::env::var("DROVER_BUS").ok();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("droverctl: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let out = Box::new(std::io::stdout());
    match runtime.block_on(run(cli, env_bus.as_deref(), out)) {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(e) => {
            if !e.is_quiet() {
                eprintln!("droverctl: {e}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}
