//! Build script shared by the crates whose binaries print a version
//! (`build = "../build/git_commit.rs"` in their Cargo.toml): sets
//! `DROVER_GIT_COMMIT` to the commit the sources were built from, so that
//! `--version` can say exactly which build runs.
//!
//! The commit is `$DROVER_GIT_COMMIT` when set (a distribution building from a
//! tarball can pass it), else `git rev-parse --short=12 HEAD` in the source
//! tree, else `unknown` (no git, or not a git checkout). The script runs again
//! when HEAD moves (a commit, a checkout), not on every edit.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(std::env::var_os("CARGO_MANIFEST_DIR")?)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=DROVER_GIT_COMMIT");
    let commit = match std::env::var("DROVER_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => {
            // Rerun when HEAD or the branch it points at moves.
            if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
                let git_dir = PathBuf::from(git_dir);
                println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
                if let (Some(common), Some(reference)) = (
                    git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]),
                    git(&["symbolic-ref", "-q", "HEAD"]),
                ) {
                    // Only files that exist: cargo reruns a script on every
                    // build while one of its watched paths is missing. A branch
                    // whose ref is packed is watched through packed-refs.
                    let common = PathBuf::from(common);
                    let loose = common.join(&reference);
                    let watched = if loose.exists() {
                        loose
                    } else {
                        common.join("packed-refs")
                    };
                    if watched.exists() {
                        println!("cargo:rerun-if-changed={}", watched.display());
                    }
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
        }
    };
    println!("cargo:rustc-env=DROVER_GIT_COMMIT={commit}");
}
