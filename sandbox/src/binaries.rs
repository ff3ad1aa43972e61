//! Finding the drover binaries a sandbox runs.
//!
//! Search order: `$DROVER_BIN_DIR` (when set, it is the only place looked at, so a caller
//! can pin exactly which build runs), else the directory of the current executable and its
//! parent (cargo puts test binaries in `target/<profile>/deps` and the workspace binaries in
//! `target/<profile>`), else `$PATH`.

use anyhow::{Result, bail};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The directories searched for drover binaries, in order.
pub fn search_dirs() -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os("DROVER_BIN_DIR") {
        return vec![PathBuf::from(dir)];
    }
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        dirs.push(dir.to_path_buf());
        if let Some(parent) = dir.parent() {
            dirs.push(parent.to_path_buf());
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs
}

/// Finds the executable `name` in `dirs` (first match wins).
pub fn locate_in(name: &str, dirs: &[PathBuf]) -> Result<PathBuf> {
    for dir in dirs {
        let candidate = dir.join(name);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    bail!(
        "binary '{name}' not found (looked in: {}); run `cargo build --workspace` first, \
         or point DROVER_BIN_DIR at the directory holding it",
        if looked.is_empty() {
            "nothing".to_string()
        } else {
            looked.join(", ")
        }
    )
}

/// Finds `name` in [`search_dirs`].
pub fn locate(name: &str) -> Result<PathBuf> {
    locate_in(name, &search_dirs())
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Under `cargo run` (cargo sets `CARGO` and `CARGO_MANIFEST_DIR` for the
/// program it runs), builds the daemons and droverctl in the same profile as
/// this executable: `cargo run -p drover-sandbox -- demo` alone builds only the
/// sandbox, and the demo needs its companions next to it. Outside cargo this
/// does nothing.
pub fn build_companions_under_cargo() -> Result<()> {
    let (Some(cargo), Some(manifest_dir)) = (
        std::env::var_os("CARGO"),
        std::env::var_os("CARGO_MANIFEST_DIR"),
    ) else {
        return Ok(());
    };
    if std::env::var_os("DROVER_BIN_DIR").is_some() {
        return Ok(());
    }
    let workspace = Path::new(&manifest_dir).join("..").join("Cargo.toml");
    let release = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.ends_with("release")))
        .unwrap_or(false);
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "--workspace", "--bins", "--manifest-path"])
        .arg(&workspace);
    if release {
        cmd.arg("--release");
    }
    eprintln!("building drover-manager, drover-agent and droverctl...");
    let status = cmd.status()?;
    if !status.success() {
        bail!("building the drover binaries failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_names_it_and_says_how_to_build() {
        let dir = std::env::temp_dir().join(format!("drover-sandbox-bins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = locate_in("drover-manager", std::slice::from_ref(&dir))
            .unwrap_err()
            .to_string();
        assert!(err.contains("'drover-manager' not found"), "{err}");
        assert!(err.contains("cargo build --workspace"), "{err}");
        assert!(err.contains(&dir.display().to_string()), "{err}");

        // A non-executable file does not count; an executable one does.
        let file = dir.join("drover-manager");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        assert!(locate_in("drover-manager", std::slice::from_ref(&dir)).is_err());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            locate_in("drover-manager", std::slice::from_ref(&dir)).unwrap(),
            file
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
