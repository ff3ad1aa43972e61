//! `drover-manager`: parse the command line, load the config, set up
//! logging, run the manager until SIGTERM/SIGINT; SIGHUP reloads the config.

use anyhow::Context;
use clap::Parser;
use drover_manager::cli::Cli;
use drover_manager::nodes::listener;
use drover_manager::{Manager, Timeouts};
use std::process::ExitCode;
use tokio::signal::unix::{SignalKind, signal};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drover-manager: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // stderr only: under systemd it lands in the journal, and logging
            // may itself point at stderr (one line, not two).
            eprintln!(
                "drover-manager: {}",
                drover_config::logging::error_line(e.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = cli.load_config().context("configuration")?;
    let log = drover_config::logging::init(&config.logging);
    let listener = listener::listener_for(&config)?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let manager = Manager::start(config, &cli.bus(), listener, Timeouts::default()).await?;
    manager.core().set_log_handle(log);
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::debug!("sd_notify: {e}");
    }
    loop {
        tokio::select! {
            _ = term.recv() => {
                tracing::info!("SIGTERM: shutting down");
                break;
            }
            _ = int.recv() => {
                tracing::info!("SIGINT: shutting down");
                break;
            }
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading the configuration");
                // Same sources and flags as at start; a config that does not
                // load is logged by `reload` and the running one kept.
                let _ = drover_manager::reload::reload(
                    manager.core(),
                    Some(manager.connection()),
                    cli.load_config(),
                )
                .await;
            }
        }
    }
    manager.shutdown().await;
    Ok(())
}
