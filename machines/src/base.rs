//! The base tree every machine boots from: Debian 12 (`bookworm`) minbase
//! from the host's own mirror, with systemd, dbus, the network and what
//! drover's packages depend on, so `apt install ./PKG.deb` needs no network
//! inside a machine.
//!
//! Built once with debootstrap into the cache directory and reused until its
//! inputs change. The inputs are written out whole (`inputs.txt`: recipe
//! version, suite, mirror, packages, files, and the host's apt configuration
//! copied in) and compared as text, so any change rebuilds. A build goes to
//! `base.new` and is renamed into place only when complete; a lock file
//! keeps two builds from racing. Machines never write to the base (an
//! overlay, or a copy, sits on top).

use crate::host;
use crate::run::run;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The Debian release of the machines.
pub const SUITE: &str = "bookworm";

/// Bumped when the recipe below changes in a way the inputs do not show.
const RECIPE: u32 = 1;

/// Packages besides minbase: systemd as PID 1, the system bus, the network,
/// and every dependency (and recommendation) of drover's packages, so apt
/// finds them all installed.
pub const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "iproute2",
    "ca-certificates",
    "procps",
    "bash-completion",
];

/// The machines' network: `host0` (nspawn's end of the veth) gets its
/// address from a per-machine drop-in. Named `10-` so it sorts before the
/// `80-container-host0.network` systemd ships (which would ask for DHCP).
pub const HOST0_NETWORK: &str =
    "[Match]\nName=host0\n\n[Network]\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n";

/// Where bases are cached: `$DROVER_MACHINES_CACHE`, else `/var/cache/drover-machines`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("DROVER_MACHINES_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/drover-machines"))
}

/// What a base is made from, as the text compared with a cached base's.
fn inputs(mirror: &str, apt: &[(PathBuf, Vec<u8>)]) -> String {
    let mut text = format!(
        "recipe {RECIPE}\nsuite {SUITE}\nvariant minbase\nmirror {mirror}\npackages {}\n\
         enable systemd-networkd\nfile etc/systemd/network/10-host0.network\n{HOST0_NETWORK}",
        PACKAGES.join(",")
    );
    for (path, bytes) in apt {
        text.push_str(&format!(
            "apt file {} ({} bytes)\n{}\n",
            path.display(),
            bytes.len(),
            String::from_utf8_lossy(bytes)
        ));
    }
    text
}

/// The base tree, built first if there is none or its inputs changed.
/// Prints what it does on stderr: a build takes minutes.
pub fn ensure(cache: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let lock = std::fs::File::create(cache.join("lock"))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking {}: {e}", cache.display()))?;
    let apt = host::apt_files()?;
    let mirror = host::mirror(&apt, SUITE)?;
    let wanted = inputs(&mirror, &apt);
    let base = cache.join("base");
    let recorded = std::fs::read_to_string(cache.join("inputs.txt")).unwrap_or_default();
    if base.join("usr/lib/systemd/systemd").exists() && recorded == wanted {
        return Ok(base);
    }
    let new = cache.join("base.new");
    remove_tree(&new)?;
    let log = cache.join("debootstrap.log");
    eprintln!(
        "machines: building the base tree ({SUITE} from {mirror}; a few minutes, once; log: {})",
        log.display()
    );
    let started = std::time::Instant::now();
    let out = run(
        Command::new("debootstrap")
            .arg("--variant=minbase")
            .arg(format!("--include={}", PACKAGES.join(",")))
            .arg(SUITE)
            .arg(&new)
            .arg(&mirror),
        Duration::from_secs(40 * 60),
    )?;
    std::fs::write(&log, out.text())?;
    if !out.ok() {
        bail!(
            "debootstrap failed (exit {:?}); see {}",
            out.code,
            log.display()
        );
    }
    chroot(&new, &["systemctl", "enable", "systemd-networkd"])?;
    let network = new.join("etc/systemd/network");
    std::fs::create_dir_all(&network)?;
    std::fs::write(network.join("10-host0.network"), HOST0_NETWORK)?;
    for (path, bytes) in &apt {
        let dest = new.join(path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&dest, bytes)?;
    }
    // What every installed system has and debootstrap does not write.
    let hosts = new.join("etc/hosts");
    if std::fs::metadata(&hosts).map(|m| m.len()).unwrap_or(0) == 0 {
        std::fs::write(
            &hosts,
            "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n",
        )?;
    }
    chroot(&new, &["apt-get", "clean"])?;
    // Each machine gets its own (an empty file makes systemd write one at boot).
    std::fs::write(new.join("etc/machine-id"), "")?;
    remove_tree(&base)?;
    std::fs::rename(&new, &base)?;
    std::fs::write(cache.join("inputs.txt"), &wanted)?;
    eprintln!(
        "machines: base tree ready in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        base.display()
    );
    Ok(base)
}

/// Removes the cached base (the next fleet builds it again).
pub fn clear(cache: &Path) -> Result<()> {
    for name in ["base", "base.new", "inputs.txt"] {
        let path = cache.join(name);
        if path.is_dir() {
            remove_tree(&path)?;
        } else if path.exists() {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

fn chroot(root: &Path, args: &[&str]) -> Result<()> {
    run(
        Command::new("chroot")
            .arg(root)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        Duration::from_secs(300),
    )?
    .into_result(&format!("chroot {} {}", root.display(), args.join(" ")))
    .map(drop)
}

/// `rm -rf` that stays on one file system (a stray mount below is left,
/// and then the removal fails loudly).
pub fn remove_tree(path: &Path) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    run(
        Command::new("rm")
            .arg("-rf")
            .arg("--one-file-system")
            .arg(path),
        Duration::from_secs(300),
    )?
    .into_result(&format!("rm -rf {}", path.display()))
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_change_of_the_inputs_is_a_new_base() {
        let apt = vec![(
            PathBuf::from("etc/apt/sources.list"),
            b"deb http://a/debian bookworm main\n".to_vec(),
        )];
        let one = inputs("http://a/debian", &apt);
        assert_eq!(one, inputs("http://a/debian", &apt));
        assert_ne!(one, inputs("http://b/debian", &apt));
        let other = vec![(
            PathBuf::from("etc/apt/sources.list"),
            b"deb http://a/debian bookworm contrib\n".to_vec(),
        )];
        assert_ne!(one, inputs("http://a/debian", &other));
        assert!(one.contains("bash-completion") && one.contains(HOST0_NETWORK));
    }
}
