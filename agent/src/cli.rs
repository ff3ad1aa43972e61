//! The `drover-agent` command line: arguments, configuration, logging,
//! signals, around [`crate::agent::run`]; what systemd hears is
//! [`crate::notify`] (turned on here: `READY=1`, the link's `STATUS=`, the
//! watchdog, `STOPPING=1`).
//!
//! Signals: SIGTERM and SIGINT stop the agent; SIGHUP reads the TLS files
//! again for the next dial ([`crate::link::tls`]).
//!
//! Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT), 1 for an invalid
//! configuration or node name (one clear line on stderr) or a lost systemd,
//! 2 for bad arguments (clap's usage error).
//!
//! `--check` merges and validates everything a start would (files, flags,
//! node name, the TLS files and the certificate's node name), prints what it
//! found on stdout and exits 0, or 1 with the reason; it dials nothing and
//! needs no bus.

use crate::connection::{Keepalive, LinkConfig};
use clap::Parser;
use drover_bus::Bus;
use drover_config::{AgentConfig, LoadReport, Sources};
use drover_protocol::NodeName;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// drover-agent: drives this node's systemd on behalf of the drover manager.
#[derive(Debug, Parser)]
#[command(name = "drover-agent", disable_version_flag = true)]
pub struct Args {
    /// Configuration file, applied after the installed ones.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Manager host name or IP address (overrides ControllerHost/ControllerAddress).
    #[arg(short = 'H', long = "host", value_name = "HOST")]
    pub host: Option<String>,
    /// Manager TCP port (overrides ControllerPort/ControllerAddress).
    #[arg(short = 'p', long = "port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    /// Node name to register with (overrides NodeName).
    #[arg(short = 'n', long = "name", value_name = "NAME")]
    pub name: Option<String>,
    /// Heartbeat interval in milliseconds (overrides HeartbeatInterval).
    #[arg(short = 'i', long = "interval", value_name = "HEARTBEAT_MS")]
    pub interval: Option<u64>,
    /// Talk to systemd on this D-Bus address.
    #[arg(long = "bus", value_name = "ADDRESS", conflicts_with = "user")]
    pub bus: Option<String>,
    /// Talk to the user's systemd on the session bus.
    #[arg(short = 'u', long = "user")]
    pub user: bool,
    /// Read only -c FILE and the environment, not /usr/share/drover, /etc/bluechi or /etc/drover.
    #[arg(long = "no-default-config")]
    pub no_default_config: bool,
    /// Check the configuration (files, flags, TLS files) and exit: 0 when
    /// the agent would start with it, 1 with the reason. Starts nothing.
    #[arg(long = "check", conflicts_with_all = ["bus", "user"])]
    pub check: bool,
    /// Print the version and exit.
    #[arg(short = 'v', long = "version")]
    pub version: bool,
}

/// What the binary runs with, after config files and flags are merged.
#[derive(Debug, Clone)]
pub struct Settings {
    pub bus: Bus,
    pub link: LinkConfig,
    pub config: AgentConfig,
    /// Which files were read and the warnings about them (logged at start).
    pub report: LoadReport,
}

/// Merges the configuration layers and the flags, and validates the result.
/// The error is the one line the binary prints.
pub fn settings(args: &Args) -> Result<Settings, String> {
    // BlueChi's /etc/bluechi/agent.conf* are read under drover's files;
    // DROVER_CONFIG_ROOT moves the default search (drover_config::layers).
    let sources = Sources::for_flags("agent", args.config.clone(), args.no_default_config)
        .map_err(|e| e.to_string())?;
    let (config, report) = AgentConfig::load_report(&sources).map_err(|e| e.to_string())?;
    let mut managers = config.controller_endpoints().map_err(|e| e.to_string())?;
    let (mut host, mut port) = managers.remove(0);
    if args.host.is_some() || args.port.is_some() {
        // A flag names the one manager to dial.
        managers.clear();
    }
    if let Some(h) = &args.host {
        drover_config::agent::check_host(h).map_err(|m| format!("--host: {m}"))?;
        host.clone_from(h);
    }
    if let Some(p) = args.port {
        port = p;
    }
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| config.node_name.clone());
    let node = NodeName::new(name)
        .map_err(|e| format!("node name: {e}; set NodeName= in [drover-agent] or pass -n NAME"))?;

    let interval_ms = args.interval.unwrap_or(config.heartbeat_interval_ms);
    if args.interval.is_some() {
        drover_config::agent::check_heartbeat(
            interval_ms,
            config.controller_heartbeat_threshold_ms,
        )
        .map_err(|m| format!("--interval: {m}"))?;
    }
    let mut link = LinkConfig::new(node, host, port);
    link.more = managers
        .into_iter()
        .map(|(host, port)| crate::link::target::Endpoint { host, port })
        .collect();
    link.notify = true;
    link.heartbeat_interval = Duration::from_millis(interval_ms);
    link.heartbeat_threshold = Duration::from_millis(config.controller_heartbeat_threshold_ms);
    link.quiet_after = config.connection_retry_count_until_quiet;
    link.keepalive = (config.link.keepalive_time_s > 0).then(|| Keepalive {
        idle: Duration::from_secs(config.link.keepalive_time_s.into()),
        interval: Duration::from_secs(config.link.keepalive_interval_s.into()),
        count: config.link.keepalive_count,
    });
    link.ip_receive_errors = config.link.ip_receive_errors;
    link.advertise_address = config.advertise_address;
    if let Some(files) = &config.tls {
        // The name the manager's certificate must carry: TLSControllerName,
        // else the host dialled (flags applied).
        let server_name = config
            .tls_controller_name
            .clone()
            .unwrap_or_else(|| link.host.clone());
        link.tls_name_follows_host = config.tls_controller_name.is_none();
        link.tls = Some(crate::link::tls::connector(
            files,
            &link.node,
            &server_name,
        )?);
    }

    let bus = Bus::from_flags(args.bus.as_deref(), args.user);
    Ok(Settings {
        bus,
        link,
        config,
        report,
    })
}

/// The whole binary.
pub fn main() -> ExitCode {
    let args = Args::parse();
    if args.version {
        println!("drover-agent {}", drover_protocol::version_line!());
        return ExitCode::SUCCESS;
    }
    let settings = match settings(&args) {
        Ok(s) => s,
        Err(line) => {
            let what = if args.check { " --check" } else { "" };
            eprintln!("drover-agent{what}: {line}");
            return ExitCode::from(1);
        }
    };
    if args.check {
        println!("{}", check_lines(&settings).join("\n"));
        return ExitCode::SUCCESS;
    }
    let log = drover_config::logging::init(&settings.config.logging);
    tracing::info!("{}", settings.report.files_line());
    for warning in &settings.report.warnings {
        tracing::warn!("{warning}");
    }
    // SetLogLevel from the manager changes this subscriber's level.
    crate::node_api::use_log_handle(log);

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drover-agent: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(serve(settings)) {
        Ok(()) => {
            tracing::info!("drover-agent stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Under systemd stderr lands in the journal too: one line, one place.
            eprintln!("drover-agent: {}", drover_config::logging::error_line(&e));
            ExitCode::from(1)
        }
    }
}

/// What `--check` prints about settings that loaded.
fn check_lines(settings: &Settings) -> Vec<String> {
    let mut lines = vec![settings.report.files_line()];
    lines.extend(
        settings
            .report
            .warnings
            .iter()
            .map(|w| format!("warning: {w}")),
    );
    let link = &settings.link;
    let transport = match (&link.tls, &settings.config.tls_controller_name) {
        (Some(_), Some(name)) => format!("mutual TLS, the manager's certificate must name {name}"),
        (Some(_), None) if link.more.is_empty() => format!(
            "mutual TLS, the manager's certificate must name {}",
            link.host
        ),
        (Some(_), None) => {
            "mutual TLS, each manager's certificate must name the host dialled".to_string()
        }
        (None, _) => {
            "plaintext (a manager on another host refuses it unless it says AllowPlaintext=true)"
                .to_string()
        }
    };
    let managers = link.managers();
    let at = managers
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let whom = if managers.len() == 1 {
        "the manager"
    } else {
        "the managers (following the leader)"
    };
    lines.push(format!(
        "node {} connects to {whom} at {at}, {transport}",
        link.node
    ));
    lines.push(match settings.config.metrics_listen {
        Some(addr) => format!("metrics: Prometheus endpoint http://{addr}/metrics"),
        None => "metrics: off (MetricsListenAddress unset)".to_string(),
    });
    lines.push("the configuration is valid".to_string());
    lines
}

async fn serve(settings: Settings) -> Result<(), crate::agent::AgentError> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    let tls = settings.link.tls.clone().zip(settings.config.tls.clone());
    crate::link::tls::spawn_reload_on_sighup(tls, settings.link.node.clone());
    let logging = &settings.config.logging;
    let endpoint = format!("{}:{}", settings.link.host, settings.link.port);
    let node = settings.link.node.clone();
    let watchdog = tokio::spawn(crate::notify::watchdog());
    let node_checks = settings.config.node_checks.clone();
    let result = crate::agent::run_configured(
        &settings.bus,
        settings.link,
        logging,
        node_checks,
        settings.config.metrics_listen,
        shutdown,
        || {
            crate::notify::ready(&endpoint, node.as_str());
        },
    )
    .await;
    crate::notify::stopping();
    watchdog.abort();
    result
}

/// SIGTERM or SIGINT cancel `shutdown`; a second one is not needed, the
/// shutdown is bounded.
fn spawn_signal_handler(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (term, int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!("cannot install signal handlers: {e}");
            return;
        }
    };
    tokio::spawn(async move {
        let (mut term, mut int) = (term, int);
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        shutdown.cancel();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("drover-agent").chain(args.iter().copied()))
    }

    #[test]
    fn flags_override_the_config() {
        let args = parse(&[
            "--no-default-config",
            "-H",
            "10.0.0.7",
            "-p",
            "9000",
            "-n",
            "node-1",
            "-i",
            "500",
        ])
        .unwrap();
        let s = settings(&args).unwrap();
        assert_eq!(s.link.host, "10.0.0.7");
        assert_eq!(s.link.port, 9000);
        assert_eq!(s.link.node.as_str(), "node-1");
        assert_eq!(s.link.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(s.bus, Bus::System);
    }

    #[test]
    fn an_interval_flag_not_below_the_threshold_is_refused() {
        let args = parse(&["--no-default-config", "-n", "a", "-i", "6000"]).unwrap();
        let err = settings(&args).unwrap_err();
        assert!(
            err.contains("--interval") && err.contains("ControllerHeartbeatThreshold"),
            "{err}"
        );
    }

    #[test]
    fn bus_selection() {
        let s = settings(&parse(&["--no-default-config", "-n", "a", "--user"]).unwrap()).unwrap();
        assert_eq!(s.bus, Bus::Session);
        let s =
            settings(&parse(&["--no-default-config", "-n", "a", "--bus", "unix:path=/x"]).unwrap())
                .unwrap();
        assert_eq!(s.bus, Bus::Address("unix:path=/x".into()));
        let err = parse(&["--user", "--bus", "unix:path=/x"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let err =
            settings(&parse(&["--no-default-config", "-n", "bad_name"]).unwrap()).unwrap_err();
        assert!(err.contains("bad_name"), "{err}");
        let err = settings(&parse(&["--no-default-config", "-n", "a", "-H", "no spaces"]).unwrap())
            .unwrap_err();
        assert!(err.starts_with("--host"), "{err}");
        assert_eq!(parse(&["-p", "0"]).unwrap_err().exit_code(), 2);
        assert_eq!(parse(&["--frobnicate"]).unwrap_err().exit_code(), 2);
        assert!(parse(&["-v"]).unwrap().version);
    }
}
