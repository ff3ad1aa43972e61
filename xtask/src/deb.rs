//! Debian packages (`make deb`) from the lists of [`crate::packages`]: the
//! staged files plus what Debian's tools and lintian expect of a package.
//!
//! * `DEBIAN/control`: the package's metadata; `Source: drover` (all come
//!   from one tree), `Maintainer:` and `Homepage:` from [`Meta`] (one place:
//!   `[workspace.package]` of `Cargo.toml`, or Debian's `DEBFULLNAME` /
//!   `DEBEMAIL` for whoever builds), `Depends:` from the binaries' libraries,
//!   the package's own list and its drover siblings at the same version.
//! * `DEBIAN/md5sums` of every file but the conffiles, as `dh_md5sums`.
//! * `/usr/share/doc/PKG/copyright` (machine-readable, with the licences of
//!   the Rust crates its binaries contain) and `changelog.gz` (a native
//!   package's Debian changelog, dated by `SOURCE_DATE_EPOCH` or the commit).
//! * Maintainer scripts for a package with a daemon, as `dh_installsystemd
//!   --no-start --restart-after-upgrade` writes them: enabled on first
//!   install (`deb-systemd-helper`), never started by the package, restarted
//!   on upgrade only if it runs (`deb-systemd-invoke try-restart`), stopped
//!   on removal, its state purged on purge.

use crate::packages::{Inputs, Layout, Package, Source, stage};
use anyhow::{Context, Result, bail};
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Who the packages are from, and when this build is.
#[derive(Debug, Clone)]
pub struct Meta {
    /// `Name <address>`.
    pub maintainer: String,
    pub homepage: String,
    /// RFC 2822, for the changelog's trailer line.
    pub date: String,
}

/// `[workspace.package]`'s `authors` and `homepage`, as cargo gave them to
/// this crate.
const AUTHORS: &str = env!("CARGO_PKG_AUTHORS");
const HOMEPAGE: &str = env!("CARGO_PKG_HOMEPAGE");

impl Meta {
    /// `DEBFULLNAME` and `DEBEMAIL` when both are set (Debian's convention
    /// for whoever builds a package), else the workspace's first author; the
    /// date from `SOURCE_DATE_EPOCH`, else the commit of `repo`'s `HEAD`,
    /// else now.
    pub fn from_env(repo: &Path) -> Result<Self> {
        let maintainer = match (std::env::var("DEBFULLNAME"), std::env::var("DEBEMAIL")) {
            (Ok(name), Ok(mail)) if !name.is_empty() && !mail.is_empty() => {
                format!("{name} <{mail}>")
            }
            _ => AUTHORS.split(':').next().unwrap_or_default().to_string(),
        };
        if !maintainer.contains('<') || !maintainer.ends_with('>') {
            bail!(
                "maintainer '{maintainer}' is not 'Name <address>' (set DEBFULLNAME and DEBEMAIL)"
            );
        }
        let epoch = std::env::var("SOURCE_DATE_EPOCH")
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| {
                let out = Command::new("git")
                    .args(["log", "-1", "--format=%ct"])
                    .current_dir(repo)
                    .output()
                    .ok()?;
                out.status
                    .success()
                    .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            });
        let mut date = Command::new("date");
        date.args(["-u", "-R"]);
        if let Some(epoch) = &epoch {
            if !epoch.chars().all(|c| c.is_ascii_digit()) {
                bail!("SOURCE_DATE_EPOCH '{epoch}' is not a number of seconds");
            }
            date.arg("-d").arg(format!("@{epoch}"));
        }
        let out = date.output().context("running date")?;
        if !out.status.success() {
            bail!("date failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(Self {
            maintainer,
            homepage: HOMEPAGE.to_string(),
            date: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        })
    }
}

impl Meta {
    /// The year of [`Meta::date`] (`Thu, 28 Nov 2025 05:00:00 +0000`).
    pub fn year(&self) -> &str {
        self.date.split_whitespace().nth(3).unwrap_or("1970")
    }
}

/// The Debian architecture of this build.
pub fn deb_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "i386",
        "arm" => "armhf",
        "powerpc64" => "ppc64el",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// The shared libraries a Rust binary links, as Debian dependencies: libc6
/// at the newest GLIBC symbol version it uses (2.36 at least when its
/// relative relocations are packed, `GLIBC_ABI_DT_RELR`: the `dist` build's
/// `-z pack-relative-relocs`), libgcc-s1 when it unwinds through libgcc_s.
pub fn library_depends(binary: &[u8]) -> Vec<String> {
    let mut newest: Option<(u32, u32)> = None;
    if packs_relative_relocations(binary) {
        newest = Some(DT_RELR_SINCE);
    }
    let needle = b"GLIBC_2.";
    let mut i = 0;
    while let Some(pos) = binary[i..].windows(needle.len()).position(|w| w == needle) {
        let start = i + pos + needle.len();
        let digits: Vec<u8> = binary[start..]
            .iter()
            .take_while(|b| b.is_ascii_digit() || **b == b'.')
            .copied()
            .collect();
        let text = String::from_utf8_lossy(&digits);
        let mut parts = text.split('.').filter_map(|p| p.parse::<u32>().ok());
        if let Some(minor) = parts.next() {
            let v = (minor, parts.next().unwrap_or(0));
            newest = Some(newest.map_or(v, |n| n.max(v)));
        }
        i = start;
    }
    let mut deps = Vec::new();
    if let Some((minor, patch)) = newest {
        deps.push(if patch == 0 {
            format!("libc6 (>= 2.{minor})")
        } else {
            format!("libc6 (>= 2.{minor}.{patch})")
        });
    }
    if contains(binary, b"libgcc_s.so.1") {
        deps.push("libgcc-s1".to_string());
    }
    deps
}

/// The version a binary with packed relative relocations (`DT_RELR`) needs
/// from the C library; the first glibc whose loader reads them is 2.36.
const GLIBC_ABI_DT_RELR: &[u8] = b"GLIBC_ABI_DT_RELR";
const DT_RELR_SINCE: (u32, u32) = (36, 0);

/// Whether `binary` has its relative relocations packed (`DT_RELR`): it
/// then asks the C library for the version `GLIBC_ABI_DT_RELR`.
pub fn packs_relative_relocations(binary: &[u8]) -> bool {
    contains(binary, GLIBC_ABI_DT_RELR)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What `dh_installsystemd --no-start --restart-after-upgrade` writes for
/// `unit` (debhelper 13), so the unit is handled as every Debian daemon's is.
pub fn maintainer_scripts(unit: &str) -> Vec<(&'static str, String)> {
    let configure = r#"if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ] ; then"#;
    vec![
        (
            "postinst",
            format!(
                "#!/bin/sh\n\
                 set -e\n\
                 # Enabled on first install as the unit's [Install] says; never\n\
                 # started by the package. An upgrade restarts it if it runs.\n\
                 {configure}\n\
                 \tdeb-systemd-helper unmask '{unit}' >/dev/null || true\n\
                 \tif deb-systemd-helper --quiet was-enabled '{unit}'; then\n\
                 \t\tdeb-systemd-helper enable '{unit}' >/dev/null || true\n\
                 \telse\n\
                 \t\tdeb-systemd-helper update-state '{unit}' >/dev/null || true\n\
                 \tfi\n\
                 fi\n\
                 {configure}\n\
                 \tif [ -d /run/systemd/system ]; then\n\
                 \t\tsystemctl --system daemon-reload >/dev/null || true\n\
                 \t\tif [ -n \"$2\" ]; then\n\
                 \t\t\tdeb-systemd-invoke try-restart '{unit}' >/dev/null || true\n\
                 \t\tfi\n\
                 \tfi\n\
                 fi\n"
            ),
        ),
        (
            "prerm",
            format!(
                "#!/bin/sh\n\
                 set -e\n\
                 # Stopped when the package is removed (not on upgrade).\n\
                 if [ -z \"${{DPKG_ROOT:-}}\" ] && [ \"$1\" = remove ] && [ -d /run/systemd/system ] ; then\n\
                 \tdeb-systemd-invoke stop '{unit}' >/dev/null || true\n\
                 fi\n"
            ),
        ),
        (
            "postrm",
            format!(
                "#!/bin/sh\n\
                 set -e\n\
                 if [ \"$1\" = remove ] && [ -d /run/systemd/system ] ; then\n\
                 \tsystemctl --system daemon-reload >/dev/null || true\n\
                 fi\n\
                 if [ \"$1\" = \"remove\" ]; then\n\
                 \tif [ -x \"/usr/bin/deb-systemd-helper\" ]; then\n\
                 \t\tdeb-systemd-helper mask '{unit}' >/dev/null || true\n\
                 \tfi\n\
                 fi\n\
                 if [ \"$1\" = \"purge\" ]; then\n\
                 \tif [ -x \"/usr/bin/deb-systemd-helper\" ]; then\n\
                 \t\tdeb-systemd-helper purge '{unit}' >/dev/null || true\n\
                 \t\tdeb-systemd-helper unmask '{unit}' >/dev/null || true\n\
                 \tfi\n\
                 fi\n"
            ),
        ),
    ]
}

/// The crate (and its features) that builds each shipped binary.
fn crate_of(bin: &str) -> (&str, &[&str]) {
    match bin {
        "drover-pki" => ("drover-tls", &["pki"]),
        "drover-proxy" => ("drover-proxy", &[]),
        other => (other, &[]),
    }
}

/// Every crate compiled into `pkg`'s binaries, as `name version: licence`
/// (cargo's dependency tree; drover's own crates left out).
fn bundled_crates(pkg: &Package, repo: &Path) -> Result<Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut crates = BTreeSet::new();
    for item in pkg.items {
        let Source::Bin(bin) = item.source else {
            continue;
        };
        let (name, features) = crate_of(bin);
        let mut cmd = Command::new(&cargo);
        cmd.args(["tree", "--locked", "-e", "normal", "--prefix", "none"])
            .args(["-f", "{p}\t{l}", "-p", name])
            .current_dir(repo);
        if !features.is_empty() {
            cmd.arg("--features").arg(features.join(","));
        }
        let out = cmd.output().context("running cargo tree")?;
        if !out.status.success() {
            bail!(
                "cargo tree -p {name} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let line = line.trim_end_matches(" (*)");
            let Some((id, licence)) = line.split_once('\t') else {
                continue;
            };
            // `name vX.Y.Z` or, for a path crate, `name vX.Y.Z (/path)`.
            let mut words = id.split_whitespace();
            let (Some(krate), Some(version)) = (words.next(), words.next()) else {
                continue;
            };
            if krate.starts_with("drover") || krate == "droverctl" {
                continue;
            }
            let licence = if licence.is_empty() {
                "unknown"
            } else {
                licence
            };
            crates.insert(format!(
                "{krate} {}: {licence}",
                version.trim_start_matches('v')
            ));
        }
    }
    Ok(crates.into_iter().collect())
}

/// `/usr/share/doc/PKG/copyright` in Debian's machine-readable format.
fn copyright(pkg: &Package, repo: &Path, meta: &Meta) -> Result<String> {
    let mut text = format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: drover\n\
         Source: {}\n",
        meta.homepage
    );
    let crates = bundled_crates(pkg, repo)?;
    if !crates.is_empty() {
        text.push_str(
            "Comment: The binaries of this package are statically linked with these Rust\n \
             crates, each under the licence given (an SPDX expression):\n",
        );
        for line in crates {
            text.push_str(&format!(" {line}\n"));
        }
    }
    text.push_str(&format!(
        "\nFiles: *\n\
         Copyright: {} the drover developers\n\
         License: Apache-2.0\n\
         \x20On Debian systems, the full text of the Apache License, Version 2.0, can\n\
         \x20be found in /usr/share/common-licenses/Apache-2.0.\n",
        meta.year()
    ));
    Ok(text)
}

/// A native package's `changelog.gz`: one entry for this version.
fn changelog(version: &str, meta: &Meta) -> String {
    format!(
        "drover ({version}) unstable; urgency=medium\n\n  \
         * drover {version}. What changed for users: CHANGELOG.md of the source.\n\n \
         -- {}  {}\n",
        meta.maintainer, meta.date
    )
}

/// Builds one `.deb` of `pkg` into `out_dir` with `dpkg-deb`; `compress` is
/// dpkg-deb's `-Z` (`xz` for releases, `none` for the quick test).
pub fn build_deb(
    pkg: &Package,
    inputs: &Inputs,
    meta: &Meta,
    out_dir: &Path,
    compress: &str,
) -> Result<PathBuf> {
    let stage_dir = out_dir.join("stage").join(pkg.name);
    if stage_dir.exists() {
        std::fs::remove_dir_all(&stage_dir)?;
    }
    let layout = Layout::debian();
    let mut installed = stage(pkg, &stage_dir, &layout, inputs)?;
    let doc = format!("/usr/share/doc/{}", pkg.name);
    let copyright_path = format!("{doc}/copyright");
    write_mode(
        &stage_dir.join(copyright_path.trim_start_matches('/')),
        copyright(pkg, &inputs.repo, meta)?.as_bytes(),
        0o644,
    )?;
    installed.push((copyright_path, 0o644));
    let changelog_path = format!("{doc}/changelog.gz");
    write_mode(
        &stage_dir.join(changelog_path.trim_start_matches('/')),
        &crate::packages::gzip(changelog(&inputs.version, meta).as_bytes())?,
        0o644,
    )?;
    installed.push((changelog_path, 0o644));

    let mut depends: Vec<String> = Vec::new();
    for item in pkg.items {
        if let Source::Bin(name) = item.source {
            let bytes = std::fs::read(inputs.bin_dir.join(name))?;
            for d in library_depends(&bytes) {
                if !depends.contains(&d) {
                    depends.push(d);
                }
            }
        }
    }
    // The newest libc requirement wins when binaries differ.
    let mut libc: Vec<String> = depends
        .iter()
        .filter(|d| d.starts_with("libc6"))
        .cloned()
        .collect();
    libc.sort_by_key(|d| version_key(d));
    depends.retain(|d| !d.starts_with("libc6"));
    if let Some(newest) = libc.pop() {
        depends.insert(0, newest);
    }
    depends.extend(pkg.depends.iter().map(|d| d.to_string()));
    for sibling in pkg.siblings {
        depends.push(format!("{sibling} (= {})", inputs.version));
    }

    let size_kib: u64 = installed
        .iter()
        .map(|(p, _)| {
            std::fs::metadata(stage_dir.join(p.trim_start_matches('/')))
                .map(|m| m.len().div_ceil(1024))
                .unwrap_or(0)
        })
        .sum();
    let arch = if pkg.arch_all { "all" } else { deb_arch() };
    let debian = stage_dir.join("DEBIAN");
    std::fs::create_dir_all(&debian)?;
    let mut control = format!(
        "Package: {}\nSource: drover\nVersion: {}\nArchitecture: {arch}\n\
         Maintainer: {}\nInstalled-Size: {size_kib}\nSection: admin\nPriority: optional\n\
         Homepage: {}\n",
        pkg.name, inputs.version, meta.maintainer, meta.homepage
    );
    if !depends.is_empty() {
        control.push_str(&format!("Depends: {}\n", depends.join(", ")));
    }
    if !pkg.recommends.is_empty() {
        control.push_str(&format!("Recommends: {}\n", pkg.recommends.join(", ")));
    }
    if !pkg.replaces.is_empty() {
        let list = pkg.replaces.join(", ");
        control.push_str(&format!("Conflicts: {list}\nReplaces: {list}\n"));
    }
    let description: Vec<String> = pkg
        .description
        .lines()
        .map(|l| format!(" {}", l.trim()))
        .collect();
    control.push_str(&format!(
        "Description: {}\n{}\n",
        pkg.summary,
        description.join("\n")
    ));
    write_mode(&debian.join("control"), control.as_bytes(), 0o644)?;
    let conffiles: Vec<&str> = installed
        .iter()
        .map(|(p, _)| p.as_str())
        .filter(|p| p.starts_with("/etc/"))
        .collect();
    if !conffiles.is_empty() {
        write_mode(
            &debian.join("conffiles"),
            format!("{}\n", conffiles.join("\n")).as_bytes(),
            0o644,
        )?;
    }
    let summed: Vec<&str> = installed
        .iter()
        .map(|(p, _)| p.trim_start_matches('/'))
        .filter(|p| !p.starts_with("etc/"))
        .collect();
    write_mode(
        &debian.join("md5sums"),
        md5sums(&stage_dir, &summed)?.as_bytes(),
        0o644,
    )?;
    if let Some(unit) = pkg.unit {
        for (name, text) in maintainer_scripts(unit) {
            write_mode(&debian.join(name), text.as_bytes(), 0o755)?;
        }
    }

    let file = out_dir.join(format!("{}_{}_{arch}.deb", pkg.name, inputs.version));
    let out = Command::new("dpkg-deb")
        .arg("--root-owner-group")
        .arg(format!("-Z{compress}"))
        .arg("--build")
        .arg(&stage_dir)
        .arg(&file)
        .output()
        .context("running dpkg-deb (package dpkg)")?;
    if !out.status.success() {
        bail!(
            "dpkg-deb --build {} failed: {}",
            stage_dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&stage_dir)?;
    Ok(file)
}

/// `md5sum` of `files` (relative to `root`), in `DEBIAN/md5sums` form.
fn md5sums(root: &Path, files: &[&str]) -> Result<String> {
    let mut files: Vec<&str> = files.to_vec();
    files.sort_unstable();
    let out = Command::new("md5sum")
        .arg("--")
        .args(&files)
        .current_dir(root)
        .output()
        .context("running md5sum (package coreutils)")?;
    if !out.status.success() {
        bail!("md5sum failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn version_key(dep: &str) -> Vec<u32> {
    dep.split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn write_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_dependencies_come_from_the_binary() {
        let fake =
            b"\0libc.so.6\0GLIBC_2.2.5\0GLIBC_2.34\0GLIBC_2.17\0libgcc_s.so.1\0GLIBC_2.3.4\0";
        assert_eq!(library_depends(fake), ["libc6 (>= 2.34)", "libgcc-s1"]);
        assert!(library_depends(b"nothing").is_empty());
        // Packed relative relocations: 2.36, unless a symbol wants newer.
        let packed = b"\0libc.so.6\0GLIBC_2.2.5\0GLIBC_2.34\0GLIBC_ABI_DT_RELR\0";
        assert_eq!(library_depends(packed), ["libc6 (>= 2.36)"]);
        let newer = b"\0libc.so.6\0GLIBC_ABI_DT_RELR\0GLIBC_2.38\0";
        assert_eq!(library_depends(newer), ["libc6 (>= 2.38)"]);
    }

    #[test]
    fn the_changelog_is_a_debian_changelog_entry() {
        let meta = Meta {
            maintainer: "A B <a@b.example>".into(),
            homepage: "https://b.example/".into(),
            date: "Thu, 01 Jan 1970 00:00:00 +0000".into(),
        };
        let text = changelog("1.2.3", &meta);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "drover (1.2.3) unstable; urgency=medium");
        assert!(lines[2].starts_with("  * "), "{text}");
        assert_eq!(
            lines.last().copied(),
            Some(" -- A B <a@b.example>  Thu, 01 Jan 1970 00:00:00 +0000")
        );
    }
}
