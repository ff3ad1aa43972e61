//! Issue 14 item 1 on real systemd nodes with real agents: heartbeat settings
//! that both sides accept never make a node flap. The agent takes the interval
//! the manager announces (`agent/src/link/heartbeat.rs`); before, it kept its
//! own threshold, and a manager that sends no heartbeats (`HeartbeatInterval=0`,
//! BlueChi's default) or sends them more slowly than that threshold made every
//! node drop and register again every few seconds. Every pair the configs
//! accept is checked on the pure rule (`no_accepted_pair_of_settings_flaps`);
//! here the two the issue reproduced run for real.
//!
//! The sandbox's agents send every 500 ms and watch for 2 s of silence; its
//! manager sends heartbeats as shipped: none (protocol 5,
//! `protocol/src/liveness.rs`). The agents' own heartbeats keep their nodes
//! online and, through `TCP_USER_TIMEOUT`, probe the manager.

use drover_sandbox::ClusterOptions;
use drover_testkit::prelude::*;
use std::time::Duration;

/// Several agent thresholds (2 s): a flapping node registers again at least
/// twice in this time.
const WATCH: Duration = Duration::from_secs(7);

/// Starts two nodes with `manager` appended to the manager's config, waits
/// `WATCH`, and checks that each node registered exactly once and is online.
async fn stays_registered(manager: &str) {
    let c = TestCluster::with(ClusterOptions {
        manager_extra_config: manager.into(),
        ..ClusterOptions::with_nodes(2)
    })
    .await;
    tokio::time::sleep(WATCH).await;
    let log = std::fs::read_to_string(c.log_path("manager")).unwrap();
    let registered = log
        .lines()
        .filter(|l| l.contains(" registered over TLS from ") || l.contains(" registered from "))
        .count();
    let dropped: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" disconnected: "))
        .collect();
    assert_eq!(
        (registered, dropped.len()),
        (2, 0),
        "with {manager:?} every node registers once and stays: {dropped:#?}"
    );
    for node in ["node1", "node2"] {
        let agent = std::fs::read_to_string(c.log_path(node)).unwrap();
        assert!(
            !agent.contains("lost the link to the manager"),
            "the agent of {node} lost its link:\n{agent}"
        );
        c.wait_status(node, "online", Duration::from_secs(1)).await;
    }
    c.down().await;
}

/// A manager that sends no heartbeats (its threshold still watches the agents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_without_heartbeats_keeps_every_node() {
    stays_registered("[drover-manager]\nHeartbeatInterval=0\n").await;
}

/// A manager whose heartbeats are further apart (3 s) than the agents' own
/// threshold (2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_slower_than_the_agents_threshold_keeps_every_node() {
    stays_registered("[drover-manager]\nHeartbeatInterval=3000\nNodeHeartbeatThreshold=9000\n")
        .await;
}

/// A manager threshold (1 s) that the agents' interval (500 ms) fills only
/// twice, while the manager reads their heartbeats in batches (protocol 10,
/// `manager/src/nodes/frames.rs`; the sandbox's links are TLS, where it does
/// so too) and judges silence by what arrived: the agents speed up to a
/// third of it, and their nodes stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_send_three_times_per_threshold_while_the_manager_reads_in_batches() {
    stays_registered("[drover-manager]\nNodeHeartbeatThreshold=1000\n").await;
}

/// `ss` figures of the agent ends of the links to the manager on `port`:
/// per connection, milliseconds since it last received data (`lastrcv`)
/// and since it last received an acknowledgement (`lastack`).
fn agent_sockets(port: u16) -> Vec<(u64, u64)> {
    let out = std::process::Command::new("ss")
        .args([
            "-tni",
            "state",
            "established",
            "dport",
            "=",
            &format!(":{port}"),
        ])
        .output()
        .expect("ss runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
    };
    text.lines()
        .filter_map(|l| Some((field(l, "lastrcv:")?, field(l, "lastack:")?)))
        .collect()
}

/// The shipped default: the manager writes nothing to an idle node (its
/// heartbeats were half of its idle CPU at fleet size), while the node's
/// own heartbeats are acknowledged and keep it online. Before protocol 5
/// the manager sent one every interval, so no agent went 1.5 s without
/// data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_manager_writes_nothing_to_idle_nodes() {
    // No orphan-dependency sweep (a `ListUnits` one grace period after a
    // node registers) in the window.
    let c = TestCluster::with(ClusterOptions {
        manager_extra_config: "[drover-manager]\nProxyGracePeriod=60000\n".into(),
        ..ClusterOptions::with_nodes(2)
    })
    .await;
    // Once registration is over the links go quiet from the manager's side:
    // every agent goes 1.5 s (three of the manager's old intervals) without
    // hearing from it, while its own heartbeats are acknowledged. With
    // manager heartbeats no agent ever does.
    let port = c.manager_port();
    let quiet = || {
        let sockets = agent_sockets(port);
        sockets.len() == 2
            && sockets
                .iter()
                .all(|&(lastrcv, lastack)| lastrcv >= 1500 && lastack < 3000)
    };
    let waited = drover_testkit::wait::poll(
        Duration::from_secs(20),
        Duration::from_millis(100),
        "every agent 1.5 s without data from the manager, its heartbeats acknowledged",
        || std::future::ready(quiet()),
    )
    .await;
    waited.unwrap_or_else(|e| panic!("{e:#}; last seen: {:?}", agent_sockets(port)));
    for node in ["node1", "node2"] {
        c.wait_status(node, "online", Duration::from_secs(1)).await;
    }
    c.down().await;
}

/// `ss` figures of the manager's ends of the agents' links on `port`: per
/// agent address, the bytes waiting unread in the manager's socket.
fn manager_sockets(port: u16) -> Vec<(String, u64)> {
    let out = std::process::Command::new("ss")
        .args([
            "-Htn",
            "state",
            "established",
            "sport",
            "=",
            &format!(":{port}"),
        ])
        .output()
        .expect("ss runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            Some((cols.get(3)?.to_string(), cols.first()?.parse().ok()?))
        })
        .collect()
}

/// On TLS links the manager reads heartbeats in batches as on plaintext
/// ones: before a batch is read, `HEARTBEATS_PER_READ - 1` heartbeat records
/// (27 bytes each on TLS 1.3: `drover_tls::records::sealed_len` of the
/// 5-byte frame) wait unread in the manager's socket, as `ss` shows, for
/// longer than the manager's threshold (2 s in the sandbox, agents sending
/// every 500 ms) — and the nodes stay online: what waits unread counts as
/// heard when it arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_manager_leaves_a_batch_of_heartbeats_unread() {
    let c = TestCluster::with(ClusterOptions {
        manager_extra_config: "[drover-manager]\nProxyGracePeriod=60000\n".into(),
        ..ClusterOptions::with_nodes(2)
    })
    .await;
    use drover_protocol::liveness::{AGENT_HEARTBEAT_FRAME_LEN, HEARTBEATS_PER_READ};
    let record = drover_tls::records::sealed_len(AGENT_HEARTBEAT_FRAME_LEN) as u64;
    assert_eq!(record, 27);
    let batch = (HEARTBEATS_PER_READ as u64 - 1) * record;
    let port = c.manager_port();
    let mut seen = std::collections::BTreeSet::new();
    let waited = drover_testkit::wait::poll(
        Duration::from_secs(40),
        Duration::from_millis(50),
        "each agent's link with a batch but one of heartbeat records waiting in the manager's socket",
        || {
            for (peer, queued) in manager_sockets(port) {
                if queued == batch {
                    seen.insert(peer);
                }
            }
            std::future::ready(seen.len() == 2)
        },
    )
    .await;
    waited.unwrap_or_else(|e| panic!("{e:#}; seen: {seen:?}, now: {:?}", manager_sockets(port)));
    let log = std::fs::read_to_string(c.log_path("manager")).unwrap();
    let dropped: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" disconnected: "))
        .collect();
    assert!(dropped.is_empty(), "no node was dropped: {dropped:#?}");
    for node in ["node1", "node2"] {
        c.wait_status(node, "online", Duration::from_secs(1)).await;
    }
    c.down().await;
}

/// The TCP segments that reach `port` on this machine (the sandbox's links
/// are on loopback) for `window`: per source port, the kernel's receive
/// time (realtime µs) of every segment whose payload is `payload` bytes.
/// Read off a packet socket (`AF_PACKET`, IPv4 only, incoming copies only,
/// every interface), so the kernel stamps each segment as it passes,
/// whatever the reader's own delays.
fn segments_to(
    port: u16,
    payload: usize,
    window: Duration,
) -> std::collections::BTreeMap<u16, Vec<u64>> {
    use nix::sys::socket::{
        AddressFamily, ControlMessageOwned, LinkAddr, MsgFlags, SockFlag, SockProtocol, SockType,
        recvmsg, setsockopt, socket, sockopt,
    };
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Packet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::EthIp,
    )
    .expect("a packet socket (root)");
    setsockopt(&fd, sockopt::ReceiveTimestampns, &true).unwrap();
    // Every IPv4 packet of the machine queues here until this thread reads
    // it: room for the other tests' bursts.
    setsockopt(&fd, sockopt::RcvBufForce, &(4 << 20)).unwrap();
    setsockopt(
        &fd,
        sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(0, 100_000),
    )
    .unwrap();
    let mut seen: std::collections::BTreeMap<u16, Vec<u64>> = Default::default();
    let end = std::time::Instant::now() + window;
    let mut packet = [0u8; 2048];
    let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
    while std::time::Instant::now() < end {
        let mut iov = [std::io::IoSliceMut::new(&mut packet)];
        let Ok(msg) =
            recvmsg::<LinkAddr>(fd.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::empty())
        else {
            continue; // the receive timeout: look at the clock again
        };
        let stamp = msg.cmsgs().ok().and_then(|mut c| {
            c.find_map(|m| match m {
                ControlMessageOwned::ScmTimestampns(ts) => {
                    Some(ts.tv_sec() as u64 * 1_000_000 + ts.tv_nsec() as u64 / 1_000)
                }
                _ => None,
            })
        });
        let (len, stamp) = (msg.bytes, stamp.expect("the kernel stamps every packet"));
        let ip = &packet[..len.min(packet.len())];
        // IPv4, TCP: header lengths from the headers, payload what is left.
        let Some(ihl) = ip.first().map(|b| usize::from(b & 0x0f) * 4) else {
            continue;
        };
        if ip.len() < ihl + 20 || ip[9] != 6 {
            continue;
        }
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]])).min(ip.len());
        let tcp = &ip[ihl..];
        let (src, dst) = (
            u16::from_be_bytes([tcp[0], tcp[1]]),
            u16::from_be_bytes([tcp[2], tcp[3]]),
        );
        let doff = usize::from(tcp[12] >> 4) * 4;
        if dst == port && total.saturating_sub(ihl + doff) == payload {
            seen.entry(src).or_default().push(stamp);
        }
    }
    seen
}

/// Heartbeats keep to slots of the realtime clock (`protocol/src/liveness.rs`,
/// "Heartbeats keep to slots"), as the kernel sees them leave real agents:
/// every agent's heartbeat records (27 bytes on the sandbox's TLS links)
/// reach the manager at the start of a 100 ms slot of the realtime clock,
/// late only by the agent's wake-up, at the agents' interval (500 ms in the
/// sandbox). The four agents are started a quarter of a slot apart, so
/// heartbeats counted from when each session began would sit at four
/// points of the slot about a quarter apart, at most one of them near its
/// start (checked: with such a timer the test fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_send_their_heartbeats_at_the_start_of_a_slot() {
    use drover_protocol::liveness::{AGENT_HEARTBEAT_FRAME_LEN, HEARTBEAT_SLOT};
    let slot_us = HEARTBEAT_SLOT.as_micros() as u64;
    let nodes: Vec<String> = (1..=4).map(|n| format!("node{n}")).collect();
    let mut c = TestCluster::with(ClusterOptions {
        manager_extra_config: "[drover-manager]\nProxyGracePeriod=60000\n".into(),
        ..ClusterOptions::with_nodes(nodes.len())
    })
    .await;
    for node in &nodes {
        c.stop_agent(node).await.unwrap();
    }
    for (k, node) in nodes.iter().enumerate() {
        // The next instant a k-th quarter into a slot of the realtime clock.
        let at_us = k as u64 * slot_us / nodes.len() as u64;
        let now_us = drover_bus::timestamp::realtime_us();
        let wait_us = (at_us + slot_us - now_us % slot_us) % slot_us;
        tokio::time::sleep(Duration::from_micros(wait_us)).await;
        c.start_agent(node).await.unwrap();
    }
    for node in &nodes {
        c.wait_status(node, "online", Duration::from_secs(10)).await;
    }
    let port = c.manager_port();
    let record = drover_tls::records::sealed_len(AGENT_HEARTBEAT_FRAME_LEN);
    let seen =
        tokio::task::spawn_blocking(move || segments_to(port, record, Duration::from_secs(4)))
            .await
            .unwrap();
    c.down().await;

    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    assert_eq!(seen.len(), nodes.len(), "one link per agent: {seen:?}");
    for (agent_port, stamps) in &seen {
        assert!(
            stamps.len() >= 6,
            "the agent on port {agent_port} sent a heartbeat every 500 ms: {stamps:?}"
        );
        let gaps: Vec<u64> = stamps.windows(2).map(|w| w[1] - w[0]).collect();
        let gap = median(gaps.clone());
        assert!(
            (450_000..=550_000).contains(&gap),
            "port {agent_port}: heartbeats {gap} µs apart (median of {gaps:?})"
        );
        let into_slot: Vec<u64> = stamps.iter().map(|t| t % slot_us).collect();
        let late = median(into_slot.clone());
        assert!(
            late < 20_000,
            "port {agent_port}: heartbeats {late} µs into their slot (median of {into_slot:?})"
        );
    }
}
