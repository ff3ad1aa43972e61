//! The whole sandbox with the real drover-manager and drover-agent (built by
//! `cargo build --workspace`): nodes come online, processes can be stopped, restarted and
//! signalled, the manager keeps its port across restarts, and nothing is left behind.

use drover_sandbox::cgroups::{Layout, SandboxCgroups};
use drover_sandbox::state::{State, mounts_below};
use drover_sandbox::{Cluster, ClusterOptions};
use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::time::Duration;

const DETECT: Duration = Duration::from_secs(10);

fn alive(pid: u32) -> bool {
    drover_sandbox::process::alive(pid)
}

fn leftovers(state: &State) -> Vec<String> {
    let mut left = Vec::new();
    let pids = state.cgroups().pids();
    if !pids.is_empty() {
        left.push(format!("processes {pids:?}"));
    }
    let mut pids: Vec<u32> = state.agent_pids.values().copied().collect();
    pids.extend(&state.extra_agent_pids);
    pids.extend(state.manager_pid);
    pids.extend(state.bus_pid);
    pids.extend(state.nodes.iter().filter_map(|n| n.systemd_pid));
    for pid in pids.into_iter().filter(|p| alive(*p)) {
        left.push(format!("pid {pid}"));
    }
    for p in state.cgroup_parents.iter().filter(|p| p.exists()) {
        left.push(format!("cgroup {}", p.display()));
    }
    if state.dir.exists() {
        left.push(format!("directory {}", state.dir.display()));
    }
    let mounts = mounts_below(&state.dir).unwrap();
    if !mounts.is_empty() {
        left.push(format!("mounts {mounts:?}"));
    }
    left
}

/// `node`, whose agent is not running, is offline; a new agent brings it online.
async fn comes_back(cluster: &mut Cluster, node: &str) {
    cluster
        .wait_node_status(node, "offline", DETECT)
        .await
        .unwrap();
    cluster.start_agent(node).await.unwrap();
    cluster
        .wait_node_status(node, "online", DETECT)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_come_online_and_survive_agent_and_manager_restarts() {
    let mut cluster = Cluster::start(ClusterOptions::with_nodes(2)).await.unwrap();
    assert_eq!(cluster.node_names(), ["node1", "node2"]);
    let port = cluster.manager_port();
    let manager_pid = cluster.state().manager_pid.unwrap();

    // Every daemon logs to its own file; the manager logs at debug level.
    let log = std::fs::read_to_string(cluster.log_path("manager")).unwrap();
    assert!(!log.is_empty());
    assert!(cluster.log_path("node1").exists());

    // A killed agent makes its node go offline; a new one brings it back.
    let first = cluster.agent_pid("node1").unwrap();
    cluster.signal_agent("node1", Signal::SIGKILL).unwrap();
    cluster
        .wait_node_status("node1", "offline", DETECT)
        .await
        .unwrap();
    cluster.start_agent("node1").await.unwrap();
    let second = cluster.agent_pid("node1").unwrap();
    assert_ne!(first, second);
    cluster
        .wait_node_status("node1", "online", DETECT)
        .await
        .unwrap();

    // A running agent is not started twice.
    let err = cluster.start_agent("node1").await.unwrap_err().to_string();
    assert!(err.contains("still running"), "{err}");

    // stop_agent reaps the agent.
    cluster.stop_agent("node2").await.unwrap();
    assert!(!alive(
        cluster
            .state()
            .agent_pids
            .get("node2")
            .copied()
            .unwrap_or(0)
    ));
    assert_eq!(cluster.agent_pid("node2"), None);
    comes_back(&mut cluster, "node2").await;

    // The manager restarts on the same port (socket activation); agents reconnect.
    cluster.stop_manager().await.unwrap();
    assert!(!alive(manager_pid));
    let err = cluster
        .wait_node_status("node1", "online", Duration::from_millis(300))
        .await;
    assert!(err.is_err(), "no manager, no status");
    cluster.start_manager().await.unwrap();
    assert_eq!(cluster.manager_port(), port);
    let log = std::fs::read_to_string(cluster.log_path("manager")).unwrap();
    assert!(
        log.contains(&format!("127.0.0.1:{port}")),
        "manager used the passed listener:\n{log}"
    );
    for n in ["node1", "node2"] {
        cluster.wait_node_status(n, "online", DETECT).await.unwrap();
    }

    let state = cluster.state().clone();
    cluster.down().await.unwrap();
    assert_eq!(leftovers(&state), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_agents_and_custom_options_are_torn_down_too() {
    let opts = ClusterOptions {
        heartbeat_interval_ms: 200,
        heartbeat_threshold_ms: 1000,
        allowed_nodes: Some(vec!["node1".into(), "node2".into(), "spare".into()]),
        manager_extra_config: "[node spare]\nAllowDependenciesOn=node1\n".into(),
        ..ClusterOptions::with_nodes(2)
    };
    let mut cluster = Cluster::start(opts).await.unwrap();
    let conf = std::fs::read_to_string(cluster.dir().join("manager.conf")).unwrap();
    assert!(
        conf.contains("AllowedNodeNames=node1,node2,spare"),
        "{conf}"
    );
    assert!(conf.contains("NodeHeartbeatThreshold=1000"), "{conf}");
    let agent = std::fs::read_to_string(cluster.dir().join("node1").join("agent.conf"));
    assert!(agent.is_ok_and(|a| a.contains("HeartbeatInterval=200")));
    assert!(
        conf.ends_with("[node spare]\nAllowDependenciesOn=node1\n"),
        "{conf}"
    );

    // A bus has one agent: the sandbox refuses a second one beside node2's own.
    let err = cluster
        .start_agent_named("node2", "spare")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("stop it before"), "{err}");
    // An extra agent on node2's bus, its own agent stopped, registers as the
    // allowed name "spare".
    cluster.stop_agent("node2").await.unwrap();
    let pid = cluster.start_agent_named("node2", "spare").await.unwrap();
    assert!(alive(pid));
    cluster
        .wait_node_status("spare", "online", DETECT)
        .await
        .unwrap();
    cluster
        .wait_node_status("node1", "online", DETECT)
        .await
        .unwrap();

    let state = cluster.state().clone();
    assert!(state.extra_agent_pids.contains(&pid));
    cluster.down().await.unwrap();
    assert!(!alive(pid));
    assert_eq!(leftovers(&state), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_agents_has_a_manager_and_offline_nodes() {
    let opts = ClusterOptions {
        start_agents: false,
        ..ClusterOptions::with_nodes(2)
    };
    let mut cluster = Cluster::start(opts).await.unwrap();
    assert_eq!(cluster.agent_pid("node1"), None);
    comes_back(&mut cluster, "node2").await;
    let state = cluster.state().clone();
    drop(cluster); // Drop without down() cleans up as well
    assert_eq!(leftovers(&state), Vec::<String>::new());
}

/// What a start that failed left behind: `err` is its error, which names the directory
/// its logs were kept in (`…/drover-sandbox-failed-ID`), so the sandbox's cgroups are
/// known; `dir` is the sandbox directory it was given. Removes the kept logs.
fn leftovers_of_failed_start(err: &str, dir: &Path) -> Vec<String> {
    let kept = err
        .split_whitespace()
        .find(|w| w.contains("drover-sandbox-failed-"))
        .unwrap_or_else(|| panic!("the error says where the logs are: {err}"));
    let kept = PathBuf::from(kept);
    let id = kept
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("drover-sandbox-failed-"))
        .unwrap()
        .to_string();
    let mut left = Vec::new();
    let cgroups = SandboxCgroups::for_id(&Layout::detect().unwrap(), &id);
    let pids = cgroups.pids();
    if !pids.is_empty() {
        left.push(format!("processes {pids:?}"));
    }
    for p in cgroups.parents.iter().filter(|p| p.exists()) {
        left.push(format!("cgroup {}", p.display()));
    }
    if dir.exists() {
        left.push(format!("directory {}", dir.display()));
    }
    // Anything still running with the sandbox directory on its command line (the bus
    // daemon's config, the daemons' config files) escaped the cgroups.
    let needle = dir.display().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            left.push(format!("process {:?}: {cmdline}", entry.file_name()));
        }
    }
    let mounts = mounts_below(dir).unwrap();
    if !mounts.is_empty() {
        left.push(format!("mounts {mounts:?}"));
    }
    std::fs::remove_dir_all(&kept).unwrap();
    left
}

fn fresh_dir(tag: &str) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    PathBuf::from(format!(
        "/tmp/drover-sb-{tag}-{}-{stamp:x}",
        std::process::id()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_failing_at_the_manager_leaves_nothing_running() {
    // Nodes and bus are up when the manager refuses its config.
    let dir = fresh_dir("badconf");
    let opts = ClusterOptions {
        dir: Some(dir.clone()),
        manager_extra_config: "[drover-manager]\nHeartbeatInterval=often\n".into(),
        ..ClusterOptions::with_nodes(2)
    };
    let err = format!("{:#}", Cluster::start(opts).await.err().expect("refused"));
    assert!(
        err.contains("drover-manager exited during startup"),
        "{err}"
    );
    assert!(
        err.contains("HeartbeatInterval"),
        "the manager's reason is quoted: {err}"
    );
    assert_eq!(leftovers_of_failed_start(&err, &dir), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_failing_at_the_agents_leaves_nothing_running() {
    // The real manager and proxy helper, and an agent that dies at once: the start fails
    // with nodes, bus and manager running.
    let real = drover_sandbox::binaries::locate("drover-manager").unwrap();
    let real_dir = real.parent().unwrap();
    let bins = fresh_dir("bins");
    std::fs::create_dir_all(&bins).unwrap();
    for name in ["drover-manager", "drover-proxy"] {
        std::os::unix::fs::symlink(real_dir.join(name), bins.join(name)).unwrap();
    }
    let agent = bins.join("drover-agent");
    std::fs::write(&agent, "#!/bin/sh\necho 'agent says: no' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let dir = fresh_dir("badagent");
    let opts = ClusterOptions {
        dir: Some(dir.clone()),
        bin_dir: Some(bins.clone()),
        ..ClusterOptions::with_nodes(2)
    };
    let err = format!("{:#}", Cluster::start(opts).await.err().expect("refused"));
    std::fs::remove_dir_all(&bins).unwrap();
    assert!(err.contains("exited during startup"), "{err}");
    assert!(err.contains("agent says: no"), "{err}");
    assert_eq!(leftovers_of_failed_start(&err, &dir), Vec::<String>::new());
}

/// Issue 14 item 8: an agent killed a moment ago is still exiting (SIGKILL
/// pending, or its files closed but no zombie yet); `start_agent` waits for
/// it instead of calling it "still running". The window used to be hit by a
/// test that waited for the node to go offline (the link closes before the
/// process is reapable); here it is hit on purpose, every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_a_moment_ago_is_replaced_at_once() {
    let mut cluster = Cluster::start(ClusterOptions::with_nodes(1)).await.unwrap();
    for round in 0..10 {
        let old = cluster.agent_pid("node1").unwrap();
        cluster.signal_agent("node1", Signal::SIGKILL).unwrap();
        cluster
            .start_agent("node1")
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e:#}"));
        assert!(!alive(old), "round {round}: the old agent is gone");
        assert_ne!(cluster.agent_pid("node1"), Some(old));
    }
    cluster
        .wait_node_status("node1", "online", DETECT)
        .await
        .unwrap();
    // A live agent is still refused.
    let err = cluster.start_agent("node1").await.unwrap_err().to_string();
    assert!(err.contains("still running"), "{err}");
    let state = cluster.state().clone();
    cluster.down().await.unwrap();
    assert_eq!(leftovers(&state), Vec::<String>::new());
}
