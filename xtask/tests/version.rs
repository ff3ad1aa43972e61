//! `--version` names the version and the git commit of the build, in every
//! shipped binary; outside git the commit is `unknown`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().join(name)
}

fn head_commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(repo())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn every_binary_prints_its_version_and_commit() {
    let version = env!("CARGO_PKG_VERSION");
    let head = head_commit();
    for name in [
        "drover-manager",
        "drover-agent",
        "drover-proxy",
        "droverctl",
        "drover-pki",
    ] {
        let out = Command::new(bin(name))
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(out.status.success(), "{name} --version: {}", out.status);
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let prefix = format!("{name} version {version} (commit ");
        let commit = line
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{name}: '{line}' is not '{prefix}C)'"));
        match &head {
            // Built from this checkout (make test builds right before testing).
            Some(head) => assert_eq!(commit, head, "{name} was built from another commit"),
            None => assert_eq!(commit, "unknown"),
        }
    }
}

#[test]
fn outside_git_the_commit_is_unknown() {
    // Run the shared build script as cargo would, in a directory that is no
    // git checkout, and read what it tells cargo.
    let dir = std::env::temp_dir().join(format!("drover-version-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("git_commit");
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .args(["--edition", "2024", "-O", "-o"])
        .arg(&script)
        .arg(repo().join("build/git_commit.rs"))
        .output()
        .expect("rustc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(&script);
        cmd.env("CARGO_MANIFEST_DIR", &dir)
            .env("GIT_CEILING_DIRECTORIES", dir.parent().unwrap())
            .env_remove("DROVER_GIT_COMMIT");
        for (k, v) in env {
            cmd.env(k, v);
        }
        String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned()
    };
    assert!(
        run(&[]).contains("cargo:rustc-env=DROVER_GIT_COMMIT=unknown\n"),
        "{}",
        run(&[])
    );
    // A distribution building from a tarball can name the commit.
    let given = run(&[("DROVER_GIT_COMMIT", "0123abcd")]);
    assert!(
        given.contains("cargo:rustc-env=DROVER_GIT_COMMIT=0123abcd\n"),
        "{given}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
