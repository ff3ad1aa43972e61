//! The per-user inotify instance limit.
//!
//! Each node (its systemd plus its session dbus-daemon) takes a few inotify instances, and
//! `fs.inotify.max_user_instances` (often 128) is per user: past it, systemd starts but
//! silently misbehaves. So before starting nodes the sandbox counts what the user already
//! uses, raises the limit if it must (and says so), or refuses with the command to run.

use anyhow::{Result, bail};
use std::os::unix::fs::MetadataExt;

const LIMIT_FILE: &str = "/proc/sys/fs/inotify/max_user_instances";
/// What one node costs: systemd takes 3 instances, its dbus-daemon 1.
pub const PER_NODE: u64 = 4;
/// For the private bus, the manager and the agents.
const FIXED: u64 = 4;
/// Extra headroom when raising, so parallel sandboxes do not raise it one by one.
const HEADROOM: u64 = 128;

/// Inotify instances held by processes of the current effective user.
fn in_use() -> u64 {
    let uid = nix::unistd::geteuid().as_raw();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut count = 0;
    for entry in procs.flatten() {
        let is_pid = entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit());
        if !is_pid || !entry.metadata().is_ok_and(|m| m.uid() == uid) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        count += fds
            .flatten()
            .filter(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|target| target.as_os_str() == "anon_inode:inotify")
            })
            .count() as u64;
    }
    count
}

/// What to do given the current use and limit: `None` if it fits, else the new limit.
pub fn required_limit(in_use: u64, limit: u64, nodes: u64) -> Option<u64> {
    let need = in_use + nodes * PER_NODE + FIXED;
    (need > limit).then_some(need + HEADROOM)
}

/// Makes sure `nodes` more nodes fit under the inotify limit.
pub fn ensure_capacity(nodes: usize) -> Result<()> {
    let limit: u64 = match std::fs::read_to_string(LIMIT_FILE) {
        Ok(text) => text.trim().parse().unwrap_or(0),
        // No such knob (unusual kernel): nothing to check.
        Err(_) => return Ok(()),
    };
    let used = in_use();
    let Some(new_limit) = required_limit(used, limit, nodes as u64) else {
        return Ok(());
    };
    match std::fs::write(LIMIT_FILE, new_limit.to_string()) {
        Ok(()) => {
            eprintln!(
                "drover-sandbox: raised fs.inotify.max_user_instances from {limit} to {new_limit} \
                 ({used} in use, {nodes} nodes need about {} more)",
                nodes as u64 * PER_NODE
            );
            Ok(())
        }
        Err(e) => bail!(
            "{nodes} nodes need about {} inotify instances but only {} of \
             fs.inotify.max_user_instances={limit} are free, and raising it failed ({e}); \
             run `sysctl -w fs.inotify.max_user_instances={new_limit}` as root or start fewer nodes",
            nodes as u64 * PER_NODE,
            limit.saturating_sub(used)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_instances_this_user_holds() {
        use nix::sys::inotify::{InitFlags, Inotify};
        let before = in_use();
        let instance = Inotify::init(InitFlags::IN_CLOEXEC).expect("inotify_init1");
        let during = in_use();
        drop(instance);
        // Other processes may come and go meanwhile; ours is counted for sure.
        assert!(during >= 1, "before {before}, during {during}");
    }

    #[test]
    fn raises_only_when_the_nodes_do_not_fit() {
        assert_eq!(required_limit(10, 128, 3), None);
        // 100 in use + 10 nodes * 4 + 4 = 144 > 128: raise to that plus headroom.
        assert_eq!(required_limit(100, 128, 10), Some(144 + HEADROOM));
    }
}
