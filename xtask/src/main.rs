//! `xtask`: see the library docs. Run through the Makefile:
//!
//! ```text
//! xtask man OUTDIR                      render docs/man/*.md to OUTDIR/NAME.SECTION
//! xtask completions OUTDIR              droverctl's bash, zsh and fish completions
//! xtask install --bin-dir DIR [--destdir D] [--prefix P] [--dbus-policy-dir X] [--zsh-dir Z]
//!               [--package NAME]...
//! xtask deb --bin-dir DIR --out DIR [--compress xz|gzip|none]
//! ```

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use xtask::packages::{self, Inputs, Layout, PACKAGES};

#[derive(Parser)]
#[command(name = "xtask", about = "drover's build tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Render the man pages of docs/man/ into OUTDIR.
    Man { out: PathBuf },
    /// Write droverctl's shell completions into OUTDIR.
    Completions { out: PathBuf },
    /// Install every package's files under DESTDIR (make install), the
    /// optional ones aside; or only the packages named with --package.
    Install {
        /// Only this package (repeatable), optional ones included
        /// (make install-bluechi-compat: drover-bluechi-compat).
        #[arg(long = "package", value_name = "NAME")]
        packages: Vec<String>,
        #[arg(long)]
        bin_dir: PathBuf,
        #[arg(long, default_value = "")]
        destdir: PathBuf,
        #[arg(long, default_value = "/usr")]
        prefix: String,
        /// dbus-daemon reads /usr/share/dbus-1/system.d and /etc/dbus-1/system.d only.
        #[arg(long, default_value = "/usr/share/dbus-1/system.d")]
        dbus_policy_dir: String,
        /// Default: PREFIX/share/zsh/site-functions.
        #[arg(long)]
        zsh_dir: Option<String>,
    },
    /// Build the .deb packages into OUT.
    Deb {
        #[arg(long)]
        bin_dir: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "xz")]
        compress: String,
    },
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ lives in the workspace")
        .to_path_buf()
}

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Man { out } => {
            std::fs::create_dir_all(&out)?;
            for (page, roff) in packages::render_man_pages(&repo(), VERSION)? {
                let path = out.join(&page);
                std::fs::write(&path, roff)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("{}", path.display());
            }
        }
        Task::Completions { out } => {
            std::fs::create_dir_all(&out)?;
            for (_, file, text) in xtask::completions::droverctl() {
                let path = out.join(file);
                std::fs::write(&path, text)?;
                println!("{}", path.display());
            }
        }
        Task::Install {
            packages: only,
            bin_dir,
            destdir,
            prefix,
            dbus_policy_dir,
            zsh_dir,
        } => {
            let prefix = prefix.trim_end_matches('/').to_string();
            let layout = Layout {
                zsh_dir: zsh_dir.unwrap_or_else(|| format!("{prefix}/share/zsh/site-functions")),
                prefix,
                dbus_policy_dir,
            };
            let root = if destdir.as_os_str().is_empty() {
                PathBuf::from("/")
            } else {
                destdir
            };
            for name in &only {
                if !PACKAGES.iter().any(|p| p.name == name.as_str()) {
                    let names: Vec<&str> = PACKAGES.iter().map(|p| p.name).collect();
                    anyhow::bail!("no package '{name}' (packages: {})", names.join(", "));
                }
            }
            let inputs = Inputs::new(&repo(), &bin_dir, VERSION)?;
            let chosen = PACKAGES.iter().filter(|p| {
                if only.is_empty() {
                    !packages::OPTIONAL.contains(&p.name)
                } else {
                    only.iter().any(|n| n == p.name)
                }
            });
            for pkg in chosen {
                for (path, mode) in packages::stage(pkg, &root, &layout, &inputs)? {
                    println!(
                        "{mode:o} {}",
                        root.join(path.trim_start_matches('/')).display()
                    );
                }
            }
        }
        Task::Deb {
            bin_dir,
            out,
            compress,
        } => {
            std::fs::create_dir_all(&out)?;
            let inputs = Inputs::new(&repo(), &bin_dir, VERSION)?;
            let meta = xtask::deb::Meta::from_env(&repo())?;
            for pkg in PACKAGES {
                let file = xtask::deb::build_deb(pkg, &inputs, &meta, &out, &compress)?;
                println!("{}", file.display());
            }
            // Each package's staging directory is gone; their parent goes too.
            let _ = std::fs::remove_dir(out.join("stage"));
        }
    }
    Ok(())
}
