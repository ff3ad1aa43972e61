//! The .deb packages hold what they should, where they should, with the right
//! modes and metadata, and what they install works.
//!
//! By default the packages are built here from the debug binaries of this
//! target directory, uncompressed, so that `make test` checks the real packing
//! code in seconds. `make deb-check` runs the same test on the release packages
//! of `make deb` (`DROVER_DEB_DIR=target/debian`). Each package is unpacked
//! with `dpkg-deb -x` into one scratch root, as `dpkg --root` would lay it out.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use xtask::packages::{self, Inputs, PACKAGES};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every file of each package (path → mode), as the package must hold it.
fn expected() -> BTreeMap<&'static str, BTreeMap<String, u32>> {
    let layout = packages::Layout::debian();
    PACKAGES
        .iter()
        .map(|p| {
            let mut files: BTreeMap<String, u32> =
                p.items.iter().map(|i| (layout.dest(i), i.mode)).collect();
            // What Debian asks of every package.
            for doc in ["copyright", "changelog.gz"] {
                files.insert(format!("/usr/share/doc/{}/{doc}", p.name), 0o644);
            }
            (p.name, files)
        })
        .collect()
}

/// Programs of the system that shipped units run, and the Debian package
/// that provides each.
const SYSTEM_PROGRAMS: &[(&str, &str)] = &[("/bin/kill", "procps")];

#[test]
fn packages_hold_their_files_with_their_modes_and_metadata() {
    let scratch =
        Scratch(std::env::temp_dir().join(format!("drover-deb-test-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    let debs_dir = match std::env::var_os("DROVER_DEB_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let out = scratch.0.join("debs");
            std::fs::create_dir_all(&out).unwrap();
            let inputs = Inputs::new(&repo(), &bin_dir(), env!("CARGO_PKG_VERSION")).unwrap();
            let meta = xtask::deb::Meta::from_env(&repo()).unwrap();
            for pkg in PACKAGES {
                xtask::deb::build_deb(pkg, &inputs, &meta, &out, "none").unwrap();
            }
            out
        }
    };
    let root = scratch.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let expected = expected();
    let mut all_files = 0;
    let mut installed_kib = 0;
    let mut dns_kib = 0;
    for pkg in PACKAGES {
        let arch = if pkg.arch_all {
            "all"
        } else {
            xtask::deb::deb_arch()
        };
        let deb = debs_dir.join(format!("{}_{version}_{arch}.deb", pkg.name));
        assert!(deb.is_file(), "{} missing", deb.display());

        // Metadata.
        let field = |name: &str| {
            run(Command::new("dpkg-deb").arg("-f").arg(&deb).arg(name))
                .trim()
                .to_string()
        };
        assert_eq!(field("Package"), pkg.name);
        assert_eq!(field("Version"), version);
        assert_eq!(field("Architecture"), arch);
        assert_eq!(field("Source"), "drover");
        assert!(
            field("Homepage").starts_with("https://"),
            "{}",
            field("Homepage")
        );
        let maintainer = field("Maintainer");
        assert!(
            maintainer.contains(" <") && maintainer.ends_with('>'),
            "{maintainer}"
        );
        assert_eq!(
            field("Recommends"),
            pkg.recommends.join(", "),
            "{}",
            pkg.name
        );
        let kib = field("Installed-Size").parse::<u64>().unwrap();
        // The budget is for drover itself; the DNS server is an add-on of its
        // own (optional, not in `make install`), sized apart (docs/packaging.md
        // "Size").
        if pkg.name == "drover-dns" {
            dns_kib = kib;
        } else {
            installed_kib += kib;
        }
        let depends = field("Depends");
        if pkg.unit.is_some() {
            for dep in ["systemd", "dbus", "drover-common (= "] {
                assert!(depends.contains(dep), "{}: Depends: {depends}", pkg.name);
            }
        }
        if pkg.name == "drover-agent" {
            // Its units' `ExecReload=/bin/kill -HUP $MAINPID`.
            assert!(
                depends.contains("procps"),
                "{}: Depends: {depends}",
                pkg.name
            );
        }
        for sibling in pkg.siblings {
            let dep = format!("{sibling} (= {version})");
            assert!(depends.contains(&dep), "{}: Depends: {depends}", pkg.name);
        }
        // BlueChi's package that ships the same D-Bus policy file or the same
        // templates: apt must swap it out, never overwrite its files.
        let bluechi = match pkg.name {
            "drover-manager" => "bluechi-controller",
            "drover-agent" | "drover-bluechi-compat" => "bluechi-agent",
            _ => "",
        };
        for key in ["Conflicts", "Replaces"] {
            assert_eq!(field(key), bluechi, "{}: {key}", pkg.name);
        }
        if !pkg.arch_all {
            assert!(
                depends.starts_with("libc6 (>= 2."),
                "{}: Depends: {depends}",
                pkg.name
            );
        }

        // Files: exactly the expected ones (directories aside), with their modes.
        let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
        let mut files = BTreeMap::new();
        for line in listing.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (perms, owner, path) = (fields[0], fields[1], fields[5]);
            assert_eq!(owner, "root/root", "{line}");
            if perms.starts_with('d') {
                continue;
            }
            assert!(
                perms.starts_with('-'),
                "{}: not a plain file: {line}",
                pkg.name
            );
            let mode = perms[1..]
                .chars()
                .fold(0u32, |m, c| (m << 1) | u32::from(c != '-'));
            files.insert(path.trim_start_matches('.').to_string(), mode);
        }
        assert_eq!(files, expected[pkg.name], "{}: files and modes", pkg.name);
        all_files += files.len();

        // /etc files are conffiles; units come with the preset, not a start.
        let control = scratch.0.join("control").join(pkg.name);
        std::fs::create_dir_all(control.parent().unwrap()).unwrap();
        run(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control));
        let etc: Vec<&String> = files.keys().filter(|p| p.starts_with("/etc/")).collect();
        let conffiles = std::fs::read_to_string(control.join("conffiles")).unwrap_or_default();
        let listed: Vec<&str> = conffiles.lines().collect();
        assert_eq!(listed, etc, "{}: conffiles", pkg.name);
        // md5sums: every file but the conffiles, each sum right.
        let sums = std::fs::read_to_string(control.join("md5sums")).unwrap();
        let summed: Vec<String> = sums
            .lines()
            .map(|l| format!("/{}", l.split_once("  ").unwrap().1))
            .collect();
        let not_etc: Vec<&String> = files.keys().filter(|p| !p.starts_with("/etc/")).collect();
        assert_eq!(
            summed.iter().collect::<Vec<_>>(),
            not_etc,
            "{}: md5sums",
            pkg.name
        );
        if let Some(unit) = pkg.unit {
            let postinst = std::fs::read_to_string(control.join("postinst")).unwrap();
            assert!(
                postinst.contains(&format!("deb-systemd-helper enable '{unit}'")),
                "{postinst}"
            );
            // An upgrade restarts a running daemon, and nothing else starts it.
            let code: Vec<&str> = postinst
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .collect();
            let starts: Vec<&&str> = code
                .iter()
                .filter(|l| l.contains("start") || l.contains("--now"))
                .collect();
            assert_eq!(
                starts,
                [
                    &format!("\t\t\tdeb-systemd-invoke try-restart '{unit}' >/dev/null || true")
                        .as_str()
                ],
                "postinst must start nothing, and restart only a running daemon on upgrade:\n{postinst}"
            );
            let prerm = std::fs::read_to_string(control.join("prerm")).unwrap();
            assert!(
                prerm.contains(&format!("deb-systemd-invoke stop '{unit}'")),
                "{prerm}"
            );
            for script in ["postinst", "prerm", "postrm"] {
                let text = std::fs::read_to_string(control.join(script)).unwrap();
                let raw: Vec<&str> = text
                    .lines()
                    .filter(|l| l.contains("systemctl") && !l.contains("daemon-reload"))
                    .collect();
                assert!(raw.is_empty(), "{script} calls systemctl directly: {raw:?}");
                run(Command::new("sh").arg("-n").arg(control.join(script)));
            }
            let mode = std::fs::metadata(control.join("postinst"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o755);
            let preset = format!("/usr/lib/systemd/system-preset/50-{}.preset", pkg.name);
            assert!(files.contains_key(&preset), "{}: no {preset}", pkg.name);
        }

        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
        run(Command::new("md5sum")
            .args(["--quiet", "-c"])
            .arg(control.join("md5sums"))
            .current_dir(&root));
        // A binary with packed relative relocations (the dist build's, see
        // docs/packaging.md "Size") starts only on glibc 2.36 or newer: the
        // package must require that, or apt would install it where it fails.
        let packed = files.keys().any(|path| {
            std::fs::read(root.join(path.trim_start_matches('/'))).is_ok_and(|bytes| {
                bytes.starts_with(b"\x7fELF") && xtask::deb::packs_relative_relocations(&bytes)
            })
        });
        if packed {
            let minor: u32 = depends
                .strip_prefix("libc6 (>= 2.")
                .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect())
                .and_then(|digits: String| digits.parse().ok())
                .unwrap_or(0);
            assert!(
                minor >= 36,
                "{}: packed relocations, Depends: {depends}",
                pkg.name
            );
        }
        let doc = root.join("usr/share/doc").join(pkg.name);
        let copyright = std::fs::read_to_string(doc.join("copyright")).unwrap();
        assert!(
            copyright.starts_with(
                "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
            ) && copyright.contains("License: Apache-2.0")
                && copyright.contains("/usr/share/common-licenses/Apache-2.0"),
            "{copyright}"
        );
        // Every package with a binary names the crates linked into it.
        if !pkg.arch_all {
            assert!(copyright.contains("\n tokio "), "{}: {copyright}", pkg.name);
        }
        let changes = run(Command::new("gzip")
            .arg("-dc")
            .arg(doc.join("changelog.gz")));
        assert!(
            changes.starts_with(&format!("drover ({version}) unstable; urgency=medium\n")),
            "{changes}"
        );
    }
    assert!(all_files >= 25, "{all_files} files in all");
    // The release packages (make deb-check) stay within the size budget.
    if std::env::var_os("DROVER_DEB_DIR").is_some() {
        // Issue 16: "the whole installed set <= 15 MB"; held to 15,000,000
        // bytes (14,648 KiB), which also satisfies the reading as MiB.
        assert!(
            installed_kib * 1024 <= 15_000_000,
            "the packages but drover-dns install {installed_kib} KiB, more than 15 MB (14,648 KiB)"
        );
        eprintln!(
            "installed size of the packages but drover-dns: {installed_kib} KiB; drover-dns: {dns_kib} KiB"
        );
    }

    // What is installed works: the units run binaries that are there and start.
    for unit in [
        "usr/lib/systemd/system/drover-manager.service",
        "usr/lib/systemd/system/drover-manager.socket",
        "usr/lib/systemd/system/drover-agent.service",
        "usr/lib/systemd/system/drover-proxy@.service",
        "usr/lib/systemd/user/drover-agent.service",
        "usr/lib/systemd/user/drover-proxy@.service",
        "usr/lib/systemd/system/drover-dns.service",
    ] {
        let text = std::fs::read_to_string(root.join(unit)).unwrap();
        for line in text
            .lines()
            .filter(|l| l.starts_with("ExecStart=") || l.starts_with("ExecReload="))
        {
            let program = line[line.find('=').unwrap() + 1..]
                .split_whitespace()
                .next()
                .unwrap();
            // A program of the system (the agents' `ExecReload=/bin/kill`) comes
            // from a package the unit's package depends on (checked with the
            // metadata above); drover's own are in the packages.
            if let Some((_, provider)) = SYSTEM_PROGRAMS.iter().find(|(p, _)| *p == program) {
                assert!(
                    std::path::Path::new(program).exists(),
                    "{unit} runs {program} (package {provider}), missing on this host"
                );
                continue;
            }
            let installed = root.join(program.trim_start_matches('/'));
            let out = run(Command::new(&installed).arg("--version"));
            assert!(out.contains(" version "), "{program} --version: {out}");
        }
    }
    for program in ["usr/bin/droverctl", "usr/bin/drover-pki"] {
        let out = run(Command::new(root.join(program)).arg("--version"));
        assert!(
            out.contains(&format!("version {version} (commit ")),
            "{program}: {out}"
        );
    }
    // Each user template is its system template without the sandbox: the
    // same [Unit] and the same commands.
    for (user, system) in [
        ("drover-dep@.service", "drover-dep@.service"),
        ("drover-proxy@.service", "drover-proxy@.service"),
        ("bluechi-dep@.service", "bluechi-dep@.service"),
        ("bluechi-proxy@.service", "bluechi-proxy@.service"),
    ] {
        let unit_lines = |dir: &str, name: &str| -> Vec<String> {
            let text = std::fs::read_to_string(root.join(dir).join(name)).unwrap();
            text.lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .filter(|l| {
                    [
                        "Description=",
                        "BindsTo=",
                        "After=",
                        "StopWhenUnneeded=",
                        "Type=",
                        "RemainAfterExit=",
                        "KillMode=",
                        "TimeoutStartSec=",
                        "ExecStop=/bin/true",
                        "SuccessExitStatus=",
                    ]
                    .iter()
                    .any(|k| l.starts_with(k))
                })
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            unit_lines("usr/lib/systemd/user", user),
            unit_lines("usr/lib/systemd/system", system),
            "{user}: the user template differs from the system one beyond its sandbox"
        );
    }
    // Man pages are gzipped roff.
    let page = run(Command::new("gzip")
        .arg("-dc")
        .arg(root.join("usr/share/man/man5/drover.conf.5.gz")));
    assert!(
        page.contains(".TH \"DROVER.CONF\" \"5\""),
        "{}",
        &page[..page.len().min(200)]
    );
    // The bash completion loads and completes droverctl's commands.
    let completion = root.join("usr/share/bash-completion/completions/droverctl");
    let script = format!(
        "source {}; COMP_WORDS=(droverctl sta); COMP_CWORD=1; COMP_LINE='droverctl sta'; COMP_POINT=13; _droverctl droverctl sta droverctl; echo \"${{COMPREPLY[@]}}\"",
        completion.display()
    );
    let words = run(Command::new("bash").arg("-c").arg(script));
    assert!(words.split_whitespace().any(|w| w == "start"), "{words}");
    assert!(words.split_whitespace().any(|w| w == "status"), "{words}");
}

#[test]
fn install_honours_prefix_and_keeps_an_edited_etc_file() {
    let scratch =
        Scratch(std::env::temp_dir().join(format!("drover-install-test-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    let inputs = Inputs::new(&repo(), &bin_dir(), env!("CARGO_PKG_VERSION")).unwrap();
    let layout = packages::Layout {
        prefix: "/opt/drover".into(),
        dbus_policy_dir: "/usr/share/dbus-1/system.d".into(),
        zsh_dir: "/opt/drover/share/zsh/site-functions".into(),
    };
    let edited = scratch.0.join("etc/drover/agent.conf");
    std::fs::create_dir_all(edited.parent().unwrap()).unwrap();
    std::fs::write(&edited, "[drover-agent]\nNodeName=mine\n").unwrap();
    for pkg in PACKAGES {
        packages::stage(pkg, &scratch.0, &layout, &inputs).unwrap();
    }
    let unit = std::fs::read_to_string(
        scratch
            .0
            .join("opt/drover/lib/systemd/system/drover-agent.service"),
    )
    .unwrap();
    assert!(
        unit.contains("ExecStart=/opt/drover/libexec/drover-agent"),
        "{unit}"
    );
    let proxy = std::fs::read_to_string(
        scratch
            .0
            .join("opt/drover/lib/systemd/system/drover-proxy@.service"),
    )
    .unwrap();
    assert!(
        proxy.contains("ExecStop=/opt/drover/libexec/drover-proxy remove %i"),
        "{proxy}"
    );
    assert!(scratch.0.join("opt/drover/libexec/drover-proxy").is_file());
    assert!(scratch.0.join("opt/drover/bin/droverctl").is_file());
    // The BlueChi names run the same helper, as "bluechi-proxy".
    let compat = std::fs::read_to_string(
        scratch
            .0
            .join("opt/drover/lib/systemd/user/bluechi-proxy@.service"),
    )
    .unwrap();
    assert!(
        compat.contains(
            "ExecStart=@/opt/drover/libexec/drover-proxy bluechi-proxy create --user %i.service"
        ),
        "{compat}"
    );
    assert!(
        scratch
            .0
            .join("usr/share/dbus-1/system.d/org.eclipse.bluechi.conf")
            .is_file()
    );
    assert_eq!(
        std::fs::read_to_string(&edited).unwrap(),
        "[drover-agent]\nNodeName=mine\n"
    );
    assert!(
        scratch.0.join("etc/drover/manager.conf").is_file(),
        "a missing /etc file is installed"
    );
}

/// The rpm spec's `%files` name, per subpackage, exactly the files of the
/// corresponding .deb (zsh's directory aside, which differs by distribution).
#[test]
fn the_rpm_spec_ships_the_same_files() {
    let spec = std::fs::read_to_string(repo().join("dist/rpm/drover.spec")).unwrap();
    let macros = [
        ("%{_libexecdir}", "/usr/libexec"),
        ("%{_unitdir}", "/usr/lib/systemd/system"),
        ("%{_userunitdir}", "/usr/lib/systemd/user"),
        ("%{_presetdir}", "/usr/lib/systemd/system-preset"),
        ("%{_mandir}", "/usr/share/man"),
        ("%{_datadir}", "/usr/share"),
        ("%{_sysconfdir}", "/etc"),
        ("%{_bindir}", "/usr/bin"),
    ];
    let mut spec_files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in spec.lines() {
        if let Some(sub) = line.strip_prefix("%files ") {
            let name = match sub.trim() {
                "ctl" => "droverctl".to_string(),
                other => format!("drover-{other}"),
            };
            current = Some(name.clone());
            spec_files.entry(name).or_default();
            continue;
        }
        if line.starts_with('%')
            && !line.starts_with("%{")
            && !line.starts_with("%config")
            && !line.starts_with("%dir")
        {
            current = None;
            continue;
        }
        let (Some(pkg), false) = (&current, line.trim().is_empty() || line.starts_with("%dir"))
        else {
            continue;
        };
        let mut path = line.trim_start_matches("%config(noreplace) ").to_string();
        for (m, v) in macros {
            path = path.replace(m, v);
        }
        if let Some(page) = path.strip_suffix('*') {
            path = format!("{page}.gz");
        }
        path = path.replace("/usr/share/zsh/site-functions", "{zsh}");
        spec_files.get_mut(pkg).unwrap().push(path);
    }
    let layout = packages::Layout {
        zsh_dir: "{zsh}".into(),
        ..packages::Layout::debian()
    };
    let deb_files: BTreeMap<String, Vec<String>> = PACKAGES
        .iter()
        .map(|p| {
            let mut files: Vec<String> = p.items.iter().map(|i| layout.dest(i)).collect();
            files.sort();
            (p.name.to_string(), files)
        })
        .collect();
    for files in spec_files.values_mut() {
        files.sort();
    }
    assert_eq!(spec_files, deb_files);
}
