//! `drover-machines`: booted Debian 12 machines on this host (see the library
//! docs and `docs/dev/machines.md`).
//!
//! ```text
//! drover-machines up [--debs DIR] [--machine NAME=ADDRESS]...   boot (and set up drover), leave running
//! drover-machines exec --dir DIR NAME -- COMMAND...             run a command inside a machine
//! drover-machines down --dir DIR                                power off, remove everything
//! drover-machines base [--rebuild]                              build (or rebuild) the cached base tree
//! drover-machines clean [--cache]                               remove fleets whose owner died (and the cache)
//! ```

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use drover_machines::{Fleet, FleetOptions, base, fleet, operator};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "drover-machines",
    about = "Booted Debian 12 machines (systemd-nspawn) on this host, for drover's packages"
)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Boot a fleet and leave it running (default: manager, web1, db1).
    Up {
        /// Install the packages of DIR (make deb: target/debian) and set drover up
        /// as the README says: certificates, settings, daemons started.
        #[arg(long, value_name = "DIR")]
        debs: Option<PathBuf>,
        /// A machine and its address in 192.0.2.0/24 (repeatable; the first is the manager host).
        #[arg(long = "machine", value_name = "NAME=ADDRESS", value_parser = parse_machine)]
        machines: Vec<(String, Ipv4Addr)>,
    },
    /// Run COMMAND inside machine NAME of the fleet in DIR.
    Exec {
        #[arg(long)]
        dir: PathBuf,
        name: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Power the fleet in DIR off and remove all it made.
    Down {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Build the base tree, or build it again with --rebuild.
    Base {
        #[arg(long)]
        rebuild: bool,
    },
    /// Remove fleets whose owner process is gone; with --cache also the base tree.
    Clean {
        #[arg(long)]
        cache: bool,
    },
}

fn parse_machine(arg: &str) -> Result<(String, Ipv4Addr), String> {
    let (name, address) = arg
        .split_once('=')
        .ok_or_else(|| format!("'{arg}' is not NAME=ADDRESS"))?;
    let valid = !name.is_empty()
        && name.len() <= 20
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    if !valid {
        return Err(format!(
            "machine name '{name}': 1 to 20 of a-z, 0-9 and '-', not starting with '-'"
        ));
    }
    let address: Ipv4Addr = address
        .parse()
        .map_err(|e| format!("address '{address}': {e}"))?;
    if address.octets()[..3] != [192, 0, 2] || matches!(address.octets()[3], 0 | 255) {
        return Err(format!("address {address}: must be a host of 192.0.2.0/24"));
    }
    Ok((name.to_string(), address))
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover-machines: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Task::Up { debs, machines } => {
            let mut options = FleetOptions::default();
            if !machines.is_empty() {
                let mut names: Vec<&String> = machines.iter().map(|(n, _)| n).collect();
                names.sort();
                names.dedup();
                if names.len() != machines.len() {
                    bail!("two machines with one name");
                }
                options.machines = machines;
            }
            let fleet = Fleet::boot(&options)?;
            if let Some(debs) = &debs {
                operator::set_up(&fleet, debs)?;
            }
            let names: Vec<String> = fleet.machines().iter().map(|m| m.name.clone()).collect();
            let dir = fleet.keep()?;
            println!("fleet in {}: {}", dir.display(), names.join(", "));
            println!(
                "  drover-machines exec --dir {} {} -- systemctl status",
                dir.display(),
                names.first().map_or("NAME", String::as_str)
            );
            println!("  drover-machines down --dir {}", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        Task::Exec { dir, name, command } => {
            let state = fleet::read_state(&dir)?;
            if !state.machines.contains(&name) {
                bail!(
                    "no machine '{name}' in {} ({})",
                    dir.display(),
                    state.machines.join(", ")
                );
            }
            let init = fleet::init_of(&state, &name)
                .with_context(|| format!("machine '{name}' is not running"))?;
            let status = std::process::Command::new("nsenter")
                .args(["-t", &init.to_string(), "-a", "--"])
                .args(&command)
                .status()
                .context("running nsenter")?;
            Ok(ExitCode::from(
                u8::try_from(status.code().unwrap_or(1)).unwrap_or(1),
            ))
        }
        Task::Down { dir } => {
            fleet::down_dir(&dir)?;
            Ok(ExitCode::SUCCESS)
        }
        Task::Base { rebuild } => {
            let cache = base::cache_dir();
            if rebuild {
                base::clear(&cache)?;
            }
            println!("{}", base::ensure(&cache)?.display());
            Ok(ExitCode::SUCCESS)
        }
        Task::Clean { cache } => {
            let problems = fleet::clean_stale();
            for p in &problems {
                eprintln!("drover-machines: {p}");
            }
            if cache {
                base::clear(&base::cache_dir())?;
            }
            Ok(if problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_arguments_are_checked() {
        assert_eq!(
            parse_machine("web1=192.0.2.11").unwrap(),
            ("web1".to_string(), Ipv4Addr::new(192, 0, 2, 11))
        );
        for bad in [
            "web1",
            "=192.0.2.1",
            "Web1=192.0.2.1",
            "a_b=192.0.2.1",
            "-x=192.0.2.1",
            "web1=10.0.0.1",
            "web1=192.0.2.255",
            "web1=192.0.2.x",
            "aaaaaaaaaaaaaaaaaaaaa=192.0.2.1",
        ] {
            assert!(parse_machine(bad).is_err(), "{bad}");
        }
    }
}
