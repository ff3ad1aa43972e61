//! The zbus systemd client and the whole agent against a real
//! `systemd --user`, started per test in its own mount + cgroup namespace
//! (docs: /work/shared/TESTING.md). Needs root and the hybrid cgroup layout
//! of the CI machines; the full multi-node sandbox is `drover-sandbox`.

use drover_agent::dispatch::{Dispatcher, Shared, pump_events};
use drover_agent::link::LinkConfig;
use drover_agent::outbox::SessionKill;
use drover_agent::systemd::dbus::ZbusSystemd;
use drover_agent::systemd::{JobInfo, Systemd};
use drover_bus::Bus;
use drover_protocol::JobKind;
use drover_protocol::handshake::Accepted;
use drover_protocol::link::manager_read_hello;
use drover_protocol::{Event, NodeName, Request, Response, ToAgent, ToManager, UnitName};
use futures::{SinkExt, StreamExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const T: Duration = Duration::from_secs(20);

/// One `systemd --user` in its own namespaces; torn down on drop (every pid
/// in its cgroups killed, the cgroups removed, the directory deleted).
struct UserSystemd {
    dir: PathBuf,
    cgroups: Vec<PathBuf>,
    child: Option<Child>,
}

/// Mounted inside the new namespaces; `$1` is the node directory.
const INNER: &str = r#"
set -e
D="$1"
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/system
mount -t tmpfs tmpfs /sys/fs/cgroup
for c in $V1; do mkdir "/sys/fs/cgroup/$c"; mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c"; done
mkdir /sys/fs/cgroup/systemd; mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
mkdir /sys/fs/cgroup/unified; mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
export XDG_RUNTIME_DIR="$D/rt" XDG_CONFIG_HOME="$D/config" HOME="$D"
exec /lib/systemd/systemd --user
"#;

/// Joins the cgroups given as arguments, then enters the namespaces.
const OUTER: &str = r#"
for p in "$@"; do echo $$ > "$p/cgroup.procs"; done
exec unshare -m -C --propagation private sh -c "$INNER" inner "$NODE_DIR"
"#;

impl UserSystemd {
    fn start(tag: &str) -> Self {
        assert!(
            !Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
            "this test helper supports the hybrid cgroup layout only (v1 + name=systemd + unified); \
             on a pure cgroup v2 host use drover-sandbox"
        );
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let name = format!("drover-agent-test-{tag}-{}-{stamp}", std::process::id());
        let mut node = UserSystemd {
            dir: std::env::temp_dir().join(&name),
            cgroups: Vec::new(),
            child: None,
        };
        std::fs::create_dir_all(node.dir.join("rt")).unwrap();
        std::fs::create_dir_all(node.dir.join("config/systemd/user")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(node.dir.join("rt"), std::fs::Permissions::from_mode(0o700))
            .unwrap();

        // Our own cgroup in each hierarchy systemd uses, below the one this
        // test runs in (so limits that apply to us apply to the node too).
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let mut v1 = Vec::new();
        for line in own.lines() {
            let mut f = line.splitn(3, ':');
            let (Some(_), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let mount = match ctrls {
                "" => "unified".to_string(),
                "name=systemd" => "systemd".to_string(),
                c if c.split(',').any(|x| matches!(x, "pids" | "memory" | "cpu")) => {
                    v1.push(c.to_string());
                    c.to_string()
                }
                _ => continue,
            };
            let dir = Path::new("/sys/fs/cgroup")
                .join(mount)
                .join(path.trim_start_matches('/'))
                .join(&name);
            std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            node.cgroups.push(dir);
        }
        let child = Command::new("sh")
            .arg("-c")
            .arg(OUTER)
            .arg("outer")
            .args(&node.cgroups)
            .env("INNER", INNER)
            .env("V1", v1.join(" "))
            .env("NODE_DIR", &node.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(node.dir.join("systemd.log")).unwrap())
            .spawn()
            .unwrap();
        node.child = Some(child);
        node
    }

    fn address(&self) -> String {
        format!("unix:path={}", self.dir.join("rt/bus").display())
    }

    fn write_unit(&self, name: &str, text: &str) {
        std::fs::write(self.dir.join("config/systemd/user").join(name), text).unwrap();
    }

    /// Connects once systemd answers on its bus.
    async fn connect(&self) -> ZbusSystemd {
        let deadline = Instant::now() + T;
        let target = Bus::Address(self.address());
        loop {
            if self.dir.join("rt/bus").exists()
                && let Ok(s) = ZbusSystemd::connect(&target).await
            {
                return s;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("systemd.log")).unwrap_or_default();
                panic!("systemd --user did not come up in {T:?}; its log:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn pids(&self) -> Vec<i32> {
        fn walk(dir: &Path, out: &mut Vec<i32>) {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        walk(&e.path(), out);
                    }
                }
            }
        }
        let mut out = Vec::new();
        for cg in &self.cgroups {
            walk(cg, &mut out);
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

impl Drop for UserSystemd {
    fn drop(&mut self) {
        // systemd --user ignores SIGTERM, and its services outlive it: kill
        // every process in its cgroups until none is left.
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                // SAFETY: plain kill(2) on a pid read from our own cgroups.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for cg in &self.cgroups {
            let mut dirs = Vec::new();
            fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
                out.push(dir.to_path_buf());
                if let Ok(entries) = std::fs::read_dir(dir) {
                    for e in entries.flatten() {
                        if e.file_type().is_ok_and(|t| t.is_dir()) {
                            collect(&e.path(), out);
                        }
                    }
                }
            }
            collect(cg, &mut dirs);
            for d in dirs.iter().rev() {
                if let Err(e) = std::fs::remove_dir(d) {
                    eprintln!("teardown: rmdir {}: {e}", d.display());
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unit(s: &str) -> UnitName {
    UnitName::new(s).unwrap()
}

fn start(u: &str, job_id: u32) -> Request {
    Request::UnitJob {
        kind: JobKind::Start,
        unit: unit(u),
        mode: "replace".into(),
        job_id,
    }
}

/// A dispatcher on the real systemd with an outbox the test reads.
async fn dispatcher(
    node: &UserSystemd,
) -> (Arc<Dispatcher<ZbusSystemd>>, mpsc::Receiver<ToManager>) {
    let systemd = Arc::new(node.connect().await);
    let shared = Arc::new(Shared::default());
    let events = systemd.subscribe().await.unwrap();
    tokio::spawn(pump_events(events, shared.clone(), systemd.clone()));
    let (tx, rx) = mpsc::channel(256);
    shared.outbox.open(1, tx, SessionKill::new());
    (Arc::new(Dispatcher::new(systemd, shared)), rx)
}

async fn next(rx: &mut mpsc::Receiver<ToManager>) -> ToManager {
    tokio::time::timeout(T, rx.recv())
        .await
        .expect("message in time")
        .expect("open")
}

/// Messages until the `JobDone` of `job_id`; returns (everything, result).
async fn until_done(rx: &mut mpsc::Receiver<ToManager>, job_id: u32) -> (Vec<ToManager>, String) {
    let mut seen = Vec::new();
    loop {
        let msg = next(rx).await;
        if let ToManager::Event(Event::JobDone { job_id: j, result }) = &msg
            && *j == job_id
        {
            let result = result.clone();
            seen.push(msg);
            return (seen, result);
        }
        seen.push(msg);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oneshot_is_done_failing_unit_is_failed_missing_unit_is_no_such_unit() {
    let node = UserSystemd::start("jobs");
    node.write_unit(
        "ok.service",
        "[Service]\nType=oneshot\nExecStart=/bin/true\n",
    );
    node.write_unit(
        "bad.service",
        "[Service]\nType=oneshot\nExecStart=/bin/false\n",
    );
    let (d, mut rx) = dispatcher(&node).await;
    d.handle(1, 1, Request::Reload).await;
    assert_eq!(
        next(&mut rx).await,
        ToManager::Reply {
            id: 1,
            result: Ok(Response::Empty)
        }
    );

    // Many fast oneshots in a row: each has its reply first and exactly one JobDone.
    for round in 0..20u32 {
        let job_id = 100 + round;
        d.handle(1, 10 + u64::from(round), start("ok.service", job_id))
            .await;
        let (seen, result) = until_done(&mut rx, job_id).await;
        assert_eq!(
            seen[0],
            ToManager::Reply {
                id: 10 + u64::from(round),
                result: Ok(Response::Empty)
            }
        );
        assert_eq!(result, "done", "round {round}: {seen:?}");
    }

    d.handle(1, 2, start("bad.service", 2)).await;
    let (seen, result) = until_done(&mut rx, 2).await;
    assert_eq!(
        seen[0],
        ToManager::Reply {
            id: 2,
            result: Ok(Response::Empty)
        }
    );
    assert_eq!(result, "failed");

    d.handle(1, 3, start("missing.service", 3)).await;
    match next(&mut rx).await {
        ToManager::Reply {
            id: 3,
            result: Err(e),
        } => {
            assert_eq!(e.name, "org.freedesktop.systemd1.NoSuchUnit", "{e}");
            assert!(e.message.contains("missing.service"), "{e}");
        }
        other => panic!("unexpected {other:?}"),
    }

    // No stray JobDone of a finished job shows up later.
    let extra = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
    assert!(extra.is_err(), "unexpected extra message: {extra:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_units_and_cancel_a_running_job() {
    let node = UserSystemd::start("cancel");
    node.write_unit(
        "slow.service",
        "[Service]\nType=oneshot\nExecStart=/bin/sleep 30\n",
    );
    let (d, mut rx) = dispatcher(&node).await;
    d.handle(1, 1, Request::Reload).await;
    next(&mut rx).await;

    d.handle(1, 2, start("slow.service", 7)).await;
    assert_eq!(
        next(&mut rx).await,
        ToManager::Reply {
            id: 2,
            result: Ok(Response::Empty)
        }
    );
    assert_eq!(
        next(&mut rx).await,
        ToManager::Event(Event::JobStateChanged {
            job_id: 7,
            state: "running".into()
        })
    );

    d.handle(1, 3, Request::ListUnits).await;
    match next(&mut rx).await {
        ToManager::Reply {
            id: 3,
            result: Ok(Response::Units(units)),
        } => {
            let slow = units
                .iter()
                .find(|u| u.name == "slow.service")
                .expect("slow.service is listed");
            assert_eq!(slow.active_state, "activating");
            assert_eq!(slow.job_type, "start");
        }
        other => panic!("unexpected {other:?}"),
    }

    d.handle(1, 4, Request::JobCancel { job_id: 7 }).await;
    let mut got = [next(&mut rx).await, next(&mut rx).await];
    got.sort_by_key(|m| matches!(m, ToManager::Event(_)));
    assert_eq!(
        got[0],
        ToManager::Reply {
            id: 4,
            result: Ok(Response::Empty)
        }
    );
    assert_eq!(
        got[1],
        ToManager::Event(Event::JobDone {
            job_id: 7,
            result: "canceled".into()
        })
    );
}

/// `job_info` reads type and state from systemd's own job objects: what the
/// agent's start-ahead of proxies (agent/src/ahead.rs) decides on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_info_reads_type_and_state_of_real_jobs() {
    let node = UserSystemd::start("jobinfo");
    node.write_unit(
        "slow.service",
        "[Service]\nType=oneshot\nExecStart=/bin/sleep 30\n",
    );
    node.write_unit(
        "later.service",
        "[Unit]\nAfter=slow.service\n[Service]\nExecStart=/bin/sleep 30\n",
    );
    let systemd = node.connect().await;
    systemd.reload().await.unwrap();
    let slow = systemd
        .unit_job(JobKind::Start, "slow.service", "replace")
        .await
        .unwrap();
    let later = systemd
        .unit_job(JobKind::Start, "later.service", "replace")
        .await
        .unwrap();
    let info = |kind: &str, state: &str| JobInfo {
        kind: kind.into(),
        state: state.into(),
    };
    // slow runs its ExecStart for 30 s; later waits for it (After=).
    let deadline = Instant::now() + T;
    while systemd.job_info(&slow).await.unwrap() != info("start", "running") {
        assert!(Instant::now() < deadline, "slow.service's job never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        systemd.job_info(&later).await.unwrap(),
        info("start", "waiting")
    );
    let stop = systemd
        .unit_job(JobKind::Stop, "later.service", "replace")
        .await
        .unwrap();
    // A stop replaces the waiting start: the old job is gone, an error.
    assert!(systemd.job_info(&later).await.is_err());
    let deadline = Instant::now() + T;
    while systemd.job_info(&stop).await.is_ok() {
        assert!(Instant::now() < deadline, "the stop job never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    systemd.cancel_job(&slow).await.unwrap();
}

/// The whole agent: real systemd below, a fake manager on TCP above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_a_remote_start_end_to_end() {
    let node = UserSystemd::start("e2e");
    node.write_unit(
        "ok.service",
        "[Service]\nType=oneshot\nExecStart=/bin/true\n",
    );
    node.connect().await; // wait until it is up

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut link = LinkConfig::new(NodeName::new("e2e").unwrap(), "127.0.0.1", port);
    link.heartbeat_interval = Duration::from_millis(100);
    let shutdown = CancellationToken::new();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let agent = tokio::spawn({
        let shutdown = shutdown.clone();
        let bus = Bus::Address(node.address());
        async move {
            drover_agent::agent::run(&bus, link, shutdown, move || {
                let _ = ready_tx.send(());
            })
            .await
        }
    });
    tokio::time::timeout(T, ready_rx)
        .await
        .expect("ready in time")
        .unwrap();

    let (sock, _) = tokio::time::timeout(T, listener.accept())
        .await
        .unwrap()
        .unwrap();
    let (pending, hello) = manager_read_hello(sock, T).await.unwrap();
    assert_eq!(hello.node, "e2e");
    let accepted = Accepted {
        session_id: 1,
        heartbeat_interval_ms: 1000,
        heartbeat_threshold_ms: 0,
        manager_version: "fake".into(),
    };
    let mut m = pending.accept(accepted, T).await.unwrap();

    m.send(ToAgent::Request {
        id: 1,
        body: Request::Reload,
    })
    .await
    .unwrap();
    m.send(ToAgent::Request {
        id: 2,
        body: start("ok.service", 42),
    })
    .await
    .unwrap();
    let mut replies = Vec::new();
    let result = loop {
        match tokio::time::timeout(T, m.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            ToManager::Heartbeat => {}
            ToManager::Reply { id, result } => replies.push((id, result)),
            ToManager::Event(Event::JobDone { job_id: 42, result }) => break result,
            ToManager::Event(_) => {}
        }
    };
    assert_eq!(result, "done");
    replies.sort_by_key(|(id, _)| *id);
    assert_eq!(
        replies,
        vec![(1, Ok(Response::Empty)), (2, Ok(Response::Empty))]
    );

    shutdown.cancel();
    let ended = tokio::time::timeout(T, agent)
        .await
        .expect("agent stops")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
}

/// Node API pass-throughs and unit subscriptions.
#[path = "real_systemd/node_api.rs"]
mod node_api;
