//! The `drover-pki` command: certificates for drover's mutual TLS. Arguments in,
//! a call into [`crate::pki`], a line per file written out. [`main`] is the whole
//! program (the binary's `main.rs` calls it): a failure prints one line
//! `drover-pki: <error and its causes>` on stderr and exits 1.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::pki::{Issued, Options, Pki, RevokeTarget, Validity};
use crate::utc;
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use drover_protocol::NodeName;

const LAYOUT: &str = "\
Files in DIR:
  ca.pem, ca.key              the CA (ca.pem is the CA bundle of the manager and agents)
  crl.pem                     the CA's revocation list, for the manager
  manager.pem, manager.key    the manager's server certificate
  etcd.pem, etcd.key          etcd's certificate, for managers that elect a leader on it
  nodes/NODE.pem, NODE.key    a node's client certificate (its SAN is the node name)
  issued.tsv                  every certificate the CA issued (what `revoke NODE` revokes)
Keys are written with mode 0600, certificates and the CRL 0644.";

#[derive(Parser)]
#[command(
    name = "drover-pki",
    version = drover_protocol::version_line!(),
    about = "Make the certificates of drover's mutual TLS: a CA, the manager's, the nodes', and revocations",
    after_help = LAYOUT
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a CA in DIR (ca.pem, ca.key) with an empty crl.pem.
    Ca {
        dir: PathBuf,
        /// Days the CA is valid.
        #[arg(long, default_value_t = 3650)]
        days: u32,
        /// Replace an existing CA key (every certificate it issued stops being trusted).
        #[arg(long)]
        force: bool,
    },
    /// Issue the manager's certificate for the names agents dial (DNS names or IP addresses).
    Manager {
        dir: PathBuf,
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Replace an existing manager key.
        #[arg(long)]
        force: bool,
    },
    /// Issue etcd's certificate for the names managers dial it by (EtcdEndpoints=;
    /// server and client authentication). Use a CA of its own for etcd.
    Etcd {
        dir: PathBuf,
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Replace an existing etcd key.
        #[arg(long)]
        force: bool,
    },
    /// Issue a client certificate per node (its subjectAltName is the node name).
    Node {
        dir: PathBuf,
        #[arg(required = true, value_name = "NODE")]
        nodes: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Replace existing node keys.
        #[arg(long)]
        force: bool,
    },
    /// Revoke every certificate ever issued for each NODE (or, with --serial, the
    /// certificates of these serials) and re-sign DIR/crl.pem.
    Revoke {
        dir: PathBuf,
        #[arg(required = true, value_name = "NODE|SERIAL")]
        targets: Vec<String>,
        /// The arguments are certificate serial numbers (hex, e.g. 4a:0f:…), not node names.
        #[arg(long)]
        serial: bool,
    },
}

/// The whole program: what the `drover-pki` binary calls.
pub fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}`: the context and its causes on one line, no backtrace.
            eprintln!("drover-pki: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Ca { dir, days, force } => {
            let pki = Pki::new(dir);
            let issued = pki
                .create_ca(&options(days, force)?)
                .context("creating the CA")?;
            report(&issued);
            println!("wrote {}", pki.crl().display());
        }
        Command::Manager {
            dir,
            names,
            days,
            force,
        } => {
            let issued = Pki::new(dir)
                .issue_manager(&names, &options(days, force)?)
                .context("issuing the manager certificate")?;
            report(&issued);
        }
        Command::Etcd {
            dir,
            names,
            days,
            force,
        } => {
            let issued = Pki::new(dir)
                .issue_etcd(&names, &options(days, force)?)
                .context("issuing etcd's certificate")?;
            report(&issued);
        }
        Command::Node {
            dir,
            nodes,
            days,
            force,
        } => {
            let nodes = nodes
                .into_iter()
                .map(NodeName::new)
                .collect::<Result<Vec<_>, _>>()?;
            for issued in Pki::new(dir)
                .issue_nodes(&nodes, &options(days, force)?)
                .context("issuing node certificates")?
            {
                report(&issued);
            }
        }
        Command::Revoke {
            dir,
            targets,
            serial,
        } => {
            let pki = Pki::new(dir);
            let targets = targets
                .iter()
                .map(|t| {
                    if serial {
                        Ok(RevokeTarget::Serial(t.parse()?))
                    } else {
                        Ok(pki.revoke_target(t)?)
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let seeded = pki.index()?.seeded_on().map(str::to_string);
            for done in pki.revoke(&targets).context("revoking")? {
                let what = match &done.node {
                    Some(node) => format!("{} (serial {})", node.as_str(), done.serial),
                    None => format!("serial {}", done.serial),
                };
                let state = if done.already {
                    "was already revoked"
                } else {
                    "revoked"
                };
                println!("{what} {state}");
            }
            if let Some(date) = seeded
                && targets.iter().any(|t| matches!(t, RevokeTarget::Node(_)))
            {
                println!(
                    "note: {} was started on {date} from the certificates present then; a \
                     certificate replaced before that is not known: revoke it with --serial",
                    pki.index_path().display()
                );
            }
            println!(
                "wrote {}; reload the manager (SIGHUP) to apply it",
                pki.crl().display()
            );
        }
    }
    Ok(())
}

fn options(days: u32, force: bool) -> Result<Options> {
    Ok(Options {
        validity: Validity::days(days)?,
        force,
    })
}

fn report(issued: &Issued) {
    println!(
        "wrote {} (serial {}, valid until {}) and {}",
        issued.certificate.display(),
        issued.serial,
        utc::format(issued.not_after),
        issued.private_key.display()
    );
}
