//! Nodes on CPUs of their own (`proxy --pin-nodes`): in a fleet each node is a
//! machine, so a node's systemd starting a unit never waits for another node's
//! processes; in the sandbox every node shares the machine's CPUs. Pinning each
//! node's processes (its systemd and everything it runs, its bus daemon among
//! them, and its agent, every thread) to one CPU of its own makes the nodes
//! stop competing with each other, as separate one-CPU machines would. The
//! manager, its bus and the benchmark itself stay on any CPU.
//!
//! Processes a pinned one starts later (the proxy helper, the units) inherit
//! its CPU, so pinning once after the sandbox is up covers the whole run.

use anyhow::{Context, Result, bail};
use drover_sandbox::Cluster;
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// Pins node `i` of `cluster` to the `i`-th CPU this process may run on.
/// Returns (node, CPU) per node. An error when there are fewer such CPUs than
/// nodes, or a process cannot be pinned.
pub fn pin_nodes(cluster: &Cluster) -> Result<Vec<(String, usize)>> {
    let ours = sched_getaffinity(Pid::from_raw(0)).context("this process's CPUs")?;
    let pinned = assign(cluster.node_names(), &cpus_in(&ours))?;
    for (node, cpu) in &pinned {
        let systemd = cluster
            .state()
            .node(node)?
            .systemd_pid
            .with_context(|| format!("node {node} is not running"))?;
        let agent = cluster
            .agent_pid(node)
            .with_context(|| format!("node {node} has no agent"))?;
        let mut set = CpuSet::new();
        set.set(*cpu).context("CPU number")?;
        let mut pids = descendants(systemd);
        pids.push(agent);
        for pid in pids {
            pin_process(pid, &set).with_context(|| format!("pinning {node}'s process {pid}"))?;
        }
    }
    Ok(pinned)
}

/// The CPUs `set` holds, in order.
fn cpus_in(set: &CpuSet) -> Vec<usize> {
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

/// Node `i` on `cpus[i]`; an error when there are fewer CPUs than nodes.
fn assign(nodes: Vec<String>, cpus: &[usize]) -> Result<Vec<(String, usize)>> {
    if cpus.len() < nodes.len() {
        bail!(
            "--pin-nodes needs a CPU per node: {} nodes, {} CPUs",
            nodes.len(),
            cpus.len()
        );
    }
    Ok(nodes.into_iter().zip(cpus.iter().copied()).collect())
}

/// Every thread of `pid` on `set`. A thread that ends meanwhile is skipped.
fn pin_process(pid: u32, set: &CpuSet) -> Result<()> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))?;
    for task in tasks {
        let Some(tid) = task?
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        match sched_setaffinity(Pid::from_raw(tid), set) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `pid` and its descendants, by `/proc/PID/task/TID/children`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) {
            for task in tasks.flatten() {
                let children = std::fs::read_to_string(task.path().join("children"));
                all.extend(
                    children
                        .unwrap_or_default()
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
        i += 1;
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_holds_the_process_and_its_children_children() {
        // sh starts a sleep of its own and waits: a child and a grandchild.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("the sleep's pid");
        let grandchild: u32 = line.trim().parse().expect("a pid");
        let all = descendants(std::process::id());
        let _ = std::process::Command::new("kill")
            .arg(grandchild.to_string())
            .status();
        let _ = child.wait();
        assert_eq!(all[0], std::process::id());
        assert!(all.contains(&child.id()), "{all:?} lacks sh {}", child.id());
        assert!(
            all.contains(&grandchild),
            "{all:?} lacks sleep {grandchild}"
        );
    }

    #[test]
    fn pin_process_moves_every_thread() {
        // A process of our own with one thread, pinned to the first CPU we may use.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let ours = sched_getaffinity(Pid::from_raw(0)).expect("our CPUs");
        let cpu = *cpus_in(&ours).first().expect("a CPU");
        let mut set = CpuSet::new();
        set.set(cpu).expect("CPU number");
        let pinned = pin_process(child.id(), &set);
        let now = sched_getaffinity(Pid::from_raw(child.id() as i32));
        let _ = child.kill();
        let _ = child.wait();
        pinned.expect("pinning");
        assert_eq!(cpus_in(&now.expect("its CPUs")), vec![cpu]);
    }

    #[test]
    fn each_node_gets_a_cpu_of_its_own_or_none_is_pinned() {
        let nodes = || vec!["node1".to_string(), "node2".to_string()];
        assert_eq!(
            assign(nodes(), &[0, 3, 5]).unwrap(),
            vec![("node1".to_string(), 0), ("node2".to_string(), 3)]
        );
        let err = assign(nodes(), &[1]).unwrap_err().to_string();
        assert_eq!(err, "--pin-nodes needs a CPU per node: 2 nodes, 1 CPUs");
    }
}
