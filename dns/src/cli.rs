//! Command line of `drover-dns` and the process around the library:
//!
//! ```text
//! drover-dns [-c FILE] [-l ADDRESS] [--bus ADDRESS | --user] [--no-default-config] [--check] [-v|--version]
//! ```
//!
//! Loads `dns.conf` (`drover_config::dns`; `-l` overrides `ListenAddress`,
//! and also takes port 0: the kernel picks one, the log says which), binds
//! UDP and TCP on the same address, says `READY=1` to systemd once both
//! listen, and serves until SIGTERM/SIGINT. The manager need not be up: its
//! bus is connected on the first query and again after a failure
//! ([`crate::feed`]). `--check` loads the configuration, prints it and exits
//! 0, or 1 with the reason. A failure to start is one line on stderr and
//! exit status 1.

use crate::cache::Settings;
use crate::feed::Feed;
use crate::handler::Handler;
use crate::records::Zone;
use anyhow::Context;
use clap::Parser;
use drover_bus::Bus;
use drover_config::exit;
use drover_config::{DnsConfig, Sources};
use hickory_server::ServerFuture;
use hickory_server::proto::rr::Name;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

/// How long one `Where` call may take before the answer is served stale.
pub const WHERE_TIMEOUT: Duration = Duration::from_secs(2);

/// A TCP client that sends nothing for this long is disconnected.
pub const TCP_IDLE: Duration = Duration::from_secs(5);

/// Targets whose every-query lines (hickory-server logs each request at
/// INFO) are kept below WARN, whatever `LogLevel` says.
pub const CHATTY_TARGETS: &[&str] = &["hickory_server", "hickory_proto"];

#[derive(Debug, Clone, Parser)]
#[command(
    name = "drover-dns",
    version = drover_protocol::version_line!(),
    disable_version_flag = true,
    about = "drover's DNS server: where each unit of the fleet runs and is healthy, as A/AAAA/SRV records"
)]
pub struct Cli {
    /// Configuration file, applied after the system files.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Listen here, UDP and TCP: `IPv4:PORT` or `[IPv6]:PORT` (overrides ListenAddress; port 0: any free port).
    #[arg(short = 'l', long = "listen", value_name = "ADDRESS")]
    pub listen: Option<SocketAddr>,
    /// The manager is on the bus at this address.
    #[arg(long = "bus", value_name = "ADDRESS", conflicts_with = "user")]
    pub bus: Option<String>,
    /// The manager is on the session bus.
    #[arg(long = "user")]
    pub user: bool,
    /// Read only -c FILE (and DROVER_LOG_* from the environment), no system files.
    #[arg(long = "no-default-config")]
    pub no_default_config: bool,
    /// Check the configuration and exit: 0 when drover-dns would start with it, 1 with the reason.
    #[arg(long = "check")]
    pub check: bool,
    /// Print the version and exit.
    #[arg(short = 'v', long = "version", action = clap::ArgAction::Version)]
    pub version: Option<bool>,
}

impl Cli {
    pub fn bus(&self) -> Bus {
        Bus::from_flags(self.bus.as_deref(), self.user)
    }

    /// The configuration from every layer, with the flags on top.
    pub fn load(&self) -> anyhow::Result<(DnsConfig, drover_config::LoadReport)> {
        let sources = Sources::for_flags("dns", self.config.clone(), self.no_default_config)?;
        let (mut config, report) = DnsConfig::load_report(&sources)?;
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        Ok((config, report))
    }
}

fn check(cli: &Cli) -> anyhow::Result<Vec<String>> {
    let (c, report) = cli.load()?;
    Ok(vec![
        report.files_line(),
        format!("ListenAddress={}", c.listen),
        format!("Zone={}", c.zone),
        format!("TTL={}s", c.ttl.as_secs()),
        format!("StaleTTL={}s", c.stale_ttl.as_secs()),
        format!("ServeStale={}s", c.serve_stale.as_secs()),
        format!("CacheSize={}", c.cache_size),
        format!("WhereRate={}", c.where_rate),
        format!("LogLevel={}", c.logging.level.as_str()),
    ])
}

/// The `drover-dns` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.check {
        return exit::check_status("drover-dns", check(&cli));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime");
    exit::status("drover-dns", runtime.and_then(|rt| rt.block_on(run(cli))))
}

/// The zone, cache settings and handler a configuration describes.
pub fn handler(config: &DnsConfig, bus: Bus) -> anyhow::Result<Handler<Feed>> {
    let origin = Name::from_ascii(format!("{}.", config.zone))
        .with_context(|| format!("zone '{}'", config.zone))?;
    let serial = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u32::try_from(d.as_secs() & 0xffff_ffff).unwrap_or(1))
        .unwrap_or(1);
    let ttl = u32::try_from(config.ttl.as_secs()).unwrap_or(u32::MAX);
    let zone = Zone::new(origin, ttl, serial).map_err(anyhow::Error::msg)?;
    let settings = Settings {
        ttl: config.ttl,
        stale_ttl: config.stale_ttl,
        max_stale: config.serve_stale,
        capacity: config.cache_size,
        rate: config.where_rate,
    };
    let feed = Feed::new(bus, WHERE_TIMEOUT);
    Ok(Handler::new(
        feed,
        zone,
        settings,
        WHERE_TIMEOUT + Duration::from_millis(500),
    ))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let (config, report) = cli.load()?;
    let _log = drover_config::logging::init_muting(&config.logging, CHATTY_TARGETS);
    tracing::info!("{}", report.files_line());
    let bus = cli.bus();
    let handler = handler(&config, bus.clone())?;
    let udp = tokio::net::UdpSocket::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on UDP {}", config.listen))?;
    let address = udp.local_addr().context("the UDP socket's address")?;
    let tcp = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on TCP {address}"))?;
    let mut server = ServerFuture::new(handler);
    server.register_socket(udp);
    server.register_listener(tcp, TCP_IDLE);
    let line = format!(
        "serving zone {}. on {address} (UDP and TCP), answers from the manager on {bus}",
        config.zone
    );
    tracing::info!("{line}");
    drover_config::notify::ready(&line);
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::select! {
        done = server.block_until_done() => {
            done.context("the DNS server stopped")?;
            anyhow::bail!("the DNS server stopped");
        }
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    drover_config::notify::stopping("stopping");
    tracing::info!("stopping");
    let _ = tokio::time::timeout(Duration::from_secs(2), server.shutdown_gracefully()).await;
    Ok(())
}
