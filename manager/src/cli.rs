//! Command line of `drover-manager` (docs/dev/architecture.md "Command lines"):
//!
//! ```text
//! drover-manager [-c FILE] [-p PORT] [--bus ADDRESS | --user] [--no-default-config] [-v|--version]
//! drover-manager --check [-c FILE] [-p PORT] [--no-default-config]
//! ```
//!
//! `--check` loads the configuration as a start would (every file, the
//! flags, the TLS certificate, key, CA bundle and revocation list), prints
//! what it found on stdout and exits: 0 when the manager would start with
//! it, 1 with the reason otherwise. It binds nothing and needs no bus.
//!
//! Config layers come first (see `drover_config::Sources`; BlueChi's
//! `/etc/bluechi/controller.conf*` are read under drover's files;
//! `DROVER_CONFIG_ROOT` moves the default search), the flags override them.
//! Which files were read, and every warning about them, is logged at start
//! and on each reload.
//!
//! [`main`] is the whole process around the library: parse the command line,
//! start the runtime, load the config, set up logging, run the manager until
//! SIGTERM/SIGINT; SIGHUP reloads the config ([`crate::reload`]), and so
//! does `io.drover.Controller.Reload`, which `drover-manager --reload` calls
//! (the unit's `ExecReload=`: it returns when the reload is applied). The
//! service manager hears of all of it through [`crate::notify`]; the
//! watchdog is pinged from this loop, after a check that the worker threads
//! run tasks and the node table's lock is free. A failure
//! to start is one line on stderr and exit status 1; so is the loss of the
//! bus connection while running (logged as an error first): the manager
//! cannot win its name back on a connection that is gone, so it leaves the
//! restart to its unit (`Restart=on-failure`).

use crate::nodes::lifecycle::Nodes;
use crate::nodes::listener;
use crate::notify;
use crate::root::Timeouts;
use crate::server::Manager;
use anyhow::Context;
use clap::Parser;
use drover_bus::Bus;
use drover_config::exit;
use drover_config::{ConfigError, LoadReport, ManagerConfig, Sources};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, Clone, Parser)]
#[command(
    name = "drover-manager",
    version = drover_protocol::version_line!(),
    disable_version_flag = true,
    about = "drover's manager: tracks nodes and serves BlueChi's D-Bus API (org.eclipse.bluechi)"
)]
pub struct Cli {
    /// Configuration file, applied after the system files.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// TCP port agents connect to (overrides ControllerPort).
    #[arg(short = 'p', long = "port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    /// Serve the API on the bus at this address.
    #[arg(long = "bus", value_name = "ADDRESS", conflicts_with = "user")]
    pub bus: Option<String>,
    /// Serve the API on the session bus.
    #[arg(long = "user")]
    pub user: bool,
    /// Read only -c FILE (and DROVER_LOG_* from the environment), no system files.
    #[arg(long = "no-default-config")]
    pub no_default_config: bool,
    /// Ask the manager serving the bus to reload its configuration, and
    /// wait until it is applied (the unit's ExecReload=); exit 1 if it fails.
    #[arg(long = "reload", conflicts_with_all = ["config", "port", "no_default_config"])]
    pub reload: bool,
    /// Check the configuration (files, flags, TLS files) and exit: 0 when
    /// the manager would start with it, 1 with the reason. Starts nothing.
    #[arg(long = "check", conflicts_with_all = ["reload", "bus", "user"])]
    pub check: bool,
    /// Print the version and exit.
    #[arg(short = 'v', long = "version", action = clap::ArgAction::Version)]
    pub version: Option<bool>,
}

impl Cli {
    pub fn bus(&self) -> Bus {
        Bus::from_flags(self.bus.as_deref(), self.user)
    }

    pub fn sources(&self) -> Result<Sources, ConfigError> {
        Sources::for_flags("manager", self.config.clone(), self.no_default_config)
    }

    /// The configuration from every layer, with the flags on top, and what
    /// loading read and warns about.
    pub fn load_config(&self) -> Result<(ManagerConfig, LoadReport), ConfigError> {
        let (mut config, report) = ManagerConfig::load_report(&self.sources()?)?;
        if let Some(port) = self.port {
            config.port = port;
        }
        Ok((config, report))
    }
}

/// Logs which files were read and every warning about them.
pub fn log_report(report: &LoadReport) {
    tracing::info!("{}", report.files_line());
    for warning in &report.warnings {
        tracing::warn!("{warning}");
    }
}

/// The `drover-manager` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.check {
        return exit::check_status("drover-manager", check(&cli));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
    {
        Ok(rt) => rt,
        Err(e) => return exit::status("drover-manager", Err(e)),
    };
    if cli.reload {
        let asked = runtime.block_on(ask_reload(&cli.bus()));
        return exit::status("drover-manager --reload", asked);
    }
    exit::status("drover-manager", runtime.block_on(run(cli)))
}

/// `--reload`: `io.drover.Controller.Reload` on the manager that owns
/// `org.eclipse.bluechi` on `bus`. The D-Bus call waits as long as the
/// reload takes (no client timeout: systemd's `TimeoutStartSec=` bounds it).
async fn ask_reload(bus: &Bus) -> anyhow::Result<()> {
    use drover_bus::bluechi::{BUS_NAME, CONTROLLER_PATH, DROVER_CONTROLLER_IFACE};
    let conn = bus
        .connect()
        .await
        .with_context(|| format!("cannot connect to {bus}"))?;
    let proxy = zbus::Proxy::new(&conn, BUS_NAME, CONTROLLER_PATH, DROVER_CONTROLLER_IFACE)
        .await
        .context("cannot reach the manager")?;
    let reply: zbus::Result<()> = proxy.call("Reload", &()).await;
    match reply {
        Ok(()) => Ok(()),
        // The manager's answer (or the bus's, when no manager owns the
        // name): its message is the whole story.
        Err(zbus::Error::FDO(e)) => {
            use zbus::DBusError;
            let hint = match *e {
                zbus::fdo::Error::ServiceUnknown(_) | zbus::fdo::Error::NameHasNoOwner(_) => {
                    " (is drover-manager running?)"
                }
                _ => "",
            };
            anyhow::bail!("{}{hint}", e.description().unwrap_or(e.name().as_str()))
        }
        Err(zbus::Error::MethodError(name, message, _)) => {
            anyhow::bail!("{}", message.unwrap_or_else(|| name.to_string()))
        }
        Err(e) => Err(e).context("the reload call failed"),
    }
}

/// `--check`: what a start would load, loaded and described, one line each.
fn check(cli: &Cli) -> anyhow::Result<Vec<String>> {
    let (config, report) = cli.load_config().context("configuration")?;
    let mut lines = vec![report.files_line()];
    lines.extend(report.warnings.iter().map(|w| format!("warning: {w}")));
    let mut names: Vec<String> = config
        .allowed_nodes
        .iter()
        .map(|n| n.as_str().to_string())
        .collect();
    names.extend(config.allowed_patterns.iter().map(|p| p.to_string()));
    let names = if names.is_empty() {
        "none listed".to_string()
    } else {
        names.join(", ")
    };
    let address = config.listen_address.map_or_else(
        || {
            if config.tls.is_some() || config.allow_plaintext {
                "every address".to_string()
            } else {
                "127.0.0.1".to_string()
            }
        },
        |a| a.to_string(),
    );
    match &config.tls {
        Some(files) => {
            let settings = drover_tls::ServerSettings::load(files).context("TLS")?;
            let certified = if config.allow_certified_nodes {
                ", and every node the CA certified"
            } else {
                ""
            };
            lines.push(format!(
                "agents: mutual TLS on {address} port {}; nodes allowed: {names}{certified}",
                config.port
            ));
            lines.push(format!(
                "TLS: manager certificate serial {}, valid until {}; {} revoked certificate(s) in the CRL",
                settings.serial(),
                drover_tls::format_utc(settings.not_after()),
                settings.revoked_count()
            ));
        }
        None if config.allow_plaintext => lines.push(format!(
            "agents: PLAINTEXT on {address} port {} from any address (AllowPlaintext=true); \
             nodes allowed: {names}",
            config.port
        )),
        None => lines.push(format!(
            "agents: plaintext on {address} port {}, loopback only: agents on other hosts \
             need TLS (TLSCertificate, TLSPrivateKey, TLSCertificateAuthority); nodes allowed: {names}",
            config.port
        )),
    }
    lines.push(match config.metrics.listen {
        Some(addr) => format!(
            "metrics: Prometheus endpoint http://{addr}/metrics{}",
            if config.metrics.per_node {
                ""
            } else {
                " (no per-node series)"
            }
        ),
        None => "metrics: off (MetricsListenAddress unset)".to_string(),
    });
    let ha = &config.ha;
    if let Some(files) = &ha.tls {
        drover_tls::settings::service_client_config(files).context("etcd's TLS")?;
    }
    lines.push(if ha.enabled() {
        format!(
            "high availability: campaigns for {} on etcd {}, lease {} s{}",
            ha.leader_key(),
            ha.endpoints
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            ha.lease_ttl_s,
            ha.tls.as_ref().map_or(String::new(), |f| format!(
                ", mutual TLS with {}",
                f.certificate.display()
            ))
        )
    } else {
        "high availability: off (EtcdEndpoints unset): this manager leads alone".to_string()
    });
    lines.push("the configuration is valid".to_string());
    Ok(lines)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let (config, report) = cli.load_config().context("configuration")?;
    let log = drover_config::logging::init(&config.logging);
    log_report(&report);
    raise_nofile();
    let listener = listener::listener_for(&config)?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let manager = Manager::start(config, &cli.bus(), listener, Timeouts::default()).await?;
    manager.log().set_handle(log);
    let sources = cli.clone();
    manager.reloader().set_source(Box::new(move || {
        sources.load_config().map(|(config, report)| {
            log_report(&report);
            config
        })
    }));
    let counts = manager.lifecycle().node_counts();
    notify::ready(*counts.borrow());
    let status = tokio::spawn(notify::follow_status(counts));
    let mut watchdog = notify::Watchdog::from_env();
    if let Some(every) = watchdog.period() {
        tracing::info!("watchdog: pinging the service manager every {every:?}");
    }
    let mut failed = None;
    // Watched from here to the end: the match is made once.
    let name_lost = manager.name_lost();
    tokio::pin!(name_lost);
    loop {
        tokio::select! {
            () = watchdog.ping_when_due(alive(manager.lifecycle().nodes())) => {}
            () = &mut name_lost => {
                let name = drover_bus::bluechi::BUS_NAME;
                tracing::error!(
                    "drover-manager lost the bus name {name} on {}: D-Bus clients no longer \
                     reach it; exiting so that the service manager restarts it",
                    cli.bus()
                );
                failed = Some(format!("lost the bus name {name} on {}", cli.bus()));
                break;
            }
            () = manager.bus_lost() => {
                tracing::error!(
                    "drover-manager lost its connection to {}; exiting so that the service manager restarts it",
                    cli.bus()
                );
                failed = Some(format!("lost its connection to {}", cli.bus()));
                break;
            }
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
                let _ = crate::reload::reload_from_source(manager.reloader()).await;
            }
        }
    }
    notify::stopping();
    status.abort();
    manager.shutdown().await;
    match failed {
        Some(why) => anyhow::bail!("{why}"),
        None => Ok(()),
    }
}

/// Raises the soft limit on open descriptors to the hard limit (the shipped
/// unit says `LimitNOFILE=65536`; systemd starts services with a soft limit
/// of 1024 otherwise): every agent is a descriptor, and so is every
/// connection waiting in the lobby (`nodes::listener::LOBBY`).
fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!("cannot raise the descriptor limit from {soft} to {hard}: {e}");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::debug!("RLIMIT_NOFILE: {e}"),
    }
}

/// The check before each watchdog ping: a task runs on the worker threads
/// and takes the node table's lock. A manager whose workers are all stuck,
/// or whose registry lock is never released, stops pinging.
async fn alive(nodes: &Arc<Nodes>) {
    let nodes = nodes.clone();
    let _ = tokio::spawn(async move {
        let _ = nodes.registry().online();
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("drover-manager").chain(args.iter().copied()))
    }

    #[test]
    fn flags() {
        let cli = parse(&[
            "-c",
            "/x.conf",
            "-p",
            "2020",
            "--bus",
            "unix:path=/b",
            "--no-default-config",
        ])
        .unwrap();
        assert_eq!(cli.port, Some(2020));
        assert_eq!(cli.bus(), Bus::Address("unix:path=/b".into()));
        let sources = cli.sources().unwrap();
        assert!(
            sources.vendor.is_none() && sources.bluechi_etc.is_none(),
            "--no-default-config skips the system files"
        );
        assert_eq!(sources.extra, Some(PathBuf::from("/x.conf")));
        assert_eq!(parse(&["--user"]).unwrap().bus(), Bus::Session);
        assert_eq!(parse(&[]).unwrap().bus(), Bus::System);
        assert!(parse(&[]).unwrap().sources().unwrap().etc.is_some());
    }

    #[test]
    fn bad_input_is_rejected() {
        assert!(parse(&["--bus", "x", "--user"]).is_err());
        assert!(parse(&["-p", "99999"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        let v = parse(&["-v"]).unwrap_err();
        assert_eq!(v.kind(), clap::error::ErrorKind::DisplayVersion);
        assert!(v.to_string().contains("drover-manager version"), "{v}");
    }
}
